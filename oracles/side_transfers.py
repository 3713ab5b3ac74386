"""Side-pool transfers of a sequence: what side pools with their own host allocation move, and their bytes after each
step (docs/pools.md, "Side pools").

Side pools beside the anchor of the hybrid controller's group (a K-only index pool, a Mamba state pool, or both, as
a hybrid model holds both) are moved by naming them in a transfer's ``extra_pools``, each with its device rows and
no host slots: the group's ``resolve_host_transfers`` grants each its slots from its own allocator, pool by pool in
name order (sglang sorts the transfers by pool name: ``indexer`` before ``mamba``), and a later load of the entry
names the slots those grants gave. With the tuning entry ``side_transfer`` (:data:`SIDE_TRANSFER_KEY`) every transfer
of a sequence (oracles/sequence.py) that moves an entry backed up by the sequence moves every side pool too, over the
same device rows:

* ``backup``: each side pool's allocator grants as many slots as the back-up moves tokens; each target layer's rows
  of the side pool's device rows are copied to those slots.
* ``load``: the slots granted with the loaded entry's back-up are copied to the load's device rows, pool by pool. An
  entry the sequence did not back up (a load-back case's own entry) has no side slots: its loads move the anchor only.
* ``evict``: the evicted entry's side slots are released (the group's ``release_transfers``).

Each side allocator is, like the anchor's (oracles/sequence.py), a first-in first-out list of free slots: ``alloc(n)``
grants the first ``n``, ``free(x)`` appends ``x`` in its order. It has as many slots as the anchor's host pool and
starts with every slot free in ascending order, so under ``on`` it never runs out before the anchor does (a side
pool holds at most the anchor's held entries).

**A side pool that refuses its grant** (``side_transfer`` = :data:`SIDE_TRANSFER_FULL`): the side pool asked last
(the last in name order) starts with its first ``S - n`` slots held by entries outside the sequence (one grant
before the sequence, never released; the group has no reclaim callback that could evict them), so its free list is
``[S - n, S)``: room for one back-up. The sequence plans which back-ups are then refused (oracles/sequence.py,
``refused`` steps). At a refused back-up the side pools asked before it have granted their slots, and the group
gives them back (``free``: appended to their free lists, so their next grants come from further on); the refusing
pool grants nothing; every transfer of the write is left with no host slots and no byte moves. The step's
``free`` states each side allocator's free count after it.

The side pools' storages are laid out as cases of their own (:func:`side_case`: the side pool's spec, its target
layers, the case's page size, device rows and host slots) in oracles/layouts.py's terms.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from hicache_fuzz.harness.model.case import Case, Direction, PoolSpec
from hicache_fuzz.oracles import layouts, sequence
from hicache_fuzz.oracles.sequence import SIDE_TRANSFER_FULL, SIDE_TRANSFER_KEY, SIDE_TRANSFER_ON

__all__ = ["SIDE_TRANSFER_FULL", "SIDE_TRANSFER_KEY", "SIDE_TRANSFER_ON", "SideStep", "apply_side_step",
           "held_outside", "side_case", "side_steps"]


@dataclass(frozen=True)
class SideStep:
    """What one step of the sequence does to the side pools, one entry per side pool in name order: their host
    slots (a back-up's grants, a load's sources, an evict's releases; empty: the step does not touch that pool; a
    refused back-up touches none), the device rows of a transfer, and each side allocator's free count after the
    step."""

    index: int
    op: str
    host_slots: tuple[tuple[int, ...], ...]
    device_rows: tuple[int, ...]
    free: tuple[int, ...]

    @property
    def transfers(self) -> bool:
        return self.op in (sequence.BACKUP, sequence.LOAD) and any(self.host_slots)

    @property
    def names_side_pools(self) -> bool:
        """Whether the step's operation names the side pools (a back-up, refused or not, or an entry that holds
        side slots)."""
        return self.op in (sequence.BACKUP, sequence.REFUSED) or any(self.host_slots)


def held_outside(case: Case, pools: int, pool: int) -> int:
    """How many of side pool `pool`'s slots (of `pools`, name order) entries outside the sequence hold before it: the
    first ``S - n`` of the pool asked last where it refuses (``side_transfer`` = ``full``), else none."""
    if sequence.side_refusals(case) and pool == pools - 1:
        return case.host_slots - case.n
    return 0


def side_steps(case: Case, pools: int = 1) -> list[SideStep]:
    """One SideStep per step of ``sequence.plan_steps(case)``, in order, for `pools` side pools (name order). Raises
    SequenceError as plan_steps does."""
    n = case.n
    frees = [deque(range(held_outside(case, pools, pool), case.host_slots)) for pool in range(pools)]
    side_of: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}  # anchor slots of a held entry -> side slots
    out = []
    none: tuple[tuple[int, ...], ...] = ((),) * pools
    for step in sequence.plan_steps(case):
        slots = none
        if step.op == sequence.BACKUP:
            if any(len(free) < n for free in frees):
                raise AssertionError(f"oracle: {step.label()} is granted though a side pool has fewer than {n} slots")
            slots = tuple(tuple(free.popleft() for _ in range(n)) for free in frees)
            side_of[step.host_indices] = slots
        elif step.op == sequence.REFUSED:
            if len(frees[-1]) >= n or any(len(free) < n for free in frees[:-1]):
                raise AssertionError(f"oracle: {step.label()} is refused though the last side pool has room")
            for free in frees[:-1]:  # granted, then given back by the group's rollback
                free.extend([free.popleft() for _ in range(n)])
        elif step.op == sequence.LOAD:
            slots = side_of.get(step.host_indices, none)
        elif step.op == sequence.EVICT:
            slots = side_of.pop(step.host_indices, none)
            for free, released in zip(frees, slots, strict=True):
                free.extend(released)
        rows = step.device_indices if any(slots) and step.op in (sequence.BACKUP, sequence.LOAD) else ()
        out.append(SideStep(step.index, step.op, slots, rows, tuple(len(free) for free in frees)))
    if case.direction is Direction.LOAD_BACK and out and any(out[0].host_slots):
        raise AssertionError("oracle: a load-back case's own entry has no side slots")
    return out


def side_case(case: Case, spec: PoolSpec, layers: int) -> Case:
    """The side pool's storages as a case: `spec`'s rows, `layers` (the side pool's target layers), the case's
    layout, page size, device rows and host slots."""
    return case.replace(pools=(spec,), layers=layers, tuning=())


def apply_side_step(side: Case, host: torch.Tensor, device: torch.Tensor, step: SideStep, pool: int = 0) -> None:
    """`step`'s copies of side pool `pool` (name order), in place, on its host and device storages (flat uint8, laid
    out as `side`)."""
    if step.op not in (sequence.BACKUP, sequence.LOAD) or not step.host_slots[pool]:
        return
    spec = side.pools[0]
    slots = torch.tensor(step.host_slots[pool], dtype=torch.int64)
    rows = torch.tensor(step.device_rows, dtype=torch.int64)
    for component in spec.components:
        for layer in range(side.layers):
            host_at = layouts.host_row_bytes(side, spec, component, layer, slots)
            device_at = layouts.device_row_bytes(side, spec, component, layer, rows)
            if step.op == sequence.BACKUP:
                host[host_at] = device[device_at]
            else:
                device[device_at] = host[host_at]
