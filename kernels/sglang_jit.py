"""sglang's JIT register and TMA kernels: one-layer and all-layer transfers, MHA and MLA.

Entry points (``sglang.kernels.ops.kvcache.hicache``): ``transfer_hicache_one_layer[_mla]`` and
``transfer_hicache_all_layer[_mla]``, called with explicit row geometry (``element_dim`` /
``element_size``; see the element_dim trap in docs/semantics.md 3.1). sglang picks the TMA kernel or the
register kernel inside the call; three backends differ only in how that choice is steered:

* ``sglang-jit``: sglang's own gate (``SGLANG_HICACHE_TMA_TRANSFER`` read once per argument tuple, page-size
  rule with the case's page size, as the host pools call it);
* ``sglang-jit-register``: the TMA gate forced off;
* ``sglang-jit-tma``: the gate forced on (the rest of the rule still applies); the ``tma_page_size`` knob
  passes the page size (page-size rule active) or None (the gate then trusts the indices).

Host layouts: layer_first and page_first (the page_first per-layer host view is strided by ``L*E``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    Scope,
)
from hicache_fuzz.harness.model.space import CaseSpace, rotating_sample
from hicache_fuzz.kernels import sglang_call as calls
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Backend, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.compile_books import CompileBooks
from hicache_fuzz.kernels.sglang_call import SglangCall
from hicache_fuzz.oracles.contract import EntryPoint, Platform

# Row sizes: every one is a JIT compile of sglang's register kernel (``element_size`` is a template parameter
# of ``_jit_hicache_module``; unroll and block quota are too, but the pools pass sglang's defaults, so the
# backends do as well). A campaign compiles the start menu at worker start-up: CUDA register-tiling rows, TMA-only
# ones (576 DeepSeek fp8 MLA, 528), and a few no JIT kernel takes (rejections; compiled once, the failure is
# memoized). The rotating rows are the rest of the menu: each campaign seed draws GROWTH_ROWS of them
# (space.rotating_sample), which join its menu one every GROW_EVERY campaign indices, compiled in the
# background one stage ahead (CaseSpace.row_bytes_growth); a handful of seeds draws every one.
JIT_ROW_MENU = (128, 256, 512, 576, 1024, 1152, 2048, 4096, 528, 96)
JIT_ROTATING_ROWS = (
    640, 768, 1280, 1536, 2560, 3072, 6144, 8192,  # multiples of 128: register and TMA kernels take them
    384, 896, 1664, 2304, 3584, 5120, 7168, 16384,
    64, 32, 16, 48, 80, 160, 192, 320,  # narrow rows: the CUDA register kernel refuses them (TMA takes them)
    656, 1040, 2064, 4608, 32768, 32784,  # GLM bf16, scale-byte rows, the 32 KiB TMA stage and just past it
)
GROW_EVERY = 150
GROWTH_ROWS = 8  # rotating rows one campaign compiles (in the background, as its menu grows)
# Drawn uniformly per side: weighted toward GPU indices so most cases get past the index checks.
JIT_INDEX_DEVICES = (IndexDevice.DEVICE,) * 6 + (IndexDevice.CPU, IndexDevice.PINNED)


def gpu_space(
    space: CaseSpace,
    *,
    layouts: tuple[HostLayout, ...],
    rows: tuple[int, ...] | None,
    rotating: tuple[int, ...] = (),
    growth_rows: int = GROWTH_ROWS,
    page_sizes: tuple[int, ...] | None = None,
    max_pools: int = 1,
    allocators: tuple[HostAllocator, ...] = (HostAllocator.PIN_MEMORY, HostAllocator.HOST_REGISTER),
    **changes: Any,
) -> CaseSpace:
    """The common narrowing of the sglang backends: MHA and MLA, what the entry points take, and row menus only
    where a row is a compile (`rows` None: every row, geometry draws included). Page sizes, layers, heads,
    tokens and pool sizes keep the space's whole range: none of them is a template parameter of these kernels
    (`page_sizes` narrows only for a backend that names a reason). `rotating`: the menu's rows beyond `rows`,
    of which the space's menu seed draws `growth_rows` as the menu grows (all of them without a seed)."""
    narrowing: dict[str, Any] = {
        "layouts": layouts,
        "attentions": (Attention.MHA, Attention.MLA),
        "max_pools": max_pools,
        "allocators": allocators,
    }
    if rows is not None:
        narrowing["row_bytes"] = rows
    if rotating:
        narrowing["row_bytes_growth"] = rotating_sample(rotating, space.menu_seed, growth_rows)
        narrowing["grow_every"] = GROW_EVERY
    if page_sizes is not None:
        narrowing["page_sizes"] = page_sizes
    return space.narrowed(**{**narrowing, **changes})


class SglangBackend(Backend):
    """Common behaviour: probe via sglang_common, GPU only, run in a worker (a kernel fault is fatal)."""

    needs_isolation = True
    supported_layouts: ClassVar[tuple[HostLayout, ...]] = ()

    def probe(self, platform: Platform) -> Availability:
        return common.probe_sglang(platform)

    def compile_books(self) -> CompileBooks | None:
        return common.BOOKS

    def common_unsupported(self, case: Case, platform: Platform) -> str | None:
        if platform.kind == "cpu":
            return "sglang's kernels need a CUDA or ROCm device"
        if case.layout not in self.supported_layouts:
            return f"{self.name} does not move {case.layout.value} pools"
        if any(p.attention is Attention.MHA_ASYM for p in case.pools):
            return "asymmetric K/V widths: these entry points take one row size"
        return None

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Any]:
        return []

    def prefetch(self, space: CaseSpace, platform: Platform) -> None:
        if platform.kind != "cpu" and self.probe(platform).available:
            common.compile_in_background(lambda: self.compile_jobs(space, platform))


def _host_stride_bytes(case: Case, row_bytes: int) -> int:
    return row_bytes if case.layout is HostLayout.LAYER_FIRST else row_bytes * case.layers


class _JitBackend(SglangBackend):
    tma_mode: ClassVar[str | None] = None
    supported_layouts = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST)

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        menus = (("tma_page_size", (True, False)),) if self.tma_mode == "on" else ()
        return gpu_space(
            space,
            layouts=self.supported_layouts,
            rows=JIT_ROW_MENU,
            rotating=JIT_ROTATING_ROWS,
            backend=self.name,
            index_devices=JIT_INDEX_DEVICES,
            tuning_menus=menus,
        )

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        reason = self.common_unsupported(case, platform)
        if reason:
            return reason
        if len(case.pools) > 1:
            return "one pool per call (groups are the sglang-pool backend's)"
        if case.host_allocator is HostAllocator.PAGEABLE:
            return "pageable host memory: the JIT/TMA kernels dereference host memory (undefined, may fault)"
        return None

    def page_size_arg(self, case: Case) -> int | None:
        if self.tma_mode == "on" and not case.tuning_value("tma_page_size", True):
            return None
        return case.page_size

    def plan(self, case: Case, platform: Platform) -> Plan:
        row = case.pools[0].row_bytes(case.pools[0].components[0])
        if common.tma_selected(row, self.page_size_arg(case), platform, self.tma_mode):
            return Plan(EntryPoint.JIT_TMA, common.TMA)
        return Plan(EntryPoint.JIT_REGISTER, common.REGISTER)

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Any]:
        module = common.hicache()
        jobs: list[Any] = []
        if platform.has_tma and self.tma_mode != "off":
            jobs.append(
                lambda: module._jit_hicache_tma_module(block_quota=common.platform_rules(platform).tma_block_quota)
            )
        quota = common.platform_rules(platform).block_quota
        # Every row of the menu, also those the register kernel refuses (e.g. 96 or 576 bytes on CUDA): sglang
        # refuses them by failing the nvcc compile (a static_assert, several seconds). The memo keeps the
        # failure per process, so paying it here, in parallel with the other compiles (and in the background
        # for spare workers), keeps it out of the cases that confirm the rejection.
        for row in sorted(set(space.row_bytes)):
            jobs.append(
                lambda row=row: module._jit_hicache_module(
                    element_size=row, unroll=common.default_unroll(row), block_quota=quota
                )
            )
        return jobs

    def sglang_calls(self, case: Case, platform: Platform) -> list[SglangCall]:
        """One call: the one-layer or all-layer transfer, MLA or K/V, in the case's direction."""
        spec = case.pools[0]
        row = spec.row_bytes(spec.components[0])
        write = case.direction is Direction.WRITE_BACK
        host, device = (calls.HOST_INDICES, calls.DEVICE_INDICES)
        idx_dst, idx_src = (host, device) if write else (device, host)
        page_size = self.page_size_arg(case)
        mla = spec.attention is Attention.MLA
        if case.scope is Scope.ONE_LAYER:
            layer = case.layer
            # (dst, src) per component
            views = [(calls.host_layer(spec, c, layer, case.layout), calls.device_layer(spec, c, layer))
                     for c in spec.components]
            pairs = [(h, d) if write else (d, h) for h, d in views]
            sizes = (("element_dim", row // spec.dtype.itemsize), ("page_size", page_size))
            if mla:
                (dst, src), = pairs
                return [SglangCall("hicache", "transfer_hicache_one_layer_mla", (dst, idx_dst, src, idx_src), sizes)]
            (k_dst, k_src), (v_dst, v_src) = pairs
            return [SglangCall("hicache", "transfer_hicache_one_layer",
                               (k_dst, v_dst, idx_dst, k_src, v_src, idx_src), sizes)]
        host_tables = [calls.host_table(spec, c, case.layers, case.layout) for c in spec.components]
        dev_tables = [calls.device_table(spec, c, case.layers) for c in spec.components]
        dst, src = (host_tables, dev_tables) if write else (dev_tables, host_tables)
        host_stride = _host_stride_bytes(case, row)
        dst_stride, src_stride = (host_stride, row) if write else (row, host_stride)
        if mla:
            strides = (("cache_src_stride_bytes", src_stride), ("cache_dst_stride_bytes", dst_stride))
            return [SglangCall("hicache", "transfer_hicache_all_layer_mla", (dst[0], idx_dst, src[0], idx_src),
                               (*strides, ("element_size", row), ("page_size", page_size)))]
        strides = (("kv_cache_src_stride_bytes", src_stride), ("kv_cache_dst_stride_bytes", dst_stride))
        return [SglangCall("hicache", "transfer_hicache_all_layer", (dst[0], dst[1], idx_dst, src[0], src[1], idx_src),
                           (*strides, ("element_size", row), ("page_size", page_size)))]

    def run(self, buffers: Materialized) -> str:
        module = common.hicache()
        with common.tma_forced(self.tma_mode), common.recording() as events:
            for call in self.sglang_calls(buffers.case, common.platform_of(buffers)):
                call.run(module, buffers)
        return common.path_of(events)


class SglangJitBackend(_JitBackend):
    name = "sglang-jit"
    description = "sglang JIT one/all-layer transfer (MHA/MLA), sglang's own TMA gate (env + page-size rule)"
    tma_mode = None


class SglangJitRegisterBackend(_JitBackend):
    name = "sglang-jit-register"
    description = "sglang JIT one/all-layer transfer with the TMA gate forced off (register kernel)"
    tma_mode = "off"


class SglangJitTmaBackend(_JitBackend):
    name = "sglang-jit-tma"
    description = "sglang JIT one/all-layer transfer with the TMA gate forced on (CUDA sm90+)"
    tma_mode = "on"

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        if platform.kind != "cpu" and not platform.has_tma:
            return "TMA needs CUDA sm90+"
        return super().unsupported_reason(case, platform)
