"""How ``sglang-hicache`` drives sglang: each host pool class through its own constructor, the real controller
constructed as the scheduler constructs it (``HybridCacheController`` over an anchor-only ``HostPoolGroup``, over the
anchor and a side pool, or over a DSA indexer's MLA anchor and the indexer; or ``HiCacheController`` over the pool),
and a case's sequence of operations through the controller's own ``write`` / ``load`` + ``start_loading`` /
``evict_host`` (with the DSA indexer's sidecar transfer as ``extra_pools``, or a side pool's transfer with its
own host allocation under ``side_transfer``: the side pools in kernels/sglang_hicache_side.py, their part of each
step in kernels/sglang_hicache_side_transfers.py). The MXFP8 pool's scale blocks, which
are no storage of the case, are checked against the oracle after every transfer (kernels/sglang_hicache_mxfp8.py).
The objects built for a case are a ``Built`` (kernels/sglang_hicache_objects.py); the case's bytes go in and out of
sglang's tensors through kernels/sglang_hicache_tensors.py.

Stand-ins (each is the least the controller needs from outside HiCache):

* ``DeviceAllocatorStandIn`` for the scheduler's ``token_to_kv_pool_allocator`` (kernels/sglang_hicache_objects.py):
  it grants the device rows the sequence names for a load and records the transfer-done event the controller hands
  it, which must be each write's and load's ack finish event.
* ``tp_group=None`` and a fresh ``threading.Event`` for ``load_cache_event``: only the storage (L3) threads use
  them, and no storage backend is attached.
* The Mamba state pool's device pool (kernels/sglang_hicache_mamba.py): the host pool reads only its
  ``MambaStateBufferInfo`` (sglang's class, built over the case's device tensors).
* The layer-sharded MLA device pool and the unified pool's second sub-pool (kernels/sglang_hicache_device.py).
* The DSA indexer's device pool (kernels/sglang_hicache_dsa.py): ``DSATokenToKVPool``'s constructor needs the
  model's DSA configuration; a stand-in holds the index buffers beside a real ``MLATokenToKVPool`` for the KV rows.
* The HiSparse coordinator (``HiSparseCoordinator``), for the HiSparse MHA pool (kernels/sglang_hicache_hisparse.py):
  its loads are that coordinator's loop, and a case with the ``requests`` knob holds its host slots in the
  coordinator's request table.
* The draft pass of a load under the base controller: it loads the target model's layers only; the hybrid
  controller's draft transfers call the host pool's ``load_to_device_per_layer(..., is_draft=True)`` for each
  packed draft layer, which this module does after each load of the base controller, with the controller's own
  index placement. Under the hybrid controller (``controller=hybrid``) the controller makes them itself.

Host indices of every back-up are granted by the pool's own allocator inside the controller's ``write`` (or, under
request slots, inside ``alloc_paged_token_slots``); the allocator's free list is set up first through its own
``alloc``/``free`` (oracles/sequence.py, ``prologue``), so the oracle knows the grants without reading them back.
The pools' ``prepare_transfer_indices`` hooks run where the controller's transfer engine runs them.

A controller load is consumed as the forward pass consumes it, layer by layer after ``wait_until`` on the load's
producer id, one load in two submitted with sglang's H2D delay knob set (kernels/sglang_hicache_layer_read.py).
"""

from __future__ import annotations

import threading
import types
from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention, Case, KVDtype, PoolSpec
from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels import sglang_hicache_dsa as dsa
from hicache_fuzz.kernels import sglang_hicache_hisparse as hisparse
from hicache_fuzz.kernels import sglang_hicache_layer_read as layer_read
from hicache_fuzz.kernels import sglang_hicache_mamba as mamba
from hicache_fuzz.kernels import sglang_hicache_mxfp8 as mxfp8
from hicache_fuzz.kernels import sglang_hicache_pagerow as pagerow
from hicache_fuzz.kernels import sglang_hicache_side as side_pools
from hicache_fuzz.kernels import sglang_hicache_side_transfers as side_moves
from hicache_fuzz.kernels import sglang_hicache_tensors as tensors
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_hicache_objects import K_ONLY, Built, forward_stream, head, indices, sync
from hicache_fuzz.kernels.sglang_hicache_settings import (
    BASE,
    HYBRID,
    TOKEN_MAJOR,
    LayerShard,
    controller_kind,
    device_rows,
    device_target_layers,
    k_only_heads,
    layer_shard,
    side_transfer,
    skip_topk_layers,
)
from hicache_fuzz.kernels.sglang_hicache_settings import case_settings as settings
from hicache_fuzz.kernels.sglang_hicache_settings import side_pools as side_pool_classes
from hicache_fuzz.oracles import sequence, side_transfers
from hicache_fuzz.oracles.pool_layouts import pool_class

# Pools without a guard for layer ids outside them, or whose guard raises (their controllers never pass such
# ids): no foreign loads.
UNGUARDED = hisparse.COORDINATOR_LOADED | {K_ONLY, mamba.MAMBA} | pagerow.PAGE_ROW_CLASSES
DTYPES = {KVDtype.BF16: torch.bfloat16, KVDtype.FP16: torch.float16, KVDtype.FP32: torch.float32,
          KVDtype.FP8: torch.float8_e4m3fn}
WRITE_POLICY = "write_through"


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


def objects_key(case: Case, device: torch.device) -> tuple[object, ...]:
    """What sglang's objects of a case are built from: cases with equal keys can share them (index variants of
    one geometry), since every run resets the allocator and copies all bytes in (the request table is made per
    run)."""
    knobs = tuple((k, v) for k, v in case.tuning if k not in (sequence.OPS_KEY, sequence.REQUESTS_KEY))
    return (case.page_size, case.layers, case.device_rows, case.host_slots, case.layout, case.pools, knobs,
            str(device))


def destroy(built: Built) -> None:
    """Unregister the host pool's pinned buffers now rather than at process exit."""
    for pool in (built.host_pool, *(side.host_pool for side in built.sides),
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
    packed drafts) and host pool, as for an MLA case (layer-sharded as the MLA pool of a layer_shard case), then the
    indexer over them (kernels/sglang_hicache_dsa.py)."""
    spec, skip, shard = case.pools[0], skip_topk_layers(case), layer_shard(case)
    anchor = _device_pool(mods, case, spec, len(skip), device, start)
    if shard is not None:
        anchor = devices.shard_mla_pool(anchor, shard)
    anchor_drafts = [_device_pool(mods, case, spec, 1, device, 0) for _ in range(drafts)]
    anchor_host = _mla_host(mods, case, anchor, anchor_drafts, start, shard)
    group = dsa.build_indexer(case, anchor, anchor_drafts, anchor_host, skip)
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
    names = side_pool_classes(case)
    built.sides = side_pools.build_sides(mods, case, names, built.host_pool, DTYPES[case.pools[0].dtype],
                                         built.device_pool.device, start, target, moves=side_transfer(case))
    entries = [entry, *(side_pools.side_entry(mods, side, target) for side in built.sides)]
    return mods.HybridCacheController(built.allocator, mods.HostPoolGroup(entries), case.page_size, None,
                                      threading.Event(), write_policy=WRITE_POLICY, io_backend=io_backend,
                                      transfer_layer_id_max=target)


def prepare_allocator(case: Case, host_pool: Any) -> None:
    """One grant of the whole pool, then the prologue's frees (oracles/sequence.py): the free list the oracle
    assumes."""
    whole = host_pool.alloc(host_pool.available_size())
    if whole is None or len(whole) != case.host_slots:
        raise AssertionError(f"host pool allocator did not grant its whole capacity of {case.host_slots} slots")
    for chunk in sequence.prologue(case):
        host_pool.free(indices(chunk, torch.device("cpu")))


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
    table = hisparse.RequestTable(case, device) if sequence.request_slots(case) else None
    sides = built.sides if side_transfer(case) else []
    side_steps = side_transfers.side_steps(case, len(sides)) if sides else []
    for side in sides:  # each side allocator as the oracle's starts
        side.hold_outside(case, len(sides))
    for position, step in enumerate(sequence.plan_steps(case)):
        side_step = side_steps[position] if sides else None
        if table is not None:
            label = hisparse.request_step(built, table, step, _start, case.layers)
            if not step.transfers:
                continue
            sync(device)
        elif step.op == sequence.EVICT:
            controller.evict_host(indices(step.host_indices, torch.device("cpu")))
            if side_step is not None and any(side_step.host_slots):
                side_moves.release_side_slots(mods, controller, sides, step, side_step)
            side_moves.check_sides(step, "evict_host + release_transfers", sides, side_step)
            continue
        elif step.op == sequence.REFUSED:
            side_moves.refused_backup(mods, built, sides, step, side_step, device)
            continue
        elif step.op == sequence.BACKUP:
            allocator.done_events.clear()
            rows = indices(step.device_indices, device)
            if side_step is not None:
                # queued (flush=False) so that the side pools' grants are checked before the copies use them
                transfers = side_moves.side_writes(mods, sides, rows)
                granted = controller.write(rows, extra_pools=transfers, flush=False)
                if granted is not None:
                    side_moves.check_side_grants(step, sides, transfers, side_step)
                    controller.start_writing()
            else:
                granted = controller.write(rows, **_sidecars(built))
            if granted is None:
                raise AssertionError(f"{step.label()}: the host allocator refused {len(step.device_indices)} slots "
                                     f"it has free")
            ack = controller.ack_write_queue.pop()
            ack.finish_event.synchronize()
            label = f"{type(controller).__name__}.write granted host slots {head(granted)}"
            why = allocator.done_event_differs(controller, "write", ack.finish_event)
            if why:
                raise AssertionError(f"{step.label()} [{label}]: {why}")
        else:
            host = indices(step.host_indices, torch.device("cpu"))
            rows = indices(step.device_indices, device)
            if _name in hisparse.COORDINATOR_LOADED:
                # its coordinator loads layer after layer on the current stream, no producer to consume: nothing
                # to read layer by layer
                hisparse.coordinator_load(controller, built, host, rows, _start, case.layers)
                label = "load_to_device_per_layer over the stage's layer ids (the HiSparse coordinator's loop)"
            else:
                label = f"{type(controller).__name__}.load + start_loading"
                allocator.grants.append(rows)
                # before the submission: the reads must follow it closely
                layers = layer_read.layers_by_wait(built, pool)
                controller.load(host, **(side_moves.side_load(mods, sides, side_step, rows) if sides
                                         else _sidecars(built)))
                allocator.done_events.clear()
                with layer_read.h2d_delay(layer_read.h2d_delayed(case, step)):
                    producer = controller.start_loading()
                reads = layer_read.read_layer_by_layer(built, layers, producer, rows)
                ack = controller.ack_load_queue.pop()
                ack.finish_event.synchronize()
                why = (layer_read.stale_read(reads, rows)
                       or allocator.done_event_differs(controller, "load", ack.finish_event))
                if why:
                    raise AssertionError(f"{step.label()} [{label}]: {why}")
                # the hybrid controller loads the packed draft layers itself; the base one leaves them to the
                # draft pass
                own_drafts = 0 if controller_kind(case) == HYBRID else drafts
                _draft_and_foreign_loads(controller, built, host, rows, io_backend, device_target_layers(case),
                                         own_drafts, () if _name in UNGUARDED else _foreign_layer_ids(built))
            sync(device)
        side_moves.check_sides(step, label, sides, side_step, device)
        if built.mxfp8 is not None:
            sync(device)
            why = built.mxfp8.check_step()
            if why:
                raise AssertionError(f"{step.label()} [{label}]: {why}")
        if record:
            sync(device)
            tensors.copy_out(pool, built)
            buffers.step_images.append((label, {s.key: s.raw.to(device, copy=True) for s in buffers.storages()}))


# Step images are whole-storage copies, one per transfer, and the runner makes as many for the oracle: a sequence
# of large storages (the scale tier reaches gigabytes) is compared at its end only, as every other case.
STEP_IMAGE_BUDGET = 1 << 30


def _images_fit(buffers: Materialized) -> bool:
    transfers = sum(1 for _ in sequence.transfer_steps(buffers.case))
    return sum(s.raw.numel() for s in buffers.storages()) * transfers <= STEP_IMAGE_BUDGET


def _sidecars(built: Built) -> dict[str, Any]:
    """The ``extra_pools`` the radix tree hands the hybrid controller's ``write`` and ``load``: the DSA indexer's
    sidecar transfer (its indices from the KV transfer's), none for the other cases."""
    return {"extra_pools": dsa.sidecar_transfers(built.dsa)} if built.dsa is not None else {}


def _foreign_layer_ids(built: Built) -> tuple[int, ...]:
    """Layer ids a guarded pool must ignore: -1, the first id past its target device layers (a draft id without
    is_draft), for the DSA indexer the target layers without index keys, and for a layer-sharded pool (the DSA
    indexer's included) the layers of the stage its rank does not own."""
    skipped = dsa.skipped_layers(built.dsa) if built.dsa is not None else []
    shard = built.dsa.shard if built.dsa is not None else built.shard
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
    with forward_stream(built, rows.device):
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
    tensors.copy_in(pool, built)
    built.outside = tensors.outside_bytes(pool, built)
    built.outside.fill_and_snapshot()
    for side in built.sides:
        side.fill_and_snapshot()
    if built.dsa is not None:
        dsa.fill_and_snapshot(buffers.case, built.dsa)
    if built.mxfp8 is not None:
        built.mxfp8.fill_and_expect(buffers.case, per_step=_images_fit(buffers))
    try:
        run_sequence(mods, buffers, built)
    finally:
        sync(buffers.device)
        tensors.copy_out(pool, built)
    why = built.outside.changed()
    for side in built.sides:
        why = why or (side.differs() if side_transfer(buffers.case) else side.changed())
    why = why or (dsa.check(buffers.case, built.dsa) if built.dsa is not None else "")
    why = why or (built.mxfp8.check_final() if built.mxfp8 is not None else "")
    if why:
        raise AssertionError(why)
