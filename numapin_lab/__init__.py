"""numapin's lab: what runs numapin's parts on one machine for ``numapin demo``, the tests and the benchmarks,
never in production.

``numapin_lab.cri``: a kubelet-like CRI client (``client``, on the fuller test proto ``cri_full.proto``), a small
in-process CRI runtime (``memory_runtime``), a private containerd + runc with a busybox image (``containerd``),
``numapin criproxy`` as a child process (``proxy_process``), the kernel's view of containers (``kernel_truth``),
the seeded kubelet-like churn (``churn``), a lab's CNI bridge network (``cni``), a local registry serving the lab's
image under every name (``registry``) and the CRI validation suite's runs and their comparison (``critest``).
``numapin_lab.k8s_bin``: Kubernetes' binaries (critest, crictl, kubelet, ...) from the environment or ``k8s-bin``.
``numapin_lab.demo``: the whole stack as real processes (``stack``), kube-apiserver's side of admission
(``admission``), kubelet's side of a pod (``pod_runner``) and the demo's story (``play``).
``numapin_lab.numa_vm``: a throw-away multi-NUMA QEMU VM (numa-lab's numa-vm.sh) to run a command in;
``numapin_lab.systemd_vm``: the same VM with systemd as PID 1 on pure cgroup v2 (``VMSpec(init="systemd")``).

The product packages (allocator, criproxy, webhook, numapin's commands) never import it at import time
(tests/architecture/test_lab_apart.py); ``numapin demo`` imports it inside the command.
"""
