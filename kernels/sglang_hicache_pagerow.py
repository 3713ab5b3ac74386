"""MiniMax M3's NVFP4 page-row host pools for ``sglang-hicache``: ``MiniMaxM3Nvfp4MainKVPoolHost`` (the main K/V
pool, an anchor) and ``MiniMaxM3Nvfp4IndexKPoolHost`` (the index-K sidecar), built through their own constructors
from sglang's ``PageRowBufferInfo``.

Both hold packed uint8 page rows, one row of ``page_size * E`` bytes per (layer, page), whatever the row packs
(NVFP4 payloads and scales). The oracle reads a page row as ``page_size`` token rows of ``E`` bytes of a
one-component pool (oracles/pool_layouts.py), so the device slab ``(layers, pages, row)`` is the case's device
storage and the host ``kv_buffer`` its host storage. The host pools only store and move the rows, whatever
quantized them; the rows here are the case's bytes. In production the MSA-v1 device pool fixes page size 128;
the host pools take any page size, and every one is drawn.

Stand-ins: the device pool (``DevicePoolStandIn``: its constructor needs the model's MSA-v1 configuration; the
host pools read only its ``PageRowBufferInfo``, built here over the case's device slab), and for the index-K
sidecar its anchor host pool (a namespace of the page size and the capacity, the only fields it reads), as for
the K-only pool.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels.sglang_hicache_mamba import DevicePoolStandIn

INDEX_K, MAIN_KV = "MiniMaxM3Nvfp4IndexKPoolHost", "MiniMaxM3Nvfp4MainKVPoolHost"
PAGE_ROW_CLASSES = frozenset({INDEX_K, MAIN_KV})


def build_page_rows(case: Case, name: str, device: torch.device, start: int) -> tuple[Any, Any]:
    """(device pool stand-in, host pool) of a page-row case: the main pool sized from its device capacity with
    a ratio for which its own sizing gives the case's host slots, the sidecar from its anchor's capacity."""
    from sglang.srt.mem_cache.device_pool_info import PageRowBufferInfo
    from sglang.srt.mem_cache.pool_host import minimax_m3_nvfp4 as module

    spec, ps, layers = case.pools[0], case.page_size, case.layers
    row = ps * spec.row_bytes(spec.components[0])
    pages = case.device_rows // ps
    slab = torch.zeros((layers, pages, row), dtype=torch.uint8, device=device)
    info = PageRowBufferInfo(slab=slab, rows=tuple(slab.unbind(0)), row_bytes=row, page_size=ps, num_pages=pages)
    device_pool = DevicePoolStandIn(info, layers, device, start)
    layout, end = case.layout.value, start + layers
    if name == INDEX_K:
        anchor = types.SimpleNamespace(page_size=ps, size=case.host_slots, page_num=case.host_slots // ps)
        host = module.MiniMaxM3Nvfp4IndexKPoolHost(info, anchor, layout, True, "cpu", "default", start_layer=start,
                                                   end_layer=end)
    else:
        size = case.device_rows - ps
        # (int(size * ratio) // ps + 1) * ps host slots; the half slot keeps float rounding below the next integer
        ratio = (case.host_slots - ps + 0.5) / size
        host = module.MiniMaxM3Nvfp4MainKVPoolHost(info, ratio, 0, ps, layout, True, "cpu", "default",
                                                   device_capacity_tokens=size, start_layer=start, end_layer=end)
    return device_pool, host


def build_jit_modules() -> None:
    """Build (or load) both page_row JIT modules (load and back-up), as the pools' constructors do on CUDA: once,
    in the campaign's builder, rather than inside a case."""
    from sglang.kernels.ops.kvcache.nvfp4_hicache import warmup_page_row_transfer

    warmup_page_row_transfer()


def device_tensors(device_pool: Any, rows: int) -> list[torch.Tensor]:
    """Each layer's page rows as the case's device rows (rows x E bytes)."""
    return [layer.view(rows, -1) for layer in device_pool.info.rows]


def host_tensors(host_pool: Any) -> list[torch.Tensor]:
    return [host_pool.kv_buffer]
