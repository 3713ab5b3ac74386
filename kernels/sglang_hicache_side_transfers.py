"""The side pools' part of each step of a ``sglang-hicache`` sequence under ``side_transfer`` (the side pools
themselves: kernels/sglang_hicache_side.py; the sequence: kernels/sglang_hicache_drive.py): the ``extra_pools`` that
name them in a back-up and a load, the release of an evicted entry's side slots, the back-up the last side pool
refuses, and the checks after each step that their grants, free counts and bytes are the oracle's
(oracles/side_transfers.py). Each check raises AssertionError with the step's label where sglang's answer is not
the oracle's.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.kernels import sglang_hicache_side as side_pools
from hicache_fuzz.kernels.sglang_hicache_objects import Built, head, indices, sync
from hicache_fuzz.oracles import sequence, side_transfers


def side_writes(mods: Any, sides: list[side_pools.SidePool], rows: torch.Tensor) -> list[Any]:
    """The ``extra_pools`` of a back-up that moves the side pools: each named with the back-up's device rows and no
    host slots, for the group's ``resolve_host_transfers`` to grant from its own allocator."""
    return [mods.PoolTransfer(name=side_pools.pool_name(mods, side), device_indices=rows) for side in sides]


def side_load(mods: Any, sides: list[side_pools.SidePool], side_step: side_transfers.SideStep | None,
              rows: torch.Tensor) -> dict[str, Any]:
    """The ``extra_pools`` of a load that moves the side pools: each one's slots from the loaded entry's back-up, to
    the load's device rows (a load of an entry the sequence did not back up names no side pool)."""
    if side_step is None or not any(side_step.host_slots):
        return {}
    cpu = torch.device("cpu")
    return {"extra_pools": [mods.PoolTransfer(name=side_pools.pool_name(mods, side),
                                              host_indices=indices(side_step.host_slots[side.position], cpu),
                                              device_indices=rows) for side in sides]}


def check_side_grants(step: sequence.Step, sides: list[side_pools.SidePool], transfers: list[Any],
                      side_step: side_transfers.SideStep) -> None:
    """The host slots that the group's ``resolve_host_transfers`` granted each side pool must be the oracle's side
    allocator's grant (AssertionError otherwise)."""
    for side, transfer in zip(sides, transfers, strict=True):
        got, want = transfer.host_indices, list(side_step.host_slots[side.position])
        if (None if got is None else got.tolist()) != want:
            raise AssertionError(f"{step.label()}: the write's {side.name} side pool transfer was granted host slots "
                                 f"{'none' if got is None else head(got)} by resolve_host_transfers, the oracle's "
                                 f"side allocator grants {want[:8]}")


def release_side_slots(mods: Any, controller: Any, sides: list[side_pools.SidePool], step: sequence.Step,
                       side_step: side_transfers.SideStep) -> None:
    """The evicted entry's side slots released as sglang releases independently allocated side-pool slots: the
    group's ``release_transfers``, which must free every one of them."""
    cpu = torch.device("cpu")
    transfers = [mods.PoolTransfer(name=side_pools.pool_name(mods, side),
                                   host_indices=indices(side_step.host_slots[side.position], cpu)) for side in sides]
    released = controller.mem_pool_host.release_transfers(transfers)
    slots = sum(len(held) for held in side_step.host_slots)
    if released != slots:
        raise AssertionError(f"{step.label()}: release_transfers freed {released} of the side pools' {slots} slots "
                             f"of the evicted entry ({', '.join(side.name for side in sides)})")


def refused_backup(mods: Any, built: Built, sides: list[side_pools.SidePool], step: sequence.Step,
                   side_step: side_transfers.SideStep | None, device: torch.device) -> None:
    """A back-up the oracle plans as refused (oracles/sequence.py): the write names every side pool, the last one
    cannot grant, and the write must return None with every side grant of it given back (no transfer keeps host
    slots), the anchor's grant given back (the anchor allocator's free count is the oracle's) and each side
    allocator's free count the oracle's. Nothing is written, so no step image is recorded."""
    if side_step is None:
        raise AssertionError(f"harness: {step.label()} is planned refused for a case whose side pools do not move")
    controller = built.controller
    rows = indices(step.device_indices, device)
    transfers = side_writes(mods, sides, rows)
    label = f"{type(controller).__name__}.write refused by the {sides[-1].name} side pool"
    granted = controller.write(rows, extra_pools=transfers, flush=False)
    if granted is not None:
        raise AssertionError(f"{step.label()}: {type(controller).__name__}.write granted host slots {head(granted)} "
                             f"although the {sides[-1].name} side pool's allocator has {side_step.free[-1]} free "
                             f"slots, fewer than the {len(step.device_indices)} the back-up needs: the group must "
                             f"refuse it (resolve_host_transfers returns None) and the write return None")
    kept = [(side.name, transfer.host_indices) for side, transfer in zip(sides, transfers, strict=True)
            if transfer.host_indices is not None]
    if kept:
        raise AssertionError(f"{step.label()} [{label}]: the {kept[0][0]} side pool's transfer kept host slots "
                             f"{head(kept[0][1])} after the group refused the write (the rollback must give every "
                             f"grant of it back)")
    free = built.allocating_pool.available_size()
    if free != step.free:
        raise AssertionError(f"{step.label()} [{label}]: the anchor's allocator has {free} free slots after the "
                             f"refused write, the oracle's {step.free}: the controller must give the anchor's grant "
                             f"back")
    check_sides(step, label, sides, side_step)


def check_sides(step: sequence.Step, label: str, sides: list[side_pools.SidePool],
                side_step: side_transfers.SideStep | None, device: torch.device | None = None) -> None:
    """After a step: each side allocator's free count is the oracle's, and (after a transfer) each side pool's bytes
    are the oracle's image of the step (AssertionError otherwise)."""
    if side_step is None:
        return
    for side in sides:
        free = side.host_pool.available_size()
        if free != side_step.free[side.position]:
            raise AssertionError(f"{step.label()} [{label}]: the {side.name} side pool's allocator has {free} free "
                                 f"slots, the oracle's side allocator {side_step.free[side.position]}")
    if device is None:
        return
    for side in sides:
        side.apply(side_step)
    sync(device)
    why = next((w for w in (side.differs() for side in sides) if w), "")
    if why:
        raise AssertionError(f"{step.label()} [{label}]: {why}")
