"""A worked example of a third-party backend (the one shown in the README).

Run it:  hicache-fuzz fuzz --backend-plugin torch_index_copy:backends --backend torch-index-copy --runs 500
(with this folder on PYTHONPATH). tests/commands/test_readme_example.py runs exactly this and expects a clean campaign.
"""

from __future__ import annotations

import torch

from hicache_fuzz.api import (
    Attention,
    Availability,
    Backend,
    BackendRejected,
    Case,
    CaseSpace,
    Direction,
    EntryPoint,
    HostLayout,
    Materialized,
    Plan,
    Platform,
)


class TorchIndexCopy(Backend):
    """layer_first load-back with torch's own index_copy_, checked against the reference contract."""

    name = "torch-index-copy"
    description = "torch index_copy_ on layer_first pools (README example)"

    def probe(self, platform: Platform) -> Availability:
        return Availability(True, f"torch {torch.__version__}")

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        return space.narrowed(layouts=(HostLayout.LAYER_FIRST,), directions=(Direction.LOAD_BACK,),
                              attentions=(Attention.MHA, Attention.MLA))

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        if case.layout is not HostLayout.LAYER_FIRST or case.direction is not Direction.LOAD_BACK:
            return "layer_first load-back only"
        if any(pool.attention is Attention.MHA_ASYM for pool in case.pools):
            return "no asymmetric K/V pools"
        return None

    def plan(self, case: Case, platform: Platform) -> Plan:
        return Plan(EntryPoint.REFERENCE, "index_copy")

    def run(self, buffers: Materialized) -> str:
        case = buffers.case
        destinations = buffers.device_indices.tolist()
        if len(set(destinations)) != len(destinations):
            raise BackendRejected("duplicate destination rows")  # index_copy_ would pick a winner silently
        if any(i < 0 for i in destinations + buffers.host_indices.tolist()):
            raise BackendRejected("negative index")
        for pool in buffers.pools:
            components = pool.spec.components
            for layer in case.moved_layers:
                for number, component in enumerate(components):
                    whole = pool.host_typed()
                    host_layer = (whole[number] if len(components) > 1 else whole)[layer]  # (S, H, D) or (S, 1, D)
                    device = pool.device_layer_typed(component, layer)
                    rows = host_layer.index_select(0, buffers.host_indices.long().cpu())
                    device.index_copy_(0, buffers.device_indices.long().to(device.device),
                                       rows.reshape(-1, *device.shape[1:]).to(device.device))
        return "index_copy"


def backends() -> list[Backend]:
    return [TorchIndexCopy()]
