"""The long form of the seeded kubelet-like churn: thousands of operations against a real containerd, with kills of
numapin and containerd restarts, every invariant judged from the kernel. Prints the JSON report; exit status 1 on
any violation. Needs root, containerd, runc and busybox-static.

``--door proxy`` (default): through ``numapin criproxy`` (numapin_lab.cri.churn). ``--door nri``: kubelet's client on
containerd (``--containerd 2.x`` or ``1.7``, NRI on) and ``numapin nri`` plugged into its NRI socket
(numapin_lab.cri.churn_nri); containers created while the plugin is down are reported apart
(``unpinnedWhilePluginDown``). Every other option is the door's own (``--door nri --help``).

    python benchmarks/churn.py --seed 7 --ops 2000 [--reserved-cpus 0] [--sysfs /sys] [--keep]
    python benchmarks/churn.py --door nri --seed 7 --ops 2000 [--containerd 2.x]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numapin_lab.cri import churn, churn_nri


def main(argv: list[str] | None = None) -> int:
    door = argparse.ArgumentParser(add_help=False)
    door.add_argument("--door", choices=("proxy", "nri"), default="proxy")
    args, rest = door.parse_known_args(argv)
    if args.door == "proxy" and ("-h" in rest or "--help" in rest):
        print(__doc__)
    return (churn_nri.main if args.door == "nri" else churn.main)(rest)


if __name__ == "__main__":
    sys.exit(main())
