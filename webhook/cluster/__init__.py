"""The cluster view: the nodes' NodeResourceTopology documents (``nodes``) and their index (``node_index``), and the
pods bindings refer to (``pods_cache``)."""
