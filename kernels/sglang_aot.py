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

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostAllocator, HostLayout, Scope
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_call as calls
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_call import SglangCall
from hicache_fuzz.kernels.sglang_jit import SglangBackend, gpu_space
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

    def sglang_calls(self, case: Case, platform: Platform) -> list[SglangCall]:
        """One op: a one-layer load-back or an all-layer write-back, by keyword, as sglang's host pools call it."""
        spec = case.pools[0]
        mla = spec.attention is Attention.MLA
        item = spec.row_bytes(spec.components[0])
        layout, layers = case.layout, case.layers
        kw: list[tuple[str, calls.Argument]] = []
        names = ("",) if mla else ("_k", "_v")  # keyword suffix per component
        if case.direction is Direction.LOAD_BACK:
            layer = case.layer
            for suffix, c in zip(names, spec.components, strict=True):
                host = (calls.host_layer(spec, c, layer, layout) if layout is HostLayout.LAYER_FIRST
                        else calls.host_tensor(spec, c))
                kw += [(f"src{suffix}", host), (f"dst{suffix}", calls.device_layer(spec, c, layer))]
            kw += [("src_indices", calls.HOST_INDICES), ("dst_indices", calls.DEVICE_INDICES), ("item_size", item)]
            if layout is not HostLayout.LAYER_FIRST:
                kw += [("layer_id", layer), ("src_layout_dim", item * layers)]
        else:
            for suffix, c in zip(names, spec.components, strict=True):
                kw.append((f"src{suffix}_layers", calls.device_table(spec, c, layers)))
                if layout is HostLayout.LAYER_FIRST:
                    kw.append((f"dst{suffix}_layers", calls.host_table(spec, c, layers, layout)))
                else:
                    kw.append((f"dst{suffix}", calls.host_tensor(spec, c)))
            if layout is not HostLayout.LAYER_FIRST:
                kw.append(("dst_layout_dim", item * layers))
            kw += [("src_indices", calls.DEVICE_INDICES), ("dst_indices", calls.HOST_INDICES), ("item_size", item),
                   ("num_layers", layers)]
        if layout is HostLayout.PAGE_HEAD:
            kw += [("page_size", case.page_size), ("head_num", spec.heads)]
        return [SglangCall("kvcacheio", aot_op(case), (), tuple(kw))]

    def run(self, buffers: Materialized) -> str:
        aot_status()  # in a fresh worker process: load the build and route sgl_kernel.kvcacheio first
        import sgl_kernel.kvcacheio as ops

        with common.recording() as events:
            for call in self.sglang_calls(buffers.case, common.platform_of(buffers)):
                common.record(f"aot:{call.function}")
                call.run(ops, buffers)
        return common.path_of(events)
