"""``python -m webhook.https.parser_process``: the webhook's body parser process (``request_body.BodyParser``).

Reads length-prefixed request bodies on stdin and answers each with its slim review on stdout, until end of input.
It imports only what parsing needs, not the webhook.
"""

from __future__ import annotations

import sys

from webhook.https.request_body import serve

if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
