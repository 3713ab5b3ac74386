"""Test-only backend for tests/commands/test_gate.py: the reference with the device indices reversed.

Any transfer of two or more distinct tokens lands rows in the wrong device slots, so the gate's corpus
replay and its campaign both have something to find.
"""

from __future__ import annotations

from typing import ClassVar

from hicache_fuzz.api import Backend, Materialized, ReferenceBackend


class ReversedDeviceIndices(ReferenceBackend):
    name = "gate-test-reversed"
    description = "test plugin: pairs host token i with device token n-1-i"

    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        host, device = super().read_indices(buffers)
        return host, device[::-1]


class FlakyOnce(ReferenceBackend):
    """Wrong the first time it meets a case (device indices reversed), right ever after in this process: what
    the gate's isolated re-run must call flaky rather than a finding."""

    name = "gate-test-flaky"
    description = "test plugin: reverses the device indices of a case the first time only"
    seen: ClassVar[set[str]] = set()

    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        host, device = super().read_indices(buffers)
        if buffers.case.case_id in self.seen:
            return host, device
        self.seen.add(buffers.case.case_id)
        return host, device[::-1]


def backends() -> list[Backend]:
    return [ReversedDeviceIndices(), FlakyOnce()]
