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

**A side pool that refuses its grant** (the tuning entry ``side_transfer`` set to :data:`SIDE_TRANSFER_FULL`; the
side pools and their transfers are oracles/side_transfers.py's): every back-up also asks the group's side pools for
host slots, and the one asked last holds room for one back-up only (its other slots are held by entries outside
the sequence). A back-up is then refused while an entry the sequence backed up still holds that room: the anchor's
allocator grants its slots first (after the evictions the anchor needs, as above), the side pool cannot grant, and
the group gives every grant of the write back, the anchor's included (``free``: appended to the free list); the
write returns nothing, no byte moves and no entry is held (the ``refused`` step). The tree leaves that node on the
device. A refusal leaves an entry held (the one holding the room), so the programs valid whatever the geometry stay
valid.

**Request slots** (the tuning entry ``requests``, present even if empty): the HiSparse coordinator's way of holding
host slots (``managers/hisparse_coordinator.py``), for the pools with sglang's ``HiSparseHostPoolMixin``. Host slots
belong to requests: a table of :data:`REQUEST_ROWS` rows, each the host slots of one request's tokens ``[0,
allocated)``, and each row's allocated length, always a whole number of pages. The same operations, with these
meanings:

* ``backup`` of request ``r`` over tokens ``[s, s + k)`` (the program's i-th back-up takes the knob's i-th entry,
  ``<request>:<start>:<count>``; a back-up without an entry is ``new:0:n``): the request's row grows by the pages
  that ``[0, s + k)`` rounded up to whole pages adds to it, taken from the allocator's free list in order
  (``alloc_paged_token_slots``); the grant is the row's slots of tokens ``[s, s + k)``, and token ``t`` is backed up
  from the case's device row ``t mod n``. ``new`` is the lowest row not held by a live request; ``start`` is a
  number, ``end`` (the request's first token not backed up yet), or ``alloc`` (its allocated length), each with an
  optional ``+m``/``-m``, clamped to ``[0, allocated]``; ``count`` a number, ``p`` (the page size) or ``n`` (the
  case's token count), with an optional ``+m``/``-m``, clamped to ``[0, n]``. Where the free list lacks the new
  pages, the oldest other live requests are released first, then the count is shortened to what fits. A back-up
  of no tokens takes no slot and moves nothing; it admits the request all the same.
* ``load``: the last ``min(end, n)`` backed-up tokens of the live request backed up most recently, from the slots
  its row holds, to the first rows of the case's device pages in reverse page order. Nothing if no live request
  holds a token.
* ``evict``: the oldest live request (by admission) is released: every slot of its row is freed, in row order
  (``allocated_host_indices``, then the pool's ``free``), and its row is emptied. Nothing if none is live.

Step 0 is request 0 over ``[0, n)``: the case's write-back, or for a load-back case a reservation (the slots the
decode side's pre-allocation takes before the transfer fills them) followed by the case's load. The prologue frees
the case's host indices first in both directions, so request 0 is granted exactly them. With no entries this plans
the very transfers of the same case without the knob: every back-up admits a request of its own over ``[0, n)``.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from hicache_fuzz.harness.model.case import Case, Direction, Scope
from hicache_fuzz.oracles.transfer import Semantics, apply_chunk_copies, chunk_copies

OPS_KEY = "ops"
BACKUP, LOAD, EVICT = "backup", "load", "evict"
OPS = (BACKUP, LOAD, EVICT)
# A planned step of a program's back-up that the group refused (a side pool could not grant its host slots): the
# anchor's grant given back, nothing moved, nothing held.
REFUSED = "refused"
# Side pools beside the anchor (oracles/side_transfers.py): ``on`` moves them with every transfer of an entry the
# sequence backed up; ``full`` too, with the side pool asked last holding room for one back-up only.
SIDE_TRANSFER_KEY = "side_transfer"
SIDE_TRANSFER_ON, SIDE_TRANSFER_FULL = "on", "full"
MAX_PROGRAM = 6
REQUESTS_KEY = "requests"
# Steps of the request-slot model only: the slots a load-back case's request holds before its load, and a request
# released (an evict of that model).
RESERVE, RELEASE = "reserve", "release"
# Rows of the request table: one more than the longest program's back-ups, so that every back-up of a program can
# admit a request of its own (as each entry of the model without request slots is one).
REQUEST_ROWS = MAX_PROGRAM + 1
NEW_REQUEST = "new"


class SequenceError(ValueError):
    """The program cannot run on this case (unknown operation, or nothing held for a load or an evict)."""


@dataclass(frozen=True)
class Step:
    """One operation of a sequence. ``host_indices``/``device_indices`` are the slots and rows it moves
    (evict and release: the host slots it frees, no device rows; reserve: the slots granted, no device rows;
    refused: the anchor's grant, given back, the device rows the write named, none of them moved, and ``free`` the
    anchor allocator's free count after it).

    Steps of the request-slot model also name their request and first token (a back-up's or reservation's grant,
    a load's first token), and hold the request table after the step (each row's slots, its allocated length
    being its length) and the allocator's free slot count."""

    index: int  # 0 is the case's own transfer
    op: str
    host_indices: tuple[int, ...]
    device_indices: tuple[int, ...]
    request: int = -1  # -1: a step without request slots
    start: int = 0
    table: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    free: int = -1
    new_pages: int = 0  # pages a back-up or reservation added to its request's row

    @property
    def transfers(self) -> bool:
        return self.op in (BACKUP, LOAD) and bool(self.device_indices)

    @property
    def direction(self) -> Direction:
        return Direction.WRITE_BACK if self.op == BACKUP else Direction.LOAD_BACK

    def label(self) -> str:
        if self.request < 0:
            return f"step {self.index} ({self.op})"
        if self.op == RELEASE:
            return f"step {self.index} ({self.op} of request {self.request})"
        end = self.start + len(self.host_indices)
        return f"step {self.index} ({self.op} of request {self.request}, tokens [{self.start}, {end}))"


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
    indices held (they are the entry it loads), except under request slots, where its request is granted them."""
    own = case.host_indices
    rest = tuple(sorted(set(range(case.host_slots)) - set(own)))
    if case.direction is Direction.WRITE_BACK or request_slots(case):  # request 0 is granted them at step 0
        return [own, rest] if rest else [own]
    return [rest] if rest else []


def reversed_pages(indices: tuple[int, ...], page_size: int) -> tuple[int, ...]:
    pages = [indices[i : i + page_size] for i in range(0, len(indices), page_size)]
    return tuple(x for page in reversed(pages) for x in page)


def plan_steps(case: Case) -> list[Step]:
    """Every step of the case's sequence, step 0 first. Raises SequenceError if the program cannot run."""
    if request_slots(case):
        return _RequestTable(case).plan()
    ops = program(case)
    n, ps = case.n, case.page_size
    free: deque[int] = deque(x for chunk in prologue(case) for x in chunk)
    # host slots of each held entry, oldest first, and whether it holds the refusing side pool's room
    held: deque[tuple[tuple[int, ...], bool]] = deque()
    room = side_refusals(case)  # the refusing side pool's room for a back-up is free
    steps: list[Step] = []

    def evict_oldest() -> tuple[int, ...]:
        nonlocal room
        slots, holds_room = held.popleft()
        free.extend(slots)
        room = room or holds_room
        return slots

    if case.direction is Direction.WRITE_BACK:
        granted = tuple(free.popleft() for _ in range(n))
        steps.append(Step(0, BACKUP, granted, case.device_indices))
        held.append((granted, room))
        room = False
    else:
        steps.append(Step(0, LOAD, case.host_indices, case.device_indices))
        held.append((case.host_indices, False))  # not backed up by the sequence: no side slots
    for i, op in enumerate(ops, start=1):
        if op == BACKUP:
            while len(free) < n and held:
                steps.append(Step(i, EVICT, evict_oldest(), ()))
            if len(free) < n:
                raise SequenceError(f"step {i} (backup): {n} host slots needed, the pool has {case.host_slots}")
            granted = tuple(free.popleft() for _ in range(n))
            if side_refusals(case) and not room:
                free.extend(granted)
                steps.append(Step(i, REFUSED, granted, case.device_indices, free=len(free)))
                continue
            steps.append(Step(i, BACKUP, granted, case.device_indices))
            held.append((granted, room))
            room = False
        elif op == LOAD:
            if not held:
                raise SequenceError(f"step {i} (load): no backed-up entry is held")
            steps.append(Step(i, LOAD, held[-1][0], reversed_pages(case.device_indices, ps)))
        else:
            if not held:
                raise SequenceError(f"step {i} (evict): no backed-up entry is held")
            steps.append(Step(i, EVICT, evict_oldest(), ()))
    return steps


def side_refusals(case: Case) -> bool:
    """Whether a side pool of the case's group holds room for one back-up only and refuses the others
    (``side_transfer`` = ``full``; the backend runs such a case only where its group has side pools)."""
    return case.tuning_value(SIDE_TRANSFER_KEY, "") == SIDE_TRANSFER_FULL and not request_slots(case)


def step_case(case: Case, step: Step) -> Case:
    """The single transfer of `step` as a case of its own (all layers, the step's index lists, no program)."""
    tuning = tuple((k, v) for k, v in case.tuning if k not in (OPS_KEY, REQUESTS_KEY))
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


# ---- request slots (the HiSparse coordinator's request table; see the module doc) --------------------------

_TERM = re.compile(r"(?P<base>[a-z]+)(?P<offset>[+-]\d+)?|(?P<number>\d+)")
_START_BASES = ("end", "alloc")
_COUNT_BASES = ("p", "n")


def request_slots(case: Case) -> bool:
    """Whether the case's host slots belong to requests (the ``requests`` knob is present, even empty)."""
    return any(key == REQUESTS_KEY for key, _ in case.tuning)


@dataclass(frozen=True)
class SlotRequest:
    """One back-up's request parameters: ``<request>:<start>:<count>`` (see the module doc)."""

    request: int | None  # None: a new request
    start: tuple[str, int]  # (base, offset); base "" is a plain number
    count: tuple[str, int]

    def text(self) -> str:
        return ":".join((NEW_REQUEST if self.request is None else str(self.request), _term_text(self.start),
                         _term_text(self.count)))


DEFAULT_REQUEST = SlotRequest(None, ("", 0), ("n", 0))


def _term_text(term: tuple[str, int]) -> str:
    base, offset = term
    if not base:
        return str(offset)
    return base if not offset else f"{base}{offset:+d}"


def _term(text: str, bases: tuple[str, ...], where: str) -> tuple[str, int]:
    match = _TERM.fullmatch(text.strip())
    if match is None or match["base"] not in (None, *bases):
        raise SequenceError(f"tuning.{REQUESTS_KEY}: {where} {text!r} is not a number or {' / '.join(bases)} "
                            f"with an optional +m / -m")
    if match["number"] is not None:
        return "", int(match["number"])
    return match["base"], int(match["offset"] or 0)


def slot_requests(case: Case) -> tuple[SlotRequest, ...]:
    """The ``requests`` knob's entries, one per back-up of the program in order."""
    text = case.tuning_value(REQUESTS_KEY, "")
    if not isinstance(text, str):
        raise SequenceError(f"tuning.{REQUESTS_KEY}: expected a comma-separated string, got {text!r}")
    out = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        parts = entry.split(":")
        if len(parts) != 3:
            raise SequenceError(f"tuning.{REQUESTS_KEY}: {entry!r} is not <request>:<start>:<count>")
        who = parts[0].strip()
        if who != NEW_REQUEST and not (who.isdigit() and int(who) < REQUEST_ROWS):
            raise SequenceError(f"tuning.{REQUESTS_KEY}: request {who!r} is neither {NEW_REQUEST!r} nor a row "
                                f"0..{REQUEST_ROWS - 1} of the request table")
        out.append(SlotRequest(None if who == NEW_REQUEST else int(who), _term(parts[1], _START_BASES, "start"),
                               _term(parts[2], _COUNT_BASES, "count")))
    return tuple(out)


def format_requests(entries: tuple[SlotRequest, ...]) -> str:
    return ",".join(e.text() for e in entries)


@dataclass
class _Held:
    """One live request: the host slots of its tokens [0, allocated), its first token not backed up yet, and
    when it was admitted and last backed up."""

    slots: list[int]
    end: int
    admitted: int
    used: int


class _RequestTable:
    """The request-slot model's planner: the allocator's free list and the request table, step by step."""

    def __init__(self, case: Case) -> None:
        self.case, self.n, self.ps = case, case.n, case.page_size
        self.entries = slot_requests(case)
        self.ops = program(case)
        self.free: deque[int] = deque(x for chunk in prologue(case) for x in chunk)
        self.live: dict[int, _Held] = {}
        self.clock = 0
        self.steps: list[Step] = []

    def plan(self) -> list[Step]:
        case = self.case
        if case.direction is Direction.WRITE_BACK:
            self._backup(0, 0, 0, self.n)
        else:
            granted, new = self._grant(0, 0, self.n)
            self.steps.append(self._step(0, RESERVE, granted, (), 0, 0, new))
            self.steps.append(self._step(0, LOAD, granted, case.device_indices, 0, 0))
        backups = 0
        for i, op in enumerate(self.ops, start=1):
            if op == BACKUP:
                entry = self.entries[backups] if backups < len(self.entries) else DEFAULT_REQUEST
                backups += 1
                request = self._new_row(i) if entry.request is None else entry.request
                held = self.live.get(request)
                end, allocated = (held.end, len(held.slots)) if held else (0, 0)
                start = min(max(_value(entry.start, {"end": end, "alloc": allocated}), 0), allocated)
                count = min(max(_value(entry.count, {"p": self.ps, "n": self.n}), 0), self.n)
                self._backup(i, request, start, count)
            elif op == LOAD:
                self._load(i)
            elif self.live:
                self._release(i, min(self.live, key=lambda r: self.live[r].admitted))
        return self.steps

    def _new_row(self, index: int) -> int:
        row = next((r for r in range(REQUEST_ROWS) if r not in self.live), None)
        if row is None:
            raise SequenceError(f"step {index} (backup): every one of the {REQUEST_ROWS} request rows is live")
        return row

    def _backup(self, index: int, request: int, start: int, count: int) -> None:
        held = self.live.get(request)
        allocated = len(held.slots) if held else 0
        wanted = -(-(start + count) // self.ps) * self.ps - allocated
        while wanted > len(self.free):
            others = [r for r in self.live if r != request]
            if not others:
                break
            self._release(index, min(others, key=lambda r: self.live[r].admitted))
        if wanted > len(self.free):  # the request itself holds the rest: as many tokens as its pages can take
            count = allocated + len(self.free) - start
        granted, new = self._grant(request, start, count)
        rows = self.case.device_indices  # token t from device row t mod n: distinct rows for up to n tokens
        device = tuple(rows[t % self.n] for t in range(start, start + count))
        self.steps.append(self._step(index, BACKUP, granted, device, request, start, new))

    def _grant(self, request: int, start: int, count: int) -> tuple[tuple[int, ...], int]:
        """alloc_paged_token_slots: the request's row grows to whole pages past start + count (only the pages it
        lacks are taken); (the slots of tokens [start, start + count), the pages taken). No tokens: nothing taken
        or changed, but the request is admitted."""
        self.clock += 1
        held = self.live.setdefault(request, _Held([], 0, self.clock, self.clock))
        held.used = self.clock
        new = 0
        if count > 0:
            page_end = -(-(start + count) // self.ps) * self.ps
            new = max(0, page_end - len(held.slots))
            held.slots += [self.free.popleft() for _ in range(new)]
            held.end = max(held.end, start + count)
        return tuple(held.slots[start : start + count]), new // self.ps

    def _load(self, index: int) -> None:
        holding = [r for r in self.live if self.live[r].end > 0]
        if not holding:
            return
        request = max(holding, key=lambda r: self.live[r].used)
        held = self.live[request]
        m = min(held.end, self.n)
        self.steps.append(self._step(index, LOAD, tuple(held.slots[held.end - m : held.end]),
                                     reversed_pages(self.case.device_indices, self.ps)[:m], request, held.end - m))

    def _release(self, index: int, request: int) -> None:
        """allocated_host_indices then free: every slot of the row, in row order; the row emptied."""
        freed = tuple(self.live.pop(request).slots)
        self.free.extend(freed)
        self.steps.append(self._step(index, RELEASE, freed, (), request, 0))

    def _step(self, index: int, op: str, host: tuple[int, ...], device: tuple[int, ...], request: int,
              start: int, new_pages: int = 0) -> Step:
        table = tuple(tuple(self.live[r].slots) if r in self.live else () for r in range(REQUEST_ROWS))
        return Step(index, op, host, device, request, start, table, len(self.free), new_pages)


def _value(term: tuple[str, int], bases: dict[str, int]) -> int:
    base, offset = term
    return (bases[base] if base else 0) + offset
