"""``python -m hicache_fuzz``: the same CLI as the ``hicache-fuzz`` console script."""

import sys

from hicache_fuzz.harness.commands.cli import main

# Guarded: a child process started with multiprocessing's "spawn" (the campaign's feed process) imports the
# parent's main module again, and must not run the CLI.
if __name__ == "__main__":
    sys.exit(main())
