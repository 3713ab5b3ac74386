"""sglang's page_unified JIT kernels (not wired into any host pool in 0.5.23).

* Load-back, one layer: ``transfer_hicache_one_layer_page_unified_lf`` (MHA, host tensor
  ``(P, G, L, 2, ps, H/G, D)``) and ``transfer_hicache_one_layer_mla_page_unified_lf`` (MLA ``(P, L, ps, D)``);
  host TOKEN indices and device token indices, both on the GPU.
* Write-back, all layers: ``transfer_hicache_all_layer_staged_lf_page_unified`` and the MLA variant; they take
  PAGE ids (device pages on the GPU, host pages CPU int64, unique, bounds-checked) and a staging buffer of
  whole pages. The case's token lists are turned into page ids as a caller would: the first index of each
  page divided by the page size (so the case must hold whole pages on both sides).
"""

from __future__ import annotations

from typing import Any

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostAllocator, HostLayout, Scope
from hicache_fuzz.harness.model.space import HEAD_GROUPS_MENU, CaseSpace
from hicache_fuzz.kernels import sglang_call as calls
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_call import SglangCall
from hicache_fuzz.kernels.sglang_jit import JIT_INDEX_DEVICES, SglangBackend, gpu_space
from hicache_fuzz.kernels.sglang_staged import (
    INDEX_DTYPES,
    STAGING_PAGES_MENU,
    staging_pages,
)
from hicache_fuzz.oracles.contract import EntryPoint, Platform

# Rows: each one, and each head-group width of it, is a compile (``element_size`` / ``group_bytes`` are template
# parameters). Start menu at worker start-up, rotating rows per campaign seed (sglang_jit.gpu_space); a row costs
# up to nine modules here, so a campaign grows by half as many rows as the other JIT backends.
PAGE_UNIFIED_ROW_MENU = (128, 256, 576, 512, 1152, 96, 48)
PAGE_UNIFIED_ROTATING_ROWS = (640, 768, 1280, 1536, 1024, 2048, 2064, 1040, 16, 32, 64, 160, 192, 320, 384, 4096)
PAGE_UNIFIED_GROWTH_ROWS = 4


class SglangPageUnifiedBackend(SglangBackend):
    name = "sglang-page-unified"
    description = "sglang JIT page_unified one-layer load-back and staged all-layer write-back (MHA/MLA)"
    supported_layouts = (HostLayout.PAGE_UNIFIED,)

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
        return None

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
        return jobs

    def sglang_calls(self, case: Case, platform: Platform) -> list[SglangCall]:
        """One call per pool: the one-layer load-back, or the all-layer write-back of whole pages through a
        staging buffer (page ids as a caller derives them from the index lists)."""
        out = []
        for spec in case.pools:
            mla = spec.attention is Attention.MLA
            host = calls.whole_host(spec)
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
        with common.recording() as events:
            for call in self.sglang_calls(buffers.case, common.platform_of(buffers)):
                call.run(module, buffers)
        return common.path_of(events)
