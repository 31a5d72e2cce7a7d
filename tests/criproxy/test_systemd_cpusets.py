"""nodeagent.node.systemd_cpusets and its D-Bus client (nodeagent.node.dbus_wire) against a real message bus: a
private dbus-daemon (no systemd runs as PID 1 here), its ``dbus-monitor`` decoding what the proxy sent. That the
call does what it should to systemd is proven in the systemd VM (tests/numa/guest/test_systemd_driver.py)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from nodeagent.node.dbus_wire import DBusConnection
from nodeagent.node.systemd_cpusets import SystemdCpusets, bitmask, unit_of

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[str]:
    """A private dbus-daemon's socket."""
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        pytest.fail("dbus-daemon not found: apt-get install dbus-daemon")
    socket = tmp_path / "bus"
    (tmp_path / "bus.conf").write_text(CONFIG.format(socket=socket))
    proc = subprocess.Popen([daemon, f"--config-file={tmp_path / 'bus.conf'}", "--nofork", "--print-address"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"unix:path="), "dbus-daemon did not start"
        yield str(socket)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bitmask_is_systemds_byte_array_form() -> None:
    assert bitmask(CPUSet()) == b""
    assert bitmask(CPUSet([0])) == b"\x01"
    assert bitmask(CPUSet([0, 1, 9])) == b"\x03\x02"
    assert bitmask(CPUSet.parse("2-3,16")) == b"\x0c\x00\x01"


def test_unit_of_a_container_cgroup() -> None:
    scope = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice/cri-containerd-ab12.scope"
    assert unit_of(scope) == "cri-containerd-ab12.scope"
    assert unit_of("/kubepods/burstable/podu-1/ab12") is None  # cgroupfs
    assert unit_of("/kubepods.slice/kubepods-podu_1.slice") is None
    assert unit_of("/.scope") is None


def test_a_call_on_a_real_bus_gets_its_reply(bus: str) -> None:
    async def go() -> str:
        conn = await DBusConnection.open(bus, bus=True)
        try:
            reply = await conn.call(path="/org/freedesktop/DBus", interface="org.freedesktop.DBus", member="GetId",
                                    destination="org.freedesktop.DBus")
            return reply.first_string()
        finally:
            await conn.close()
    bus_id = asyncio.run(go())
    assert len(bus_id) == 32 and int(bus_id, 16) >= 0


def test_set_unit_properties_on_the_wire_as_dbus_monitor_decodes_it(bus: str, tmp_path: Path) -> None:
    """No systemd on this bus: the daemon answers ServiceUnknown (surfaced as the reason), and its monitor shows
    the call as systemd would receive it: the unit, runtime, AllowedCPUs and AllowedMemoryNodes bitmasks."""
    monitor_out = tmp_path / "monitor.txt"
    with open(monitor_out, "wb") as out:
        monitor = subprocess.Popen(["dbus-monitor", "--address", f"unix:path={bus}"], stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while b"NameAcquired" not in monitor_out.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)

        async def go() -> str | None:
            s = SystemdCpusets(sockets=((bus, True),), timeout=10)
            try:
                return await s.set("cri-containerd-ab12.scope", CPUSet([0, 1, 9]), CPUSet([1]))
            finally:
                await s.close()
        why = asyncio.run(go())
        assert why is not None and "org.freedesktop.DBus.Error.ServiceUnknown" in why, why
        deadline = time.monotonic() + 20
        while b"ServiceUnknown" not in monitor_out.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        monitor.terminate()
        monitor.wait(timeout=10)
    text = " ".join(monitor_out.read_text().split())
    call = text[text.index("member=SetUnitProperties"):]
    assert "destination=org.freedesktop.systemd1" in text
    assert call.startswith('member=SetUnitProperties string "cri-containerd-ab12.scope" boolean true array [ '
                           'struct { string "AllowedCPUs" variant array of bytes [ 03 02 ] } '
                           'struct { string "AllowedMemoryNodes" variant array of bytes [ 02 ] } ]'), call[:400]


def test_no_systemd_to_reach_is_a_reason_not_an_exception(tmp_path: Path) -> None:
    async def go() -> str | None:
        s = SystemdCpusets(sockets=((str(tmp_path / "none"), False), (str(tmp_path / "nobus"), True)), timeout=5)
        try:
            return await s.set("x.scope", CPUSet([1]), None)
        finally:
            await s.close()
    why = asyncio.run(go())
    assert why is not None and "systemd cannot be reached" in why and "nobus" in why, why

