"""sglang's page_unified JIT kernels, on the host tensor sglang's own page_unified host pool allocates.

* Load-back, one layer: ``transfer_hicache_one_layer_page_unified_lf`` (MHA, host tensor
  ``(P, G, L, 2, ps, H/G, D)``) and ``transfer_hicache_one_layer_mla_page_unified_lf`` (MLA ``(P, L, ps, D)``);
  host TOKEN indices and device token indices, both on the GPU.
* Write-back, all layers: ``transfer_hicache_all_layer_staged_lf_page_unified`` and the MLA variant; they take
  PAGE ids (device pages on the GPU, host pages CPU int64, unique, bounds-checked) and a staging buffer of
  whole pages. The case's token lists are turned into page ids as a caller would: the first index of each
  page divided by the page size (so the case must hold whole pages on both sides).

The host tensor. No host pool of sglang 0.5.23 calls these kernels (its pools have no page_unified transfer
branch), but its MHA and MLA host pools build the page_unified host buffer (``layout="page_unified"``, the MHA pool
with ``head_group_num``): through ``PageUnifiedLayout`` (pool_host/page_unified.py), which validates the group row
and gives the buffer's shape. So each pool of a case gets sglang's host pool, built by its own constructor
(kernels/sglang_pool_calls.py's ``pool_construction``) over a device pool of one page beside the padding page (the
device pool only describes its rows to the host pool's constructor: the kernels take the case's device layers), and
its ``kv_buffer`` is the host tensor the kernels take. The case's host bytes are copied into it before the calls
and back after them, so the whole-storage comparison judges what the kernels did to sglang's buffer.

* A constructor that refuses is judged by the contract (``page_unified_layout_rules`` in oracles/contract.py): a
  group row that is not a multiple of 16 bytes must be refused, anything else is a wrong rejection.
* The layout's L3 chunk span (``PageUnifiedLayout.chunk_span``) is checked against the oracle's page_unified strides
  (``page_unified_chunk`` in oracles/layouts.py) before the transfer: ranges from layer 0 and from a later layer,
  the empty range and an out-of-range head group (which sglang must refuse). A disagreement fails the case.
* An MLA host pool of fewer pages than layers cannot be built by sglang 0.5.23: ``MLATokenToKVPoolHost`` takes one
  view per layer along its page axis (mla.py, ``_initialize_transfer_views``) and raises ``IndexError``. Such
  cases are unsupported, with that reason.
* An sglang without page_unified host pools makes every case unsupported, with the reason (:func:`host_pool_absent`);
  one whose module lacks what the build needs makes the backend unavailable (:func:`host_pool_hooks_missing`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.space import HEAD_GROUPS_MENU, CaseSpace
from hicache_fuzz.kernels import sglang_call as calls
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels import sglang_pool
from hicache_fuzz.kernels.base import Availability, Plan
from hicache_fuzz.kernels.buffers import Materialized, PoolBuffers
from hicache_fuzz.kernels.sglang_call import SglangCall
from hicache_fuzz.kernels.sglang_jit import JIT_INDEX_DEVICES, SglangBackend, gpu_space
from hicache_fuzz.kernels.sglang_pool_calls import HOST_MHA, HOST_MLA, MEMORY_POOL, Constructor, pool_construction
from hicache_fuzz.kernels.sglang_staged import (
    INDEX_DTYPES,
    STAGING_PAGES_MENU,
    staging_pages,
)
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.contract import EntryPoint, Platform

# Rows: each one, and each head-group width of it, is a compile (``element_size`` / ``group_bytes`` are template
# parameters). Start menu at worker start-up, rotating rows per campaign seed (sglang_jit.gpu_space); a row costs
# up to nine modules here, so a campaign grows by half as many rows as the other JIT backends.
PAGE_UNIFIED_ROW_MENU = (128, 256, 576, 512, 1152, 96, 48)
PAGE_UNIFIED_ROTATING_ROWS = (640, 768, 1280, 1536, 1024, 2048, 2064, 1040, 16, 32, 64, 160, 192, 320, 384, 4096)
PAGE_UNIFIED_GROWTH_ROWS = 4

PAGE_UNIFIED_MODULE = "sglang.srt.mem_cache.pool_host.page_unified"
# Where sglang keeps the page_unified layout, relative to its package folder (found without importing sglang).
PAGE_UNIFIED_FILE = ("srt", "mem_cache", "pool_host", "page_unified.py")


class SglangPageUnifiedBackend(SglangBackend):
    name = "sglang-page-unified"
    description = ("sglang JIT page_unified one-layer load-back and staged all-layer write-back (MHA/MLA), on the "
                   "host buffer of sglang's own page_unified host pool")
    supported_layouts = (HostLayout.PAGE_UNIFIED,)

    def probe(self, platform: Platform) -> Availability:
        base = common.probe_sglang(platform)
        if not base.available:
            return base
        absent = host_pool_absent()
        if absent is not None:
            return Availability(True, f"{base.reason}; {absent}: every case is unsupported")
        try:
            missing = host_pool_hooks_missing()
        except Exception as exc:
            return Availability(False, f"sglang's host-pool modules do not import: {type(exc).__name__}: {exc}")
        if missing:
            return Availability(False, f"{common.sglang_origin()} lacks what the harness builds page_unified host "
                                       f"pools with: {', '.join(missing)}")
        return base

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        return gpu_space(
            space,
            layouts=self.supported_layouts,
            rows=PAGE_UNIFIED_ROW_MENU,
            rotating=PAGE_UNIFIED_ROTATING_ROWS,
            growth_rows=PAGE_UNIFIED_GROWTH_ROWS,
            max_pools=3,  # run() makes one call per pool
            index_devices=JIT_INDEX_DEVICES,
            index_dtypes=INDEX_DTYPES,
            tuning_menus=(("staging_pages", STAGING_PAGES_MENU),),
            backend=self.name,
        )

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        reason = self.common_unsupported(case, platform)
        if reason:
            return reason
        write = case.direction is Direction.WRITE_BACK
        if write and case.scope is not Scope.ALL_LAYERS:
            return "the page_unified write-back moves all layers"
        if not write and case.scope is not Scope.ONE_LAYER:
            return "the page_unified load-back moves one layer"
        if case.host_allocator is HostAllocator.PAGEABLE:
            return "pageable host memory: the page_unified kernels need pinned/registered host memory"
        ps = case.page_size
        if write and (len(case.host_indices) % ps or len(case.device_indices) % ps):
            return "the page_unified write-back takes page ids: a partial page cannot be expressed"
        if any(p.attention is Attention.MLA for p in case.pools) and case.host_pages < case.layers:
            return (f"an MLA host pool of {case.host_pages} pages for {case.layers} layers: sglang's "
                    f"MLATokenToKVPoolHost takes one view per layer along the page axis of its page_unified buffer "
                    f"and cannot be built (IndexError)")
        return host_pool_absent()

    def plan(self, case: Case, platform: Platform) -> Plan:
        empty_write = case.direction is Direction.WRITE_BACK and not case.n  # no page, no launch
        return Plan(EntryPoint.JIT_PAGE_UNIFIED, "none" if empty_write else common.PAGE_UNIFIED)

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Any]:
        module = common.hicache()
        quota = common.platform_rules(platform).block_quota
        jobs: list[Any] = []
        for row in sorted(set(space.row_bytes)):
            # Each group width (row / groups) is its own JIT module: the warm-up compiles every one the generator
            # can draw (a width first met inside a case would cost that case a compile of seconds).
            for groups in HEAD_GROUPS_MENU:
                unit = row // groups
                if row % groups == 0 and unit % 16 == 0:
                    jobs.append(
                        lambda unit=unit: module._jit_hicache_page_unified_module(element_size=unit, block_quota=quota)
                    )
                    jobs.append(lambda unit=unit: module._jit_page_unified_write_back(unit, is_mla=False))
            if row % 16 == 0:
                jobs.append(lambda row=row: module._jit_page_unified_write_back(row, is_mla=True))
        # The host pools' constructors ask sglang whether their whole rows take the JIT kernels
        # (can_use_hicache_jit_kernel with the case's page size), which builds the TMA module or the row's register
        # module: asked here as they ask it, with no page size (the TMA gate) and with page size 1 (the register
        # module, for the page sizes the TMA gate's page rule turns away).
        gate = getattr(module, "can_use_hicache_jit_kernel", None)
        if gate is not None:
            for row in sorted(set(space.row_bytes)):
                jobs.append(lambda row=row: gate(element_size=row))
                jobs.append(lambda row=row: gate(element_size=row, page_size=1))
        return jobs

    def sglang_calls(self, case: Case, platform: Platform) -> list[SglangCall]:
        """One call per pool: the one-layer load-back, or the all-layer write-back of whole pages through a
        staging buffer (page ids as a caller derives them from the index lists), on the host tensor of sglang's
        host pool of that pool."""
        out = []
        for spec in case.pools:
            mla = spec.attention is Attention.MLA
            host = calls.host_pool_buffer(spec)
            if case.direction is Direction.LOAD_BACK:
                devices = tuple(calls.device_layer(spec, c, case.layer) for c in spec.components)
                function = f"transfer_hicache_one_layer{'_mla' if mla else ''}_page_unified_lf"
                out.append(SglangCall("hicache", function,
                                      (*devices, host, calls.HOST_INDICES, calls.DEVICE_INDICES, case.layer)))
                continue
            ps = case.page_size
            pages = staging_pages(case, int(case.tuning_value("staging_pages", 0)), platform)
            tables = tuple(calls.device_table(spec, c, case.layers) for c in spec.components)
            function = ("transfer_hicache_all_layer_mla_staged_lf_page_unified" if mla
                        else "transfer_hicache_all_layer_staged_lf_page_unified")
            out.append(SglangCall("hicache", function,
                                  (*tables, calls.PageIds(calls.DEVICE_INDICES, ps),
                                   calls.PageIds(calls.HOST_INDICES, ps), calls.Staging(host, pages), host)))
        return out

    def run(self, buffers: Materialized) -> str:
        module = common.hicache()
        case = buffers.case
        host_pools = self._host_pools(case, buffers.device)
        keep = False
        try:
            for pool in buffers.pools:
                layout = host_pools[pool.spec.name].page_unified_layout
                why = span_disagreement(layout, span_probes(case, pool.spec))
                if why:
                    raise AssertionError(f"pool {pool.spec.name}: {why}")
            for pool in buffers.pools:
                sglang_host_bytes(pool, host_pools[pool.spec.name]).copy_(pool.host.payload)
            with common.recording() as events:
                try:
                    for call in self.sglang_calls(case, common.platform_of(buffers)):
                        call.run(module, buffers, host_pools)
                finally:
                    if buffers.device.type != "cpu":
                        torch.cuda.synchronize(buffers.device)
                    for pool in buffers.pools:
                        pool.host.payload.copy_(sglang_host_bytes(pool, host_pools[pool.spec.name]))
            keep = True  # only a call that returned normally hands its host pools on (a refusal may be a fault)
            return common.path_of(events)
        finally:
            if keep:
                self._kept = (_objects_key(case, buffers.device), host_pools)
            else:
                _destroy(host_pools)

    _kept: tuple[tuple[object, ...], dict[str, Any]] | None = None

    def _host_pools(self, case: Case, device: torch.device) -> dict[str, Any]:
        """sglang's host pool of each pool of the case, by pool name: the kept ones if the geometry matches (index
        variants: building one costs a pinned allocation, and every case copies all its bytes in), else new."""
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == _objects_key(case, device):
            return kept[1]
        if kept is not None:
            _destroy(kept[1])
        built: dict[str, Any] = {}
        try:
            with common.registrations_released_on_failure():
                for spec in case.pools:
                    built[spec.name] = build_host_pool(case, spec, device)
        except BaseException:
            _destroy(built)
            raise
        return built


# ---- sglang's page_unified host pools ------------------------------------------------------------------------


def build_host_pool(case: Case, spec: PoolSpec, device: torch.device) -> Any:
    """sglang's page_unified host pool of `spec` (``host_slots`` tokens, the case's page size and layers, the pool's
    head groups), built by its constructor over the buffer info of a device pool of one page beside the padding
    page: the host pool reads only the device rows' geometry, and the kernels move the case's own device layers."""
    missing = host_pool_hooks_missing()
    if missing:
        raise common.SglangUnavailable(f"{common.sglang_origin()} lacks {', '.join(missing)}")
    made = pool_construction(case, spec, device_size=case.page_size)
    device_pool = made.device_pool.call(_class(made.device_pool), device)
    info = device_pool.get_device_pool_infos()[0].buffer_info
    return made.host_pool.call(_class(made.host_pool), device, info)


def _class(constructor: Constructor) -> Any:
    return getattr(importlib.import_module(constructor.module), constructor.cls)


def sglang_host_bytes(pool: PoolBuffers, host_pool: Any) -> torch.Tensor:
    """The host pool's buffer as flat bytes, which must hold exactly the case's host storage of the pool."""
    flat = host_pool.kv_buffer.view(torch.uint8).view(-1)
    if flat.numel() != pool.host.payload.numel():
        raise RuntimeError(f"harness: sglang's page_unified host pool {pool.spec.name} holds {flat.numel()} bytes, "
                           f"the case's host storage {pool.host.payload.numel()}")
    return flat


def _objects_key(case: Case, device: torch.device) -> tuple[object, ...]:
    """What sglang's host pools of a case are built from (the device pool is one page, whatever the case's)."""
    return (case.page_size, case.layers, case.host_slots, case.pools, str(device))


def _destroy(host_pools: dict[str, Any]) -> None:
    for host_pool in host_pools.values():
        destroy = getattr(host_pool, "destroy", None)
        if destroy is not None:
            destroy()


def host_pool_hooks_missing() -> list[str]:
    """What sglang's host pools lack of what the build uses (qualified names; none where all is there): the
    page_unified layout with its chunk span and page shape, and the MHA host pool's head groups. Imports them, as
    the other pool backends do (sglang_pool's loader: the AOT ops made callable first, which the pools' modules bind
    at import and their constructors' pointer tables call)."""
    sglang_pool._pool_modules()
    page_unified = importlib.import_module(PAGE_UNIFIED_MODULE)
    mha = importlib.import_module(HOST_MHA)
    for module in (MEMORY_POOL, HOST_MLA):
        importlib.import_module(module)
    layout = getattr(page_unified, "PageUnifiedLayout", None)
    if layout is None:
        missing = [f"{PAGE_UNIFIED_MODULE}.PageUnifiedLayout"]
    else:
        missing = [f"{PAGE_UNIFIED_MODULE}.PageUnifiedLayout.{name}" for name in ("chunk_span", "page_dims")
                   if not hasattr(layout, name)]
    if "head_group_num" not in inspect.signature(mha.MHATokenToKVPoolHost.__init__).parameters:
        missing.append(f"{HOST_MHA}.MHATokenToKVPoolHost(head_group_num=...)")
    return missing


def host_pool_absent() -> str | None:
    """Why the sglang under test has no page_unified host layout, or None: where it has one, and where no sglang is
    installed (a prediction for another machine assumes sglang 0.5.23's pools). Found without importing sglang (a
    campaign's feed processes ask it of every case): the layout's module beside sglang's host pools."""
    return _absent_on(tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _absent_on(path: tuple[str, ...]) -> str | None:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    folder = Path(spec.origin).parent if spec.origin else Path(next(iter(spec.submodule_search_locations or ()), ""))
    module = folder.joinpath(*PAGE_UNIFIED_FILE)
    if module.is_file():
        return None
    return (f"sglang at {folder} has no page_unified host layout ({module} is missing): the backend builds the host "
            f"tensor only through sglang's page_unified host pool")


# ---- the layout's L3 chunk span, against the oracle's strides ------------------------------------------------


class SpanProbe(NamedTuple):
    layers: tuple[int, int]  # the half-open layer range
    group: int  # the head group
    want: tuple[int, int] | None  # the oracle's (offset, length) of the chunk; None: no chunk, sglang must refuse


def span_probes(case: Case, spec: PoolSpec) -> list[SpanProbe]:
    """The chunks asked of a pool's layout: every layer of the first group and one layer of the last from layer 0;
    the last layer and the upper half from a later layer (where the pool has one); the empty range at both ends;
    and a head group past the last. Each with the oracle's answer (oracles/layouts.py, ``page_unified_chunk``)."""
    L, G = case.layers, spec.head_groups
    asked = [((0, L), 0), ((0, 1), G - 1), ((L - 1, L), G - 1), ((L // 2, L), 0), ((0, 0), 0), ((L, L), G - 1),
             ((0, L), G)]
    unique = list(dict.fromkeys(asked))
    return [SpanProbe(layers, group, layouts.page_unified_chunk(case, spec, layers, group)) for layers, group in unique]


def span_disagreement(layout: Any, probes: list[SpanProbe]) -> str:
    """'' if sglang's ``PageUnifiedLayout.chunk_span`` answers every probe as the oracle does (a span it returns, a
    ``ValueError`` where the oracle has no chunk), else the first disagreement."""
    for probe in probes:
        refusal = ""
        got: tuple[int, int] | None
        try:
            offset, length = layout.chunk_span(probe.layers, probe.group)
            got = (int(offset), int(length))
        except ValueError as exc:
            got, refusal = None, str(exc)
        if got == probe.want:
            continue
        answer = f"refused it ({refusal})" if got is None else f"returned (offset, length) {got}"
        want = (f"(offset, length) {probe.want}" if probe.want is not None
                else "no chunk: an empty or out-of-range layer range or head group must be refused")
        return (f"sglang's PageUnifiedLayout.chunk_span({probe.layers}, {probe.group}) {answer}; the oracle's "
                f"page_unified strides give {want}")
    return ""
