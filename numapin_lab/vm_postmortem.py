"""What a frozen multi-NUMA guest was doing: collected from the host once a watchdog (numapin_lab.numa_vm's
``stalled``) has given up on the guest, before the VM is stopped.

Three sources, gentlest first, each written to a file of the ``into`` directory:

1. The guest itself, if any of it still runs (``guest.txt``): the guest command started by tests/numa/harness
   watches for a request file in the shared directory and answers with sysrq ``l`` (every CPU's backtrace) and
   ``t`` (every task) to its kernel log and console, and ``/proc/<pid>/task/<tid>/stack`` of every running or
   blocked task.
2. QEMU's monitor (``monitor.txt``): which vCPUs are halted and, sampled a few times, where each one executes
   (RIP), with the guest kernel's symbol when the guest wrote its ``/proc/kallsyms`` text symbols at start.
3. The guest kernel's own word (``console.log``): an NMI injected into every vCPU; the guest command set
   ``kernel.unknown_nmi_panic`` and ``kernel.panic_print`` at start, so the kernel panics with every CPU's
   backtrace on its serial console (a file of numa-vm.sh's run directory, hard-linked
   here first: numa-vm.sh removes its run directory when QEMU exits).

Best effort throughout: whatever cannot be had is said in ``summary.txt`` rather than raised.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DUMP_DONE", "DUMP_REQUEST", "KALLSYMS", "PostMortem", "Symbols", "collect", "run_dir_of"]

DUMP_REQUEST = "dump-request"   # written by the host into the shared directory: the guest's answer, please
DUMP_DONE = "dump-done"         # written by the guest when its answer (guest.txt) is complete
GUEST_DUMP = "guest.txt"
KALLSYMS = "kallsyms"           # the guest kernel's text symbols, written by the guest at start
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b[A-Za-z]")
_RIP = re.compile(r"^RIP=([0-9a-f]{16})", re.M)
_CPU_HEADER = re.compile(r"^CPU#(\d+)", re.M)
_HLT = re.compile(r"HLT=(\d)")


@dataclass(frozen=True)
class PostMortem:
    into: Path
    guest_answered: bool
    halted: str           # which vCPUs QEMU showed halted (HLT=1: idle) in its first register sample
    hot: tuple[str, ...]  # the symbols the vCPUs were found in, most frequent first, "symbol xN"
    panic_lines: int      # lines the guest kernel printed after the NMI

    def summary(self) -> str:
        hot = ", ".join(self.hot[:6]) or "no RIP sample"
        return (f"post-mortem in {self.into}: the guest {'answered' if self.guest_answered else 'did not answer'} "
                f"the sysrq request; vCPUs: {self.halted or '?'}; executing: {hot}; {self.panic_lines} console "
                f"line(s) after the NMI")


class Symbols:
    """Addresses to ``symbol+0xoff`` from ``/proc/kallsyms`` lines (``address type name [module]``)."""

    def __init__(self, text: str) -> None:
        pairs = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tTwW":
                with contextlib.suppress(ValueError):
                    pairs.append((int(parts[0], 16), parts[2] + (f" {parts[3]}" if len(parts) > 3 else "")))
        pairs.sort()
        self._addrs = [a for a, _ in pairs]
        self._names = [n for _, n in pairs]

    def __len__(self) -> int:
        return len(self._addrs)

    def name(self, address: int) -> str:
        i = bisect.bisect_right(self._addrs, address) - 1
        if i < 0 or address - self._addrs[i] > 1 << 20:
            return f"{address:#x}"
        return f"{self._names[i]}+{address - self._addrs[i]:#x}"


def run_dir_of(runs_dir: Path) -> Path | None:
    """numa-vm.sh's run directory of the one VM running under ``runs_dir`` (its ``$NUMA_VM_RUNS``)."""
    runs = sorted(runs_dir.glob("run.*"), key=lambda p: p.stat().st_mtime if p.exists() else 0.0)
    return runs[-1] if runs else None


def hmp(sock: Path, commands: Sequence[str], timeout: float = 20.0) -> list[str]:
    """Answers of QEMU's human monitor (``-monitor unix:...``) to ``commands``, terminal escapes removed."""
    out = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        _read_prompt(s)
        for c in commands:
            s.sendall(c.encode() + b"\n")
            text = _ANSI.sub("", _read_prompt(s)).replace("\r", "")
            out.append(text.split("\n", 1)[1] if "\n" in text else text)  # the echoed command first
    return out


def _read_prompt(s: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"(qemu) "):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").removesuffix("(qemu) ")


def collect(runs_dir: Path, shared: Path, into: Path, *, guest_wait: float = 45.0, panic_wait: float = 60.0,
            samples: int = 5) -> PostMortem:
    """Ask, sample and dump as described in the module's docstring; the VM is still running when this returns
    (unless the NMI's panic stopped it)."""
    into.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    run = run_dir_of(runs_dir)
    console = into / "console.log"
    if run is not None:
        try:
            os.link(run / "console.log", console)  # survives numa-vm.sh's removal of its run directory
        except OSError as e:
            notes.append(f"console.log not linked: {e}")
    else:
        notes.append(f"no numa-vm.sh run directory under {runs_dir}")
    # 1. the guest's own answer, if anything in it still runs
    (shared / DUMP_DONE).unlink(missing_ok=True)
    (shared / DUMP_REQUEST).write_text("sysrq l t, stacks\n")
    answered = _wait_for(shared / DUMP_DONE, guest_wait)
    for name in (GUEST_DUMP, DUMP_DONE):
        with contextlib.suppress(OSError):
            (shared / name).replace(into / name)
    # 2. QEMU's view of the vCPUs
    halted, hot, monitor_text = "", [], ""
    sock = run / "monitor.sock" if run is not None else None
    if sock is not None:
        try:
            halted, hot, monitor_text = _sample(sock, shared / KALLSYMS, samples)
        except OSError as e:
            notes.append(f"QEMU monitor: {e}")
    (into / "monitor.txt").write_text(monitor_text)
    # 3. the guest kernel's backtraces by NMI (panic_print): read from the serial console
    before = _lines(console)
    if sock is not None:
        try:
            hmp(sock, ["nmi"])
        except OSError as e:
            notes.append(f"NMI not injected: {e}")
        _wait_quiet(console, panic_wait)
    after = _lines(console)
    pm = PostMortem(into, answered, halted, tuple(f"{name} x{n}" for name, n in Counter(hot).most_common()),
                    max(0, after - before))
    (into / "summary.txt").write_text(pm.summary() + "\n" + "".join(f"{n}\n" for n in notes))
    return pm


def _sample(sock: Path, kallsyms: Path, samples: int) -> tuple[str, list[str], str]:
    try:
        symbols = Symbols(kallsyms.read_text(errors="replace"))
    except OSError:
        symbols = Symbols("")
    text = []
    hot: list[str] = []
    halted = ""
    text.append(f"== info cpus\n{hmp(sock, ['info cpus'])[0]}")
    for i in range(samples):
        regs = hmp(sock, ["info registers -a"])[0]
        heads = [int(m.group(1)) for m in _CPU_HEADER.finditer(regs)]
        rips = [int(m.group(1), 16) for m in _RIP.finditer(regs)]
        where = [symbols.name(r) for r in rips]
        hot += [w.split("+", 1)[0] for w in where]
        text.append(f"== sample {i + 1}: " + ", ".join(f"CPU{c} {w}" for c, w in zip(heads, where, strict=False)))
        if i == 0:
            idle = [str(c) for c, h in zip(heads, _HLT.findall(regs), strict=False) if h == "1"]
            halted = f"{len(idle)} of {len(heads)} halted ({','.join(idle) or 'none'})"
            text.append(regs)
        time.sleep(1.0)
    return halted, hot, "\n".join(text) + "\n"


def _wait_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(1.0)
    return path.exists()


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _wait_quiet(path: Path, seconds: float) -> None:
    """Until ``path`` has not grown for 10 s, or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    size, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            now_size = path.stat().st_size
        except OSError:
            now_size = -1
        if now_size != size:
            size, since = now_size, time.monotonic()
        elif time.monotonic() - since > 10:
            return
        time.sleep(1.0)
