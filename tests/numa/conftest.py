"""tests/numa/guest holds checks that run inside the multi-NUMA VMs (test_multi_numa.py boots them): it is
collected only there ($NUMAPIN_IN_VM=1), never on the host."""

import os

from tests.numa.shapes import IN_VM_ENV

collect_ignore_glob = [] if os.environ.get(IN_VM_ENV) == "1" else ["guest/*"]
