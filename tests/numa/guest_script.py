"""The shell script the multi-NUMA guest runs around its pytest (tests.numa.harness gives it to numa-vm.sh).

In order:

1. A tmpfs for /tmp (containerd's overlayfs snapshots cannot live on the guest's overlay root; tests keep their
   containerd under /tmp), with the host paths under /tmp that the guest needs bound back into it from the
   overlay first (tests.numa.guest_paths plans them), so a checkout under /tmp stays visible; then a check that
   the host's interpreter is there (exit GUEST_SETUP_FAILED with the path otherwise).
2. The kernel told to talk when frozen: console log level 7 (the serial console is a host file, read even when
   nothing in the guest runs), every CPU's backtrace on a soft lockup, and a panic with every CPU's backtrace
   (``panic_print`` 0x40; not every task's state as well: on a frozen 2s4n guest that overflowed the kernel's log
   buffer through the slow serial console and lost the backtraces) on an NMI from the host
   (numapin_lab.vm_postmortem injects one); the kernel's
   text symbols written to the shared directory (in the background, at the lowest priority).
3. A heartbeat rewritten every 10 s (the counter first, then what runs, bounded in time: ``ps`` reads
   ``/proc/<pid>/cmdline`` and can block on a stuck process), for the host's stall check.
4. A responder to the host's dump request (numapin_lab.vm_postmortem): sysrq ``l`` and ``t``, then the kernel
   stack of every running or blocked task and the kernel log's tail.
5. The pytest command, timed by the guest's clock (guest-start, guest-end).

Arguments: the number K of paths to keep, the K paths, then the command. ``$NUMAPIN_VM_SHARED`` is the shared
directory.
"""

from __future__ import annotations

from collections.abc import Sequence

from numapin_lab.vm_postmortem import DUMP_DONE, DUMP_REQUEST, GUEST_DUMP, KALLSYMS

__all__ = ["GUEST_SETUP_FAILED", "HEARTBEAT", "guest_command", "tmp_command"]

HEARTBEAT = "heartbeat"
GUEST_SETUP_FAILED = 3  # the guest could not be prepared (a path not visible, a mount refused): its message says

# step 1: a tmpfs on /tmp with the kept paths bound back (arguments: K, the K paths; the rest is left in "$@")
TMP_PART = r"""
fail() { echo "numapin-vm: $*" >&2; exit __SETUP__; }
# staged under a private mount: a mount whose parent propagates (systemd makes / and /run shared) cannot be moved
s=/run/numapin-stage t=/run/numapin-stage/tmp
mkdir -p $s && mount -t tmpfs -o mode=755 numapin-stage $s && mount --make-private $s \
  || fail "cannot mount a private staging tmpfs at $s"
mkdir -p $t && mount -t tmpfs -o mode=1777 numapin-tmp $t || fail "cannot mount a tmpfs for /tmp"
k=$1; shift
while [ "$k" -gt 0 ]; do
  p=$1; shift; k=$((k - 1))
  [ -d "$p" ] || fail "$p: not visible in the guest (under the host's /tmp, it should be on the overlay root)"
  mkdir -p "$t${p#/tmp}" && mount --rbind "$p" "$t${p#/tmp}" || fail "$p: cannot bind it over the guest's /tmp"
done
mount --move $t /tmp || fail "cannot move the tmpfs onto /tmp"
cd -- "$PWD" 2>/dev/null || fail "$PWD: the working directory is not visible in the guest"
"""

SCRIPT = TMP_PART + r"""
w=$NUMAPIN_VM_SHARED
[ -x "$1" ] || fail "$1: the host's interpreter is not visible in the guest"
cat /sys/devices/system/clocksource/clocksource0/current_clocksource > "$w/guest-clocksource"
echo 7 > /proc/sys/kernel/printk
echo 1 > /proc/sys/kernel/sysrq
echo 1 > /proc/sys/kernel/softlockup_all_cpu_backtrace 2>/dev/null
echo 1 > /proc/sys/kernel/unknown_nmi_panic 2>/dev/null
echo 64 > /proc/sys/kernel/panic_print 2>/dev/null
( nice -n 19 grep ' [tTwW] ' /proc/kallsyms > "$w/__KALLSYMS__.tmp"; mv -f "$w/__KALLSYMS__.tmp" "$w/__KALLSYMS__" ) &
( i=0; while :; do
    i=$((i + 1)); echo $i > "$w/__HEARTBEAT__"
    timeout 20 ps -eo pid,stat,pcpu,etime,args --sort=-pcpu 2>/dev/null | head -15 > "$w/ps.tmp"
    mv -f "$w/ps.tmp" "$w/ps.txt"; sleep 10
  done ) & hb=$!
( while [ ! -e "$w/__REQUEST__" ]; do sleep 2; done
  echo l > /proc/sysrq-trigger; echo t > /proc/sysrq-trigger
  {
    echo "== uptime, load"; cat /proc/uptime /proc/loadavg
    echo "== running (R) and blocked (D) tasks: path, state, comm, wchan, kernel stack"
    timeout 90 sh -c 'for t in /proc/[0-9]*/task/[0-9]*; do
        s=$(cat "$t/stat" 2>/dev/null); s=${s##*) }; s=${s%% *}
        case $s in R|D) echo "-- $t $s $(cat "$t/comm" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null)"
                        cat "$t/stack" 2>/dev/null ;; esac
      done'
    echo "== kernel log (tail)"; timeout 30 dmesg 2>/dev/null | tail -n 4000
  } > "$w/__DUMP__.tmp" 2>&1
  mv -f "$w/__DUMP__.tmp" "$w/__DUMP__"; echo done > "$w/__DONE__" ) & dr=$!
date +%s.%N > "$w/guest-start"
"$@"; rc=$?
date +%s.%N > "$w/guest-end"
kill $hb $dr 2>/dev/null
exit $rc
"""


def guest_command(keep: Sequence[str], command: Sequence[str]) -> list[str]:
    """argv for numa-vm.sh: the script above, with ``keep`` (paths under /tmp to keep visible) and ``command``."""
    return ["/bin/sh", "-c", _fill(SCRIPT), "numapin-guest", str(len(keep)), *keep, *command]


def tmp_command(keep: Sequence[str], command: Sequence[str]) -> list[str]:
    """Step 1 alone, then ``command``: for checking it in a private mount namespace without a VM."""
    return ["/bin/sh", "-c", _fill(TMP_PART) + 'exec "$@"\n', "numapin-guest", str(len(keep)), *keep, *command]


def _fill(script: str) -> str:
    return (script.replace("__SETUP__", str(GUEST_SETUP_FAILED)).replace("__KALLSYMS__", KALLSYMS)
            .replace("__HEARTBEAT__", HEARTBEAT).replace("__REQUEST__", DUMP_REQUEST)
            .replace("__DUMP__", GUEST_DUMP).replace("__DONE__", DUMP_DONE))
