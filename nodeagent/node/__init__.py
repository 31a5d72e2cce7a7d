"""The node side: what the kernel says a container runs on (``kernel``), convergence of every running container to its
decision (``converge``), cgroup writes (``cpuset_pusher``), containerd's records (``records``, ``runtime_reads``),
CFS conversions (``cfs``) and devices' NUMA nodes (``devices``)."""
