"""Admission: AdmissionReview in and out (``review``, ``slim``), ``/mutate`` (``mutate``, ``jsonpatch_diff``),
``/validate`` for pods and bindings (``validate``, ``binding``), the topology simulation of a node (``simulate``,
``synthetic_node``) and the answer when a request cannot be judged (``unjudged``)."""
