"""Backends for tests/commands/test_selftest.py: a "mutant" that is the reference in disguise, and a broken
reference."""

from __future__ import annotations

from hicache_fuzz.api import Backend, Case, ReferenceBackend


class ReferenceLookalike(ReferenceBackend):
    """Claims a bug but behaves exactly like the reference: no campaign can kill it."""

    name = "test-zoo-lookalike"
    models_bug = "B0: none (identical to the reference; selftest must report it as a survivor)"


class BrokenReference(ReferenceBackend):
    """Replaces the reference with one that forgets the last page of multi-page transfers."""

    name = "reference"

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        if len(host) >= 2 * case.page_size:
            return host[: -case.page_size], device[: -case.page_size]
        return host, device


def lookalike() -> list[Backend]:
    return [ReferenceLookalike()]


def broken_reference() -> list[Backend]:
    return [BrokenReference()]
