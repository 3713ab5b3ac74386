"""Where sglang's kernel sources come from: an installed sglang, a folder, a wheel or sdist."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from dataclasses import dataclass

from hicache_fuzz.harness.isa import fetch as isa_fetch
from hicache_fuzz.harness.isa.symbols import BadInput, SourceUnavailable

# ---------------------------------------------------------------------------------------------------------
# sglang sources and mutants


@dataclass(frozen=True)
class SglangSource:
    """Where sglang's JIT kernels are read from.

    ``csrc_dir`` normally is ``jit_dir / "csrc"``; a mutant self-test points it at a modified copy.
    """

    jit_dir: pathlib.Path  # .../sglang/kernels/jit, holding csrc/ and include/
    csrc_dir: pathlib.Path
    version: str
    origin: str

    @property
    def include_dir(self) -> pathlib.Path:
        return self.jit_dir / "include"


HOW_TO_GET_SGLANG = (
    "install sglang (pip install sglang==0.5.23) or download it without installing "
    "(pip download --no-deps sglang==0.5.23 -d DIR) and pass --sglang-source DIR/sglang-0.5.23-*.whl "
    "(a wheel, an sdist, or an unpacked folder containing sglang/kernels/jit)"
)


def _read_version(package_dir: pathlib.Path) -> str:
    version_file = package_dir / "_version.py"
    if version_file.is_file():
        match = re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]", version_file.read_text(errors="replace"))
        if match:
            return match.group(1)
    for metadata in sorted(package_dir.parent.glob("sglang-*.dist-info/METADATA")):
        match = re.search(r"^Version:\s*(\S+)", metadata.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match.group(1)
    return "unknown"


def _find_jit_dir(root: pathlib.Path) -> pathlib.Path | None:
    candidates = [
        root,
        root / "kernels" / "jit",
        root / "sglang" / "kernels" / "jit",
        root / "python" / "sglang" / "kernels" / "jit",
    ]
    for candidate in candidates:
        if (candidate / "csrc" / "kvcacheio" / "hicache.cuh").is_file() and (candidate / "include").is_dir():
            return candidate
    return None


def resolve_sglang_source(
    path: pathlib.Path | str | None, cache_dir: pathlib.Path | None = None
) -> SglangSource:
    """Locate sglang's kernels: a folder, a wheel/sdist (extracted into the cache) or the installed one."""
    cache = cache_dir or isa_fetch.default_cache_dir()
    if path is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SourceUnavailable(
                f"sglang is not installed and --sglang-source was not given; {HOW_TO_GET_SGLANG}"
            )
        package_dir = pathlib.Path(next(iter(spec.submodule_search_locations)))
        jit_dir = _find_jit_dir(package_dir)
        if jit_dir is None:
            raise SourceUnavailable(
                f"the installed sglang at {package_dir} has no kernels/jit/csrc/kvcacheio/hicache.cuh "
                f"(too old or too new for this check); {HOW_TO_GET_SGLANG}"
            )
        return SglangSource(
            jit_dir, jit_dir / "csrc", _read_version(package_dir), f"installed package {package_dir}"
        )
    source = pathlib.Path(path).expanduser().resolve()
    if not source.exists():
        raise SourceUnavailable(f"--sglang-source {source} does not exist; {HOW_TO_GET_SGLANG}")
    if source.is_file():
        try:
            jit_dir = isa_fetch.extract_sglang_kernels(source, cache)
        except isa_fetch.FetchError as error:
            raise BadInput(str(error)) from error
        version_match = re.match(r"sglang-([0-9][^-]*?)(?:-|\.tar|\.zip)", source.name)
        version = version_match.group(1) if version_match else _read_version(jit_dir.parent.parent)
        return SglangSource(jit_dir, jit_dir / "csrc", version, f"archive {source}")
    found = _find_jit_dir(source)
    if found is None:
        raise SourceUnavailable(
            f"--sglang-source {source} contains no kernels/jit/csrc/kvcacheio/hicache.cuh; "
            f"{HOW_TO_GET_SGLANG}"
        )
    return SglangSource(found, found / "csrc", _read_version(found.parent.parent), f"folder {source}")


