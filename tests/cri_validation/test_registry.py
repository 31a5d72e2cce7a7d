"""The lab's local registry (numapin_lab.cri.registry) over real HTTP: any repository name is the busybox image, two
names are two images, two tags of one name one image, a digest it did not make is unknown, every blob matches its
digest."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from numapin_lab.cri.containerd import _busybox, build_image_archive
from numapin_lab.cri.registry import RegistryProcess


def _get(url: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read(), r.headers["Docker-Content-Digest"]


def test_the_registry_serves_every_name_as_its_own_image(tmp_path: Path) -> None:
    build_image_archive(tmp_path / "images.tar", _busybox())
    with RegistryProcess(tmp_path) as reg:
        base = f"http://{reg.address}/v2"
        one, d1 = _get(f"{base}/e2e-test-images/busybox/manifests/1.29-2")
        again, d1b = _get(f"{base}/e2e-test-images/busybox/manifests/other-tag")
        two, _ = _get(f"{base}/k8s-staging-cri-tools/test-image-1/manifests/latest")
        assert d1 == d1b == "sha256:" + hashlib.sha256(one).hexdigest() and one == again
        m1, m2 = json.loads(one), json.loads(two)
        assert m1["config"]["digest"] != m2["config"]["digest"] and m1["layers"] == m2["layers"]
        for blob in (m1["config"], m1["layers"][0]):
            data, _ = _get(f"{base}/e2e-test-images/busybox/blobs/{blob['digest']}")
            assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"]
        by_digest, _ = _get(f"{base}/any/name/manifests/{d1}")
        assert by_digest == one
        web = json.loads(_get(f"{base}/e2e-test-images/busybox/blobs/{m1['config']['digest']}")[0])
        assert web["config"]["Cmd"] == ["/bin/sh"]
        nginx = json.loads(_get(f"{base}/e2e-test-images/nginx/manifests/1.14-2")[0])
        cfg = json.loads(_get(f"{base}/e2e-test-images/nginx/blobs/{nginx['config']['digest']}")[0])
        assert cfg["config"]["Entrypoint"][:2] == ["/bin/httpd", "-f"]
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(f"{base}/x/manifests/sha256:{'0' * 64}")
        assert e.value.code == 404
