"""Side-pool transfers of a sequence: what a side pool with its own host allocation moves, and its bytes after each
step (docs/pools.md, "Side pools").

A side pool beside the anchor of the hybrid controller's group (a K-only index pool, a Mamba state pool) is moved
by naming it in a transfer's ``extra_pools`` with its device rows and no host slots: the group's
``resolve_host_transfers`` grants the slots from the side pool's own allocator, and a later load of the entry names
the slots that grant gave. With the tuning entry ``side_transfer`` (:data:`SIDE_TRANSFER_KEY`) every transfer of a
sequence (oracles/sequence.py) that moves an entry backed up by the sequence moves the side pool too, over the same
device rows:

* ``backup``: the side pool's allocator grants as many slots as the back-up moves tokens; each target layer's rows
  of the side pool's device rows are copied to those slots.
* ``load``: the slots granted with the loaded entry's back-up are copied to the load's device rows. An entry the
  sequence did not back up (a load-back case's own entry) has no side slots: its loads move the anchor only.
* ``evict``: the evicted entry's side slots are released (the group's ``release_transfers``).

The side allocator is, like the anchor's (oracles/sequence.py), a first-in first-out list of free slots:
``alloc(n)`` grants the first ``n``, ``free(x)`` appends ``x`` in its order. It starts with every slot free in
ascending order and has as many slots as the anchor's host pool, so it never runs out before the anchor does (the
side pool holds at most the anchor's held entries).

The side pool's storages are laid out as a case of their own (:func:`side_case`: the side pool's spec, its target
layers, the case's page size, device rows and host slots) in oracles/layouts.py's terms.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from hicache_fuzz.harness.model.case import Case, Direction, PoolSpec
from hicache_fuzz.oracles import layouts, sequence

SIDE_TRANSFER_KEY = "side_transfer"
SIDE_TRANSFER_ON = "on"


@dataclass(frozen=True)
class SideStep:
    """What one step of the sequence does to the side pool: its host slots (a back-up's grant, a load's source,
    an evict's release; empty: the step does not touch the side pool) and device rows (a transfer's rows)."""

    index: int
    op: str
    host_slots: tuple[int, ...]
    device_rows: tuple[int, ...]

    @property
    def transfers(self) -> bool:
        return self.op in (sequence.BACKUP, sequence.LOAD) and bool(self.host_slots)


def side_steps(case: Case) -> list[SideStep]:
    """One SideStep per step of ``sequence.plan_steps(case)``, in order. Raises SequenceError as plan_steps does."""
    free: deque[int] = deque(range(case.host_slots))
    side_of: dict[tuple[int, ...], tuple[int, ...]] = {}  # anchor slots of a held entry -> its side slots
    out = []
    for step in sequence.plan_steps(case):
        slots: tuple[int, ...] = ()
        if step.op == sequence.BACKUP:
            if len(free) < len(step.host_indices):
                raise sequence.SequenceError(f"{step.label()}: the side pool has {len(free)} free slots, the "
                                             f"back-up moves {len(step.host_indices)} tokens")
            slots = tuple(free.popleft() for _ in step.host_indices)
            side_of[step.host_indices] = slots
        elif step.op == sequence.LOAD:
            slots = side_of.get(step.host_indices, ())
        elif step.op == sequence.EVICT:
            slots = side_of.pop(step.host_indices, ())
            free.extend(slots)
        rows = step.device_indices if slots and step.op != sequence.EVICT else ()
        out.append(SideStep(step.index, step.op, slots, rows))
    if case.direction is Direction.LOAD_BACK and out and out[0].host_slots:
        raise AssertionError("oracle: a load-back case's own entry has no side slots")
    return out


def side_case(case: Case, spec: PoolSpec, layers: int) -> Case:
    """The side pool's storages as a case: `spec`'s rows, `layers` (the side pool's target layers), the case's
    layout, page size, device rows and host slots."""
    return case.replace(pools=(spec,), layers=layers, tuning=())


def apply_side_step(side: Case, host: torch.Tensor, device: torch.Tensor, step: SideStep) -> None:
    """`step`'s copies, in place, on the side pool's host and device storages (flat uint8, laid out as `side`)."""
    if not step.transfers:
        return
    spec = side.pools[0]
    slots = torch.tensor(step.host_slots, dtype=torch.int64)
    rows = torch.tensor(step.device_rows, dtype=torch.int64)
    for component in spec.components:
        for layer in range(side.layers):
            host_at = layouts.host_row_bytes(side, spec, component, layer, slots)
            device_at = layouts.device_row_bytes(side, spec, component, layer, rows)
            if step.op == sequence.BACKUP:
                host[host_at] = device[device_at]
            else:
                device[device_at] = host[host_at]
