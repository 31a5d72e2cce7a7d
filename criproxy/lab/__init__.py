"""A lab to run CRI against, for the demo, the tests and the benchmarks: a kubelet-like CRI client
(``client``), a small in-process CRI runtime (``memory_runtime``), and a private containerd + runc with a
busybox image (``lab``). The proxy itself never imports it."""
