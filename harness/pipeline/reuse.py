"""Storage reuse: a case runs on the storages the previous case of the same geometry left behind.

An index variant (harness/engine/variants.py) has its case's geometry: the same pools, layers, rows, page
size and layout, so the same storages. Allocating and filling them again costs more than the kernel call, so a
worker that is told to (``reuse``) keeps the last case's storages and hands them to the next case when the
geometry matches: the sources are filled afresh for the new case (its own seed, so the bytes it moves are new),
the destinations keep their content. Nothing about the check changes: the runner still takes its "before" copy
of every storage, applies the oracle to it and compares every byte of every storage.

What can differ from a fresh run is only what a destination held before the call. Two rules keep that from
hiding a bug. The storages are reused only for a case whose fill seed they have not seen: a case with a seed
they have seen (the same case for the next backend: the feed sends index i to every backend) would move
source bytes a destination may already hold, so a write the kernel skipped would go unnoticed (CPU test:
`tests/campaign/test_variants.py`). And a failure seen on reused storages is run again on fresh ones
(runner.py) before it is reported, so reproducers, damage classes and bug identities are those of the case
alone.
"""

from __future__ import annotations

import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.pipeline.materialize import materialize, rematerialize
from hicache_fuzz.kernels.buffers import HostMemory, Materialized

GeometryKey = tuple[object, ...]


def geometry_key(case: Case) -> GeometryKey:
    """Everything that shapes a case's storages and their roles (indices, seed, note, backend excluded)."""
    return (case.direction, case.scope, case.layout, case.pools, case.layers, case.page_size, case.device_rows,
            case.host_slots, case.layer, case.host_index, case.device_index, case.host_allocator)


class StorageReuse:
    """The storages of the last case, kept for the next case of the same geometry."""

    def __init__(self) -> None:
        self._kept: Materialized | None = None
        self._key: GeometryKey | None = None
        self._seeds: set[int] = set()  # fill seeds of every case run on the kept storages
        self.reused = 0  # cases that ran on kept storages
        self.fresh = 0  # cases that needed new ones

    def take(self, case: Case, device: torch.device, memory: HostMemory | None) -> tuple[Materialized, bool]:
        """Buffers for `case` and whether they are reused. The caller gives them back with :meth:`keep` or
        releases them (after a device error, or when it will not reuse them)."""
        key = geometry_key(case)
        if (self._kept is not None and key == self._key and self._kept.device == device
                and case.seed not in self._seeds):
            kept, self._kept = self._kept, None
            try:
                buffers = rematerialize(kept, case)
            except BaseException:
                kept.release()
                raise
            self.reused += 1
            return buffers, True
        self.drop()
        self.fresh += 1
        return materialize(case, device, memory), False

    def keep(self, buffers: Materialized) -> None:
        """Keep `buffers` (the storages the last case ran on) for the next case of their geometry."""
        key = geometry_key(buffers.case)
        seeds = self._seeds if key == self._key else set()
        self.drop()
        self._kept, self._key, self._seeds = buffers, key, seeds | {buffers.case.seed}

    def drop(self) -> None:
        if self._kept is not None:
            self._kept.release()
        self._kept, self._key, self._seeds = None, None, set()
