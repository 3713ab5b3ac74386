"""Compiled listings of the ISA check, kept between runs so a warm check does not compile again.

A module's listing (ROCm assembly, CUDA SASS) is a pure function of what went into the compiler: the
translation unit, sglang's kernel sources it includes, the compiler and its version, and the flags (arch,
strict passes, header and device-library folders). The cache key hashes all of them; any change is a new key,
so a stale listing is never read. The verdict is not cached: it is recomputed from the listing on every run
(parsing takes milliseconds), so a change to the check's own rules applies at once.

Layout: ``<cache_dir>/listings/<key>.txt`` (cache_dir is the ISA cache, ``$HICACHE_FUZZ_CACHE_DIR/isa`` or
``~/.cache/hicache-fuzz/isa``). Compile errors are never cached. ``HICACHE_FUZZ_ISA_LISTING_CACHE=off`` turns the
cache off (every module is compiled). Delete the folder to empty it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Callable, Sequence

from hicache_fuzz.harness.isa.modules import ModuleSpec
from hicache_fuzz.harness.isa.source import SglangSource
from hicache_fuzz.harness.isa.toolchains import _CompileOutcome

CACHE_SUBDIR = "listings"
SWITCH_ENV = "HICACHE_FUZZ_ISA_LISTING_CACHE"
# Bumped when the stored format or what the key covers changes.
KEY_VERSION = "hicache-fuzz isa listing 1"
# Stand-in for the kernel source folder in keyed text: a mutant's copy lives in a fresh temporary folder, and
# the same bytes there must map to the same key.
SOURCE_PLACEHOLDER = "<sglang-jit>"
CSRC_PLACEHOLDER = "<sglang-csrc>"


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "").lower() not in ("off", "0", "no", "false")


@functools.lru_cache(maxsize=32)
def _folder_digest(folder: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for relative, _size, _mtime in stamp:
        digest.update(relative.encode() + b"\0")
        digest.update((pathlib.Path(folder) / relative).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def folder_digest(folder: pathlib.Path) -> str:
    """sha256 over every file's relative path and bytes under `folder` (memoized per size/mtime listing)."""
    if not folder.is_dir():
        return "absent"
    stamp = tuple(sorted(
        (str(path.relative_to(folder)), path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*") if path.is_file()
    ))
    return _folder_digest(str(folder), stamp)


def tool_stamp(path: str) -> str:
    """A compiler binary's identity beyond its version line: resolved path, size and modification time."""
    try:
        resolved = pathlib.Path(path).resolve()
        status = resolved.stat()
    except OSError:
        return f"{path}:unresolved"
    return f"{resolved}:{status.st_size}:{status.st_mtime_ns}"


def listing_key(unit: str, command: Sequence[str], tool_version: str, source: SglangSource) -> str:
    """The cache key of one module's listing: translation unit, compile command (tool + flags), tool version
    and binary, and the bytes of sglang's kernel sources and headers."""
    def neutral(text: str) -> str:
        return text.replace(str(source.csrc_dir), CSRC_PLACEHOLDER).replace(str(source.jit_dir), SOURCE_PLACEHOLDER)

    digest = hashlib.sha256()
    for part in (KEY_VERSION, neutral(unit), *map(neutral, command), tool_version, tool_stamp(command[0]),
                 folder_digest(source.csrc_dir), folder_digest(source.include_dir)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def listing_path(cache_dir: pathlib.Path, key: str) -> pathlib.Path:
    return cache_dir / CACHE_SUBDIR / f"{key}.txt"


def load(cache_dir: pathlib.Path, key: str) -> str | None:
    path = listing_path(cache_dir, key)
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def store(cache_dir: pathlib.Path, key: str, listing: str) -> None:
    """Write atomically (a concurrent reader sees the old file or the whole new one); a full or read-only disk
    only costs the next run a compile."""
    path = listing_path(cache_dir, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            handle.write(listing)
        os.replace(handle.name, path)
    except OSError:
        pass


def with_cache(
    compile_one: Callable[[ModuleSpec, pathlib.Path], _CompileOutcome],
    cache_dir: pathlib.Path | None,
    key_of: Callable[[ModuleSpec], str],
) -> Callable[[ModuleSpec, pathlib.Path], _CompileOutcome]:
    """`compile_one` reading and filling the cache under `cache_dir` (None, or the cache switched off: as is)."""
    if cache_dir is None or not enabled():
        return compile_one

    def compile_cached(module: ModuleSpec, directory: pathlib.Path) -> _CompileOutcome:
        key = key_of(module)
        listing = load(cache_dir, key)
        if listing is not None:
            return _CompileOutcome(module, listing, 0.0, "", listing_path(cache_dir, key), cached=True)
        outcome = compile_one(module, directory)
        if not outcome.error:
            store(cache_dir, key, outcome.listing)
        return outcome

    return compile_cached
