"""numapin's node agent, shared by both doors into the node (the CRI proxy, ``criproxy``, and the NRI plugin,
``nriplugin``): the decisions, the state, the kernel truth and convergence, modes, NodeResourceTopology, /status and
/metrics. It speaks CRI messages (``protos.cri_pb2``) and reaches the runtime only through the ports of
``nodeagent.ports``, which each door supplies; it never imports a door."""
