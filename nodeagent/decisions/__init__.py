"""The proxy's decisions: CreateContainer, UpdateContainerResources and removals (``pinning``), StartContainer
(``starts``, ``gate``), the pod as CRI shows it (``cri_intent``, ``pod_roles``, ``cri_pods``), mode changes and
their sources (``mode_apply``, ``mode_request``, ``pod_watch``), what the proxy tracks (``registry``) and the start-
up reconcile (``reconcile``)."""
