"""Talking to the Kubernetes API server: the API client and the list/watch loops, shared by the webhook's cluster view
and the proxy's pod watch and NodeResourceTopology publisher, so that neither product imports the other."""
