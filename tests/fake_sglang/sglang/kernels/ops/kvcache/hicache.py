"""Fake ``sglang.kernels.ops.kvcache.hicache``: the JIT transfer entry points, in plain torch on the CPU.

Same names and keyword arguments as the real module; the semantics are the contract's (per-token for the
one/all-layer ops, page runs for the staged write-back, page ids for the page_unified write-back); and the gate the
pools ask whether a JIT kernel takes a row, as sglang answers it on an sm90 CUDA device.
"""

from __future__ import annotations

import os

import torch

from sglang._fake_core import at, copy_rows, page_pairs, pairs, stride_bytes, table


def transfer_hicache_one_layer(k_dst: torch.Tensor, v_dst: torch.Tensor, idx_dst: torch.Tensor, k_src: torch.Tensor,
                               v_src: torch.Tensor, idx_src: torch.Tensor, *, element_dim: int,
                               page_size: int | None = None) -> None:
    for dst, src in ((k_dst, k_src), (v_dst, v_src)):
        transfer_hicache_one_layer_mla(dst, idx_dst, src, idx_src, element_dim=element_dim, page_size=page_size)


def transfer_hicache_one_layer_mla(dst: torch.Tensor, idx_dst: torch.Tensor, src: torch.Tensor,
                                   idx_src: torch.Tensor, *, element_dim: int, page_size: int | None = None) -> None:
    row = element_dim * dst.element_size()
    index_pairs = pairs(idx_dst, idx_src, empty_ok=False)
    copy_rows(dst.data_ptr(), stride_bytes(dst), src.data_ptr(), stride_bytes(src), row, index_pairs)


def transfer_hicache_all_layer(k_ptr_dst: torch.Tensor, v_ptr_dst: torch.Tensor, idx_dst: torch.Tensor,
                               k_ptr_src: torch.Tensor, v_ptr_src: torch.Tensor, idx_src: torch.Tensor, *,
                               kv_cache_src_stride_bytes: int, kv_cache_dst_stride_bytes: int, element_size: int,
                               page_size: int | None = None) -> None:
    for dst, src in ((k_ptr_dst, k_ptr_src), (v_ptr_dst, v_ptr_src)):
        transfer_hicache_all_layer_mla(dst, idx_dst, src, idx_src, cache_src_stride_bytes=kv_cache_src_stride_bytes,
                                       cache_dst_stride_bytes=kv_cache_dst_stride_bytes, element_size=element_size,
                                       page_size=page_size)


def transfer_hicache_all_layer_mla(ptr_dst: torch.Tensor, idx_dst: torch.Tensor, ptr_src: torch.Tensor,
                                   idx_src: torch.Tensor, *, cache_src_stride_bytes: int, cache_dst_stride_bytes: int,
                                   element_size: int, page_size: int | None = None) -> None:
    index_pairs = pairs(idx_dst, idx_src, empty_ok=False)
    for dst, src in zip(table(ptr_dst), table(ptr_src), strict=True):
        copy_rows(dst, cache_dst_stride_bytes, src, cache_src_stride_bytes, element_size, index_pairs)


def _staged(device_tables: list[torch.Tensor], hosts: list[torch.Tensor], device_indices: torch.Tensor,
            host_indices: torch.Tensor, page_size: int, element_size: int) -> None:
    index_pairs = page_pairs(host_indices, device_indices, page_size)
    for pointers, host in zip(device_tables, hosts, strict=True):  # host: (slots, layers, heads, dim)
        for layer, device in enumerate(table(pointers)):
            copy_rows(host.data_ptr() + layer * stride_bytes(host, 1), stride_bytes(host), device, element_size,
                      element_size, index_pairs)


def transfer_hicache_all_layer_staged_lf_pf(k_ptrs: torch.Tensor, v_ptrs: torch.Tensor, device_indices: torch.Tensor,
                                            host_indices: torch.Tensor, staging_k: torch.Tensor,
                                            staging_v: torch.Tensor, k_host: torch.Tensor, v_host: torch.Tensor, *,
                                            page_size: int, element_size: int) -> None:
    _staged([k_ptrs, v_ptrs], [k_host, v_host], device_indices, host_indices, page_size, element_size)


def transfer_hicache_all_layer_mla_staged_lf_pf(ptrs: torch.Tensor, device_indices: torch.Tensor,
                                                host_indices: torch.Tensor, staging: torch.Tensor, host: torch.Tensor,
                                                *, page_size: int, element_size: int) -> None:
    _staged([ptrs], [host], device_indices, host_indices, page_size, element_size)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8)


def transfer_hicache_one_layer_page_unified_lf(k_dev: torch.Tensor, v_dev: torch.Tensor, host: torch.Tensor,
                                               host_indices: torch.Tensor, device_indices: torch.Tensor,
                                               layer: int) -> None:
    ps = host.shape[4]  # host: (pages, groups, layers, 2, page_size, heads per group, dim)
    for d, t in pairs(device_indices, host_indices):
        for c, dev in enumerate((k_dev, v_dev)):
            _bytes(dev[d]).copy_(_bytes(host[t // ps, :, layer, c, t % ps]).reshape(_bytes(dev[d]).shape))


def transfer_hicache_one_layer_mla_page_unified_lf(dev: torch.Tensor, host: torch.Tensor, host_indices: torch.Tensor,
                                                   device_indices: torch.Tensor, layer: int) -> None:
    ps = host.shape[2]  # host: (pages, layers, page_size, dim)
    for d, t in pairs(device_indices, host_indices):
        _bytes(dev[d]).copy_(_bytes(host[t // ps, layer, t % ps]).reshape(_bytes(dev[d]).shape))


def _page_unified_write(tables: list[torch.Tensor], src_pages: torch.Tensor, dst_pages: torch.Tensor,
                        host: torch.Tensor, mla: bool) -> None:
    ps = host.shape[2] if mla else host.shape[4]
    row = host[0, 0, 0].numel() * host.element_size() if mla else host[0, :, 0, 0, 0].numel() * host.element_size()
    for dst_page, src_page in pairs(dst_pages, src_pages):
        for c, pointers in enumerate(tables):
            for layer, device in enumerate(table(pointers)):
                for slot in range(ps):
                    source = at(device + (src_page * ps + slot) * row, row)
                    target = _bytes(host[dst_page, layer, slot]) if mla else _bytes(host[dst_page, :, layer, c, slot])
                    target.copy_(source.view(target.shape))


def transfer_hicache_all_layer_staged_lf_page_unified(k_ptrs: torch.Tensor, v_ptrs: torch.Tensor,
                                                      src_pages: torch.Tensor, dst_pages: torch.Tensor,
                                                      staging: torch.Tensor, host: torch.Tensor) -> None:
    _page_unified_write([k_ptrs, v_ptrs], src_pages, dst_pages, host, mla=False)


def transfer_hicache_all_layer_mla_staged_lf_page_unified(ptrs: torch.Tensor, src_pages: torch.Tensor,
                                                          dst_pages: torch.Tensor, staging: torch.Tensor,
                                                          host: torch.Tensor) -> None:
    _page_unified_write([ptrs], src_pages, dst_pages, host, mla=True)


# ---- the JIT kernels' gate (sglang's can_use_hicache_jit_kernel on an sm90 CUDA device) --------------------------

TMA_STAGE_BYTES = 32 * 1024
COPY_GROUP_THREADS = 32
GROUP_BYTES = (128,)  # CUDA's copy groups
TMA_ENV = "SGLANG_HICACHE_TMA_TRANSFER"


def hicache_tma_rows_per_chunk(element_size: int) -> int:
    rows = 1
    while rows * 2 <= TMA_STAGE_BYTES // element_size and rows * 2 <= 128:
        rows *= 2
    return rows


def _tma_enabled() -> bool:
    return os.environ.get(TMA_ENV, "1").strip().lower() not in ("0", "false", "no", "off", "")


def _default_unroll(element_size: int) -> int:
    return 4 if element_size <= 512 else 2 if element_size <= 1024 else 1


def can_use_hicache_jit_kernel(*, element_size: int, unroll: int | None = None, block_quota: int | None = None,
                               page_size: int | None = None) -> bool:
    """The TMA kernel where it takes the row (16-byte multiples, pages tiling its chunk), else the register kernel
    where the row tiles its copy rounds."""
    if _tma_enabled() and element_size % 16 == 0 and (
            page_size is None or page_size % hicache_tma_rows_per_chunk(element_size) == 0):
        return True
    unroll = unroll or _default_unroll(element_size)
    if unroll <= 0 or COPY_GROUP_THREADS % unroll:
        return False
    lanes = COPY_GROUP_THREADS // unroll
    return any(group % lanes == 0 and element_size % group == 0 and group // lanes in (4, 8, 16)
               for group in GROUP_BYTES)
