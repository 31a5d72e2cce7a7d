"""What the proxy publishes and serves: ``/status`` (``status``), ``/metrics`` (``metrics``), NodeResourceTopology
(``nrt``), the local control socket (``control``) and the HTTP server (``http_server``)."""
