"""Test-only backend for tests/commands/test_gate.py: the reference with the device indices reversed.

Any transfer of two or more distinct tokens lands rows in the wrong device slots, so the gate's corpus
replay and its campaign both have something to find.
"""

from __future__ import annotations

from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.reference import ReferenceBackend


class ReversedDeviceIndices(ReferenceBackend):
    name = "gate-test-reversed"
    description = "test plugin: pairs host token i with device token n-1-i"

    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        host, device = super().read_indices(buffers)
        return host, device[::-1]


def backends() -> list[Backend]:
    return [ReversedDeviceIndices()]
