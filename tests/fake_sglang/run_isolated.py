"""Run a standalone reproducer with only torch and the fake sglang importable: ``hicache_fuzz`` (and the
repository's ``tests`` package) are blocked by a meta-path finder, so a script that imports them fails.

Usage: python run_isolated.py SCRIPT.py   (exit status: the script's)
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys
from pathlib import Path

BLOCKED = ("hicache_fuzz", "tests")


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: a standalone reproducer needs only torch and sglang")
        return None


def main() -> None:
    sys.meta_path.insert(0, Blocker())
    sys.path[:] = [str(Path(__file__).resolve().parent)] + [p for p in sys.path[1:] if "eco-repro" not in p]
    try:
        import hicache_fuzz  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("isolation failed: hicache_fuzz is importable")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
