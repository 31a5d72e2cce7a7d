"""Which host paths the multi-NUMA guest keeps visible (tests.numa.guest_paths) and the guest command's first step
that does it (tests.numa.guest_script's tmpfs on /tmp with those paths bound back), without a VM: the step runs
for real in a private mount namespace of this machine (``unshare -m``), under a tmpfs /run of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.numa.guest_paths import GuestPathError, needed_paths, plan
from tests.numa.guest_script import GUEST_SETUP_FAILED, tmp_command


def test_paths_under_tmp_are_kept_outermost_first_and_once() -> None:
    keep = plan([Path("/tmp/numapin-clone-abc"), Path("/tmp/numapin-clone-abc/.venv"), Path("/usr"),
                 Path("/tmp/venvs/x"), Path("/tmp/numapin-clone-abc")], [Path("/var/tmp/numapin-vm-1/2s4n")])
    assert keep == ("/tmp/numapin-clone-abc", "/tmp/venvs/x")


def test_paths_elsewhere_need_nothing_even_with_spaces() -> None:
    assert plan([Path("/root/numapin clone"), Path("/root/numapin clone/.venv"), Path("/usr")],
                [Path("/var/tmp/numapin vm")]) == ()


def test_a_shared_directory_under_tmp_is_kept_too() -> None:
    assert plan([Path("/root/x")], [Path("/tmp/share")]) == ("/tmp/share",)


def test_a_relative_path_is_judged_where_it_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert plan([Path("clone")], []) == (str(tmp_path / "clone"),)


@pytest.mark.parametrize(("path", "why"), [
    ("/run/user/0/numapin", "/run is a tmpfs numa-vm.sh mounts"),
    ("/dev/shm/numapin", "/dev is the guest's own devtmpfs"),
    ("/var/lib/containerd/numapin", "/var/lib/containerd is a tmpfs"),
    ("/mnt/numa-lab/x", "numa-vm.sh's per-run share"),
])
def test_a_checkout_the_guest_cannot_see_is_refused_with_the_path_and_why(path: str, why: str) -> None:
    with pytest.raises(GuestPathError) as e:
        plan([Path(path)], [])
    assert path in str(e.value)
    assert why in str(e.value)


def test_tmp_itself_is_refused() -> None:
    with pytest.raises(GuestPathError, match="/tmp: the guest mounts its own tmpfs there"):
        plan([Path("/tmp")], [])


@pytest.mark.parametrize("share", ["/var/tmp/a,b", "/var/tmp/a\nb", "/var/tmp/a "])
def test_a_shared_directory_qemu_cannot_take_is_refused(share: str) -> None:
    with pytest.raises(GuestPathError) as e:
        plan([Path("/root/x")], [Path(share)])
    assert repr(share) in str(e.value)
    assert "-virtfs" in str(e.value)


def test_the_interpreter_and_the_checkout_are_needed() -> None:
    root = Path(__file__).resolve().parents[2]
    needed = needed_paths(root)
    assert needed[0] == root
    assert any((p / "bin").is_dir() or p.name == "bin" for p in needed[1:])


def in_private_mounts(tmp_path: Path, keep: list[str], command: list[str]) -> subprocess.CompletedProcess[str]:
    """``tmp_command`` in a private mount namespace, with its own tmpfs on /run (the step stages its /tmp there)."""
    inner = tmp_command(keep, command)
    wrapper = 'mount -t tmpfs numapin-test-run /run || exit 99; exec "$@"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", wrapper, "wrap", *inner],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_guest_tmpfs_keeps_a_checkout_under_tmp_visible_and_hides_the_rest(tmp_path: Path) -> None:
    assert Path("/tmp") in tmp_path.parents, "pytest's tmp_path is expected under /tmp here"
    clone = tmp_path / "numapin clone"
    (clone / ".venv/bin").mkdir(parents=True)
    (clone / ".venv/bin/python").write_text("x")
    (tmp_path / "other").write_text("hidden")
    r = in_private_mounts(tmp_path, [str(clone)],
                          ["/bin/sh", "-c", 'cat "$1/.venv/bin/python"; echo; ls -A /tmp; findmnt -n -o FSTYPE /tmp; '
                           'pwd; ls -A "$2"', "x", str(clone), str(tmp_path)])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "x"                               # the kept checkout, with its content
    assert lines[1] == tmp_path.relative_to("/tmp").parts[0]  # /tmp holds only the kept path's first component
    assert lines[2] == "tmpfs"                           # a fresh tmpfs on /tmp
    assert lines[3] == str(tmp_path)                     # the working directory is its path on the new /tmp
    assert lines[4:] == ["numapin clone"]                # the rest of the host's /tmp is hidden
    assert (tmp_path / "other").read_text() == "hidden"  # and untouched


def test_the_guest_tmpfs_says_which_path_it_cannot_keep(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone")
    r = in_private_mounts(tmp_path, [missing], ["true"])
    assert r.returncode == GUEST_SETUP_FAILED
    assert f"numapin-vm: {missing}: not visible in the guest" in r.stderr
