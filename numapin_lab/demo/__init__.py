"""``numapin demo``'s stack and story, also driven by the end-to-end tests: the whole stack as real processes
(``stack``), kube-apiserver's side of admission (``admission``), kubelet's side of a pod (``pod_runner``), the
demo's steps (``play``)."""
