"""What the code a process runs depends on, read without importing it: the one rule for "did the sources change".

Two things are kept across processes on the strength of this rule: the probe cache's answers
(pipeline/probe_cache.py) and the standing pool's ready workers (pipeline/standing.py). Both ask the same
question, whether the Python a new process would import is what an earlier one imported, and answer it alike:
the path, size and mtime of every file of the source trees (no contents read, so a tree of thousands of files
costs milliseconds), installed versions from the package metadata, the GPU driver's version from /proc or /sys.
Packages are located, never imported (an import of sglang is what both try to avoid).

Kernel sources (``KERNEL_SOURCE_SUFFIXES``) are left out of the trees' fingerprints: sglang's JIT compiles them
when a case first needs a module, never at import or in a probe, and keys its builds on their contents itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

DRIVER_FILES = ("/proc/driver/nvidia/version", "/sys/module/amdgpu/version")
# Kernel sources that sglang's JIT compiles when a case first needs a module, never at import (see above).
KERNEL_SOURCE_SUFFIXES = (".cuh", ".cu", ".h", ".hpp", ".hip", ".inc")


def files_digest(folder: Path) -> str:
    """sha256 over the relative path, size and mtime of every file under `folder` (no contents read) but the
    kernel sources (KERNEL_SOURCE_SUFFIXES) and byte-code caches."""
    digest = hashlib.sha256()
    entries: list[tuple[str, int, int]] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(KERNEL_SOURCE_SUFFIXES):
                continue
            path = os.path.join(root, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            entries.append((os.path.relpath(path, folder), stat.st_size, stat.st_mtime_ns))
    for relative, size, mtime in sorted(entries):
        digest.update(f"{relative}\0{size}\0{mtime}\0".encode())
    return digest.hexdigest()


def package_folder(name: str) -> Path | None:
    """The folder of the top-level package `name` as this process would import it (located, not imported)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.submodule_search_locations:
        return None
    return Path(spec.origin).resolve().parent


def installed_version(name: str) -> str:
    """The distribution's version from its metadata ("" when it is not installed as a distribution)."""
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return ""


def package_files(name: str) -> str:
    """Where package `name` would be imported from and the fingerprint of its files ("(not found)" if nowhere)."""
    folder = package_folder(name)
    return f"{folder} {files_digest(folder)}" if folder is not None else "(not found)"


def module_file(name: str) -> str:
    """Where module `name` (a plugin's) would be imported from, with its file's size and mtime; a package's
    whole folder. Its parent packages are imported to locate a dotted name (a top-level one is only located)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return f"(not found: {type(exc).__name__})"
    if spec is None or not spec.origin:
        return "(not found)"
    origin = Path(spec.origin).resolve()
    if spec.submodule_search_locations:
        return f"{origin.parent} {files_digest(origin.parent)}"
    try:
        stat = origin.stat()
    except OSError:
        return str(origin)
    return f"{origin} {stat.st_size} {stat.st_mtime_ns}"


def driver_version() -> str:
    for path in DRIVER_FILES:
        try:
            with open(path) as handle:
                return handle.readline().strip()
        except OSError:
            continue
    return ""


def torch_build() -> str:
    import torch

    return f"{torch.__version__} cuda={torch.version.cuda} hip={getattr(torch.version, 'hip', None)}"
