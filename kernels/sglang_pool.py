"""sglang's real host pools, HostPoolGroup and the controller's index placement, on real device pools.

For every pool of the case the backend builds a real device pool (``MHATokenToKVPool`` /
``MLATokenToKVPool``, ``size = device_rows - page_size`` so it has exactly ``device_rows`` rows) and a real host
pool (``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``, layout layer_first or page_first, pinned,
``host_token_capacity = host_slots``), copies the harness's storages into them, lets sglang
move the data, and copies both pools back into the harness's storages for the byte comparison. Several pools
form a ``HostPoolGroup`` (anchor first). ``PoolSpec.write_back_jit = False`` switches the real pool's
``can_use_write_back_jit`` off after construction, modelling a side pool without the staged path (K-only,
DSA indexer or DeepSeek-V4 pools on ROCm).

The io backend (tuning knob ``io_backend``, as a server's ``--hicache-io-backend``) is the controller's and every
transfer's: ``kernel`` (the JIT kernels, or sgl_kernel's AOT ops for the rows and pools they do not take) or
``direct`` (sgl_kernel's ``transfer_kv_direct`` on layer_first); page_first moves with ``kernel`` only, so a
page_first case takes ``kernel`` whatever the knob says (``sglang_pool_calls.io_backend``).

Index placement is the controller's (tuning knob ``controller``):

* ``base``: ``HiCacheController._move_write_operation`` itself (called unbound on a stand-in controller) for
  write-back - host indices stay on the CPU only for kernel + page_first + the facade's
  ``can_use_write_back_jit`` - and ``move_indices`` for load-back;
* ``hybrid``: the HybridCacheController's per-pool routing (re-implemented from
  hybrid_cache_controller.py:845-863, 1518-1602): with page_first + kernel and some child on the staged path,
  each pool with ``can_use_write_back_jit`` gets CPU host indices and the others CUDA ones.

With the direct io backend ``move_indices`` keeps both index lists on the CPU (layer_first: host indices sorted,
device indices in the same order), and every placement comes down to it.

So the case's index lists are what the radix tree hands the controller (host indices from the host
allocator, CPU int64; device indices CUDA int64), and the contract is the REFERENCE one:
every production-shaped input must be moved correctly; a rejection is a finding. Inputs production never
produces (out-of-range, duplicate, partial or irregular pages, empty, int32, pageable pools) are unsupported.
The base controller with a group whose children disagree reproduces the "index on the wrong device" class:
the facade says False, every host index goes to CUDA, the anchor still takes its staged path and its
TensorMatcher rejects the CUDA host indices.

Load-back of all layers calls ``load_to_device_per_layer`` for each layer, as the controller does.

What the backend hands sglang (the pools' constructor calls, the placement rule, the transfer calls) is defined
once, in kernels/sglang_pool_calls.py; a standalone reproducer prints the same definitions.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    PoolSpec,
    Scope,
    page_runs_contiguous,
)
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_jit import SglangBackend, gpu_space
from hicache_fuzz.kernels.sglang_pool_calls import (
    HOST_MHA,
    HOST_MLA,
    MEMORY_POOL,
    Constructor,
    Placement,
    device_buffers,
    io_backend,
    placement,
    pool_construction,
    pool_transfers,
)
from hicache_fuzz.oracles import pool_layouts
from hicache_fuzz.oracles.contract import EntryPoint, Platform

POOL_ROW_MENU = (128, 256, 512, 576, 1024, 1152, 2048)
POOL_ROTATING_ROWS = (640, 768, 1280, 1536, 2560)  # compiled rows beyond the start menu, sampled per seed
CONTROLLERS = ("hybrid", "base")


def aot_available() -> tuple[bool, str]:
    from hicache_fuzz.kernels.sglang_aot import aot_status

    return aot_status()


# What a prediction for another machine assumes about sgl_kernel's AOT ops (see aot_state).
AOT_ASSUMED = ("assumed callable: the modelled accelerator is not this machine's, and sglang's server runs with "
               "sgl_kernel installed")


def aot_state(platform: Platform) -> tuple[bool, str]:
    """(callable, why) for sgl_kernel's AOT ops on `platform`. Probed where this machine has the platform's
    accelerator (a campaign's workers); a prediction for another machine (``fuzz --dry-run --platform cuda`` on a
    CPU-only machine) cannot probe it and assumes the production set-up, in which sgl_kernel is installed beside
    sglang: the pools' AOT paths and the ``direct`` io backend then count as running cases, as they do on the
    GPU."""
    here = torch.cuda.is_available() and (platform.kind == "rocm") == bool(getattr(torch.version, "hip", None))
    if here:
        return aot_available()
    return True, AOT_ASSUMED


def aot_assumptions(platform: Platform) -> tuple[str, ...]:
    """What a prediction for `platform` assumes about the AOT ops (a backend's ``prediction_assumptions``)."""
    callable_, why = aot_state(platform)
    return (f"sgl_kernel's AOT ops: {why}",) if callable_ and why == AOT_ASSUMED else ()


def pool_paths(case: Case, spec: PoolSpec, platform: Platform) -> str:
    """The implementation sglang's pool picks for this pool (mha.py:579-711, 424-564; mla.py:696-1143)."""
    if io_backend(case) == pool_layouts.DIRECT:
        return "aot:" + direct_op(case)
    row = spec.row_bytes(spec.components[0])
    mla = spec.attention is Attention.MLA
    tma = common.tma_selected(row, case.page_size, platform, None)
    jit = tma or common.register_row_ok(row, platform)
    jit_path = common.TMA if tma else common.REGISTER
    if case.direction is Direction.WRITE_BACK:
        if case.layout is HostLayout.LAYER_FIRST:
            return jit_path if jit else "aot:transfer_kv_all_layer" + ("_mla" if mla else "")
        if write_back_jit(case, spec):
            return common.STAGED
        return "aot:transfer_kv_all_layer" + ("_mla" if mla else "") + "_lf_pf"
    if jit:
        return jit_path
    op = "transfer_kv_per_layer" + ("_mla" if mla else "")
    return "aot:" + op + ("_pf_lf" if case.layout is HostLayout.PAGE_FIRST else "")


def direct_op(case: Case) -> str:
    """The sgl_kernel op the MHA and MLA pools call with the direct io backend (mha.py:511-540, 675-694;
    mla.py:766-786, 1088-1107): one op for both directions on layer_first, one per direction on
    page_first_direct."""
    if case.layout is HostLayout.LAYER_FIRST:
        return "transfer_kv_direct"
    if case.direction is Direction.WRITE_BACK:
        return "transfer_kv_all_layer_direct_lf_pf"
    return "transfer_kv_per_layer_direct_pf_lf"


def write_back_jit(case: Case, spec: PoolSpec) -> bool:
    """The pool's can_use_write_back_jit: page_first, staged row rule (E % 16), and the spec's flag."""
    return (
        case.layout is HostLayout.PAGE_FIRST
        and spec.write_back_jit
        and all(spec.row_bytes(c) % 16 == 0 for c in spec.components)
    )


def placements(case: Case) -> list[tuple[IndexDevice, IndexDevice]]:
    """(host index device, device index device) each pool receives after the controller."""
    # move_indices: kernel io moves host indices to CUDA and leaves device indices; direct io takes both on the CPU
    direct = io_backend(case) == pool_layouts.DIRECT
    moved = (IndexDevice.CPU, IndexDevice.CPU) if direct else (IndexDevice.DEVICE, case.device_index.device)
    given = (case.host_index.device, case.device_index.device)
    cpu_host = (IndexDevice.CPU, case.device_index.device)
    rule = placement(case)
    flags = [write_back_jit(case, p) for p in case.pools]  # all False off page_first
    if rule is Placement.BASE_WRITE:
        return [given if all(flags) else moved for _ in case.pools]  # the group facade is all(children)
    if rule is Placement.MOVE_ALL or not any(flags):
        return [moved for _ in case.pools]
    return [cpu_host if flag else moved for flag in flags]


def expected_run(case: Case, platform: Platform) -> tuple[list[str], str | None]:
    """Paths of the pools that run, in order, and why the run is expected to stop (None if it completes)."""
    paths: list[str] = []
    for spec, (host_dev, _) in zip(case.pools, placements(case), strict=True):
        path = pool_paths(case, spec, platform)
        paths.append(path)
        if path == common.STAGED and host_dev is IndexDevice.DEVICE:
            return paths, f"pool {spec.name}: staged write-back receives CUDA host indices"
    return paths, None


class SglangPoolBackend(SglangBackend):
    name = "sglang-pool"
    description = (
        "sglang MHA/MLA host pools (layer_first with kernel or direct io, page_first with kernel io) + "
        "HostPoolGroup + controller index placement, on real device pools"
    )
    supported_layouts = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST)
    # No geometry_setup_variants of its own: a pool case's cost is its per-case work (copies into and out of
    # sglang's pool objects), not the build of the pools, so more variants per geometry only slow a campaign. A
    # pool case costs several times a JIT case; every 6th index gives it about the worker time each other
    # backend gets (docs/engine.md, "Backend fan-out").
    relative_case_cost = 6
    coverage_exemptions: ClassVar[Mapping[str, str]] = MappingProxyType({
        "index_dtype=int32": "the pools are fuzzed with production-shaped inputs (reference contract: a "
        "rejection is a finding) and the controller only ever gets int64 indices: the allocators hand out "
        "int64, and the radix caches cast req_to_token's int32 rows to int64 before they become tree values "
        "(sglang 0.5.23 radix_cache.py:472, unified_radix_cache.py:1234); int32 index tensors are covered at "
        "the kernel entry points by sglang-jit/-tma/-staged/-page-unified",
    })

    def probe(self, platform: Platform) -> Availability:
        base = common.probe_sglang(platform)
        if not base.available:
            return base
        try:
            _pool_modules()
        except Exception as exc:
            return Availability(False, f"sglang host-pool modules do not import: {type(exc).__name__}: {exc}")
        ok, why = aot_available()
        aot = f"; AOT fallbacks: {why}" if ok else f"; AOT fallbacks unavailable ({why})"
        return Availability(True, base.reason + aot)

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        return gpu_space(
            space,
            layouts=self.supported_layouts,
            rows=POOL_ROW_MENU,
            rotating=POOL_ROTATING_ROWS,
            max_pools=3,
            index_dtypes=(IndexDtype.INT64,),
            # what the allocators hand the controller: host indices on the CPU, device indices on the GPU
            host_index_devices=(IndexDevice.CPU,),
            device_index_devices=(IndexDevice.DEVICE,),
            # every io backend as often (as sglang-hicache's knob: either is a production set-up)
            tuning_menus=(("controller", CONTROLLERS), ("io_backend", pool_layouts.IO_BACKENDS)),
            invalid_rate=0.0,
            irregular_rate=0.0,
            backend=self.name,
        )

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        reason = self.common_unsupported(case, platform)
        if reason:
            return reason
        if case.scope is Scope.ONE_LAYER and case.direction is Direction.WRITE_BACK:
            return "host pools back up all layers at once"
        if case.host_allocator is HostAllocator.PAGEABLE:
            return "sglang pins host pools on CUDA/ROCm"
        if case.host_index.dtype is not IndexDtype.INT64 or case.device_index.dtype is not IndexDtype.INT64:
            return "sglang's allocators hand out int64 indices"
        if case.device_index.device is not IndexDevice.DEVICE or case.host_index.device is not IndexDevice.CPU:
            return "production inputs: host indices from the host allocator (CPU), device indices on the GPU"
        if case.tuning_value("controller", "hybrid") not in CONTROLLERS:
            return f"unknown controller {case.tuning_value('controller')!r}"
        if io_backend(case) not in pool_layouts.IO_BACKENDS:
            return f"unknown io_backend {case.tuning_value('io_backend')!r}"
        n, ps = case.n, case.page_size
        h, d = case.host_indices, case.device_indices
        if n == 0 or len(d) != n or n % ps:
            return "the controller moves whole, non-empty pages with equal index lists"
        if (
            any(not 0 <= x < case.host_slots for x in h)
            or any(not ps <= x < case.device_rows for x in d)
            or len(set(h)) != n
            or len(set(d)) != n
        ):
            return "indices outside the allocators' ranges or repeated (kernels do not bounds-check)"
        if not (page_runs_contiguous(h, ps) and page_runs_contiguous(d, ps)) or any(x % ps for x in h[::ps]):
            return "the allocators hand out whole aligned pages"
        if case.device_rows <= ps or case.device_rows % ps:
            return "a device pool has size + page_size rows, a multiple of the page size"
        paths, _ = expected_run(case, platform)
        ok, why = aot_state(platform)
        aot = [p for p in paths if p.startswith("aot:")]
        if aot and not ok:
            return f"reaches the AOT op {aot[0][4:]}, unavailable here ({why})"
        return None

    def prediction_assumptions(self, platform: Platform) -> tuple[str, ...]:
        return aot_assumptions(platform)

    def coverage_labels(self, case: Case) -> Mapping[str, str | int | bool]:
        return MappingProxyType({"io_backend": io_backend(case)})

    def plan(self, case: Case, platform: Platform) -> Plan:
        paths, _ = expected_run(case, platform)
        return Plan(EntryPoint.REFERENCE, common.path_of(paths))

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Any]:
        from hicache_fuzz.kernels.sglang_jit import SglangJitBackend
        from hicache_fuzz.kernels.sglang_staged import SglangStagedBackend

        return SglangJitBackend().compile_jobs(space, platform) + SglangStagedBackend().compile_jobs(space, platform)

    def run(self, buffers: Materialized) -> str:
        mods = _pool_modules()
        case = buffers.case
        built: list[tuple[Any, Any, Any]] = []  # (pool buffers, device pool, host pool)
        # sglang's pool objects of the previous case are used again when the geometry is the same (index
        # variants): building them costs pinned allocations and device pools, more than the transfer itself.
        # Their contents are overwritten from the case's storages below, so nothing carries over.
        pairs = self._pool_objects(mods, case, buffers)
        keep = False
        try:
            for pool, (device_pool, host_pool) in zip(buffers.pools, pairs, strict=True):
                _allocator_round_trip(case, host_pool)
                _copy_in(pool, device_pool, host_pool)
                built.append((pool, device_pool, host_pool))
            host_facade: Any = built[0][2]
            if len(built) > 1:
                entries = [
                    mods.PoolEntry(
                        name=p.spec.name,
                        host_pool=h,
                        device_pool=d,
                        layer_mapper=lambda x: x,
                        is_primary_index_anchor=(i == 0),
                    )
                    for i, (p, d, h) in enumerate(built)
                ]
                host_facade = mods.HostPoolGroup(entries)
            placed = _place(mods, case, host_facade, [h for _, _, h in built], buffers)
            io = io_backend(case)
            with common.recording() as events:
                try:
                    for (_pool, device_pool, host_pool), (host_idx, dev_idx) in zip(built, placed, strict=True):
                        for method, layer in pool_transfers(case):
                            transfer(host_pool, method, layer, device_pool, host_idx, dev_idx, io)
                finally:
                    if buffers.device.type != "cpu":
                        torch.cuda.synchronize(buffers.device)
                    for pool, device_pool, host_pool in built:
                        _copy_out(pool, device_pool, host_pool)
            keep = True  # only a call that returned normally hands its objects on (a refusal may be a fault)
            return common.path_of(events)
        finally:
            if keep:
                self._kept = (_objects_key(case, buffers), pairs)
            else:
                _destroy(pairs)

    _kept: tuple[tuple[object, ...], list[tuple[Any, Any]]] | None = None

    def _pool_objects(self, mods: Any, case: Case, buffers: Materialized) -> list[tuple[Any, Any]]:
        """(device pool, host pool) per pool of the case: the kept ones if the geometry matches, else new."""
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == _objects_key(case, buffers):
            return kept[1]
        if kept is not None:
            _destroy(kept[1])
        pairs: list[tuple[Any, Any]] = []
        try:
            with common.registrations_released_on_failure():
                for pool in buffers.pools:
                    pairs.append(_build(mods, case, pool.spec, buffers.device))
        except BaseException:
            _destroy(pairs)
            raise
        return pairs


def transfer(host_pool: Any, method: str, layer: int | None, device_pool: Any, host_idx: Any, dev_idx: Any,
             io: str = pool_layouts.KERNEL) -> None:
    """One of pool_transfers' calls on a host pool, with the io backend `io` (the case's io_backend)."""
    layer_arg = () if layer is None else (layer,)
    getattr(host_pool, method)(device_pool, host_idx, dev_idx, *layer_arg, io)


# The controller takes the host indices of a write-back from the host pool's own allocator (HostKVCache.alloc),
# which this backend otherwise bypasses (the case brings its indices). So every case also asks each host pool for
# the case's token count and gives it back: a whole number of pages must be granted, as distinct slots of the pool;
# an allocator that refuses or hands out anything else fails the case (a page check that refuses every odd number
# of pages shows here). Then the freed slots must be free: freeing them again is refused (sglang's double-free
# check), and the whole pool can be granted and given back (a `free` that leaves the last freed slot marked used is
# seen only by a later grant of that slot). Nothing is moved.
def _allocator_round_trip(case: Case, host_pool: Any) -> None:
    granted = host_pool.alloc(case.n)
    if granted is None:
        raise AssertionError(f"host pool allocator refused {case.n} slots of a pool of {case.host_slots}")
    try:
        slots = granted.tolist()
        if len(slots) != case.n or len(set(slots)) != case.n or not all(0 <= s < case.host_slots for s in slots):
            raise AssertionError(f"host pool allocator granted {len(slots)} slots for {case.n} (distinct "
                                 f"{len(set(slots))}, range {min(slots, default=0)}..{max(slots, default=0)} of "
                                 f"{case.host_slots})")
    finally:
        host_pool.free(granted)
    if case.n:
        _expect_double_free_refused(host_pool, granted)
    _grant_whole_pool(case, host_pool)


def _expect_double_free_refused(host_pool: Any, freed: Any) -> None:
    try:
        host_pool.free(freed)
    except AssertionError as exc:
        if "Double-free" not in str(exc):
            raise
        return
    raise AssertionError(f"host pool allocator accepted a second free of {len(freed)} slots it had just freed")


def _grant_whole_pool(case: Case, host_pool: Any) -> None:
    """Every slot is free between cases: the pool's whole capacity, in whole pages, must be granted at once."""
    whole = host_pool.available_size() // case.page_size * case.page_size
    if whole < case.host_slots // case.page_size * case.page_size:
        raise AssertionError(f"host pool allocator has {host_pool.available_size()} of {case.host_slots} slots "
                             f"free after every grant was given back")
    granted = host_pool.alloc(whole)
    if granted is None:
        raise AssertionError(f"host pool allocator refused its whole free capacity ({whole} slots)")
    host_pool.free(granted)


def _objects_key(case: Case, buffers: Materialized) -> tuple[object, ...]:
    """What sglang's pool objects of a case are built from."""
    return (case.page_size, case.layers, case.device_rows, case.host_slots, case.layout, case.pools,
            str(buffers.device))


def _destroy(pairs: list[tuple[Any, Any]]) -> None:
    for _, host_pool in pairs:
        destroy = getattr(host_pool, "destroy", None)
        if destroy is not None:
            destroy()


# ---- sglang plumbing (lazy) ---------------------------------------------------------------------------------


def _load_pool_modules() -> Any:
    # The pool modules bind ``from sgl_kernel.kvcacheio import transfer_kv_*`` at import: make the AOT ops
    # callable first (real sglang-kernel, else this project's build) so the real pool code reaches them.
    aot_available()
    import sglang.srt.mem_cache.memory_pool as memory_pool
    import sglang.srt.mem_cache.pool_host.mha as mha
    import sglang.srt.mem_cache.pool_host.mla as mla
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry

    _rebind_placeholder_ops(mha)
    _rebind_placeholder_ops(mla)
    common.spy_aot_ops(mha)
    common.spy_aot_ops(mla)
    return types.SimpleNamespace(
        by_module={MEMORY_POOL: memory_pool, HOST_MHA: mha, HOST_MLA: mla},
        HiCacheController=HiCacheController,
        HostPoolGroup=HostPoolGroup,
        PoolEntry=PoolEntry,
    )


def _rebind_placeholder_ops(module: Any) -> None:
    """If the pool module was imported before the AOT ops were made callable (so it bound an import-only
    stand-in's placeholders), point those names at the now callable ``sgl_kernel.kvcacheio`` functions."""
    import sgl_kernel.kvcacheio as kvcacheio

    for name in dir(module):
        bound = getattr(module, name)
        if name.startswith("transfer_kv") and type(bound).__name__ in ("Placeholder", "MissingOp"):
            replacement = getattr(kvcacheio, name, None)
            if callable(replacement) and type(replacement).__name__ not in ("Placeholder", "MissingOp"):
                setattr(module, name, replacement)


_MODS: Any = None


def _pool_modules() -> Any:
    global _MODS
    if _MODS is None:
        common.hicache()
        _MODS = _load_pool_modules()
    return _MODS


def _build(mods: Any, case: Case, spec: PoolSpec, device: torch.device) -> tuple[Any, Any]:
    made = pool_construction(case, spec)
    device_pool = made.device_pool.call(_class(mods, made.device_pool), device)
    info = device_pool.get_device_pool_infos()[0].buffer_info
    host_pool = made.host_pool.call(_class(mods, made.host_pool), device, info)
    if not made.write_back_jit:
        host_pool.can_use_write_back_jit = False
    return device_pool, host_pool


def _class(mods: Any, constructor: Constructor) -> Any:
    return getattr(mods.by_module[constructor.module], constructor.cls)


def _device_layers(spec: PoolSpec, device_pool: Any, component: str) -> Any:
    return getattr(device_pool, device_buffers(spec)[spec.components.index(component)])


def _layer_pairs(pool: Any, device_pool: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(ours, theirs): every device layer of every component of one pool, as uint8 (device_rows, row_bytes)
    views of the case's storage and of sglang's per-layer tensors, in the same order."""
    spec, case = pool.spec, pool.case
    ours: list[torch.Tensor] = []
    theirs: list[torch.Tensor] = []
    for c in spec.components:
        layers = _device_layers(spec, device_pool, c)
        for layer in range(case.layers):
            ours.append(pool.device_layer(c, layer))
            theirs.append(layers[layer].view(torch.uint8).view(case.device_rows, -1))
    return ours, theirs


# One _foreach_copy_ per direction instead of a copy_ per layer and component: up to 256 launches and their
# Python a pool case (2 components x 128 layers, in and out), fused by torch's multi-tensor apply.
def _copy_in(pool: Any, device_pool: Any, host_pool: Any) -> None:
    ours, theirs = _layer_pairs(pool, device_pool)
    torch._foreach_copy_(theirs, ours)
    host_pool.kv_buffer.view(torch.uint8).view(-1).copy_(pool.host.payload)


def _copy_out(pool: Any, device_pool: Any, host_pool: Any) -> None:
    ours, theirs = _layer_pairs(pool, device_pool)
    torch._foreach_copy_(ours, theirs)
    pool.host.payload.copy_(host_pool.kv_buffer.view(torch.uint8).view(-1))


def _place(mods: Any, case: Case, facade: Any, host_pools: list[Any], buffers: Materialized) -> list[Any]:
    """Run the controller's index placement; one (host, device) index pair per pool."""
    controller = types.SimpleNamespace(io_backend=io_backend(case), mem_pool_host=facade, device=buffers.device)
    cls = mods.HiCacheController
    controller.move_indices = types.MethodType(cls.move_indices, controller)
    controller._move_op_indices = types.MethodType(cls._move_op_indices, controller)
    h, d = buffers.host_indices, buffers.device_indices
    rule = placement(case)
    if rule is Placement.BASE_WRITE:
        op = types.SimpleNamespace(host_indices=h, device_indices=d, pool_transfers=None)
        host_idx, dev_idx, _ = cls._move_write_operation(controller, op)
        return [(host_idx, dev_idx) for _ in host_pools]
    flags = [bool(getattr(p, "can_use_write_back_jit", False)) for p in host_pools]
    if rule is Placement.MOVE_ALL or not any(flags):
        pair = controller.move_indices(h, d)
        return [pair for _ in host_pools]
    return [(h.cpu(), d) if flag else controller.move_indices(h, d) for flag in flags]
