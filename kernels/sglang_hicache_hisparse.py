"""The HiSparse coordinator's part of ``sglang-hicache``: the HiSparse MHA pool's loads, and its host slots held in
the coordinator's request table.

This module stands in for the HiSparse coordinator (``HiSparseCoordinator``) of the HiSparse MHA pool: its loads
are that coordinator's loop (global layer ids of the stage, the kernel io backend). A case with the ``requests``
knob holds its host slots as the coordinator does (``RequestTable``): the coordinator's request table, filled by
the pool's own ``alloc_paged_token_slots`` for each back-up, whose grant is backed up with
``backup_from_device_all_layer`` (``admit_request_into_staging``), loaded from the request's row, and freed on
release through ``allocated_host_indices`` and the pool's ``free`` (``request_finished``). Without the knob its
back-ups go through the controller's ``write`` (the same pool call, slots from ``HostKVCache.alloc``). Under
request slots every grant, the request table after it and the allocator's free count are compared with the
oracle's before the grant is used.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels.sglang_hicache_objects import Built, head, indices
from hicache_fuzz.kernels.sglang_hicache_settings import REQUEST_SLOT_CLASSES
from hicache_fuzz.oracles import sequence

# Pools whose loads their own coordinator makes, not a HiCache controller: the HiSparse MHA pool takes the stage's
# global layer ids and has no guard for others (its coordinator never asks for them).
COORDINATOR_LOADED = REQUEST_SLOT_CLASSES


class RequestTable:
    """The HiSparse coordinator's request table (``hisparse_coordinator.py``): ``req_to_host_pool``, one row of host
    slots per request (-1 where none), int64 on the device, and ``req_to_host_pool_allocated_len``, each row's
    allocated length, int64 on the CPU. The pool's own ``alloc_paged_token_slots`` fills it and
    ``allocated_host_indices`` reads it. A row is the coordinator's longest context plus a page wide; no request
    here holds more than the pool's capacity, which stands for that context."""

    def __init__(self, case: Case, device: torch.device) -> None:
        width = case.host_slots + case.page_size
        self.slots = torch.full((sequence.REQUEST_ROWS, width), -1, dtype=torch.int64, device=device)
        self.allocated = torch.zeros(sequence.REQUEST_ROWS, dtype=torch.int64)

    def release(self, request: int) -> None:
        """The row emptied, as the coordinator's ``request_finished`` leaves it."""
        self.slots[request, :] = -1
        self.allocated[request] = 0

    def differs(self, step: sequence.Step) -> str:
        """'' if the table is the oracle's after `step`, else its first difference."""
        lengths = [len(row) for row in step.table]
        if self.allocated.tolist() != lengths:
            return f"req_to_host_pool_allocated_len is {self.allocated.tolist()}, the oracle's {lengths}"
        got = self.slots.cpu()
        want = torch.full_like(got, -1)
        for request, row in enumerate(step.table):
            want[request, : len(row)] = torch.tensor(row, dtype=torch.int64)
        differs = (got != want).nonzero()
        if not len(differs):
            return ""
        request, token = (int(v) for v in differs[0])
        return (f"req_to_host_pool row {request} holds {int(got[request, token])} at token {token}, the oracle's "
                f"{int(want[request, token])}")


def request_step(built: Built, table: RequestTable, step: sequence.Step, start: int, layers: int) -> str:
    """One step of a request-slot sequence as the HiSparse coordinator makes it (the label names its calls): a
    back-up's or reservation's grant from the pool's ``alloc_paged_token_slots``, backed up with
    ``backup_from_device_all_layer`` (the kernel io backend; a grant of no tokens moves nothing, as the
    coordinator's ``_backup_device_locs_to_host`` skips it); a load from the request's row, layer by layer over the
    stage's global layer ids; a release through ``allocated_host_indices`` and the pool's ``free``. The grant, the
    freed slots, the table and the allocator's free count must be the oracle's (AssertionError otherwise), the
    grant before it is used."""
    pool, device = built.host_pool, table.slots.device
    count = len(step.host_indices)
    why = ""
    if step.op == sequence.RELEASE:
        freed = pool.allocated_host_indices(table.slots, step.request, table.allocated[step.request])
        label = f"allocated_host_indices of request {step.request} + free"
        why = _slots_differ("allocated_host_indices", freed, step.host_indices, device)
        if not why and freed.numel() > 0:
            pool.free(freed)
        table.release(step.request)
    elif step.op == sequence.LOAD:
        host = table.slots[step.request, step.start : step.start + count]
        rows = indices(step.device_indices, device)
        for layer in range(start, start + layers):
            pool.load_to_device_per_layer(built.device_pool, host, rows, layer, io_backend="kernel")
        return f"load_to_device_per_layer of request {step.request}'s slots over the stage's layer ids"
    else:
        granted = pool.alloc_paged_token_slots(table.slots, table.allocated, step.request, step.start, count)
        label = f"alloc_paged_token_slots granted {head(granted)}"
        why = _slots_differ("alloc_paged_token_slots", granted, step.host_indices, device)
        if not why and step.transfers:
            label += " + backup_from_device_all_layer"
            pool.backup_from_device_all_layer(built.device_pool, granted, indices(step.device_indices, device),
                                              io_backend="kernel")
    why = why or table.differs(step)
    if not why and pool.available_size() != step.free:
        why = f"the host pool has {pool.available_size()} free slots, the oracle's free list {step.free}"
    if why:
        raise AssertionError(f"{step.label()} [{label}]: {why}")
    return label


def _slots_differ(call: str, got: torch.Tensor, want: tuple[int, ...], device: torch.device) -> str:
    """'' if `got` holds the slots `want` as the coordinator hands them to the transfer kernels (int64 on the
    request table's device), else how it differs."""
    if got.dtype != torch.int64 or got.device != device:
        return (f"{call} returned {got.dtype} on {got.device}, not the request table's int64 on {device} (the "
                f"coordinator hands it to the transfer kernels as it is)")
    values = got.tolist()
    if values == list(want):
        return ""
    at = next((i for i, (a, b) in enumerate(zip(values, want, strict=False)) if a != b), min(len(values), len(want)))
    got_at = values[at] if at < len(values) else "nothing"
    want_at = want[at] if at < len(want) else "nothing"
    return (f"{call} returned {len(values)} slots, the oracle's {len(want)}; the first difference at position {at}: "
            f"{got_at}, the oracle's {want_at}")


def coordinator_load(controller: Any, built: Built, host: torch.Tensor, rows: torch.Tensor, start: int,
                     layers: int) -> None:
    """A HiSparse load as its coordinator makes it: the kernel io backend, global layer ids of the stage."""
    host_idx, dev_idx = controller.move_indices(host, rows)
    for layer in range(start, start + layers):
        built.host_pool.load_to_device_per_layer(built.device_pool, host_idx, dev_idx, layer, io_backend="kernel")
