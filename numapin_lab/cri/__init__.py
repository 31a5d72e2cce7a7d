"""A lab to run CRI against: a kubelet-like CRI client (``client``), a small in-process CRI runtime
(``memory_runtime``), a private containerd + runc with a busybox image (``containerd``), the proxy as a child
process (``proxy_process``), the kernel's view (``kernel_truth``) and the seeded churn (``churn``)."""
