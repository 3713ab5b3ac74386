"""The CPU reference backend: an independent, deliberately plain implementation of every transfer.

It works on sglang-shaped typed tensors with PyTorch indexing (never the oracle's byte-offset maps), so it
and the oracle are two implementations of one specification and checking one against the other means
something. It is also the parent of the bug-zoo mutants (:mod:`hicache_fuzz.kernels.zoo`), which override
one of its small steps each: read indices, validate, expand pages, find host rows, copy.

Semantics are those of the REFERENCE entry point: per token, except page_first_direct (host page = first
host index of the page // page_size) and the page_unified write-back (page ids on both sides).
"""

from __future__ import annotations

import torch

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout
from hicache_fuzz.kernels.base import Availability, Backend, BackendRejected, Plan
from hicache_fuzz.kernels.buffers import Materialized, PoolBuffers
from hicache_fuzz.oracles.contract import EntryPoint, Platform


class ReferenceBackend(Backend):
    name = "reference"
    description = "pure-PyTorch CPU reference: bounds-checked, any index placement"

    def probe(self, platform: Platform) -> Availability:
        return Availability(True, f"torch {torch.__version__}, runs on the CPU")

    def plan(self, case: Case, platform: Platform) -> Plan:
        return Plan(EntryPoint.REFERENCE, self.name)

    def run(self, buffers: Materialized) -> str:
        case = buffers.case
        host, device = self.read_indices(buffers)
        host, device = self.expand(case, host, device)
        self.validate(case, host, device)
        for pool in buffers.pools:
            for layer in case.moved_layers:
                for component in pool.spec.components:
                    self.copy(pool, component, layer, host, device)
        return self.name

    # ---- the steps mutants override ------------------------------------------------------------------
    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        return buffers.host_indices.cpu().tolist(), buffers.device_indices.cpu().tolist()

    def page_granular(self, case: Case) -> bool:
        return case.layout is HostLayout.PAGE_FIRST_DIRECT or (
            case.layout is HostLayout.PAGE_UNIFIED and case.direction is Direction.WRITE_BACK
        )

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        """Page-granular transfers: one (host page, device page) per page, expanded to all its tokens."""
        if len(host) != len(device):
            raise BackendRejected(f"index lists differ in length: {len(host)} host, {len(device)} device")
        if not self.page_granular(case):
            return host, device
        ps = case.page_size
        if len(host) % ps:
            raise BackendRejected(f"{len(host)} indices is not a whole number of pages of {ps}")
        out_h: list[int] = []
        out_d: list[int] = []
        align_device = case.layout is HostLayout.PAGE_UNIFIED
        for start in range(0, len(host), ps):
            host_page_start = (host[start] // ps) * ps
            device_start = (device[start] // ps) * ps if align_device else device[start]
            out_h.extend(host_page_start + t for t in range(ps))
            out_d.extend(device_start + t for t in range(ps))
        return out_h, out_d

    def validate(self, case: Case, host: list[int], device: list[int]) -> None:
        for value in host:
            if not 0 <= value < case.host_slots:
                raise BackendRejected(f"host index {value} out of range [0, {case.host_slots})")
        for value in device:
            if not 0 <= value < case.device_rows:
                raise BackendRejected(f"device index {value} out of range [0, {case.device_rows})")
        destinations = host if case.direction is Direction.WRITE_BACK else device
        if len(set(destinations)) != len(destinations):
            raise BackendRejected("duplicate destination indices")

    def host_rows(self, pool: PoolBuffers, component: str, layer: int) -> torch.Tensor:
        """A view of one (component, layer) of the host pool indexed [page, slot, ...]."""
        case, spec = pool.case, pool.spec
        P, ps = case.host_pages, case.page_size
        c = spec.components.index(component)
        layout = case.layout
        if spec.attention is Attention.MLA:
            whole = pool.host_typed()
            if layout is HostLayout.LAYER_FIRST:
                return whole[layer].view(P, ps, *whole.shape[2:])
            if layout is HostLayout.PAGE_FIRST:
                return whole[:, layer].unflatten(0, (P, ps))
            return whole[:, layer]  # page_first_direct and page_unified: (P, ps, ...)
        if spec.attention is Attention.MHA_ASYM:
            half = pool.host_component_typed(component)
        elif layout is HostLayout.PAGE_UNIFIED:
            # (P, G, L, 2, ps, H/G, D) -> (P, ps, G, H/G, D)
            return pool.host_typed()[:, :, layer, c].permute(0, 2, 1, 3, 4)
        else:
            half = pool.host_typed()[c]
        if layout is HostLayout.LAYER_FIRST:
            return half[layer].unflatten(0, (P, ps))
        if layout is HostLayout.PAGE_FIRST:
            return half[:, layer].unflatten(0, (P, ps))
        if layout is HostLayout.PAGE_FIRST_DIRECT:
            return half[:, layer]
        if layout is HostLayout.PAGE_HEAD:
            # (P, H, ps, L, D) -> (P, ps, H, D)
            return half[:, :, :, layer].permute(0, 2, 1, 3)
        raise AssertionError(layout)

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        self.copy_rows(pool, host_component=component, host_layer=layer, device_component=component,
                       device_layer=layer, host=host, device=device)

    def copy_rows(self, pool: PoolBuffers, *, host_component: str, host_layer: int, device_component: str,
                  device_layer: int, host: list[int], device: list[int]) -> None:
        """Move rows between one host (component, layer) and one device (component, layer); the two are
        chosen independently so mutants can model K/V and layer mix-ups with the same code."""
        if not host:
            return
        ps = pool.case.page_size
        rows = self.host_rows(pool, host_component, host_layer)
        dev = pool.device_layer_typed(device_component, device_layer)
        h = torch.tensor(host, dtype=torch.int64)
        d = torch.tensor(device, dtype=torch.int64, device=dev.device)
        page, slot = torch.div(h, ps, rounding_mode="floor"), torch.remainder(h, ps)
        if pool.case.direction is Direction.WRITE_BACK:
            values = dev[d].to(rows.device)
            rows[page, slot] = values.reshape(len(host), *rows.shape[2:])
        else:
            values = rows[page, slot].to(dev.device)
            dev[d] = values.reshape(len(device), *dev.shape[1:])
