"""The case's bytes in sglang's tensors, for ``sglang-hicache``: which of sglang's tensors hold each of the case's
storages (copied in before a sequence and out after it, and after each transfer for the step images), sglang's
tensor of each device layer (which the layer-wise read copies), and the bytes of sglang's tensors that no case
storage holds (a layer-sharded pool's other layers, a token-major pool's entry padding), which must keep their
values. The DSA indexer's pairs are kernels/sglang_hicache_dsa.py's, the Mamba and page-row pools' tensors those
modules' own.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention
from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels import sglang_hicache_dsa as dsa
from hicache_fuzz.kernels import sglang_hicache_mamba as mamba
from hicache_fuzz.kernels import sglang_hicache_pagerow as pagerow
from hicache_fuzz.kernels.buffers import PoolBuffers
from hicache_fuzz.kernels.sglang_hicache_objects import K_ONLY, Built
from hicache_fuzz.kernels.sglang_hicache_settings import TOKEN_MAJOR, LayerShard, device_rows
from hicache_fuzz.kernels.sglang_hicache_settings import case_settings as settings


def _device_tensors(pool: PoolBuffers, built: Built, component: str) -> list[torch.Tensor]:
    """sglang's per-layer device tensors of one component, in the case's layer order (target, then drafts)."""
    name = settings(pool.case)[0]
    if name == mamba.MAMBA:
        return mamba.device_tensors(built.device_pool, built.drafts, component)
    if name in pagerow.PAGE_ROW_CLASSES:
        return pagerow.device_tensors(built.device_pool, pool.case.device_rows)
    k_only = name == K_ONLY

    def of(device_pool: Any) -> list[torch.Tensor]:
        if k_only:
            return list(device_pool.k_buffer)
        if pool.spec.attention is Attention.MLA:
            return list(device_pool.kv_buffer)
        return list(device_pool.k_buffer if component == "k" else device_pool.v_buffer)

    target = of(built.device_pool)
    if built.shard is not None:  # the rank's share of the stage's layers
        target = target[built.shard.start : built.shard.start + built.shard.owned]
    return target + [of(p)[0] for p in built.drafts]


def _host_tensors(pool: PoolBuffers, built: Built) -> list[torch.Tensor]:
    """sglang's host tensors whose bytes, one after another, are the case's host storage."""
    host = built.host_pool
    if settings(pool.case)[0] == mamba.MAMBA:
        return mamba.host_tensors(host)
    if settings(pool.case)[0] in pagerow.PAGE_ROW_CLASSES:
        return pagerow.host_tensors(host)
    if pool.spec.attention is Attention.MHA_ASYM:
        return [host.k_buffer, host.v_buffer]
    if settings(pool.case)[0] == K_ONLY:
        return [host.k_buffer]
    return [host.kv_buffer]


def device_layers(pool: PoolBuffers, built: Built) -> list[tuple[str, int, torch.Tensor]]:
    """sglang's tensor of each layer of the case's device storage, as (component, layer, uint8 view of
    device_rows x row bytes)."""
    if built.dsa is not None:
        component = pool.spec.components[0]
        return [(component, layer, theirs)
                for layer, (_ours, theirs) in enumerate(dsa.case_pairs(pool, built.dsa)[: pool.case.layers])]
    rows = pool.case.device_rows
    return [(component, layer, theirs.view(torch.uint8).view(rows, -1))
            for component in pool.spec.components
            for layer, theirs in enumerate(_device_tensors(pool, built, component))]


def _pairs(pool: PoolBuffers, built: Built) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, theirs) of equal shape: the case's storages and sglang's tensors holding the same bytes."""
    if built.dsa is not None:
        return dsa.case_pairs(pool, built.dsa)
    out = [(pool.device_layer(component, layer), theirs) for component, layer, theirs in device_layers(pool, built)]
    if built.shard is not None:
        return out + _sharded_host_pairs(pool, built, built.shard)
    start = 0
    payload = pool.host.payload
    for tensor in _host_tensors(pool, built):
        flat = tensor.view(torch.uint8).view(-1)
        out.append((payload[start : start + flat.numel()], flat))
        start += flat.numel()
    if start != payload.numel():
        raise RuntimeError(f"harness: sglang's host pool holds {start} bytes, the case's host storage "
                           f"{payload.numel()}")
    return out


def _sharded_host(pool: PoolBuffers, built: Built, shard: LayerShard) -> tuple[torch.Tensor, int]:
    """sglang's host tensor of a layer-sharded MLA case as uint8 in the case's shape (its own layer count), and
    the layer axis."""
    row = pool.spec.row_bytes(pool.spec.components[0])
    return devices.sharded_mla_host(built.host_pool.kv_buffer, pool.case, shard, pool.case.layers - shard.owned, row)


def _sharded_host_pairs(pool: PoolBuffers, built: Built, shard: LayerShard) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, theirs) of a layer-sharded MLA case's host storage (oracles/pool_layouts.py, the layer-sharded
    section): the owned layers are sglang's first host layers, the drafts its layers from ``ceil(L / size)``."""
    host, axis = _sharded_host(pool, built, shard)
    row, drafts = pool.spec.row_bytes(pool.spec.components[0]), pool.case.layers - shard.owned
    ours = pool.host.payload.view(devices.mla_host_shape(pool.case, pool.case.layers, row))
    owned, draft = devices.sharded_mla_share(host, axis, shard, drafts)
    return [(ours.narrow(axis, 0, shard.owned), owned), (ours.narrow(axis, shard.owned, drafts), draft)]


def outside_bytes(pool: PoolBuffers, built: Built) -> devices.OutsideBytes:
    """The regions of sglang's tensors a case's sequence must not change and no case storage holds: a
    layer-sharded pool's other device layers and its host layers no owned layer maps to, a token-major pool's
    entry bytes past its layers' rows."""
    outside = devices.OutsideBytes()
    shard = built.shard
    if shard is not None:
        for layer, tensor in enumerate(built.device_pool.kv_buffer):
            if not shard.start <= layer < shard.start + shard.owned:
                outside.add(f"device layer {layer} (rank {shard.rank} of {shard.size} does not own it)", tensor)
        host, axis = _sharded_host(pool, built, shard)
        spare = devices.unwritten_mla_host_layers(host, axis, shard)
        if spare is not None:
            outside.add(f"host layers {shard.owned}..{shard.host_target_layers - 1} (no owned layer maps to them)",
                        spare)
    if device_rows(pool.case) == TOKEN_MAJOR:
        # the target's views only: packed draft layers are pools of their own
        target = pool.case.layers - settings(pool.case)[3]
        views = [tensor for component in pool.spec.components
                 for tensor in _device_tensors(pool, built, component)[:target]]
        padding = devices.entry_padding(views)
        if padding is not None:
            outside.add("the unified pool's entry bytes past the layers' rows", *padding)
    return outside


def copy_in(pool: PoolBuffers, built: Built) -> None:
    for ours, theirs in _pairs(pool, built):
        theirs.copy_(ours)


def copy_out(pool: PoolBuffers, built: Built) -> None:
    for ours, theirs in _pairs(pool, built):
        ours.copy_(theirs)
