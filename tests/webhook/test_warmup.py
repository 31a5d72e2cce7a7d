"""Before /readyz says ready: the decision paths warmed up without a trace, and (``numapin webhook``) the heap
settled out of the garbage collector's full passes."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import aiohttp
import pytest

from tests.webhook.helpers import PKI, Client
from tests.webhook.nrt_fixtures import write_cluster
from webhook.app import WebhookApp, WebhookOptions
from webhook.https.heap import settle
from webhook.https.warmup import warm_up


async def test_warm_up_runs_every_decision_path_and_leaves_no_trace(pki: PKI, nrt_dir: Path, pods_dir: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    write_cluster(nrt_dir)
    caplog.set_level(logging.INFO, "numapin")
    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=nrt_dir,
                                    pods_dir=pods_dir, nrt_poll_seconds=0.05))
    await app.start()
    try:
        assert app.prepared.is_set()  # directory sources: warmed up before serving starts
        assert "warmed up in" in caplog.text and "(mutate patched, validate allowed)" in caplog.text
        assert "heap settled" not in caplog.text  # an embedded webhook leaves the host process's heap alone
        async with aiohttp.ClientSession() as s:
            c = Client(app.port, pki, s)  # type: ignore[arg-type]
            assert await c.get("/readyz") == (200, "ok\n")
            status, metrics = await c.get("/metrics")
        assert status == 200 and "numapin_webhook_requests_total{" not in metrics  # nothing counted
        assert "numapin_webhook_unjudged_total{" not in metrics and "pod_lookups_total{" not in metrics
        assert len(app.pods) == 0 and all(not app.binding_validator.pending(n) for n in app.nodes.names())
        # the simulator answered for the made-up pod: the paths really ran
        again = await warm_up(parser=app.server.parser, mutate=app.mutate, validate=app.validate, nodes=app.nodes,
                              simulator=app.simulator)
        assert again.verdicts == ("patched", "allowed")
    finally:
        await app.stop()


async def test_warm_up_with_no_node_known(pki: PKI, nrt_dir: Path) -> None:
    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=nrt_dir))
    await app.start()
    try:
        assert app.prepared.is_set() and app.server.ready() == (True, "ok")
    finally:
        await app.stop()


def test_settle_freezes_what_is_alive_out_of_collections() -> None:
    class Node:
        pass

    kept = [Node() for _ in range(100)]
    try:
        settled = settle()
        # what it froze, counted right after; other threads of this process (the VM boots' in the whole suite) may
        # free frozen objects since, and nothing but settle freezes, so the count can only have fallen
        assert settled.frozen_objects >= 100 and 0 < gc.get_freeze_count() <= settled.frozen_objects
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(k) in tracked for k in kept)  # full passes no longer visit them
        young = Node()
        assert any(o is young for o in gc.get_objects())  # what comes after is collected as usual
    finally:
        gc.unfreeze()
    assert any(o is kept[0] for o in gc.get_objects())


async def test_the_webhook_command_settles_its_heap(pki: PKI, nrt_dir: Path) -> None:
    """``numapin webhook`` (the CLI's options) settles the heap after the warm-up; in a child process, so this
    test's own heap is not frozen."""
    import asyncio
    import sys

    write_cluster(nrt_dir)
    code = ("import asyncio, gc, logging, sys\n"
            "from pathlib import Path\n"
            "from webhook.app import WebhookApp, WebhookOptions\n"
            "logging.basicConfig(level='INFO', stream=sys.stdout)\n"
            "async def main():\n"
            f"    app = WebhookApp(WebhookOptions(cert=Path({str(pki.cert)!r}), key=Path({str(pki.key)!r}),\n"
            f"        host='127.0.0.1', port=0, nrt_dir=Path({str(nrt_dir)!r}), settle_heap=True))\n"
            "    await app.start()\n"
            "    print('FROZEN=%d' % gc.get_freeze_count(), 'node tracked',\n"
            "          any(o is app.nodes.get('w-0') for o in gc.get_objects()), flush=True)\n"
            "    await app.stop()\n"
            "asyncio.run(main())\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT,
                                                cwd=Path(__file__).resolve().parents[2])
    out = (await proc.communicate())[0].decode()
    assert proc.returncode == 0, out
    assert "heap settled:" in out and "node tracked False" in out, out
    frozen = int(out.split("FROZEN=", 1)[1].split()[0])
    assert frozen > 10_000, out
