"""numapin_lab.vm_postmortem without a VM: symbols from ``/proc/kallsyms`` lines, and a collection against a
monitor that speaks QEMU's human monitor protocol on a real unix socket (prompt, echoed command, answer) and a
shared directory where a stand-in guest answers the dump request. The collection against a real frozen guest is
what the multi-NUMA harness does (tests/numa/harness.py); docs/numa.md says what it found."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from numapin_lab.vm_postmortem import DUMP_DONE, DUMP_REQUEST, KALLSYMS, Symbols, collect

KALLSYMS_TEXT = """ffffffff81000000 T _stext
ffffffff81a59170 t native_safe_halt
ffffffff81a59180 T default_idle
ffffffff81100000 D some_data
ffffffffc0000000 t overlay_open\t[overlay]
"""

REGS = """CPU#0
RIP=ffffffff81a5917b RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1
CPU#1
RIP=ffffffffc0000010 RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
"""


def test_symbols_name_text_addresses_only() -> None:
    s = Symbols(KALLSYMS_TEXT)
    assert len(s) == 4
    assert s.name(0xFFFFFFFF81A5917B) == "native_safe_halt+0xb"
    assert s.name(0xFFFFFFFF81A59180) == "default_idle+0x0"
    assert s.name(0xFFFFFFFFC0000010) == "overlay_open [overlay]+0x10"
    assert s.name(0x1000) == "0x1000"


def fake_monitor(path: Path, commands: list[str]) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        with server:
            server.settimeout(30)
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(b"QEMU 7.2 monitor - type 'help' for more information\r\n(qemu) ")
                    buf = b""
                    while True:
                        data = conn.recv(4096)
                        if not data:
                            break
                        buf += data
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            cmd = line.decode()
                            commands.append(cmd)
                            answer = REGS if cmd == "info registers -a" else "* CPU #0: thread_id=1\r\n"
                            conn.sendall(f"\x1b[D{cmd}\r\n{answer}(qemu) ".encode())
                    if commands and commands[-1] == "nmi":
                        return

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_collect_asks_the_guest_samples_the_vcpus_and_sends_an_nmi(tmp_path: Path) -> None:
    runs, shared = tmp_path / "runs", tmp_path / "shared"
    run = runs / "run.abc"
    run.mkdir(parents=True)
    shared.mkdir()
    (run / "console.log").write_text("boot\n")
    (shared / KALLSYMS).write_text(KALLSYMS_TEXT)
    commands: list[str] = []
    server = fake_monitor(run / "monitor.sock", commands)

    def guest() -> None:  # answers the dump request as the guest command's responder does
        for _ in range(300):
            if (shared / DUMP_REQUEST).exists():
                (shared / "guest.txt").write_text("== running (R) and blocked (D) tasks\n")
                (shared / DUMP_DONE).write_text("done\n")
                return
            threading.Event().wait(0.1)

    g = threading.Thread(target=guest, daemon=True)
    g.start()
    pm = collect(runs, shared, tmp_path / "pm", guest_wait=30, panic_wait=2, samples=2)
    server.join(timeout=30)
    assert pm.guest_answered
    assert (tmp_path / "pm/guest.txt").read_text().startswith("== running")
    assert commands == ["info cpus", "info registers -a", "info registers -a", "nmi"]
    assert pm.halted == "1 of 2 halted (0)"
    assert pm.hot == ("native_safe_halt x2", "overlay_open [overlay] x2")
    assert "CPU0 native_safe_halt+0xb, CPU1 overlay_open [overlay]+0x10" in (tmp_path / "pm/monitor.txt").read_text()
    # the console is hard-linked: it outlives numa-vm.sh's removal of its run directory
    (run / "console.log").unlink()
    assert (tmp_path / "pm/console.log").read_text() == "boot\n"
    assert "answered" in (tmp_path / "pm/summary.txt").read_text()
