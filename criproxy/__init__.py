"""numapin's CRI proxy: relays kubelet's CRI calls to containerd and pins containers' cpusets."""
