"""A real Kubernetes control plane for tests: etcd (Debian's ``etcd-server``) and kube-apiserver v1.36.2 (the
binaries of ``shared/k8s-bin``), on loopback, in a private directory (``binaries``, ``control_plane``)."""
