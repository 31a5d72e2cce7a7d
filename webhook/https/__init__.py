"""The HTTPS server: TLS and certificates (``tls``, ``certs``, ``client_certs``), the listener and its limits
(``listener``, ``limits``), request bodies and the parser process (``request_body``, ``parser_process``), routes
(``server``), workers and their metrics (``workers``, ``worker_metrics``, ``metrics``), warm-up and the heap
(``warmup``, ``heap``)."""
