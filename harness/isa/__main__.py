"""``python -m hicache_fuzz.harness.isa``: the static ISA check, the same as ``hicache-fuzz isa``."""

import sys

from hicache_fuzz.harness.isa.check import main

sys.exit(main())
