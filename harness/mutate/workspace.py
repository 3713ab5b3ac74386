"""A private copy of the sglang package that mutants are applied to, one at a time.

The user's install is only ever read: the copy is made once per slot (``cp -a``, else :func:`shutil.copytree`),
a mutant is written into the copy, the target runs with the copy first on ``PYTHONPATH``, and the file is
restored from the original bytes afterwards (and checked).

Byte-code: the copy keeps the install's ``__pycache__`` (``copy2`` keeps the sources' mtimes, so those
``.pyc`` stay valid and a target does not recompile all of sglang). The mutated module's ``.pyc`` is deleted
when the mutant is written and again when the original is restored: Python validates a ``.pyc`` by the
source's mtime (whole seconds) and size, and a same-size mutant (``%`` -> ``&``) restored within the same
second would otherwise leave the mutated byte-code standing in for the original.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hicache_fuzz.harness.mutate.mutant import Mutant


def tree_digest(root: Path) -> str:
    """sha256 over every file (path and bytes) under `root/sglang`, byte-code caches excluded."""
    digest = hashlib.sha256()
    package = root / "sglang"
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


class Workspace:
    """`<dir>/sglang`: a copy of the package under `root`."""

    def __init__(self, original_root: Path, directory: Path) -> None:
        self.original_root = original_root
        self.root = directory.resolve()  # on PYTHONPATH of targets that may change directory
        if (self.root / "sglang").exists():
            shutil.rmtree(self.root / "sglang")
        self.root.mkdir(parents=True, exist_ok=True)
        _copy_package(original_root / "sglang", self.root / "sglang")

    @contextmanager
    def applied(self, mutant: Mutant) -> Iterator[Path]:
        """The copy with `mutant` written into it; restored (and verified) on exit."""
        path = self.root / mutant.file
        original = (self.original_root / mutant.file).read_bytes()
        text = original.decode("utf-8")
        path.write_text(mutant.apply(text), encoding="utf-8")
        _drop_bytecode(path)
        try:
            yield path
        finally:
            path.write_bytes(original)
            _drop_bytecode(path)
            if path.read_bytes() != original:
                raise RuntimeError(f"could not restore {path} after mutant {mutant.id}")

    def remove(self) -> None:
        shutil.rmtree(self.root / "sglang", ignore_errors=True)


def _copy_package(source: Path, destination: Path) -> None:
    """A real copy (never links: a mutant is written into it). `cp -a` where there is one: ~6,000 files, and
    many slots copy at once (--jobs-per-gpu), which Python's copytree would serialise on the GIL."""
    cp = shutil.which("cp")
    if cp is not None and os.name == "posix":
        done = subprocess.run([cp, "-a", str(source), str(destination)], capture_output=True, text=True)
        if done.returncode == 0:
            return
        shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(source, destination, symlinks=True)


def _drop_bytecode(path: Path) -> None:
    if path.suffix != ".py":
        return
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(path.stem + ".*.pyc"):
            pyc.unlink(missing_ok=True)


def child_environment(workspace_root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a target process: the private copy first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(workspace_root), *filter(None, [env.get("PYTHONPATH")])])
    return env
