"""``python -m hicache_fuzz``: the same CLI as the ``hicache-fuzz`` console script."""

import sys

from hicache_fuzz.harness.commands.cli import main

sys.exit(main())
