"""Test and benchmark support for the CRI proxy: a kubelet-like CRI client, a small in-process CRI
runtime, and a private containerd lab. Not used by the proxy itself."""
