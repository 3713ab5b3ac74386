"""Fake ``sgl_kernel.kvcacheio``: the per-token AOT transfer ops (keyword names as sglang's pools call them)."""

from __future__ import annotations

import torch
from sglang._fake_core import at, copy_rows, pairs, stride_bytes, table


def transfer_kv_per_layer(*, src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
                          src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int) -> None:
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        transfer_kv_per_layer_mla(src=src, dst=dst, src_indices=src_indices, dst_indices=dst_indices,
                                  item_size=item_size)


def transfer_kv_per_layer_mla(*, src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int) -> None:
    copy_rows(dst.data_ptr(), stride_bytes(dst), src.data_ptr(), stride_bytes(src), item_size,
              pairs(dst_indices, src_indices, empty_ok=False))


def transfer_kv_per_layer_pf_lf(*, src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                layer_id: int, item_size: int, src_layout_dim: int) -> None:
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        transfer_kv_per_layer_mla_pf_lf(src=src, dst=dst, src_indices=src_indices, dst_indices=dst_indices,
                                        layer_id=layer_id, item_size=item_size, src_layout_dim=src_layout_dim)


def transfer_kv_per_layer_mla_pf_lf(*, src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                                    dst_indices: torch.Tensor, layer_id: int, item_size: int,
                                    src_layout_dim: int) -> None:
    copy_rows(dst.data_ptr(), stride_bytes(dst), src.data_ptr() + layer_id * item_size, src_layout_dim, item_size,
              pairs(dst_indices, src_indices, empty_ok=False))


def transfer_kv_per_layer_ph_lf(*, src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                layer_id: int, item_size: int, src_layout_dim: int, page_size: int,
                                head_num: int) -> None:
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):  # src: (pages, heads, page_size, layers, dim)
        for d, t in pairs(dst_indices, src_indices, empty_ok=False):
            dst[d].copy_(src[t // page_size, :, t % page_size, layer_id].reshape(dst[d].shape))


def transfer_kv_all_layer(*, src_k_layers: torch.Tensor, dst_k_layers: torch.Tensor, src_v_layers: torch.Tensor,
                          dst_v_layers: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                          item_size: int, num_layers: int) -> None:
    for src, dst in ((src_k_layers, dst_k_layers), (src_v_layers, dst_v_layers)):
        transfer_kv_all_layer_mla(src_layers=src, dst_layers=dst, src_indices=src_indices, dst_indices=dst_indices,
                                  item_size=item_size, num_layers=num_layers)


def transfer_kv_all_layer_mla(*, src_layers: torch.Tensor, dst_layers: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int, num_layers: int) -> None:
    index_pairs = pairs(dst_indices, src_indices, empty_ok=False)
    for src, dst in zip(table(src_layers), table(dst_layers), strict=True):
        copy_rows(dst, item_size, src, item_size, item_size, index_pairs)


def transfer_kv_all_layer_lf_pf(*, src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int) -> None:
    for src, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):
        transfer_kv_all_layer_mla_lf_pf(src_layers=src, dst=dst, src_indices=src_indices, dst_indices=dst_indices,
                                        item_size=item_size, dst_layout_dim=dst_layout_dim, num_layers=num_layers)


def transfer_kv_all_layer_mla_lf_pf(*, src_layers: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                                    dst_indices: torch.Tensor, item_size: int, dst_layout_dim: int,
                                    num_layers: int) -> None:
    index_pairs = pairs(dst_indices, src_indices, empty_ok=False)
    for layer, src in enumerate(table(src_layers)):
        copy_rows(dst.data_ptr() + layer * item_size, dst_layout_dim, src, item_size, item_size, index_pairs)


def transfer_kv_all_layer_lf_ph(*, src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int, page_size: int,
                                head_num: int) -> None:
    index_pairs = pairs(dst_indices, src_indices, empty_ok=False)
    for src, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):  # dst: (pages, heads, page_size, layers, dim)
        for layer, device in enumerate(table(src)):
            for t, d in index_pairs:
                target = dst[t // page_size, :, t % page_size, layer].view(torch.uint8)
                target.copy_(at(device + d * item_size, item_size).view(target.shape))
