"""``numapin demo``: numapin's whole job on this machine, with real parts (see DESCRIPTION)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

HELP = "run the whole stack on this machine (containerd, CRI proxy, webhook) and pin real pods (needs root)"
DESCRIPTION = """\
Plays on this machine what a Kubernetes cluster with numapin does, with real parts:

  1. starts a private containerd (its own directory, socket and images; it does not touch a system containerd),
     `numapin criproxy` in front of it (this machine's real /sys, topology manager policy single-numa-node,
     the first CPU reserved) and `numapin webhook` over HTTPS with a fresh CA and certificate from `numapin certs`;
  2. sends a shared pod and a `share` pod through the webhook as kube-apiserver and the scheduler do: /mutate (the
     CPU intent is stamped), /validate, and the scheduler's pods/binding, judged against the NodeResourceTopology
     the proxy publishes; then runs them through the proxy as kubelet does (RunPodSandbox, CreateContainer,
     StartContainer, with the mutated pod's annotations in the sandbox config);
  3. does the same with an `exclusive` pod (its binding is denied under single-numa-node while the node has no
     room, with the node's reason) and shows the `share` and the `exclusive` pod side by side;
  4. binds more exclusive pods until a binding is denied;
  5. sends a pod that no NUMA node can hold: /validate denies it, and the proxy (the node's backstop) refuses it;
  6. shows what `numapin status` sees; every step draws which container holds which CPUs and NUMA nodes and checks
     it against the processes' real Cpus_allowed_list, Mems_allowed_list and cpuset cgroups;
  7. deletes the pods as kubelet does (the shared pool widens again), and stops everything: no process, mount,
     cgroup directory or socket stays.

Ctrl-C at any time stops and cleans up too. --keep leaves the stack running after step 6 and prints how to reach
it (CRI socket, status URL, webhook URL) until Ctrl-C. Logs of containerd, the proxy and the webhook are in the
work directory (deleted at the end; --keep to read them).

With --topology (e.g. 2s4n: 2 sockets x 2 cores x 2 threads, 4 NUMA nodes), the same story runs inside a
throw-away QEMU virtual machine of that shape (numa-lab's numa-vm.sh: this machine's kernel, with the NUMA nodes,
SMT siblings and distances the guest kernel really enforces), so NUMA alignment can be seen on a single-node
machine: pods pinned to one of the 4 nodes, their memory nodes, bindings denied by single-numa-node. Under
software emulation the VM makes it slower (one to two minutes). --keep cannot be combined with it.

Needs root and the Debian packages containerd, runc and busybox-static (scripts/demo.sh installs them; with
--topology also qemu-system-x86 and linux-image-amd64).
Exit status: 0 every check passed and nothing was left behind, 1 a check failed, 2 a prerequisite is missing.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep", action="store_true",
                        help="keep the stack running after the demo for exploration; Ctrl-C stops it")
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help="work directory (must not exist or be empty; default: a new /tmp/numapin-demo-*)")
    parser.add_argument("--node-name", default=None, help="node name in the NodeResourceTopology (default: hostname)")
    parser.add_argument("--sysfs", default="/sys", metavar="ROOT", help="sysfs root the proxy reads (default /sys)")
    parser.add_argument("--reserved-cpus", default=None, metavar="LIST",
                        help="CPUs the proxy keeps for the system (default: the first CPU)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"),
                        help="log level of the proxy and the webhook (their logs are in the work directory)")
    parser.add_argument("--topology", metavar="SHAPE",
                        help="run the demo inside a multi-NUMA VM of this shape: a numa-vm.sh preset (2s4n, 1s2n, "
                             "1s2n-nosmt, 2s2n) or <S>s<C>c<T>t<N>n, e.g. 2s4c1t8n")


def _fail(msg: str) -> int:
    print(f"numapin demo: {msg}", file=sys.stderr)
    return 2


def _no_demo(e: ModuleNotFoundError) -> int:
    """The demo lives in numapin_lab and needs the ``demo`` extra; an installation without them (the container
    image) says so instead of a traceback."""
    package = (e.name or "").split(".")[0]
    if package not in ("numapin_lab", "jsonpatch", "jsonpointer"):
        raise e
    return _fail(f"this installation has no demo (module {package} is missing): pip install 'numapin[demo]'")


def run_in_vm(args: argparse.Namespace) -> int:
    """``numapin demo`` again, inside a VM of ``args.topology`` (its work directory on the guest's /run: a tmpfs
    containerd's snapshots can use), its output streamed here."""
    try:
        from numapin_lab.numa_vm import VM_FAILURE, VMError, VMSpec, find_numa_vm, topology_spec
        from numapin_lab.numa_vm import run_in_vm as run_vm
    except ModuleNotFoundError as e:
        return _no_demo(e)

    try:
        topology_spec(args.topology)
        find_numa_vm()
    except VMError as e:
        return _fail(str(e))
    if args.keep:
        return _fail("--keep cannot be combined with --topology (the VM stops when the demo ends)")
    if args.sysfs != "/sys" or args.workdir is not None:
        return _fail("--sysfs and --workdir cannot be combined with --topology (the VM has its own)")
    inner = ["demo", "--workdir", "/run/numapin-demo", "--log-level", args.log_level,
             "--node-name", args.node_name or f"numa-vm-{args.topology}"]
    if args.reserved_cpus:
        inner += ["--reserved-cpus", args.reserved_cpus]
    try:
        spec = VMSpec(topology=args.topology, env={"PYTHONUNBUFFERED": "1"})
        print(f"numapin demo: booting a {args.topology} virtual machine (numa-vm.sh; under software emulation "
              f"this takes a minute or two)", flush=True)
        result = run_vm(spec, [sys.executable, "-m", "numapin", *inner], cwd=str(Path(__file__).resolve().parents[1]))
    except VMError as e:
        return _fail(str(e))
    if result.returncode == VM_FAILURE:
        print("numapin demo: the virtual machine failed (see numa-vm's messages above)", file=sys.stderr)
        return 2
    return result.returncode


def run(args: argparse.Namespace) -> int:
    if args.topology:
        return run_in_vm(args)
    import grpc.aio

    from allocator.cpuset import CPUSet
    from allocator.errors import AllocatorError
    from allocator.topology import Topology
    try:
        from numapin_lab.cri.containerd import ContainerdLab, LabError
        from numapin_lab.demo.play import Demo, say
        from numapin_lab.demo.stack import LocalStack, StackError, StackOptions
    except ModuleNotFoundError as e:
        return _no_demo(e)

    try:
        topology = Topology.from_sysfs(args.sysfs)
    except AllocatorError as e:
        return _fail(f"--sysfs {args.sysfs}: {e}")
    if topology.num_cpus < 2:
        return _fail("this machine has 1 CPU: pinning needs at least 2 (one is reserved for the system)")
    try:
        reserved = CPUSet.parse(args.reserved_cpus) if args.reserved_cpus else CPUSet([topology.all_cpus.min()])
    except ValueError as e:
        return _fail(f"--reserved-cpus: {e}")
    if not reserved or not reserved.issubset(topology.all_cpus) or reserved == topology.all_cpus:
        return _fail(f"--reserved-cpus {reserved}: must be some, not all, of this machine's CPUs "
                     f"({topology.all_cpus})")
    try:
        ContainerdLab.check_prerequisites()
    except LabError as e:
        return _fail(f"{e} (scripts/demo.sh installs what is missing)")
    if args.workdir is not None:
        workdir = args.workdir.resolve()
        if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
            return _fail(f"--workdir {workdir}: must not exist or be an empty directory")
        if len(str(workdir)) > 60:
            return _fail(f"--workdir {workdir}: too long for unix socket paths (60 characters at most)")
    else:
        workdir = Path(tempfile.mkdtemp(prefix="numapin-demo-", dir="/tmp"))
    options = StackOptions(workdir=workdir, node_name=args.node_name or socket.gethostname(), sysfs=args.sysfs,
                           reserved_cpus=str(reserved), log_level=args.log_level)
    stack = LocalStack(options, say=lambda s: say("   " + s))

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    code = 0
    interrupted = False
    demo: Demo | None = None
    try:
        say(f"numapin demo: the whole stack on this machine (work directory {workdir})")
        say("")
        say("1. Starting the stack")
        stack.start()
        demo = Demo(stack, topology, reserved)
        code = demo.play(keep=args.keep)
        if args.keep:
            demo.explain_keep()
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        interrupted = True
        say("")
        say("interrupted: stopping and cleaning up")
    except (StackError, LabError) as e:
        print(f"numapin demo: {e}", file=sys.stderr)
        code = 1
    except (grpc.aio.AioRpcError, OSError) as e:  # a part failed under us: say what, still clean up
        detail = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else str(e)
        print(f"numapin demo: failed: {detail} (logs in {stack.logs})", file=sys.stderr)
        code = 1
    finally:
        # a second Ctrl-C (or a signal sent to the whole process group) must not cut the clean-up short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if demo is not None and demo.pods and args.keep:
                with contextlib.suppress(Exception):
                    demo.cleanup_pods()  # as kubelet would; stop() below removes whatever remains anyway
            say("")
            say("8. Stopping everything")
            left = stack.stop()
        finally:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if left:
            say("LEFT BEHIND: " + "; ".join(left))
            code = 1
        else:
            say(f"   nothing left behind: no numapin or containerd process, no socket, mount or cgroup directory "
                f"(/sys/fs/cgroup/*/{stack.cgroup_root}), {workdir} removed")
    if interrupted:
        return 130
    say("")
    say("demo finished: every check passed" if code == 0 else "demo finished: SOME CHECKS FAILED (see above)")
    return code

