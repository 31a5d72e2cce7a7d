"""The long form of the seeded kubelet-like churn (numapin_lab.cri.churn): thousands of operations against a
real containerd and ``numapin criproxy``, with proxy kills and containerd restarts, every invariant judged
from the kernel. Prints the JSON report; exit status 1 on any violation. Needs root, containerd, runc and
busybox-static.

    python benchmarks/churn.py --seed 7 --ops 2000 [--reserved-cpus 0] [--sysfs /sys] [--keep]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numapin_lab.cri.churn import main

if __name__ == "__main__":
    sys.exit(main())
