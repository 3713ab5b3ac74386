"""Run standalone reproducers with only torch and sglang importable: ``hicache_fuzz`` and this repository's
``tests`` package are blocked by a meta-path finder and the repository is taken off ``sys.path``, so a script
that needs them fails. By default the fake sglang next to this file is the sglang they get (CPU CI);
``--real`` leaves the installed sglang (the GPU check, docs/reproducers.md).

Usage: python run_isolated.py [--real] SCRIPT.py...
Prints the script's output and "EXIT <code> <script>" per script; exit status: the largest code.
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys
from pathlib import Path

BLOCKED = ("hicache_fuzz", "tests")
HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent.parent


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: a standalone reproducer needs only torch and sglang")
        return None


def _keep(entry: str) -> bool:
    # The root would expose the folders behind hicache_fuzz, this folder the fake sglang (added back first
    # unless --real); other folders under the root (a bundle's sgl_kernel stand-in on the GPU machine) stay.
    return Path(entry or ".").resolve() not in (REPOSITORY, HERE)


def main(argv: list[str]) -> int:
    real = "--real" in argv
    scripts = [a for a in argv if a != "--real"]
    sys.meta_path.insert(0, Blocker())
    sys.path[:] = ([] if real else [str(HERE)]) + [p for p in sys.path if p and _keep(p)]
    try:
        import hicache_fuzz  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("isolation failed: hicache_fuzz is importable")
    if real:
        import torch

        try:
            import sglang

            where = f"sglang from {Path(sglang.__file__).parent}"
        except ImportError as exc:
            where = f"sglang not importable: {exc}"
        print(f"# torch {torch.__version__}, {where}", flush=True)
    worst = 0
    for script in scripts:
        sys.argv = [script]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception as exc:  # a script that dies is a failing script, reported with the others
            print(f"{type(exc).__name__}: {exc}")
            code = 2
        print(f"EXIT {code} {script}", flush=True)
        worst = max(worst, code)
    # The proof that the scripts ran on torch and sglang alone: nothing of this repository was loaded.
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    print(f"# isolation: modules of {' / '.join(BLOCKED)} loaded: {', '.join(leaked) or 'none'}", flush=True)
    return max(worst, 2) if leaked else worst


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
