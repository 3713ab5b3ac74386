"""The translation units sglang's load_jit builds for the HiCache copy kernels, as module specs per platform."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from hicache_fuzz.harness.isa.symbols import BLOCK_SIZE, DEFAULT_BLOCK_QUOTA, PLATFORM_ROCM, PLATFORMS, BadInput

# What tvm-ffi's load_inline prepends to every unit sglang generates (utils/compile/spec.py).
TVM_FFI_INCLUDES = (
    "tvm/ffi/container/tensor.h",
    "tvm/ffi/dtype.h",
    "tvm/ffi/error.h",
    "tvm/ffi/extra/c_env_api.h",
    "tvm/ffi/function.h",
)

# ---------------------------------------------------------------------------------------------------------
# Modules: the translation units sglang's load_jit generates


@dataclass(frozen=True)
class ModuleSpec:
    """One JIT module: a kernel header plus the exported wrappers that instantiate its kernels."""

    name: str
    header: str  # relative to kernels/jit/csrc
    wrappers: tuple[tuple[str, str], ...]  # (export name, function expression) as in load_jit(cuda_wrappers=)
    expected_kernels: tuple[str, ...]  # readable instantiations that must appear in the ISA
    platforms: tuple[str, ...]

    def translation_unit(self, csrc_dir: pathlib.Path) -> str:
        lines = [f"#include <{header}>" for header in TVM_FFI_INCLUDES]
        lines.append(f'#include "{(csrc_dir / self.header).as_posix()}"')
        lines.append("namespace sglang {")
        lines += [
            f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({function}));" for export, function in self.wrappers
        ]
        lines.append("}  // namespace sglang")
        return "\n".join(lines) + "\n"


_INDEX_TYPES = ("int32_t", "int64_t")
_BOOLS = ("false", "true")


def _per_index_and_mla(kernel: str, *args: object) -> tuple[str, ...]:
    """The kernel's instantiations for both index types and both is_mla values, index type first."""
    tail = "".join(f", {arg}" for arg in args)
    return tuple(f"{kernel}<{index}{tail}, {mla}>" for index in _INDEX_TYPES for mla in _BOOLS)


def _hicache_module(platform: str, element_bytes: int, unroll: int) -> ModuleSpec:
    quota = DEFAULT_BLOCK_QUOTA[platform]
    args = f"{element_bytes}, {unroll}, {quota}, {BLOCK_SIZE}"
    wrappers = tuple(
        (f"launch_{entry}", f"&HiCacheKernel<{args}>::run_{entry}")
        for entry in ("one", "all", "one_mla", "all_mla")
    )
    expected = tuple(
        name for scope in ("per", "all") for name in _per_index_and_mla(f"hicache_transfer_{scope}_layer", args)
    )
    return ModuleSpec(
        f"hicache-e{element_bytes}-u{unroll}", "kvcacheio/hicache.cuh", wrappers, expected, (platform,)
    )


def _page_unified_load_module(platform: str, element_bytes: int) -> ModuleSpec:
    quota = DEFAULT_BLOCK_QUOTA[platform]
    args = f"{element_bytes}, 1, {quota}, {BLOCK_SIZE}"
    wrappers = (
        ("launch_one_page_unified", f"&HiCacheKernel<{args}>::run_one_page_unified<false>"),
        ("launch_one_mla_page_unified", f"&HiCacheKernel<{args}>::run_one_page_unified<true>"),
    )
    expected = _per_index_and_mla("hicache_transfer_per_layer_page_unified", element_bytes, BLOCK_SIZE)
    return ModuleSpec(
        f"hicache-page-unified-e{element_bytes}", "kvcacheio/hicache.cuh", wrappers, expected, (platform,)
    )


def _staged_module(platform: str, element_bytes: int, unroll: int) -> ModuleSpec:
    quota = DEFAULT_BLOCK_QUOTA[platform]
    args = f"{element_bytes}, {unroll}, {quota}, {BLOCK_SIZE}"
    wrappers = (
        ("launch_all_lf_pf_staged", f"&HiCacheStagedWriteBackKernel<{args}>::run_all_lf_pf_staged"),
        ("launch_all_mla_lf_pf_staged", f"&HiCacheStagedWriteBackKernel<{args}>::run_all_mla_lf_pf_staged"),
    )
    expected = _per_index_and_mla("hicache_relayout_kernel", element_bytes)
    return ModuleSpec(
        f"staged-e{element_bytes}-u{unroll}",
        "kvcacheio/staged_write_back.cuh",
        wrappers,
        expected,
        (platform,),
    )


def _page_unified_write_back_module(platform: str, group_bytes: int) -> ModuleSpec:
    # sglang builds one module per is_mla; both go into one unit here to halve the compile time.
    wrappers = (
        ("launch", f"&HiCachePageUnifiedWriteBackKernel<{group_bytes}, false>::run"),
        ("launch_mla", f"&HiCachePageUnifiedWriteBackKernel<{group_bytes}, true>::run"),
    )
    expected = _per_index_and_mla("hicache_page_unified_relayout_kernel", group_bytes)
    return ModuleSpec(
        f"page-unified-wb-g{group_bytes}", "kvcacheio/staged_write_back.cuh", wrappers, expected, (platform,)
    )


def modules_for(platform: str) -> tuple[ModuleSpec, ...]:
    """The instantiations checked per platform, chosen to cover every package width and kernel family.

    Element sizes follow sglang's default unroll (4 up to 512 B, 2 up to 1024 B, else 1). ROCm adds the
    narrow copy rounds only it has (GROUP_BYTES 64/32): 576 B is DeepSeek's fp8 MLA row.
    """
    if platform not in PLATFORMS:
        raise BadInput(f"unknown platform {platform!r}")
    modules = [
        _hicache_module(platform, 256, 4),  # 16 B packages (dwordx4 / .128)
        _hicache_module(platform, 1024, 2),  # 8 B packages (dwordx2 / .64)
        _hicache_module(platform, 2048, 1),  # 4 B packages (dword / 32-bit), by design for E > 1024
        _page_unified_load_module(platform, 256),
        _staged_module(platform, 256, 4),
        _page_unified_write_back_module(platform, 256),
    ]
    if platform == PLATFORM_ROCM:
        modules += [
            _hicache_module(platform, 576, 2),  # 64 B rounds -> 4 B packages
            _hicache_module(platform, 192, 4),  # 64 B rounds -> 8 B packages
        ]
    return tuple(modules)


