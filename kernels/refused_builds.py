"""A record on disk of the JIT modules sglang refuses to build, so each process does not pay nvcc to learn it again.

sglang refuses some row sizes at compile time: the kernel's ``static_assert`` fails inside nvcc (or hipcc), which
takes several seconds, and sglang's on-disk JIT cache keeps only successful builds. The per-process memo in
:mod:`sglang_common` remembers a failure for the life of a process, but every new process (each worker of a pool,
each spare, each restart, ``jit-warm``) would run the failing compiles again: a worker's warm-up on a warm cache
would be nearly all refusals (a cached module loads in a fraction of a second).

What is recorded: only a build failure that names a failed static assertion, the kernel's own verdict on its
template arguments, which the same sources and toolchain give every time. A failure of anything else (nvcc
missing, a full disk, a timeout) is never recorded, so it is met again, as before.

The key: the module factory, its arguments, and a fingerprint of everything the verdict depends on: the
content of sglang's JIT kernel sources, headers and build helpers, the HiCache ops module, sglang's, torch's
and CUDA/HIP's versions, the GPU architecture and the compiler root. An edited or mutated sglang (``mutate``
builds private copies) has another fingerprint, so it never meets a verdict recorded for other sources.

The records live beside sglang's own JIT cache (``$SGLANG_JIT_CACHE_DIR``, else ``~/.cache/sglang/jit``), in
``hicache-fuzz-refused-builds/``: a CI job that keeps that folder keeps both. A record replays the original
error (a ``RuntimeError`` with the compiler's text), so the case that asks for the module sees what the build
said. ``HICACHE_FUZZ_REFUSED_BUILDS=off`` turns the record off (every process compiles again).

Processes that ask for the same module at once (the campaign's builder and a worker) take its lock in
``locks/`` (:meth:`RefusedBuilds.building`), so a refusal is compiled by one of them and replayed by the others.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.json_input import InputError, read_json_file
from hicache_fuzz.kernels.compile_books import module_lock

FOLDER = "hicache-fuzz-refused-builds"
SWITCH_ENV = "HICACHE_FUZZ_REFUSED_BUILDS"
RECORD_VERSION = 1
MAX_MESSAGE_CHARS = 20_000
# nvcc: 'error: static assertion failed with "..."'; clang/hipcc: 'static assertion failed due to requirement'
# or 'static_assert failed'.
_STATIC_ASSERT = re.compile(r"static[ _]assert(ion)? failed", re.IGNORECASE)
_BUILD_FAILED = "Failed to build JIT module"
# What sglang compiles a HiCache module from, relative to the sglang package folder.
SOURCE_FOLDERS = ("kernels/jit/csrc/kvcacheio", "kernels/jit/include", "kernels/jit/utils")
SOURCE_FILES = ("kernels/ops/kvcache/hicache.py",)


def is_compile_refusal(exc: BaseException) -> bool:
    """A build failure that is the kernel's own static assertion: deterministic for the same sources."""
    text = str(exc)
    return type(exc) is RuntimeError and _BUILD_FAILED in text and _STATIC_ASSERT.search(text) is not None


def cache_folder() -> Path:
    """Where the records live: beside sglang's JIT cache (same variable, same default)."""
    root = os.environ.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit"
    return Path(root).expanduser() / FOLDER


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "on").strip().lower() not in {"off", "0", "no", "false"}


def source_fingerprint(sglang_folder: Path) -> str:
    """sha256 over the relative path and content of every file sglang builds a HiCache module from."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for folder in SOURCE_FOLDERS:
        base = sglang_folder / folder
        if base.is_dir():
            files.extend(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files.extend(p for name in SOURCE_FILES if (p := sglang_folder / name).is_file())
    for path in sorted(files):
        digest.update(str(path.relative_to(sglang_folder)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def toolchain_fingerprint() -> list[str]:
    """Versions and the device architecture: the same sources may be refused by one compiler and not another."""
    import torch

    parts = [f"torch={torch.__version__}", f"cuda={torch.version.cuda}", f"hip={getattr(torch.version, 'hip', None)}",
             f"cuda_home={os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH') or ''}",
             f"rocm_path={os.environ.get('ROCM_PATH') or ''}"]
    try:
        from importlib import metadata

        parts.append(f"sglang={metadata.version('sglang')}")
    except Exception:
        parts.append("sglang=?")
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        parts.append(f"arch={getattr(properties, 'gcnArchName', '')}|{properties.major}.{properties.minor}")
    return parts


_REPLAYED = [0]  # refusals served from a record in this process, over every RefusedBuilds (see replayed_here)


def replayed_here() -> int:
    """How many builds this process did not run because a record said they are refused (the worker's greeting
    reports it, so a campaign's start-up record shows what the records saved)."""
    return _REPLAYED[0]


class RefusedBuilds:
    """The records of one sglang tree (its ops module file locates the tree); thread-safe."""

    def __init__(self, module_file: str | None, folder: Path | None = None,
                 toolchain: Callable[[], Iterable[str]] = toolchain_fingerprint) -> None:
        self.module_file = module_file
        self.folder = folder if folder is not None else cache_folder()
        self._toolchain = toolchain
        self._fingerprint: str | None = None
        self._lock = threading.Lock()
        self.replayed = 0  # refusals served from a record in this process

    def fingerprint(self) -> str | None:
        """None when the records are off or the sources cannot be found (then nothing is read or written)."""
        if not enabled() or not self.module_file:
            return None
        with self._lock:
            if self._fingerprint is None:
                # sglang/kernels/ops/kvcache/hicache.py -> sglang/
                sglang_folder = Path(self.module_file).resolve().parents[3]
                digest = hashlib.sha256(source_fingerprint(sglang_folder).encode())
                for part in self._toolchain():
                    digest.update(part.encode() + b"\0")
                self._fingerprint = digest.hexdigest()
            return self._fingerprint

    def _path(self, label: str, key: Any) -> Path | None:
        fingerprint = self.fingerprint()
        if fingerprint is None:
            return None
        name = hashlib.sha256(f"{fingerprint}|{label}|{key!r}".encode()).hexdigest()[:40]
        return self.folder / f"{name}.json"

    @contextlib.contextmanager
    def building(self, label: str, key: Any) -> Iterator[None]:
        """Hold the cross-process lock of module (`label`, `key`) of these sources around a lookup and the build:
        a process that asks for a module another is building waits, then finds its record (a refusal) or
        sglang's cached build, instead of running nvcc again. No lock while the records are off or where the folder
        cannot be written."""
        fingerprint = self.fingerprint()
        with contextlib.ExitStack() as held:
            if fingerprint is not None:
                with contextlib.suppress(OSError):  # a folder that cannot be written: build unlocked, as before
                    held.enter_context(module_lock(self.folder / "locks", f"{fingerprint}|{label}|{key!r}"))
            yield

    def lookup(self, label: str, key: Any) -> RuntimeError | None:
        """The recorded refusal of (`label`, `key`) for these sources, as the error the build raised; else None.
        A record that cannot be read or does not match is ignored (the build runs)."""
        path = self._path(label, key)
        if path is None or not path.exists():
            return None
        try:
            data = read_json_file(path, max_bytes=8 * MAX_MESSAGE_CHARS)
        except InputError:  # not a regular file, too large, not UTF-8 JSON: ignored (the build runs)
            return None
        if not (isinstance(data, dict) and data.get("version") == RECORD_VERSION and data.get("label") == label
                and data.get("key") == repr(key) and data.get("fingerprint") == self.fingerprint()
                and isinstance(data.get("message"), str)):
            return None
        self.replayed += 1
        _REPLAYED[0] += 1
        return RuntimeError(data["message"])

    def record(self, label: str, key: Any, exc: BaseException) -> bool:
        """Keep `exc` if it is a compile refusal; True if it was written. Written atomically (a reader sees a
        whole record or none); a folder that cannot be written is not an error (the next process compiles)."""
        if not is_compile_refusal(exc):
            return False
        path = self._path(label, key)
        if path is None:
            return False
        data = {"version": RECORD_VERSION, "label": label, "key": repr(key), "fingerprint": self.fingerprint(),
                "message": str(exc)[:MAX_MESSAGE_CHARS]}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            temporary.write_text(json.dumps(data), encoding="utf-8")
            os.replace(temporary, path)
        except OSError:
            return False
        return True
