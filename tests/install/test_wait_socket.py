"""``numapin wait-socket`` (the systemd units' ordering by sockets) against real unix sockets."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from numapin.cli import main


def test_a_listening_socket_answers_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen()
        assert main(["wait-socket", f"unix://{path}", "--timeout", "0"]) == 0


def test_a_stale_socket_file_or_no_file_is_not_an_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the file stays, nobody listens
    assert path.exists()
    assert main(["wait-socket", str(path), "--timeout", "0.3", "--interval", "0.05"]) == 1
    assert "nothing answered" in capsys.readouterr().err
    assert main(["wait-socket", str(tmp_path / "none.sock"), "--timeout", "0"]) == 1


def test_it_waits_for_a_socket_that_comes_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numapin.cmd_wait_socket as w

    path = tmp_path / "late.sock"
    listener = socket.socket(socket.AF_UNIX)
    tried = threading.Event()
    real = w.answers

    def attempt(p: str) -> bool:  # the real check; the listener starts only after it failed once
        ok = real(p)
        tried.set()
        return ok

    def serve_after_first_attempt() -> None:
        tried.wait(30)
        listener.bind(str(path))
        listener.listen()

    monkeypatch.setattr(w, "answers", attempt)
    t = threading.Thread(target=serve_after_first_attempt)
    t.start()
    try:
        assert main(["wait-socket", str(path), "--timeout", "60", "--interval", "0.05", "--quiet"]) == 0
    finally:
        t.join()
        listener.close()


@pytest.mark.parametrize("argv", [["relative.sock"], ["/x.sock", "--timeout", "-1"], ["/x.sock", "--interval", "0"]])
def test_bad_arguments(argv: list[str]) -> None:
    assert main(["wait-socket", *argv]) == 2
