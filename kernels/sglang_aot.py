"""The AOT ops of ``sgl_kernel.kvcacheio`` (sglang-kernel 0.4.10), per-token transfers, MHA and MLA.

Runs the real sgl_kernel where it loads against the installed torch, else this project's build of the same
ops from sglang's pinned public sources (hicache_fuzz.kernels.aot_build, docs/aot.md); the prebuilt
sglang-kernel 0.4.10 wheel targets torch 2.14 and fails on e.g. torch 2.11 (``undefined symbol``).
``probe`` / ``hicache-fuzz backends`` say which build is in use and where it came from, or why none is.

Ops (keyword names as sglang's pools call them): load-back one layer ``transfer_kv_per_layer[_mla]``
(layer_first), ``transfer_kv_per_layer[_mla]_pf_lf`` (page_first), ``transfer_kv_per_layer_ph_lf`` (page_head);
write-back all layers ``transfer_kv_all_layer[_mla]`` (layer_first, pointer tables),
``transfer_kv_all_layer[_mla]_lf_pf`` (page_first), ``transfer_kv_all_layer_lf_ph`` (page_head).
Measured results: docs/aot.md.
"""

from __future__ import annotations

from typing import Any

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostAllocator, HostLayout, Scope
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_jit import SglangBackend, _host_layer, gpu_space
from hicache_fuzz.oracles.contract import EntryPoint, Platform


def aot_status() -> tuple[bool, str]:
    """(callable, what is in use and where it came from / why not) for the ``sgl_kernel.kvcacheio`` ops.

    The real sglang-kernel when it loads against this torch, else this project's build of the same sources
    (hicache_fuzz.kernels.aot_build: fetched at a pinned sglang commit, built for the installed torch)."""
    from hicache_fuzz.kernels.aot_build.loader import activate

    state = activate()
    return state.available, state.reason


def aot_build_note() -> str:
    """What this project's AOT build folder holds (without loading anything), for reasons shown on CPU."""
    from hicache_fuzz.kernels.aot_build.loader import read_build

    return f"AOT ops: {read_build().reason}"


def aot_op(case: Case) -> str:
    mla = case.pools[0].attention is Attention.MLA
    m = "_mla" if mla else ""
    suffix = {HostLayout.LAYER_FIRST: "", HostLayout.PAGE_FIRST: "pf", HostLayout.PAGE_HEAD: "ph"}[case.layout]
    if case.direction is Direction.LOAD_BACK:
        return f"transfer_kv_per_layer{m}" + (f"_{suffix}_lf" if suffix else "")
    return f"transfer_kv_all_layer{m}" + (f"_lf_{suffix}" if suffix else "")


class SglangAotBackend(SglangBackend):
    name = "sglang-aot"
    description = "sgl_kernel.kvcacheio AOT per-token ops (layer_first/page_first/page_head, MHA/MLA)"
    supported_layouts = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_HEAD)

    def probe(self, platform: Platform) -> Availability:
        why = common.gpu_reason(platform)
        if why is not None:
            return Availability(False, f"{why}; {aot_build_note()}")
        ok, reason = aot_status()
        return Availability(ok, reason)

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        # Prebuilt ops: no row or page size is a compile, so both keep the whole range (geometry draws too).
        return gpu_space(space, layouts=self.supported_layouts, rows=None, backend=self.name)

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        reason = self.common_unsupported(case, platform)
        if reason:
            return reason
        if len(case.pools) > 1:
            return "one pool per call"
        if case.layout is HostLayout.PAGE_HEAD and case.pools[0].attention is Attention.MLA:
            return "page_head does not exist for MLA"
        if case.direction is Direction.LOAD_BACK and case.scope is not Scope.ONE_LAYER:
            return "AOT load-back ops move one layer"
        if case.direction is Direction.WRITE_BACK and case.scope is not Scope.ALL_LAYERS:
            return "AOT write-back ops move all layers"
        if case.host_allocator is HostAllocator.PAGEABLE:
            return "pageable host memory: pointer-table ops dereference it (undefined, may fault)"
        if case.n == 0:
            return "zero-length AOT launch divides by zero on the host (by reading): would kill the worker"
        return None

    def plan(self, case: Case, platform: Platform) -> Plan:
        return Plan(EntryPoint.AOT, f"aot:{aot_op(case)}")

    def run(self, buffers: Materialized) -> str:
        aot_status()  # in a fresh worker process: load the build and route sgl_kernel.kvcacheio first
        import sgl_kernel.kvcacheio as ops

        case = buffers.case
        pool = buffers.pools[0]
        spec = pool.spec
        mla = spec.attention is Attention.MLA
        item = spec.row_bytes(spec.components[0])
        layout_dim = item * case.layers
        name = aot_op(case)
        op = getattr(ops, name)
        h, d = buffers.host_indices, buffers.device_indices
        kw: dict[str, Any] = {}
        if case.direction is Direction.LOAD_BACK:
            layer = case.layer

            def host(c: str) -> Any:
                if case.layout is HostLayout.LAYER_FIRST:
                    return _host_layer(pool, c, layer)
                return pool.host_typed() if mla else pool.host_component_typed(c)

            if mla:
                kw = {"src": host("kv"), "dst": pool.device_layer_typed("kv", layer)}
            else:
                kw = {
                    "src_k": host("k"),
                    "dst_k": pool.device_layer_typed("k", layer),
                    "src_v": host("v"),
                    "dst_v": pool.device_layer_typed("v", layer),
                }
            kw.update(src_indices=h, dst_indices=d, item_size=item)
            if case.layout is not HostLayout.LAYER_FIRST:
                kw.update(layer_id=layer, src_layout_dim=layout_dim)
            if case.layout is HostLayout.PAGE_HEAD:
                kw.update(page_size=case.page_size, head_num=spec.heads)
        else:
            dev = {
                c: common.ptr_table([pool.device_layer(c, i) for i in range(case.layers)], buffers.device)
                for c in spec.components
            }
            if case.layout is HostLayout.LAYER_FIRST:
                host_tables = {
                    c: common.ptr_table([_host_layer(pool, c, i) for i in range(case.layers)], buffers.device)
                    for c in spec.components
                }
                if mla:
                    kw = {"src_layers": dev["kv"], "dst_layers": host_tables["kv"]}
                else:
                    kw = {
                        "src_k_layers": dev["k"],
                        "dst_k_layers": host_tables["k"],
                        "src_v_layers": dev["v"],
                        "dst_v_layers": host_tables["v"],
                    }
            else:
                if mla:
                    kw = {"src_layers": dev["kv"], "dst": pool.host_typed()}
                else:
                    kw = {
                        "src_k_layers": dev["k"],
                        "dst_k": pool.host_component_typed("k"),
                        "src_v_layers": dev["v"],
                        "dst_v": pool.host_component_typed("v"),
                    }
                kw.update(dst_layout_dim=layout_dim)
                if case.layout is HostLayout.PAGE_HEAD:
                    kw.update(page_size=case.page_size, head_num=spec.heads)
            kw.update(src_indices=d, dst_indices=h, item_size=item, num_layers=case.layers)
        with common.recording() as events:
            common.record(f"aot:{name}")
            op(**kw)
        return common.path_of(events)
