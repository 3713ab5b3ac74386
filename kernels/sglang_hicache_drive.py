"""How ``sglang-hicache`` drives sglang: each host pool class through its own constructor, the real controller
constructed as the scheduler constructs it (``HybridCacheController`` over an anchor-only ``HostPoolGroup``, over the
anchor and a side pool, or over a DSA indexer's MLA anchor and the indexer; or ``HiCacheController`` over the pool),
and a case's sequence of operations through the controller's own ``write`` / ``load`` + ``start_loading`` /
``evict_host`` (with the DSA indexer's sidecar transfer as ``extra_pools``, or a side pool's transfer with its
own host allocation under ``side_transfer``: kernels/sglang_hicache_side.py). The MXFP8 pool's scale blocks, which
are no storage of the case, are checked against the oracle after every transfer (kernels/sglang_hicache_mxfp8.py).

Stand-ins (each is the least the controller needs from outside HiCache):

* ``DeviceAllocatorStandIn`` for the scheduler's ``token_to_kv_pool_allocator``: it returns the device pool, grants
  the device rows the sequence names for a load (which rows the device allocator picks is the radix tree's
  business, not HiCache's, and the oracle must know them), and records the transfer-done event the controller hands
  it. After each ``write`` and ``start_loading`` the event recorded under the controller's key for that operation
  (``(id(controller), "write")`` / ``"load"``) must be that operation's ack's finish event: sglang's allocators that
  recycle rows (the unified sub-pool allocator) wait on it before reusing rows a transfer still touches. The
  harness itself waits on the ack's finish event.
* ``tp_group=None`` and a fresh ``threading.Event`` for ``load_cache_event``: only the storage (L3) threads use
  them, and no storage backend is attached.
* The Mamba state pool's device pool (kernels/sglang_hicache_mamba.py): the host pool reads only its
  ``MambaStateBufferInfo`` (sglang's class, built over the case's device tensors).
* The layer-sharded MLA device pool and the unified pool's second sub-pool (kernels/sglang_hicache_device.py).
* The DSA indexer's device pool (kernels/sglang_hicache_dsa.py): ``DSATokenToKVPool``'s constructor needs the
  model's DSA configuration; a stand-in holds the index buffers beside a real ``MLATokenToKVPool`` for the KV rows.
* The HiSparse coordinator (``HiSparseCoordinator``), for the HiSparse MHA pool: its loads are that coordinator's
  loop (global layer ids of the stage, the kernel io backend). A case with the ``requests`` knob holds its host
  slots as the coordinator does (``RequestTable``): the coordinator's request table, filled by the pool's own
  ``alloc_paged_token_slots`` for each back-up, whose grant is backed up with ``backup_from_device_all_layer``
  (``admit_request_into_staging``), loaded from the request's row, and freed on release through
  ``allocated_host_indices`` and the pool's ``free`` (``request_finished``). Without the knob its back-ups go
  through the controller's ``write`` (the same pool call, slots from ``HostKVCache.alloc``).
* The draft pass of a load under the base controller: it loads the target model's layers only; the hybrid
  controller's draft transfers call the host pool's ``load_to_device_per_layer(..., is_draft=True)`` for each
  packed draft layer, which this module does after each load of the base controller, with the controller's own
  index placement. Under the hybrid controller (``controller=hybrid``) the controller makes them itself.

Host indices of every back-up are granted by the pool's own allocator inside the controller's ``write`` (or, under
request slots, inside ``alloc_paged_token_slots``); the allocator's free list is set up first through its own
``alloc``/``free`` (oracles/sequence.py, ``prologue``), so the oracle knows the grants without reading them back.
Under request slots every grant, the request table after it and the allocator's free count are compared with the
oracle's before the grant is used. The pools' ``prepare_transfer_indices`` hooks run where the
controller's transfer engine runs them.

A load is consumed as the forward pass consumes it: ``start_loading()`` returns a producer id of the controller's
``LayerDoneCounter``; on a stream of its own (the forward stream's stand-in) that id is made the consumer, as the
model runner makes it, and for each transfer layer in order ``wait_until(layer)`` is followed by a copy of the
load's rows of that device layer. Each copy must equal the layer once the whole load has finished. One load in two
(drawn from the case and the step) is submitted with sglang's test knob ``SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES``
set, which slows every layer of that submission on the H2D stream, so that a wait that does not cover its layer
reads bytes the load has not yet written.
"""

from __future__ import annotations

import os
import threading
import types
import zlib
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from hicache_fuzz.harness.model.case import Attention, Case, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels import sglang_hicache_dsa as dsa
from hicache_fuzz.kernels import sglang_hicache_mamba as mamba
from hicache_fuzz.kernels import sglang_hicache_mxfp8 as mxfp8
from hicache_fuzz.kernels import sglang_hicache_pagerow as pagerow
from hicache_fuzz.kernels import sglang_hicache_side as side_pools
from hicache_fuzz.kernels.buffers import Materialized, PoolBuffers
from hicache_fuzz.kernels.sglang_hicache_settings import (
    BASE,
    HYBRID,
    REQUEST_SLOT_CLASSES,
    TOKEN_MAJOR,
    LayerShard,
    controller_kind,
    device_rows,
    device_target_layers,
    k_only_heads,
    layer_shard,
    side_pool,
    side_transfer,
    skip_topk_layers,
)
from hicache_fuzz.kernels.sglang_hicache_settings import case_settings as settings
from hicache_fuzz.oracles import sequence, side_transfers
from hicache_fuzz.oracles.pool_layouts import owned_device_layers, pool_class

K_ONLY = "MHATokenToKOnlyPoolHost"
# Pools whose loads their own coordinator makes, not a HiCache controller: the HiSparse MHA pool takes the stage's
# global layer ids and has no guard for others (its coordinator never asks for them).
COORDINATOR_LOADED = REQUEST_SLOT_CLASSES
# Pools without a guard for layer ids outside them, or whose guard raises (their controllers never pass such
# ids): no foreign loads.
UNGUARDED = COORDINATOR_LOADED | {K_ONLY, mamba.MAMBA} | pagerow.PAGE_ROW_CLASSES
DTYPES = {KVDtype.BF16: torch.bfloat16, KVDtype.FP16: torch.float16, KVDtype.FP32: torch.float32,
          KVDtype.FP8: torch.float8_e4m3fn}
WRITE_POLICY = "write_through"
# sglang's test knob (mem_cache/l2_transfer.py, submit_host_to_device): read on every submission, it sleeps this
# many GPU cycles on the H2D stream before each layer's copies. ~100 us a layer at H100 clocks: longer than the host
# takes to enqueue a layer, so the H2D stream falls behind the forward stream's reads.
H2D_DELAY_ENV = "SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES"
H2D_DELAY_CYCLES = 200_000
# Every load's submission holds it: the knob is process-wide, and a delayed submission's setting must not leak
# into another thread's submission, nor be restored over another's.
_H2D_DELAY_LOCK = threading.Lock()


class DeviceAllocatorStandIn:
    """The scheduler's device token allocator, as far as the controllers use it (see the module doc)."""

    def __init__(self, device_pool: Any) -> None:
        self.device_pool = device_pool
        self.grants: deque[torch.Tensor] = deque()
        # the transfer-done events the controller handed over, by its key ((id(controller), "write" or "load"))
        self.done_events: dict[Any, Any] = {}

    def get_kvcache(self) -> Any:
        return self.device_pool

    def alloc(self, need_size: int) -> torch.Tensor:
        rows = self.grants.popleft()
        if len(rows) != need_size:
            raise AssertionError(f"the controller asked the device allocator for {need_size} rows, the load has "
                                 f"{len(rows)}")
        return rows

    def set_hicache_transfer_done_event(self, key: Any, event: Any) -> None:
        self.done_events[key] = event

    def done_event_differs(self, controller: Any, operation: str, finish_event: Any) -> str:
        """'' if the controller handed over `finish_event` for its `operation` ("write" or "load") since the
        record was last cleared, else what it handed over."""
        key = (id(controller), operation)
        got = self.done_events.get(key)
        if got is finish_event:
            return ""
        what = "no event" if got is None else "another event than the ack's finish event"
        return (f"the controller handed the device allocator {what} under ({type(controller).__name__}, "
                f"{operation!r}) for this {operation}: set_hicache_transfer_done_event must receive the "
                f"{operation}'s finish event, which allocators that recycle rows wait on")


def load_modules() -> Any:
    """sglang's modules this backend drives (imported here, never at generation time)."""
    import sglang.srt.mem_cache.pool_host.mha as mha
    import sglang.srt.mem_cache.pool_host.mla as mla
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.mem_cache.hybrid_cache.host_pool_config import with_packed_draft_layer_mapping
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry
    from sglang.srt.mem_cache.memory_pool import MHATokenToKOnlyPool, MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup

    return types.SimpleNamespace(mha=mha, mla=mla, HiCacheController=HiCacheController,
                                 HybridCacheController=HybridCacheController, HostPoolGroup=HostPoolGroup,
                                 PoolName=PoolName, PoolTransfer=PoolTransfer, build_pool_entry=build_pool_entry,
                                 with_packed_draft_layer_mapping=with_packed_draft_layer_mapping,
                                 MHATokenToKVPool=MHATokenToKVPool, MLATokenToKVPool=MLATokenToKVPool,
                                 MHATokenToKOnlyPool=MHATokenToKOnlyPool)


class Built:
    """sglang's objects for one pool of a case: the target device pool, one one-layer device pool per packed draft
    layer, the host pool (an instance of the case's class), and the controller over them with its device
    allocator stand-in."""

    def __init__(self, device_pool: Any, drafts: list[Any], host_pool: Any) -> None:
        self.device_pool, self.drafts, self.host_pool = device_pool, drafts, host_pool
        self.allocator = DeviceAllocatorStandIn(device_pool)
        self.controller: Any = None
        self.side: side_pools.SidePool | None = None  # the group's side pool, if the case has one
        self.dsa: dsa.DsaGroup | None = None  # a DSA indexer's anchor and config, if the case's pool is one
        self.mxfp8: mxfp8.ScaleStorages | None = None  # the MXFP8 pool's scale blocks, if the case's pool is one
        self.shard: LayerShard | None = None  # the rank's share of the stage, if the MLA pool is layer-sharded
        # bytes of sglang's tensors no case storage holds, which must keep their values (kernels/sglang_hicache_device)
        self.outside = devices.OutsideBytes()
        self.forward_stream: Any = None  # the stream standing for the forward stream (CUDA), made at first use

    @property
    def allocating_pool(self) -> Any:
        """The host pool whose allocator grants the controller's host slots: the group's anchor (the DSA indexer
        rides on its MLA anchor's slots), else the case's pool."""
        return self.dsa.anchor_host if self.dsa is not None else self.host_pool


def objects_key(case: Case, device: torch.device) -> tuple[object, ...]:
    """What sglang's objects of a case are built from: cases with equal keys can share them (index variants of
    one geometry), since every run resets the allocator and copies all bytes in (the request table is made per
    run)."""
    knobs = tuple((k, v) for k, v in case.tuning if k not in (sequence.OPS_KEY, sequence.REQUESTS_KEY))
    return (case.page_size, case.layers, case.device_rows, case.host_slots, case.layout, case.pools, knobs,
            str(device))


def destroy(built: Built) -> None:
    """Unregister the host pool's pinned buffers now rather than at process exit."""
    for pool in (built.host_pool, built.side.host_pool if built.side else None,
                 built.dsa.anchor_host if built.dsa else None):
        release = getattr(pool, "destroy", None)
        if release is not None:
            release()


def _device_pool(mods: Any, case: Case, spec: PoolSpec, layers: int, device: torch.device, start: int) -> Any:
    size, ps, dtype = case.device_rows - case.page_size, case.page_size, DTYPES[spec.dtype]
    end = start + layers  # exclusive, as the model runner's layer ranges are
    if settings(case)[0] == K_ONLY:
        heads, head_dim = k_only_heads(spec)
        return mods.MHATokenToKOnlyPool(size, ps, dtype, heads, head_dim, layers, str(device), False,
                                        start_layer=start, end_layer=end)
    if spec.attention is Attention.MLA:
        rope = 64 if spec.head_dim > 64 else 0
        return mods.MLATokenToKVPool(size, ps, dtype, spec.head_dim - rope, rope, layers, str(device), False,
                                     start_layer=start, end_layer=end)
    v_head_dim = spec.v_head_dim if spec.attention is Attention.MHA_ASYM else None
    return mods.MHATokenToKVPool(size, ps, dtype, spec.heads, spec.head_dim, layers, str(device), False,
                                 v_head_dim=v_head_dim, start_layer=start, end_layer=end, enable_alt_stream=False)


def build(mods: Any, case: Case, device: torch.device) -> Built:
    """The case's pool through its class's own constructor (generated settings: layout, page size, layers,
    start layer, packed draft layers, host capacity)."""
    name, _io, start, drafts = settings(case)
    spec = case.pools[0]
    target = case.layers - drafts
    if name == mamba.MAMBA:
        mamba_device, mamba_drafts, mamba_host = mamba.build_mamba(case, DTYPES[spec.dtype], device, start, drafts)
        return _finish(mods, case, Built(mamba_device, mamba_drafts, mamba_host))
    if name in pagerow.PAGE_ROW_CLASSES:
        page_device, page_host = pagerow.build_page_rows(case, name, device, start)
        return _finish(mods, case, Built(page_device, [], page_host))
    if name == dsa.DSA:
        return _finish(mods, case, _build_dsa(mods, case, device, start, drafts))
    if name == mxfp8.MXFP8:
        mxfp8_device, mxfp8_host = mxfp8.build_mxfp8(case, device, start)
        built = Built(mxfp8_device, [], mxfp8_host)
        built.mxfp8 = mxfp8.ScaleStorages(case, mxfp8_device, mxfp8_host)
        return _finish(mods, case, built)
    shard = layer_shard(case)
    if device_rows(case) == TOKEN_MAJOR:
        device_pool = devices.token_major_pool(case, spec, target, DTYPES[spec.dtype], device, start)
    elif shard is not None:
        device_pool = devices.shard_mla_pool(_device_pool(mods, case, spec, shard.stage_layers, device, start), shard)
    else:
        device_pool = _device_pool(mods, case, spec, target, device, start)
    draft_pools = [_device_pool(mods, case, spec, 1, device, 0) for _ in range(drafts)]
    if name == "MLATokenToKVPoolHost":
        built = Built(device_pool, draft_pools, _mla_host(mods, case, device_pool, draft_pools, start, shard))
        built.shard = shard
        return _finish(mods, case, built)
    size, ps = case.device_rows - case.page_size, case.page_size
    common: dict[str, Any] = {"device_capacity_tokens": size, "start_layer": start, "end_layer": start + target}
    cls = getattr(mods.mha, pool_class(name).name)
    if name == K_ONLY:
        # built over the device pool itself, whose class has no device pool provider (sglang's
        # get_device_pool_infos raises for it); the anchor host pool it is sized from in production (an MHA pool
        # beside it) is read for its page size and capacity only
        anchor = types.SimpleNamespace(page_size=ps, size=case.host_slots, page_num=case.host_slots // ps)
        host_pool = cls(device_pool, anchor, case.layout.value, True, "cpu", "default")
        return _finish(mods, case, Built(device_pool, draft_pools, host_pool))
    info = device_pool.get_device_pool_infos()[0].buffer_info
    if name == "HiSparseMHATokenToKVPoolHost":
        # sized from the device pool: host slots = (int(size * ratio) // ps + 1) * ps, so this ratio gives the
        # case's host_slots exactly (the half slot keeps float rounding below the next integer)
        ratio = (case.host_slots - ps + 0.5) / size
        host_pool = cls(info, ratio, ps, **common)
    else:
        draft_infos = [p.get_device_pool_infos()[0].buffer_info for p in draft_pools]
        host_pool = cls(info, 2.0, 0, ps, case.layout.value, True, "cpu", "default", draft_buffer_infos=draft_infos,
                        pool_label=spec.name, host_token_capacity=case.host_slots, **common)
    return _finish(mods, case, Built(device_pool, draft_pools, host_pool))


def _mla_host(mods: Any, case: Case, device_pool: Any, draft_pools: list[Any], start: int,
              shard: LayerShard | None = None) -> Any:
    """``MLATokenToKVPoolHost`` over `device_pool` (its layers are the target's) and the packed draft pools; for a
    layer-sharded pool as ``build_kv_host_pool`` builds it (``layer_shard_enabled``, ``ceil(L / size)`` target
    layers), over the owned range's buffer info that the pool's own ``get_device_pool_infos`` hands out."""
    target = device_pool.layer_num
    info = device_pool.get_device_pool_infos()[0].buffer_info
    draft_infos = [p.get_device_pool_infos()[0].buffer_info for p in draft_pools]
    sharding: dict[str, Any] = {} if shard is None else {"layer_shard_enabled": True}
    return mods.mla.MLATokenToKVPoolHost(info, 2.0, 0, case.page_size, case.layout.value, True, "cpu", "default", None,
                                         draft_infos,
                                         target_layer_num=target if shard is None else shard.host_target_layers,
                                         pool_label=case.pools[0].name, host_token_capacity=case.host_slots,
                                         device_capacity_tokens=case.device_rows - case.page_size, start_layer=start,
                                         end_layer=start + target, **sharding)


def _build_dsa(mods: Any, case: Case, device: torch.device, start: int, drafts: int) -> Built:
    """A DSA case: the MLA anchor's device pools (every target layer of the stage, skipped ones included, and the
    packed drafts) and host pool, as for an MLA case, then the indexer over them (kernels/sglang_hicache_dsa.py)."""
    spec, skip = case.pools[0], skip_topk_layers(case)
    anchor = _device_pool(mods, case, spec, len(skip), device, start)
    anchor_drafts = [_device_pool(mods, case, spec, 1, device, 0) for _ in range(drafts)]
    group = dsa.build_indexer(case, anchor, anchor_drafts, _mla_host(mods, case, anchor, anchor_drafts, start), skip)
    built = Built(group.device, list(group.drafts), group.host)
    built.dsa = group
    return built


def _finish(mods: Any, case: Case, built: Built) -> Built:
    """The controller over `built`, once its host pool is checked to have the case's capacity."""
    if built.host_pool.size != case.host_slots:
        raise RuntimeError(f"harness: {type(built.host_pool).__name__} was built with {built.host_pool.size} host "
                           f"slots, the case has {case.host_slots}")
    built.controller = controller_for(mods, case, built)
    return built


# ---- the case's bytes <-> sglang's tensors ---------------------------------------------------------------

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


def _device_layers(pool: PoolBuffers, built: Built) -> list[tuple[str, int, torch.Tensor]]:
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
    out = [(pool.device_layer(component, layer), theirs) for component, layer, theirs in _device_layers(pool, built)]
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


# The host tensor of the MLA pool per layout, as (shape before the layer axis, the layer axis): the case's host
# storage has the same shape with the case's layers.
_MLA_HOST_LAYER_AXIS = {HostLayout.LAYER_FIRST: 0, HostLayout.PAGE_FIRST: 1, HostLayout.PAGE_FIRST_DIRECT: 1}


def _mla_host_shape(case: Case, layers: int, row: int) -> tuple[int, ...]:
    S, ps = case.host_slots, case.page_size
    return {HostLayout.LAYER_FIRST: (layers, S, row), HostLayout.PAGE_FIRST: (S, layers, row),
            HostLayout.PAGE_FIRST_DIRECT: (S // ps, layers, ps, row)}[case.layout]


def _sharded_host(pool: PoolBuffers, built: Built, shard: LayerShard) -> tuple[torch.Tensor, int]:
    """sglang's host tensor of a layer-sharded MLA case as uint8 in the case's shape (its own layer count), and
    the layer axis."""
    row = pool.spec.row_bytes(pool.spec.components[0])
    layers = shard.host_target_layers + pool.case.layers - shard.owned
    host = built.host_pool.kv_buffer.view(torch.uint8).view(_mla_host_shape(pool.case, layers, row))
    return host, _MLA_HOST_LAYER_AXIS[pool.case.layout]


def _sharded_host_pairs(pool: PoolBuffers, built: Built, shard: LayerShard) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, theirs) of a layer-sharded MLA case's host storage (oracles/pool_layouts.py, the layer-sharded
    section): the owned layers are sglang's first host layers, the drafts its layers from ``ceil(L / size)``."""
    host, axis = _sharded_host(pool, built, shard)
    row, drafts = pool.spec.row_bytes(pool.spec.components[0]), pool.case.layers - shard.owned
    ours = pool.host.payload.view(_mla_host_shape(pool.case, pool.case.layers, row))
    return [(ours.narrow(axis, 0, shard.owned), host.narrow(axis, 0, shard.owned)),
            (ours.narrow(axis, shard.owned, drafts), host.narrow(axis, shard.host_target_layers, drafts))]


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
        if shard.host_target_layers > shard.owned:
            outside.add(f"host layers {shard.owned}..{shard.host_target_layers - 1} (no owned layer maps to them)",
                        host.narrow(axis, shard.owned, shard.host_target_layers - shard.owned))
    if device_rows(pool.case) == TOKEN_MAJOR:
        views = [tensor for component in pool.spec.components for tensor in _device_tensors(pool, built, component)]
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


# ---- the sequence ----------------------------------------------------------------------------------------

def controller_for(mods: Any, case: Case, built: Built) -> Any:
    """The case's controller, as the scheduler constructs it: HiCacheController over the host pool, or the
    HybridCacheController over a HostPoolGroup whose anchor entry sglang's own assembler builds (stage-local
    layer mapping, the packed draft layers' transfer ids after the target's, the draft device pools), with the
    case's side pool beside it if it has one (kernels/sglang_hicache_side.py). A DSA indexer's group is its MLA
    anchor and the indexer, as sglang's DSA stack groups them (kernels/sglang_hicache_dsa.py)."""
    _name, io_backend, start, drafts = settings(case)
    if controller_kind(case) == BASE:
        return mods.HiCacheController(built.allocator, built.host_pool, case.page_size, None, threading.Event(),
                                      write_policy=WRITE_POLICY, io_backend=io_backend)
    if built.dsa is not None:
        return mods.HybridCacheController(built.allocator, mods.HostPoolGroup(dsa.group_entries(mods, built.dsa)),
                                          case.page_size, None, threading.Event(), write_policy=WRITE_POLICY,
                                          io_backend=io_backend, transfer_layer_id_max=built.device_pool.layer_num)
    target = device_target_layers(case)
    mapping = mods.with_packed_draft_layer_mapping({layer: layer for layer in range(target)},
                                                   transfer_layer_start=target, target_device_layer_num=target,
                                                   draft_layer_num=drafts)
    entry = mods.build_pool_entry(name=mods.PoolName.KV, host_pool=built.host_pool, device_pool=built.device_pool,
                                  layer_mapping=mapping, transfer_layer_id_max=target + drafts, is_anchor=True,
                                  packed_draft_device_pools=tuple(built.drafts))
    entries = [entry]
    side = side_pool(case)
    if side:
        built.side = side_pools.build_side(mods, case, side, built.host_pool, DTYPES[case.pools[0].dtype],
                                           built.device_pool.device, start, target, moves=side_transfer(case))
        entries.append(side_pools.side_entry(mods, built.side, target))
    return mods.HybridCacheController(built.allocator, mods.HostPoolGroup(entries), case.page_size, None,
                                      threading.Event(), write_policy=WRITE_POLICY, io_backend=io_backend,
                                      transfer_layer_id_max=target)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _indices(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def prepare_allocator(case: Case, host_pool: Any) -> None:
    """One grant of the whole pool, then the prologue's frees (oracles/sequence.py): the free list the oracle
    assumes."""
    whole = host_pool.alloc(host_pool.available_size())
    if whole is None or len(whole) != case.host_slots:
        raise AssertionError(f"host pool allocator did not grant its whole capacity of {case.host_slots} slots")
    for chunk in sequence.prologue(case):
        host_pool.free(_indices(chunk, torch.device("cpu")))


def run_sequence(mods: Any, buffers: Materialized, built: Built) -> None:
    """Every step of the case through the controller; after each transfer of a sequence case, the storages are
    copied back and recorded in ``buffers.step_images``."""
    case, device = buffers.case, buffers.device
    pool = buffers.pools[0]
    _name, io_backend, _start, drafts = settings(case)
    allocator, controller = built.allocator, built.controller
    allocator.grants.clear()
    controller.ack_write_queue.clear()
    controller.ack_load_queue.clear()
    built.allocating_pool.clear()  # the allocator's state as built: every slot free
    prepare_allocator(case, built.allocating_pool)
    record = bool(sequence.program(case)) and _images_fit(buffers)
    buffers.step_images = []
    table = RequestTable(case, device) if sequence.request_slots(case) else None
    side = built.side if built.side is not None and side_transfer(case) else None
    side_steps = side_transfers.side_steps(case) if side is not None else []
    if side is not None:
        side.host_pool.clear()  # the side allocator as the oracle's starts: every slot free, ascending
    for position, step in enumerate(sequence.plan_steps(case)):
        side_step = side_steps[position] if side is not None else None
        if table is not None:
            label = _request_step(built, table, step, _start, case.layers)
            if not step.transfers:
                continue
            _sync(device)
        elif step.op == sequence.EVICT:
            controller.evict_host(_indices(step.host_indices, torch.device("cpu")))
            if side is not None and side_step is not None and side_step.host_slots:
                _release_side_slots(mods, controller, side, step, side_step)
            continue
        elif step.op == sequence.BACKUP:
            allocator.done_events.clear()
            rows = _indices(step.device_indices, device)
            if side is not None and side_step is not None:
                # queued (flush=False) so that the side pool's grant is checked before the copies use it
                transfer = mods.PoolTransfer(name=side_pools.pool_name(mods, side), device_indices=rows)
                granted = controller.write(rows, extra_pools=[transfer], flush=False)
                if granted is not None:
                    _check_side_grant(step, side, transfer, side_step)
                    controller.start_writing()
            else:
                granted = controller.write(rows, **_sidecars(built))
            if granted is None:
                raise AssertionError(f"{step.label()}: the host allocator refused {len(step.device_indices)} slots "
                                     f"it has free")
            ack = controller.ack_write_queue.pop()
            ack.finish_event.synchronize()
            label = f"{type(controller).__name__}.write granted host slots {_head(granted)}"
            why = allocator.done_event_differs(controller, "write", ack.finish_event)
            if why:
                raise AssertionError(f"{step.label()} [{label}]: {why}")
        else:
            host = _indices(step.host_indices, torch.device("cpu"))
            rows = _indices(step.device_indices, device)
            if _name in COORDINATOR_LOADED:
                # its coordinator loads layer after layer on the current stream, no producer to consume: nothing
                # to read layer by layer
                _coordinator_load(controller, built, host, rows, _start, case.layers)
                label = "load_to_device_per_layer over the stage's layer ids (the HiSparse coordinator's loop)"
            else:
                label = f"{type(controller).__name__}.load + start_loading"
                allocator.grants.append(rows)
                layers = _layers_by_wait(built, pool)  # before the submission: the reads must follow it closely
                controller.load(host, **(_side_load(mods, side, side_step, rows) if side is not None
                                         else _sidecars(built)))
                allocator.done_events.clear()
                with _h2d_delay(_h2d_delayed(case, step)):
                    producer = controller.start_loading()
                reads = _read_layer_by_layer(built, layers, producer, rows)
                ack = controller.ack_load_queue.pop()
                ack.finish_event.synchronize()
                why = _stale_read(reads, rows) or allocator.done_event_differs(controller, "load", ack.finish_event)
                if why:
                    raise AssertionError(f"{step.label()} [{label}]: {why}")
                # the hybrid controller loads the packed draft layers itself; the base one leaves them to the
                # draft pass
                own_drafts = 0 if controller_kind(case) == HYBRID else drafts
                _draft_and_foreign_loads(controller, built, host, rows, io_backend, device_target_layers(case),
                                         own_drafts, () if _name in UNGUARDED else _foreign_layer_ids(built))
            _sync(device)
        if side is not None and side_step is not None:
            side.apply(side_step)
            _sync(device)
            why = side.differs()
            if why:
                raise AssertionError(f"{step.label()} [{label}]: {why}")
        if built.mxfp8 is not None:
            _sync(device)
            why = built.mxfp8.check_step()
            if why:
                raise AssertionError(f"{step.label()} [{label}]: {why}")
        if record:
            _sync(device)
            copy_out(pool, built)
            buffers.step_images.append((label, {s.key: s.raw.to(device, copy=True) for s in buffers.storages()}))


# Step images are whole-storage copies, one per transfer, and the runner makes as many for the oracle: a sequence
# of large storages (the scale tier reaches gigabytes) is compared at its end only, as every other case.
STEP_IMAGE_BUDGET = 1 << 30


def _images_fit(buffers: Materialized) -> bool:
    transfers = sum(1 for _ in sequence.transfer_steps(buffers.case))
    return sum(s.raw.numel() for s in buffers.storages()) * transfers <= STEP_IMAGE_BUDGET


def _head(granted: torch.Tensor) -> str:
    values = granted.tolist()
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, ...] ({len(values)})"


def _h2d_delayed(case: Case, step: sequence.Step) -> bool:
    """Whether the load of `step` is submitted with the H2D delay: one load in two, a function of the case and the
    step only, so that a replay of the case delays the same loads."""
    return zlib.crc32(f"{case.case_id}:{step.index}".encode()) % 2 == 0


@contextmanager
def _h2d_delay(delayed: bool) -> Iterator[None]:
    """sglang's H2D delay knob set for the submissions inside (`delayed`), then as it was: sglang reads it on every
    submission, so only the delayed loads pay for it."""
    with _H2D_DELAY_LOCK:
        if not delayed:
            yield
            return
        before = os.environ.get(H2D_DELAY_ENV)
        os.environ[H2D_DELAY_ENV] = str(H2D_DELAY_CYCLES)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(H2D_DELAY_ENV, None)
            else:
                os.environ[H2D_DELAY_ENV] = before


class LayerRead(NamedTuple):
    """One device layer of a load as the forward stream read it."""

    component: str
    layer: int  # of the case's device storage
    waited_for: int  # the transfer layer id passed to wait_until before the read
    tensor: torch.Tensor  # sglang's tensor of the layer (device_rows x row bytes, uint8)
    read: torch.Tensor  # its rows of the load, copied on the forward stream after the wait


def _layer_done_at(case: Case, built: Built) -> list[int | None]:
    """For each layer of the case's device storage, the transfer layer id whose event marks it loaded: a target
    layer its own (a DSA indexer's layer the device layer owning its index keys), a packed draft layer under the
    hybrid controller the last one (sglang finishes every draft before the final target-layer event), under the
    base controller none (the draft pass loads it after the load)."""
    drafts = settings(case)[3]
    target: range | tuple[int, ...] = range(case.layers - drafts)
    if built.dsa is not None:
        target = owned_device_layers(skip_topk_layers(case))
    elif built.shard is not None:  # case layer j is the stage's device layer start + j
        target = range(built.shard.start, built.shard.start + built.shard.owned)
    draft_at = built.controller.transfer_layer_id_max - 1 if controller_kind(case) == HYBRID else None
    return [*target, *[draft_at] * drafts]


@contextmanager
def _forward_stream(built: Built, device: torch.device) -> Iterator[None]:
    """Work inside runs on the stand-in for the forward stream, after the current stream's work (the load's row
    indices are made there). On the CPU (the fake sglang) there are no streams: work runs in order."""
    if device.type != "cuda":
        yield
        return
    if built.forward_stream is None:
        built.forward_stream = torch.cuda.Stream(device)
    stream = built.forward_stream
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield


def _layers_by_wait(built: Built, pool: PoolBuffers) -> list[tuple[int, list[tuple[str, int, torch.Tensor]]]]:
    """The layers of the case's device storage that a load brings, grouped by the transfer layer id whose event
    marks them loaded, in the order of the ids: the case's device storage only (an MXFP8 pool's scale blocks and a
    DSA case's MLA anchor, loaded beside it, are judged once the load is done)."""
    done_at = _layer_done_at(pool.case, built)
    by_transfer_layer: dict[int, list[tuple[str, int, torch.Tensor]]] = {}
    for component, layer, tensor in _device_layers(pool, built):
        at = done_at[layer]
        if at is not None:
            by_transfer_layer.setdefault(at, []).append((component, layer, tensor))
    return sorted(by_transfer_layer.items())


def _read_layer_by_layer(built: Built, layers: list[tuple[int, list[tuple[str, int, torch.Tensor]]]], producer: int,
                         rows: torch.Tensor) -> list[LayerRead]:
    """The load of `producer` consumed as the forward pass consumes it (the model runner's ``set_consumer``, then
    the device pool's ``wait_until(layer)`` before attention reads the layer): the load's rows of each of `layers`
    (``_layers_by_wait``), copied after the wait for the transfer layer that marks it loaded."""
    counter = built.controller.layer_done_counter
    reads = []
    with _forward_stream(built, rows.device):
        counter.set_consumer(producer)
        for at, loaded in layers:
            counter.wait_until(at)
            reads += [LayerRead(component, layer, at, tensor, tensor.index_select(0, rows))
                      for component, layer, tensor in loaded]
        counter.set_consumer(-1)  # as a batch without a load sets it: later reads wait on nothing
    return reads


def _stale_read(reads: list[LayerRead], rows: torch.Tensor) -> str:
    """'' if every layer the forward stream read holds what that layer holds once the whole load has finished,
    else the first that does not. The whole load is the runner's to compare with the oracle (the step's image or
    the final storages): a load that moves wrong bytes is reported there, against the oracle; what only the reads
    can show is a wait that returned before its layer was loaded."""
    if not reads:
        return ""
    _sync(rows.device)
    loaded = [r.tensor.index_select(0, rows) for r in reads]
    if torch.equal(torch.cat([r.read.view(-1) for r in reads]), torch.cat([t.view(-1) for t in loaded])):
        return ""
    for r, now in zip(reads, loaded, strict=True):
        differs = (r.read != now).nonzero()
        if len(differs):
            index, byte = (int(v) for v in differs[0])
            return (f"layer-wise read: device layer {r.layer} ({r.component.upper()}) as the forward stream read it "
                    f"after layer_done_counter.wait_until({r.waited_for}) differs from the layer once the load had "
                    f"finished in {len(differs)} bytes, the first at device row {int(rows[index])} byte {byte}")
    return ""


class RequestTable:
    """The HiSparse coordinator's request table (``hisparse_coordinator.py``): ``req_to_host_pool``, one row of host
    slots per request (-1 where none), int64 on the device, and ``req_to_host_pool_allocated_len``, each row's
    allocated length, int64 on the CPU. The pool's own ``alloc_paged_token_slots`` fills it and
    ``allocated_host_indices`` reads it. A row is the coordinator's longest context plus a page wide; no request
    here holds more than the pool's capacity, which stands for that context."""

    def __init__(self, case: Case, device: torch.device) -> None:
        width = case.host_slots + case.page_size
        self.slots = torch.full((sequence.REQUEST_ROWS, width), -1, dtype=torch.int64, device=device)
        self.allocated = torch.zeros(sequence.REQUEST_ROWS, dtype=torch.int64)

    def release(self, request: int) -> None:
        """The row emptied, as the coordinator's ``request_finished`` leaves it."""
        self.slots[request, :] = -1
        self.allocated[request] = 0

    def differs(self, step: sequence.Step) -> str:
        """'' if the table is the oracle's after `step`, else its first difference."""
        lengths = [len(row) for row in step.table]
        if self.allocated.tolist() != lengths:
            return f"req_to_host_pool_allocated_len is {self.allocated.tolist()}, the oracle's {lengths}"
        got = self.slots.cpu()
        want = torch.full_like(got, -1)
        for request, row in enumerate(step.table):
            want[request, : len(row)] = torch.tensor(row, dtype=torch.int64)
        differs = (got != want).nonzero()
        if not len(differs):
            return ""
        request, token = (int(v) for v in differs[0])
        return (f"req_to_host_pool row {request} holds {int(got[request, token])} at token {token}, the oracle's "
                f"{int(want[request, token])}")


def _request_step(built: Built, table: RequestTable, step: sequence.Step, start: int, layers: int) -> str:
    """One step of a request-slot sequence as the HiSparse coordinator makes it (the label names its calls): a
    back-up's or reservation's grant from the pool's ``alloc_paged_token_slots``, backed up with
    ``backup_from_device_all_layer`` (the kernel io backend; a grant of no tokens moves nothing, as the
    coordinator's ``_backup_device_locs_to_host`` skips it); a load from the request's row, layer by layer over the
    stage's global layer ids; a release through ``allocated_host_indices`` and the pool's ``free``. The grant, the
    freed slots, the table and the allocator's free count must be the oracle's (AssertionError otherwise), the
    grant before it is used."""
    pool, device = built.host_pool, table.slots.device
    count = len(step.host_indices)
    why = ""
    if step.op == sequence.RELEASE:
        freed = pool.allocated_host_indices(table.slots, step.request, table.allocated[step.request])
        label = f"allocated_host_indices of request {step.request} + free"
        why = _slots_differ("allocated_host_indices", freed, step.host_indices, device)
        if not why and freed.numel() > 0:
            pool.free(freed)
        table.release(step.request)
    elif step.op == sequence.LOAD:
        host = table.slots[step.request, step.start : step.start + count]
        rows = _indices(step.device_indices, device)
        for layer in range(start, start + layers):
            pool.load_to_device_per_layer(built.device_pool, host, rows, layer, io_backend="kernel")
        return f"load_to_device_per_layer of request {step.request}'s slots over the stage's layer ids"
    else:
        granted = pool.alloc_paged_token_slots(table.slots, table.allocated, step.request, step.start, count)
        label = f"alloc_paged_token_slots granted {_head(granted)}"
        why = _slots_differ("alloc_paged_token_slots", granted, step.host_indices, device)
        if not why and step.transfers:
            label += " + backup_from_device_all_layer"
            pool.backup_from_device_all_layer(built.device_pool, granted, _indices(step.device_indices, device),
                                              io_backend="kernel")
    why = why or table.differs(step)
    if not why and pool.available_size() != step.free:
        why = f"the host pool has {pool.available_size()} free slots, the oracle's free list {step.free}"
    if why:
        raise AssertionError(f"{step.label()} [{label}]: {why}")
    return label


def _slots_differ(call: str, got: torch.Tensor, want: tuple[int, ...], device: torch.device) -> str:
    """'' if `got` holds the slots `want` as the coordinator hands them to the transfer kernels (int64 on the
    request table's device), else how it differs."""
    if got.dtype != torch.int64 or got.device != device:
        return (f"{call} returned {got.dtype} on {got.device}, not the request table's int64 on {device} (the "
                f"coordinator hands it to the transfer kernels as it is)")
    values = got.tolist()
    if values == list(want):
        return ""
    at = next((i for i, (a, b) in enumerate(zip(values, want, strict=False)) if a != b), min(len(values), len(want)))
    got_at = values[at] if at < len(values) else "nothing"
    want_at = want[at] if at < len(want) else "nothing"
    return (f"{call} returned {len(values)} slots, the oracle's {len(want)}; the first difference at position {at}: "
            f"{got_at}, the oracle's {want_at}")


def _coordinator_load(controller: Any, built: Built, host: torch.Tensor, rows: torch.Tensor, start: int,
                      layers: int) -> None:
    """A HiSparse load as its coordinator makes it: the kernel io backend, global layer ids of the stage."""
    host_idx, dev_idx = controller.move_indices(host, rows)
    for layer in range(start, start + layers):
        built.host_pool.load_to_device_per_layer(built.device_pool, host_idx, dev_idx, layer, io_backend="kernel")


def _sidecars(built: Built) -> dict[str, Any]:
    """The ``extra_pools`` the radix tree hands the hybrid controller's ``write`` and ``load``: the DSA indexer's
    sidecar transfer (its indices from the KV transfer's), none for the other cases."""
    return {"extra_pools": dsa.sidecar_transfers(built.dsa)} if built.dsa is not None else {}


def _side_load(mods: Any, side: side_pools.SidePool, side_step: side_transfers.SideStep | None,
               rows: torch.Tensor) -> dict[str, Any]:
    """The ``extra_pools`` of a load that moves the side pool: its slots from the loaded entry's back-up, to the
    load's device rows (a load of an entry the sequence did not back up names no side pool)."""
    if side_step is None or not side_step.host_slots:
        return {}
    transfer = mods.PoolTransfer(name=side_pools.pool_name(mods, side),
                                 host_indices=_indices(side_step.host_slots, torch.device("cpu")), device_indices=rows)
    return {"extra_pools": [transfer]}


def _check_side_grant(step: sequence.Step, side: side_pools.SidePool, transfer: Any,
                      side_step: side_transfers.SideStep) -> None:
    """The side pool's host slots that the group's ``resolve_host_transfers`` granted must be the oracle's side
    allocator's grant (AssertionError otherwise)."""
    got = transfer.host_indices
    values = None if got is None else got.tolist()
    if values != list(side_step.host_slots):
        raise AssertionError(f"{step.label()}: the write's {side.name} side pool transfer was granted host slots "
                             f"{'none' if got is None else _head(got)} by resolve_host_transfers, the oracle's side "
                             f"allocator grants {list(side_step.host_slots)[:8]}")


def _release_side_slots(mods: Any, controller: Any, side: side_pools.SidePool, step: sequence.Step,
                        side_step: side_transfers.SideStep) -> None:
    """The evicted entry's side slots released as sglang releases independently allocated side-pool slots: the
    group's ``release_transfers``, which must free every one of them."""
    transfer = mods.PoolTransfer(name=side_pools.pool_name(mods, side),
                                 host_indices=_indices(side_step.host_slots, torch.device("cpu")))
    released = controller.mem_pool_host.release_transfers([transfer])
    if released != len(side_step.host_slots):
        raise AssertionError(f"{step.label()}: release_transfers freed {released} of the {side.name} side pool's "
                             f"{len(side_step.host_slots)} slots of the evicted entry")


def _foreign_layer_ids(built: Built) -> tuple[int, ...]:
    """Layer ids a guarded pool must ignore: -1, the first id past its target device layers (a draft id without
    is_draft), for the DSA indexer the target layers without index keys, and for a layer-sharded pool the layers
    of the stage its rank does not own."""
    skipped = dsa.skipped_layers(built.dsa) if built.dsa is not None else []
    shard = built.shard
    others = [] if shard is None else [layer for layer in range(shard.stage_layers)
                                       if not shard.start <= layer < shard.start + shard.owned]
    return (-1, built.device_pool.layer_num, *skipped, *others)


def _draft_and_foreign_loads(controller: Any, built: Built, host: torch.Tensor, rows: torch.Tensor,
                             io_backend: str, target: int, draft_pass: int, foreign: tuple[int, ...]) -> None:
    """The first `draft_pass` packed draft layers (is_draft=True, as the hybrid controller's draft transfers; their
    ids follow the `target` layers), then loads of the `foreign` layer ids, which the pool must ignore (none for a
    pool without a guard for them). The oracle expects the draft layers moved and nothing else touched.

    They run on the forward stream's stand-in, never on the legacy default stream: sglang's callers of
    ``load_to_device_per_layer`` (the L2 transfer engine on its H2D stream, the HiSparse coordinator's streams) never
    hand it that stream, and sgl_kernel's page_first_direct op (``cudaMemcpyBatchAsync``) fails there with
    ``invalid argument``."""
    host_idx, dev_idx = controller.move_indices(host, rows)
    pool = built.host_pool
    with _forward_stream(built, rows.device):
        for depth, draft_pool in enumerate(built.drafts[:draft_pass]):
            pool.load_to_device_per_layer(draft_pool, host_idx, dev_idx, target + depth, io_backend, is_draft=True)
        for layer in foreign:
            pool.load_to_device_per_layer(built.device_pool, host_idx, dev_idx, layer, io_backend)


def drive(mods: Any, buffers: Materialized, built: Built) -> None:
    """The case's sequence on `built` (objects_key(case) equal to theirs): the case's bytes in, the steps, the
    bytes back out (also when a step raises). Bytes outside the case's storages are checked after it: a side pool's
    must be unchanged, a DSA indexer's tail pages too, its MLA anchor's must be the oracle's, and so must an MXFP8
    pool's scale blocks (also checked after every transfer where the step images fit their budget)."""
    pool = buffers.pools[0]
    copy_in(pool, built)
    built.outside = outside_bytes(pool, built)
    built.outside.fill_and_snapshot()
    if built.side is not None:
        built.side.fill_and_snapshot()
    if built.dsa is not None:
        dsa.fill_and_snapshot(buffers.case, built.dsa)
    if built.mxfp8 is not None:
        built.mxfp8.fill_and_expect(buffers.case, per_step=_images_fit(buffers))
    try:
        run_sequence(mods, buffers, built)
    finally:
        _sync(buffers.device)
        copy_out(pool, built)
    why = built.outside.changed()
    if built.side is not None:
        why = why or (built.side.differs() if side_transfer(buffers.case) else built.side.changed())
    why = why or (dsa.check(buffers.case, built.dsa) if built.dsa is not None else "")
    why = why or (built.mxfp8.check_final() if built.mxfp8 is not None else "")
    if why:
        raise AssertionError(why)
