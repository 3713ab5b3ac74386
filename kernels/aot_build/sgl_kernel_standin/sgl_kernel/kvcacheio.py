"""``sgl_kernel.kvcacheio`` for hicache-fuzz's stand-in: thin wrappers over ``torch.ops.sgl_kernel``.

The ops themselves are sglang's (transfer.cu of the pinned sglang commit, built by
``python -m hicache_fuzz.kernels.aot_build.build``). These wrappers only give them the Python interface
sglang's host pools call: the same function names, keyword names and defaults as sglang-kernel 0.4.10
(block quota 2 and 32 warps per block on CUDA, 16 warps on ROCm; the MLA per-layer loads read the block
quota from SGLANG_HICACHE_BLOCK_QUOTA, default 2 on CUDA and 16 on ROCm). Arguments are passed to the op
in schema order, so a wrapper and the registered schema can be compared name by name (tests do).
"""

from __future__ import annotations

import os
from typing import Any

import torch

_ON_ROCM = torch.version.hip is not None
WARPS_PER_BLOCK = 16 if _ON_ROCM else 32
BLOCK_QUOTA = 2


def _op(name: str) -> Any:
    """The registered op's default overload; a clear error when the library is not loaded."""
    try:
        return getattr(torch.ops.sgl_kernel, name).default
    except (AttributeError, RuntimeError) as exc:
        raise NotImplementedError(
            f"torch.ops.sgl_kernel.{name} is not registered: load the AOT build first "
            "(hicache_fuzz.kernels.aot_build.loader.activate())"
        ) from exc


def _mla_block_quota() -> int:
    default = 16 if _ON_ROCM else 2
    try:
        return int(os.environ.get("SGLANG_HICACHE_BLOCK_QUOTA", default))
    except ValueError:
        return default


def get_device_accessible_ptr(tensor: torch.Tensor, device_index: int) -> int:
    return int(_op("get_device_accessible_ptr")(tensor, device_index))


# ---- MHA, per token ------------------------------------------------------------------------------------


def transfer_kv_per_layer(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
                          src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int,
                          block_quota: int = BLOCK_QUOTA, num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_per_layer")(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size, block_quota,
                                 num_warps_per_block)


def transfer_kv_per_layer_pf_lf(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
                                src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int, item_size: int,
                                src_layout_dim: int, block_quota: int = BLOCK_QUOTA,
                                num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_per_layer_pf_lf")(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                       src_layout_dim, block_quota, num_warps_per_block)


def transfer_kv_per_layer_ph_lf(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
                                src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int, item_size: int,
                                src_layout_dim: int, page_size: int, head_num: int, block_quota: int = BLOCK_QUOTA,
                                num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_per_layer_ph_lf")(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                       src_layout_dim, page_size, head_num, block_quota, num_warps_per_block)


def transfer_kv_all_layer(src_k_layers: torch.Tensor, dst_k_layers: torch.Tensor, src_v_layers: torch.Tensor,
                          dst_v_layers: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                          item_size: int, num_layers: int, block_quota: int = BLOCK_QUOTA,
                          num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_all_layer")(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                                 item_size, num_layers, block_quota, num_warps_per_block)


def transfer_kv_all_layer_lf_pf(src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int, block_quota: int = BLOCK_QUOTA,
                                num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_all_layer_lf_pf")(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices,
                                       item_size, dst_layout_dim, num_layers, block_quota, num_warps_per_block)


def transfer_kv_all_layer_lf_ph(src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int, page_size: int, head_num: int,
                                block_quota: int = BLOCK_QUOTA, num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_all_layer_lf_ph")(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices,
                                       item_size, dst_layout_dim, num_layers, page_size, head_num, block_quota,
                                       num_warps_per_block)


# ---- MLA, per token ------------------------------------------------------------------------------------


def transfer_kv_per_layer_mla(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int, block_quota: int | None = None,
                              num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    quota = _mla_block_quota() if block_quota is None else block_quota
    _op("transfer_kv_per_layer_mla")(src, dst, src_indices, dst_indices, item_size, quota, num_warps_per_block)


def transfer_kv_per_layer_mla_pf_lf(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                                    dst_indices: torch.Tensor, layer_id: int, item_size: int, src_layout_dim: int,
                                    block_quota: int | None = None,
                                    num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    quota = _mla_block_quota() if block_quota is None else block_quota
    _op("transfer_kv_per_layer_mla_pf_lf")(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
                                           quota, num_warps_per_block)


def transfer_kv_all_layer_mla(src_layers: torch.Tensor, dst_layers: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int, num_layers: int,
                              block_quota: int = BLOCK_QUOTA, num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_all_layer_mla")(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers,
                                     block_quota, num_warps_per_block)


def transfer_kv_all_layer_mla_lf_pf(src_layers: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                                    dst_indices: torch.Tensor, item_size: int, dst_layout_dim: int, num_layers: int,
                                    block_quota: int = BLOCK_QUOTA,
                                    num_warps_per_block: int = WARPS_PER_BLOCK) -> None:
    _op("transfer_kv_all_layer_mla_lf_pf")(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                           num_layers, block_quota, num_warps_per_block)


# ---- page-granular copies from the host ------------------------------------------------------------------


def transfer_kv_direct(src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor], src_indices: torch.Tensor,
                       dst_indices: torch.Tensor, page_size: int) -> None:
    _op("transfer_kv_direct")(src_layers, dst_layers, src_indices, dst_indices, page_size)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int,
                                       page_size: int) -> None:
    _op("transfer_kv_per_layer_direct_pf_lf")(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    _op("transfer_kv_all_layer_direct_lf_pf")(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size)


def transfer_embedding_ranges_direct(src: torch.Tensor, dst: torch.Tensor, src_starts: list[int],
                                     dst_starts: list[int], lengths: list[int]) -> None:
    _op("transfer_embedding_ranges_direct")(src, dst, src_starts, dst_starts, lengths)


def copy_all_layer_kv_cache_cpu(*args: Any, **kwargs: Any) -> None:
    """A CPU-backend op of sglang-kernel, not part of the kvcacheio transfer build."""
    raise NotImplementedError("copy_all_layer_kv_cache_cpu is not built by hicache-fuzz's AOT build (CPU backend op)")
