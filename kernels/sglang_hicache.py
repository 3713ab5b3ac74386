"""``sglang-hicache``: sglang's HiCache driven the way the server drives it.

Each case builds one host pool of a generated sglang class (oracles/pool_layouts.py lists them) through the class's
own constructor, with generated settings: layout, page size (the generator's whole range, 1..256), layer count,
pipeline-stage ``start_layer``, packed MTP draft layers and io backend (``kernel`` or ``direct``). The real
controller (``HybridCacheController`` over sglang's ``HostPoolGroup``, or ``HiCacheController``) moves the data:
step 0 is the case's own transfer, then the case's program of back-ups, loads and evictions (oracles/sequence.py),
with the host slots granted by the pool's own allocator. How, and the stand-ins: kernels/sglang_hicache_drive.py.
Storages are compared byte-exact after every transfer (``Materialized.step_images``) and at the end.

Case knobs (``tuning``): ``controller`` (``hybrid``: the HybridCacheController over a HostPoolGroup, as the scheduler
builds it; ``base``: HiCacheController over the pool), ``pool_kind`` (``standard``: the pool class of the case's
attention kind; ``hisparse``: the HiSparse MHA pool; ``k_only``: the K-only pool; ``mamba``: the Mamba state pool;
``nvfp4_index_k`` / ``nvfp4_main_kv``: MiniMax M3's NVFP4 page-row pools; ``dsa``: the DeepSeek sparse attention indexer
pool beside its MLA anchor (kernels/sglang_hicache_dsa.py); ``mxfp8``: the MXFP8 block-scaled MHA pool, whose scale
blocks are judged beside the case's payload (kernels/sglang_hicache_mxfp8.py); or the name of a class the oracle does
not model, which is reported unsupported with the reason), ``io_backend``, ``start_layer``, ``draft_layers`` (the last
of ``layers`` are packed draft layers), ``index_topk_freq`` (the DSA indexer's: which of the stage's layers own index
keys), ``side_pool`` (a K-only index pool, a Mamba state pool, or both, beside the anchor in the hybrid controller's
group: their flags change the group's, and without ``side_transfer`` their bytes must stay as they were),
``side_transfer`` (``on``: the side pools move with every transfer of an entry the sequence backed up, each with host
slots from its own allocator; ``full``, drawn by a profile of its own: the same, the side pool asked last holding room
for one back-up, so that the group refuses the others and gives every grant of them back; oracles/side_transfers.py),
``layer_shard`` (``size/rank/remainder``: the MLA pool, or the DSA indexer and its MLA
anchor, layer-sharded over context-parallel ranks, the case the rank's share), ``device_rows`` (``token_major``: the
device pool is sglang's unified pool, whose per-layer tensors are strided views; kernels/sglang_hicache_device.py),
``ops`` (the program) and ``requests`` (present
in the HiSparse profile's cases: the HiSparse pool's host slots held in its coordinator's request table, each back-up of
the program a request's tokens; oracles/sequence.py). ``draft_layers`` is an upper bound: a pool packs at most ``layers
- 1`` draft layers, so a one-layer case has none. Generation and labels import neither sglang nor torch's GPU side.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    Scope,
    page_runs_contiguous,
)
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_hicache_mxfp8 import MXFP8, torch_unsupported
from hicache_fuzz.kernels.sglang_hicache_settings import (
    CONTROLLERS,
    DEVICE_ROWS,
    DEVICE_ROWS_KEY,
    DRAFT_LAYERS,
    INDEX_TOPK_FREQS,
    IO_BACKENDS,
    LAYER_SHARD_KEY,
    LAYER_SHARDS,
    LAYOUTS,
    PACKED,
    POOL_KINDS,
    PROGRAMS,
    REQUEST_SLOT_CLASSES,
    ROW_GROWTH,
    SIDE_POOL_CLASSES,
    SIDE_POOLS,
    SIDE_TRANSFER_VALUES,
    SIDE_TRANSFERS,
    START_LAYERS,
    TOKEN_MAJOR,
    case_settings,
    contract_entry,
    controller_kind,
    device_rows,
    index_topk_freq,
    layer_shard,
    layer_shard_problem,
    operation_kinds,
    profiles,
    request_slot_kinds,
    side_pool,
    side_pools,
    side_refusals,
    side_transfer,
    skip_topk_layers,
    target_rows_strided,
)
from hicache_fuzz.kernels.sglang_jit import GROW_EVERY, SglangBackend
from hicache_fuzz.kernels.sglang_pool import POOL_ROW_MENU, aot_assumptions, aot_state, pool_paths
from hicache_fuzz.oracles import pool_layouts, sequence
from hicache_fuzz.oracles.contract import EntryPoint, Platform, hicache_jit_takes_row
from hicache_fuzz.oracles.side_transfers import SIDE_TRANSFER_KEY


class SglangHicacheBackend(SglangBackend):
    name = "sglang-hicache"
    description = (
        "sglang host pool classes (MHA/MLA/asymmetric/HiSparse/K-only/Mamba/NVFP4 page rows/DSA indexer/MXFP8) "
        "built by their constructors, driven by "
        "the real HiCache controllers through sequences of back-ups, loads and evictions"
    )
    supported_layouts = LAYOUTS
    # Each case builds its pools and controller and runs several transfers: set as sglang-pool's measured cost
    # until this backend's own is measured.
    relative_case_cost = 6
    coverage_exemptions: ClassVar[Mapping[str, str]] = MappingProxyType({
        "index_dtype=int32": "the controller only ever gets int64 indices (the allocators hand out int64); "
        "int32 index tensors are covered at the kernel entry points by the sglang-jit family",
    })

    def probe(self, platform: Platform) -> Availability:
        base = common.probe_sglang(platform)
        if not base.available:
            return base
        try:
            self.sglang_modules()
        except Exception as exc:
            return Availability(False, f"sglang's HiCache modules do not import: {type(exc).__name__}: {exc}")
        return base

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        return space.narrowed(
            layouts=LAYOUTS,
            attentions=(Attention.MHA, Attention.MLA, Attention.MHA_ASYM),
            row_bytes=POOL_ROW_MENU,
            row_bytes_growth=ROW_GROWTH,
            grow_every=GROW_EVERY,
            max_pools=1,
            directions=(Direction.WRITE_BACK, Direction.LOAD_BACK),
            scopes=(Scope.ALL_LAYERS,),
            allocators=(HostAllocator.PIN_MEMORY, HostAllocator.HOST_REGISTER),
            index_dtypes=(IndexDtype.INT64,),
            host_index_devices=(IndexDevice.CPU,),
            device_index_devices=(IndexDevice.DEVICE,),
            tuning_menus=(("controller", CONTROLLERS), (DEVICE_ROWS_KEY, DEVICE_ROWS), ("draft_layers", DRAFT_LAYERS),
                          ("index_topk_freq", INDEX_TOPK_FREQS), ("io_backend", IO_BACKENDS),
                          (LAYER_SHARD_KEY, LAYER_SHARDS), ("ops", PROGRAMS), ("pool_kind", POOL_KINDS),
                          ("side_pool", SIDE_POOLS), ("start_layer", START_LAYERS),
                          # drawn last: the knobs before it draw as they did before it was added
                          (SIDE_TRANSFER_KEY, SIDE_TRANSFERS)),
            invalid_rate=0.0,
            irregular_rate=0.0,
            partial_rate=0.0,
            empty_rate=0.0,
            backend=self.name,
            profiles=profiles(space.menu_seed),
        )

    def prediction_assumptions(self, platform: Platform) -> tuple[str, ...]:
        return aot_assumptions(platform)

    def coverage_labels(self, case: Case) -> Mapping[str, str | int | bool]:
        name, io_backend, start, drafts = case_settings(case)
        shard = layer_shard(case)
        return MappingProxyType({
            "pool_class": name,
            "controller": controller_kind(case),
            "side_pool": side_pool(case) or "none",
            "side_transfer": side_transfer(case),
            "side_refused_backup": side_refusals(case) and _refuses(case),
            "io_backend": io_backend,
            "start_layer_nonzero": start > 0,
            "draft_layer": drafts > 0,
            "layer_shard": shard.label if shard is not None else "none",
            "layer_sharded_class": name if shard is not None else "none",
            "layer_shard_unwritten_host_layers": shard is not None and shard.host_target_layers > shard.owned,
            "device_rows": device_rows(case),
            "token_major_draft_layers": drafts > 0 and device_rows(case) == TOKEN_MAJOR,
            "skipped_index_layers": any(skip_topk_layers(case)),
            "operation": "+".join(operation_kinds(case)),
            "request_slots": "+".join(request_slot_kinds(case)) or "none",
            "sequence_length": 1 + len(sequence.program(case)) if _program_ok(case) else 1,
        })

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        if platform.kind == "cpu":
            return "sglang's kernels need a CUDA or ROCm device"
        return (self.case_unsupported(case) or self.aot_unsupported(case, platform) or torch_unsupported(case)
                or self.transfer_unsupported(case, platform))

    def case_unsupported(self, case: Case) -> str | None:
        """Why the case is not one this backend drives (platform aside); None if it is."""
        if len(case.pools) != 1:
            return ("one pool of the case's storages per case: a group's side pool is the side_pool knob's (moved "
                    "with side_transfer); groups whose pools are all case storages are sglang-pool's")
        name, io_backend, start, drafts = case_settings(case)
        if name not in pool_layouts.POOL_CLASSES:
            return f"unknown pool_kind {case.tuning_value('pool_kind')!r}"
        if io_backend not in pool_layouts.IO_BACKENDS:
            return f"unknown io_backend {io_backend!r}"
        if controller_kind(case) not in CONTROLLERS:
            return f"unknown controller {controller_kind(case)!r}"
        if case.tuning_value("side_pool", "") not in ("", *SIDE_POOL_CLASSES):
            return f"unknown side_pool {case.tuning_value('side_pool')!r}"
        if case.tuning_value(SIDE_TRANSFER_KEY, "") not in SIDE_TRANSFER_VALUES:
            return f"unknown {SIDE_TRANSFER_KEY} {case.tuning_value(SIDE_TRANSFER_KEY)!r}"
        if sequence.side_refusals(case) and not side_pools(case):
            # the oracle plans the refusals from the knob alone (oracles/sequence.py)
            return (f"{SIDE_TRANSFER_KEY} {sequence.SIDE_TRANSFER_FULL!r} makes a side pool refuse back-ups, and the "
                    f"case's group has none (side_pool {case.tuning_value('side_pool', '')!r} does not fit it)")
        if start < 0 or drafts < 0:
            return f"start_layer {start} / draft_layers {drafts} do not fit a {case.layers}-layer pool"
        if index_topk_freq(case) < 1:
            return f"index_topk_freq {case.tuning_value('index_topk_freq')!r} is not a positive integer"
        if sequence.request_slots(case) and name not in REQUEST_SLOT_CLASSES:
            return (f"{sequence.REQUESTS_KEY}: host slots in the HiSparse coordinator's request table, which drives "
                    f"{', '.join(sorted(REQUEST_SLOT_CLASSES))}, not {name}")
        problem = layer_shard_problem(case)
        if problem:
            return f"unknown {problem}"
        if case.tuning_value(DEVICE_ROWS_KEY, PACKED) not in (PACKED, TOKEN_MAJOR):
            return f"unknown {DEVICE_ROWS_KEY} {case.tuning_value(DEVICE_ROWS_KEY)!r}"
        spec = case.pools[0]
        why = pool_layouts.mismatch(pool_layouts.pool_class(name), spec.attention, case.layout, io_backend, drafts,
                                    case.page_size, tuple(spec.row_bytes(c) for c in spec.components))
        if why:
            return why
        if case.scope is not Scope.ALL_LAYERS:
            return "the controller moves all layers"
        if case.host_allocator is HostAllocator.PAGEABLE:
            return "sglang pins host pools on CUDA/ROCm"
        if case.host_index.dtype is not IndexDtype.INT64 or case.device_index.dtype is not IndexDtype.INT64:
            return "sglang's allocators hand out int64 indices"
        if case.device_index.device is not IndexDevice.DEVICE or case.host_index.device is not IndexDevice.CPU:
            return "production inputs: host indices from the host allocator (CPU), device indices on the GPU"
        return _index_reason(case) or _sequence_reason(case)

    def aot_unsupported(self, case: Case, platform: Platform) -> str | None:
        name, io_backend, _start, _drafts = case_settings(case)
        ok, why = aot_state(platform)
        if ok:
            return None
        # the MXFP8 pool moves its payload as the MHA pool does and its scale blocks with JIT kernels only
        if name not in ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost", MXFP8):
            return f"{name} moves KV with sgl_kernel's AOT ops, unavailable here ({why})"
        if io_backend == pool_layouts.DIRECT or case.layout in (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD):
            return f"{io_backend} io with {case.layout.value} reaches sgl_kernel's AOT ops, unavailable here ({why})"
        for direction in Direction:
            path = pool_paths(case.replace(direction=direction), case.pools[0], platform)
            if path.startswith("aot:"):
                return f"reaches the AOT op {path[4:]}, unavailable here ({why})"
        return None

    def transfer_unsupported(self, case: Case, platform: Platform) -> str | None:
        """Why sglang builds the case's pool on `platform` and then refuses its transfers (None if it moves them):
        the ops the pools refuse on strided token-major device rows (oracles/pool_layouts.py states the rule and
        judges the refusal), where whether the JIT kernel takes the row (TMA or the register kernel) is the
        platform's. The refusals the contract predicts (contract_entry: the layer-sharded MLA pool's and DSA
        indexer's back-ups, packed draft rows beside strided target rows, refused before any transfer) are no
        transfer rule; the sharded MLA pool's hangs on the JIT gate, which the contract takes with sglang's TMA
        switch at its default, so a process whose gate answers otherwise for the case does not run it."""
        name, io_backend, _start, drafts = case_settings(case)
        spec = case.pools[0]
        row = spec.row_bytes(spec.components[0])
        jit = common.tma_selected(row, case.page_size, platform) or common.register_row_ok(row, platform)
        if (contract_entry(case) is EntryPoint.MLA_SHARDED and case.layout is HostLayout.PAGE_FIRST
                and jit != hicache_jit_takes_row(row, case.page_size, platform)):
            return (f"the layer-sharded MLA back-up on page_first hangs on the JIT gate, which here ({common.TMA_ENV} "
                    f"{'on' if common.tma_env_enabled() else 'off'}, sglang's copy rounds) answers "
                    f"{'yes' if jit else 'no'} for a {row}-byte row at page size {case.page_size}, the contract's "
                    f"(the switch at sglang's default, on) {'no' if jit else 'yes'}")
        if target_rows_strided(case) and drafts == 0:
            return pool_layouts.strided_rows_refusal(name, case.layout, io_backend, jit) or None
        return None

    def plan(self, case: Case, platform: Platform) -> Plan:
        return Plan(contract_entry(case), controller_path(case))

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Any]:
        """sglang-pool's modules, and the JIT modules of the Mamba and NVFP4 page-row pools (the page-row pools
        use theirs on CUDA only)."""
        from hicache_fuzz.kernels import sglang_hicache_mamba, sglang_hicache_pagerow
        from hicache_fuzz.kernels.sglang_pool import SglangPoolBackend

        jobs: list[Any] = [*SglangPoolBackend().compile_jobs(space, platform), sglang_hicache_mamba.build_jit_module]
        if platform.kind == "cuda":
            jobs.append(sglang_hicache_pagerow.build_jit_modules)
        return jobs

    def sglang_modules(self) -> Any:
        """sglang's modules this backend drives (after the AOT ops are made callable for the pools)."""
        from hicache_fuzz.kernels import sglang_hicache_drive, sglang_pool

        sglang_pool._pool_modules()
        return sglang_hicache_drive.load_modules()

    def run(self, buffers: Materialized) -> str:
        from hicache_fuzz.kernels import sglang_hicache_drive as drive

        mods = self.sglang_modules()
        case = buffers.case
        key = drive.objects_key(case, buffers.device)
        # The previous case's objects are used again for the same key (index variants of one geometry): building
        # them registers pinned host memory and makes device pools and streams. Only objects of a run that
        # returned normally are kept (a failed run may have left them in any state).
        kept, self._kept = self._kept, None
        built = kept[1] if kept is not None and kept[0] == key else None
        if kept is not None and built is None:
            drive.destroy(kept[1])
        if built is None:
            with common.registrations_released_on_failure():
                built = drive.build(mods, case, buffers.device)
        try:
            drive.drive(mods, buffers, built)
        except BaseException:
            drive.destroy(built)
            raise
        self._kept = (key, built)
        return controller_path(case)

    _kept: tuple[tuple[object, ...], Any] | None = None


def controller_path(case: Case) -> str:
    """The path this backend reports: the controller and its io backend (it judges bytes, not kernel paths)."""
    return f"hicache-controller:{case_settings(case)[1]}"


def _refuses(case: Case) -> bool:
    """Whether the case's sequence has a back-up its side pool refuses (a program that does not run has none)."""
    try:
        return any(step.op == sequence.REFUSED for step in sequence.plan_steps(case))
    except sequence.SequenceError:
        return False


def _program_ok(case: Case) -> bool:
    try:
        sequence.program(case)
    except sequence.SequenceError:
        return False
    return True


def _index_reason(case: Case) -> str | None:
    n, ps = case.n, case.page_size
    h, d = case.host_indices, case.device_indices
    if n == 0 or len(d) != n or n % ps:
        return "the controller moves whole, non-empty pages with equal index lists"
    if (any(not 0 <= x < case.host_slots for x in h) or any(not ps <= x < case.device_rows for x in d)
            or len(set(h)) != n or len(set(d)) != n):
        return "indices outside the allocators' ranges or repeated"
    if not (page_runs_contiguous(h, ps) and page_runs_contiguous(d, ps)) or any(x % ps for x in h[::ps]) or any(
            x % ps for x in d[::ps]):
        return "the allocators hand out whole aligned pages"
    if case.device_rows <= ps or case.device_rows % ps:
        return "a device pool has size + page_size rows, a multiple of the page size"
    return None


def _sequence_reason(case: Case) -> str | None:
    try:
        sequence.plan_steps(case)
    except sequence.SequenceError as exc:
        return str(exc)
    return None
