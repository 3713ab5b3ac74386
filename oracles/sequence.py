"""Stateful sequences: a case's own transfer followed by a program of HiCache operations, and what each step does.

A sequence case is an ordinary case (its own transfer is step 0) plus the tuning entry ``ops``: a comma-separated
program over :data:`OPS`. The shadow model below turns the program into concrete steps, each with its index lists,
from the case alone, so the case file is the whole reproducer and the oracle never reads anything back from
sglang (docs/semantics.md, section 9).

The model has two parts:

* **The host allocator**, in the oracle's own terms: a first-in first-out list of free host slots. ``alloc(n)``
  grants the first ``n`` entries; ``free(x)`` appends ``x`` in its order. Before step 0 the pool is made full
  (one grant of its whole capacity) and then given back in a fixed order (:func:`prologue`): for a write-back
  the case's host indices first, then every other slot ascending. So the write-back of step 0 is granted exactly
  the case's host indices, and later back-ups are granted the other slots, then slots evicted before them.
* **The cache entries**: each back-up holds the host slots it was granted, together with the device rows it
  copied, until it is evicted; a load copies the newest held entry back to the device.

Operations (what the radix tree asks the controller for):

* ``backup``: back up the case's device rows again. If fewer than ``n`` host slots are free, the oldest held
  entries are evicted first (as the tree evicts to make room), then the grant is the allocator's.
* ``load``: load the newest held entry to the device rows the device allocator grants: the case's device pages
  in reverse page order, so the data of one page lands in another page's rows.
* ``evict``: free the host slots of the oldest held entry.

A program is valid when every ``load`` and ``evict`` finds a held entry. :func:`valid_programs` lists the
programs valid whatever the geometry (a back-up may evict all older entries, so only the entry it creates is
counted on).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hicache_fuzz.harness.model.case import Case, Direction, Scope
from hicache_fuzz.oracles.transfer import Semantics, apply_chunk_copies, chunk_copies

OPS_KEY = "ops"
BACKUP, LOAD, EVICT = "backup", "load", "evict"
OPS = (BACKUP, LOAD, EVICT)
MAX_PROGRAM = 6


class SequenceError(ValueError):
    """The program cannot run on this case (unknown operation, or nothing held for a load or an evict)."""


@dataclass(frozen=True)
class Step:
    """One operation of a sequence. ``host_indices``/``device_indices`` are the slots and rows it moves
    (evict: the host slots it frees, no device rows)."""

    index: int  # 0 is the case's own transfer
    op: str
    host_indices: tuple[int, ...]
    device_indices: tuple[int, ...]

    @property
    def transfers(self) -> bool:
        return self.op != EVICT

    @property
    def direction(self) -> Direction:
        return Direction.WRITE_BACK if self.op == BACKUP else Direction.LOAD_BACK

    def label(self) -> str:
        return f"step {self.index} ({self.op})"


def program(case: Case) -> tuple[str, ...]:
    """The case's operation program (empty: the case is its own transfer only)."""
    text = case.tuning_value(OPS_KEY, "")
    if not isinstance(text, str):
        raise SequenceError(f"tuning.{OPS_KEY}: expected a comma-separated string, got {text!r}")
    ops = tuple(op.strip() for op in text.split(",") if op.strip())
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise SequenceError(f"tuning.{OPS_KEY}: unknown operation(s) {unknown}; known: {', '.join(OPS)}")
    return ops


def format_program(ops: tuple[str, ...]) -> str:
    return ",".join(ops)


def prologue(case: Case) -> list[tuple[int, ...]]:
    """The frees that follow one grant of the whole host pool, in order: they set the allocator's free list so
    that step 0's write-back is granted exactly the case's host indices. A load-back case keeps its host
    indices held (they are the entry it loads)."""
    own = case.host_indices
    rest = tuple(sorted(set(range(case.host_slots)) - set(own)))
    if case.direction is Direction.WRITE_BACK:
        return [own, rest] if rest else [own]
    return [rest] if rest else []


def reversed_pages(indices: tuple[int, ...], page_size: int) -> tuple[int, ...]:
    pages = [indices[i : i + page_size] for i in range(0, len(indices), page_size)]
    return tuple(x for page in reversed(pages) for x in page)


def plan_steps(case: Case) -> list[Step]:
    """Every step of the case's sequence, step 0 first. Raises SequenceError if the program cannot run."""
    ops = program(case)
    n, ps = case.n, case.page_size
    free: deque[int] = deque(x for chunk in prologue(case) for x in chunk)
    held: deque[tuple[int, ...]] = deque()  # host slots of each held entry, oldest first
    steps: list[Step] = []

    def evict_oldest() -> tuple[int, ...]:
        slots = held.popleft()
        free.extend(slots)
        return slots

    if case.direction is Direction.WRITE_BACK:
        granted = tuple(free.popleft() for _ in range(n))
        steps.append(Step(0, BACKUP, granted, case.device_indices))
    else:
        steps.append(Step(0, LOAD, case.host_indices, case.device_indices))
    held.append(case.host_indices)
    for i, op in enumerate(ops, start=1):
        if op == BACKUP:
            while len(free) < n and held:
                steps.append(Step(i, EVICT, evict_oldest(), ()))
            if len(free) < n:
                raise SequenceError(f"step {i} (backup): {n} host slots needed, the pool has {case.host_slots}")
            granted = tuple(free.popleft() for _ in range(n))
            steps.append(Step(i, BACKUP, granted, case.device_indices))
            held.append(granted)
        elif op == LOAD:
            if not held:
                raise SequenceError(f"step {i} (load): no backed-up entry is held")
            steps.append(Step(i, LOAD, held[-1], reversed_pages(case.device_indices, ps)))
        else:
            if not held:
                raise SequenceError(f"step {i} (evict): no backed-up entry is held")
            steps.append(Step(i, EVICT, evict_oldest(), ()))
    return steps


def step_case(case: Case, step: Step) -> Case:
    """The single transfer of `step` as a case of its own (all layers, the step's index lists, no program)."""
    tuning = tuple((k, v) for k, v in case.tuning if k != OPS_KEY)
    return case.replace(direction=step.direction, scope=Scope.ALL_LAYERS, host_indices=step.host_indices,
                        device_indices=step.device_indices, tuning=tuning)


def apply_sequence(case: Case, payloads: dict[str, torch.Tensor], semantics: Semantics,
                   on_transfer: Callable[[Step], None] | None = None) -> None:
    """Apply every transfer of the case's sequence in place to `payloads` (payload views keyed by storage);
    `on_transfer(step)` is called after each. A case without a program is its own transfer only (exactly the
    single-transfer oracle). Evicts move no bytes."""
    if not program(case):
        apply_chunk_copies(case, chunk_copies(case, semantics), payloads, payloads)
        if on_transfer is not None:
            on_transfer(Step(0, BACKUP if case.direction is Direction.WRITE_BACK else LOAD, case.host_indices,
                             case.device_indices))
        return
    for step in plan_steps(case):
        if not step.transfers:
            continue
        sub = step_case(case, step)
        apply_chunk_copies(sub, chunk_copies(sub, semantics), payloads, payloads)
        if on_transfer is not None:
            on_transfer(step)


def valid_programs(max_length: int = MAX_PROGRAM) -> tuple[str, ...]:
    """Every program of 1..max_length operations that is valid whatever the geometry (see the module doc)."""
    out = []
    for length in range(1, max_length + 1):
        for ops in itertools.product(OPS, repeat=length):
            if _valid_worst_case(ops):
                out.append(format_program(ops))
    return tuple(out)


def _valid_worst_case(ops: tuple[str, ...]) -> bool:
    held = 1  # step 0's entry
    for op in ops:
        if op == BACKUP:
            held = 1  # at worst it evicted every older entry
        elif not held:
            return False
        elif op == EVICT:
            held -= 1
    return True


def transfer_steps(case: Case) -> Iterator[Step]:
    """The steps that move bytes, in order (the snapshots a backend records are of these)."""
    if not program(case):
        yield Step(0, BACKUP if case.direction is Direction.WRITE_BACK else LOAD, case.host_indices,
                   case.device_indices)
        return
    yield from (s for s in plan_steps(case) if s.transfers)
