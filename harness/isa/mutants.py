"""Source mutants: sglang's load_nc/store_nc rewritten the wrong way, which the check must reject (its own
selftest)."""

from __future__ import annotations

import pathlib
import re
import shutil
from dataclasses import dataclass

from hicache_fuzz.harness.isa.source import SglangSource
from hicache_fuzz.harness.isa.symbols import PLATFORM_CUDA, PLATFORM_ROCM, BadInput


@dataclass(frozen=True)
class Mutant:
    """A deliberate defect in a copy of hicache.cuh that a check must catch (the checks' self-test)."""

    name: str
    platform: str
    description: str
    replacements: tuple[tuple[str, str], ...]  # (regex, replacement), each must match at least once


_NT_LOAD_VECTOR = r"native_uint{n} tmp = __builtin_nontemporal_load\(reinterpret_cast<const native_uint{n}\*>\(src\)\);\s*return __builtin_bit_cast\(uint{n}, tmp\);"  # noqa: E501
_NT_STORE_VECTOR = r"__builtin_nontemporal_store\(__builtin_bit_cast\(native_uint{n}, value\), reinterpret_cast<native_uint{n}\*>\(dst\)\);"  # noqa: E501
_COMPONENTS = ("x", "y", "z", "w")


def _scalar_loads(width: int) -> str:
    loads = ", ".join(f"__builtin_nontemporal_load(&src->{c})" for c in _COMPONENTS[:width])
    return f"return uint{width}{{{loads}}};"


def _scalar_stores(width: int) -> str:
    return " ".join(f"__builtin_nontemporal_store(value.{c}, &dst->{c});" for c in _COMPONENTS[:width])


def _ptx_scalar_loads(width: int) -> str:
    return "\\n\\t".join(f"ld.global.L1::no_allocate.b32 %{i},[%{width}+{4 * i}];" for i in range(width))


def _ptx_scalar_stores(width: int) -> str:
    return "\\n\\t".join(f"st.global.L1::no_allocate.b32 [%0+{4 * i}],%{i + 1};" for i in range(width))


MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "rocm-scalarized",
            PLATFORM_ROCM,
            "ROCm load_nc/store_nc for uint2/uint4 issue 2/4 separate 32-bit nontemporal builtins instead of "
            "one "
            "native vector access (clang -O3 re-merges them; only --strict sees it)",
            (
                (_NT_LOAD_VECTOR.format(n=2), _scalar_loads(2)),
                (_NT_LOAD_VECTOR.format(n=4), _scalar_loads(4)),
                (_NT_STORE_VECTOR.format(n=2), _scalar_stores(2)),
                (_NT_STORE_VECTOR.format(n=4), _scalar_stores(4)),
            ),
        ),
        Mutant(
            "rocm-plain",
            PLATFORM_ROCM,
            "ROCm load_nc/store_nc become plain loads/stores (the nontemporal builtins are defined away)",
            (
                (
                    r"#pragma once\n",
                    "#pragma once\n#ifdef USE_ROCM\n#define __builtin_nontemporal_load(p) (*(p))\n"
                    "#define __builtin_nontemporal_store(v, p) ((void)(*(p) = (v)))\n#endif\n",
                ),
            ),
        ),
        Mutant(
            "rocm-narrow-group",
            PLATFORM_ROCM,
            "ROCm pick_group_bytes skips the 128-byte round, so 16-byte packages shrink to 8 bytes",
            ((r"return group_fits\(bytes, lanes_per_worker, 128\)\s*\?\s*128u", "return false ? 128u"),),
        ),
        Mutant(
            "cuda-scalarized",
            PLATFORM_CUDA,
            "CUDA load_nc/store_nc for uint2/uint4 issue 32-bit ld/st.global.L1::no_allocate "
            "instead of v2/v4",
            (
                (re.escape("ld.global.L1::no_allocate.v2.b32 {%0,%1},[%2];"), _ptx_scalar_loads(2)),
                (re.escape("ld.global.L1::no_allocate.v4.b32 {%0,%1,%2,%3},[%4];"), _ptx_scalar_loads(4)),
                (re.escape("st.global.L1::no_allocate.v2.b32 [%0],{%1,%2};"), _ptx_scalar_stores(2)),
                (re.escape("st.global.L1::no_allocate.v4.b32 [%0],{%1,%2,%3,%4};"), _ptx_scalar_stores(4)),
            ),
        ),
        Mutant(
            "cuda-plain",
            PLATFORM_CUDA,
            "CUDA load_nc/store_nc lose the L1::no_allocate qualifier",
            ((re.escape(".global.L1::no_allocate."), ".global."),),
        ),
    )
}


def mutate_hicache_source(text: str, mutant: Mutant) -> str:
    """Apply ``mutant`` to the text of hicache.cuh; raises BadInput when the source lacks a pattern."""
    for pattern, replacement in mutant.replacements:
        # The replacement is literal C++ text; escape backslashes so re does not read \n in it.
        text, count = re.subn(pattern, replacement.replace("\\", "\\\\"), text)
        if count == 0:
            raise BadInput(
                f"mutant {mutant.name}: hicache.cuh has no match for /{pattern}/ (sglang changed?)"
            )
    return text


def apply_mutant(source: SglangSource, mutant_name: str, dest: pathlib.Path) -> SglangSource:
    """A copy of the source's kvcacheio kernels under ``dest`` with ``mutant_name`` applied to hicache.cuh."""
    mutant = MUTANTS.get(mutant_name)
    if mutant is None:
        raise BadInput(f"unknown mutant {mutant_name!r}; known: {', '.join(sorted(MUTANTS))}")
    csrc_copy = dest / "csrc"
    if csrc_copy.exists():
        shutil.rmtree(csrc_copy)
    shutil.copytree(source.csrc_dir / "kvcacheio", csrc_copy / "kvcacheio")
    header = csrc_copy / "kvcacheio" / "hicache.cuh"
    header.write_text(mutate_hicache_source(header.read_text(), mutant))
    return SglangSource(source.jit_dir, csrc_copy, source.version, f"{source.origin} + mutant {mutant_name}")


