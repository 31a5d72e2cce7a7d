"""The relay: kubelet's CRI connections copied to the runtime (HTTP/2 frames: ``frame_server`` and the other
``frame_*`` modules; or a gRPC relay, ``grpc_relay``), the listening socket (``socket_server``), CRI's wire facts
(``cri_api``, ``h2wire``) and the few edits numapin makes in the messages (``wire``)."""
