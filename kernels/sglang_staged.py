"""sglang's JIT staged write-back, layer_first device -> page_first host, MHA and MLA.

Entry points: ``transfer_hicache_all_layer_staged_lf_pf`` and ``transfer_hicache_all_layer_mla_staged_lf_pf``
(``sglang.kernels.ops.kvcache.hicache``). Device layers are passed as uint64 pointer tables, host indices as
CPU int64 (only the first index of each page counts), and a device staging buffer whose page capacity sets
the chunking: sglang's pools size it ``min(host pages, 64)`` pages; the ``staging_pages`` knob (0 = the pool's
choice) also tries 1 and 3 pages so chunk boundaries are crossed with few pages.
"""

from __future__ import annotations

from typing import Any

from hicache_fuzz.harness.model.case import Attention, Case, HostAllocator, HostLayout, IndexDevice, IndexDtype
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_call as calls
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_call import SglangCall
from hicache_fuzz.kernels.sglang_jit import SglangBackend, gpu_space
from hicache_fuzz.oracles.contract import EntryPoint, Platform

# Rows: each one is a compile (``element_size`` is a template parameter of ``_jit_hicache_staged_module``). The
# start menu is compiled at worker start-up, the rotating rows drawn per campaign seed (sglang_jit.gpu_space).
STAGED_ROW_MENU = (128, 256, 576, 1152, 512, 1024, 48, 96, 528, 2064)
STAGED_ROTATING_ROWS = (
    640, 768, 1280, 1536, 2560, 3072, 144, 1040,  # E % 16 == 0: the staged path takes them
    16, 32, 64, 80, 160, 192, 320, 384,
    656, 896, 2048, 4096, 4608, 8192, 24, 40,  # 24 and 40: not a multiple of 16, refused
)
STAGING_PAGES_MENU = (0, 1, 3, 64)
# Menus are drawn uniformly per side; repeats weight them (host CPU int64 + device GPU is what the staged
# entry accepts).
STAGED_INDEX_DEVICES = (IndexDevice.CPU, IndexDevice.DEVICE, IndexDevice.PINNED, IndexDevice.DEVICE)
INDEX_DTYPES = (IndexDtype.INT64, IndexDtype.INT64, IndexDtype.INT32)


def staging_pages(case: Case, knob: int, platform: Platform) -> int:
    """Staging capacity in pages: the pool's min(host pages, chunk) for 0, else the knob."""
    chunk = common.platform_rules(platform).staging_page_chunk
    return knob if knob > 0 else min(case.host_pages, chunk)


class SglangStagedBackend(SglangBackend):
    name = "sglang-staged"
    description = "sglang JIT staged write-back layer_first -> page_first (MHA/MLA), chunked over staging pages"
    supported_layouts = (HostLayout.PAGE_FIRST,)

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        from hicache_fuzz.harness.model.case import Direction, Scope

        return gpu_space(
            space,
            layouts=self.supported_layouts,
            rows=STAGED_ROW_MENU,
            rotating=STAGED_ROTATING_ROWS,
            max_pools=3,
            directions=(Direction.WRITE_BACK,),
            scopes=(Scope.ALL_LAYERS,),
            index_devices=STAGED_INDEX_DEVICES,
            index_dtypes=INDEX_DTYPES,
            allocators=(HostAllocator.PIN_MEMORY, HostAllocator.HOST_REGISTER, HostAllocator.PAGEABLE),
            tuning_menus=(("staging_pages", STAGING_PAGES_MENU),),
            backend=self.name,
        )

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        return self.common_unsupported(case, platform)

    def plan(self, case: Case, platform: Platform) -> Plan:
        # zero indices: the chunk loop launches nothing
        return Plan(EntryPoint.JIT_STAGED, common.STAGED if case.n else "none")

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Any]:
        module = common.hicache()
        quota = common.platform_rules(platform).block_quota
        return [
            lambda row=row: module._jit_hicache_staged_module(
                element_size=row, unroll=common.default_unroll(row), block_quota=quota
            )
            for row in sorted(set(space.row_bytes))
            if row % 16 == 0
        ]

    def sglang_calls(self, case: Case, platform: Platform) -> list[SglangCall]:
        """One call per pool: every layer's pages through a staging buffer of the chunk's tokens."""
        tokens = staging_pages(case, int(case.tuning_value("staging_pages", 0)), platform) * case.page_size
        out = []
        for spec in case.pools:
            tables = tuple(calls.device_table(spec, c, case.layers) for c in spec.components)
            hosts = tuple(calls.host_tensor(spec, c) for c in spec.components)  # (S, L, H, D) each
            staging = tuple(calls.Staging(host, tokens) for host in hosts)
            sizes = (("page_size", case.page_size), ("element_size", spec.row_bytes(spec.components[0])))
            function = ("transfer_hicache_all_layer_mla_staged_lf_pf" if spec.attention is Attention.MLA
                        else "transfer_hicache_all_layer_staged_lf_pf")
            out.append(SglangCall("hicache", function,
                                  (*tables, calls.DEVICE_INDICES, calls.HOST_INDICES, *staging, *hosts), sizes))
        return out

    def run(self, buffers: Materialized) -> str:
        module = common.hicache()
        with common.recording() as events:
            for call in self.sglang_calls(buffers.case, common.platform_of(buffers)):
                call.run(module, buffers)
        return common.path_of(events)
