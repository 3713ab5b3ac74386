"""Minimize a failing case: domain-aware greedy reduction that keeps the failure's *signature*.

"Still fails" is not enough: a reduction may drift to a different bug (oss-fuzz #452), so a candidate is
kept only if its bug identity equals the original's (and, for a rejection of valid input, the check that fired:
``kept_key``). Passes, each a generator of smaller
candidates, run in order and repeat until none makes progress (a fixpoint) or the budget (runs, seconds) is
spent:

0. shorter sequences (operations left out of a sequence case's program, oracles/sequence.py);
1. fewer pools (drop side pools), fewer layers (one-layer cases keep or move their layer);
2. fewer pages (page-sized blocks of the paired index lists, halving block sizes), then fewer tokens;
3. smaller pages (page_size 1, halves), smaller rows (one head, narrower heads, fp8, symmetric K/V);
4. compact index values (page ids renumbered in order), simpler patterns (contiguous ascending, per side
   and both), tighter pools (host slots and device rows just covering the indices);
5. defaults: no tuning knobs, int64 device-side indices, the default allocator, seed 0.

Out-of-range indices (the contract violations some failures are about) keep their distance from the bound
they violate when pools or pages shrink, so "one past the end" stays one past the end.

A candidate must also be strictly smaller by :func:`cost` (bytes, index entries, layers, pools, then a
count of non-plain features), which makes the loop terminate. Failures found by Hypothesis are first shrunk
by Hypothesis itself (:func:`hicache_fuzz.harness.campaign.strategies.find_failure`) and then go through the same
passes.

The ``minimize`` subcommand (:mod:`hicache_fuzz.harness.commands.minimize`) runs this on reproducer files.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hicache_fuzz.harness.findings.identity import error_cause, signature
from hicache_fuzz.harness.findings.trigger import derive_trigger, trigger_runs
from hicache_fuzz.harness.model.case import (
    LAYOUTS_BY_ATTENTION,
    Attention,
    Case,
    CaseError,
    HostAllocator,
    HostLayout,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.oracles import layouts, sequence

RunCase = Callable[[Case], Result]
Reduction = Callable[[Case], Iterator["Case | None"]]
CampaignHook = Callable[[Case, Result], tuple[Case, Result, dict[str, Any]]]

DEFAULT_MAX_RUNS = 400
DEFAULT_MAX_SECONDS = 120.0


# ---- size and cost --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseSize:
    indices: int  # host + device index entries
    bytes: int  # payload bytes of every storage (all pools, device + host)
    layers: int
    pools: int
    page_size: int

    def to_dict(self) -> dict[str, int]:
        return {"indices": self.indices, "bytes": self.bytes, "layers": self.layers, "pools": self.pools,
                "page_size": self.page_size}


def case_size(case: Case) -> CaseSize:
    storage = sum(layouts.device_bytes(case, p) + layouts.host_bytes(case, p) for p in case.pools)
    return CaseSize(len(case.host_indices) + len(case.device_indices), storage, case.layers, len(case.pools),
                    case.page_size)


def _irregularity(indices: tuple[int, ...]) -> int:
    """Steps that are not +1: 0 for a contiguous ascending run."""
    return sum(1 for a, b in itertools.pairwise(indices) if b != a + 1)


def complexity(case: Case) -> int:
    """Non-plain features: each counts 1 (index pattern steps count each)."""
    score = len(case.tuning)
    score += _program_length(case)
    score += (case.host_index != IndexSpec()) + (case.device_index != IndexSpec())
    score += case.host_allocator is not HostAllocator.PIN_MEMORY
    score += case.seed != 0
    score += _irregularity(case.host_indices) + _irregularity(case.device_indices)
    score += bool(case.host_indices) and min(case.host_indices) != 0
    for pool in case.pools:
        score += pool.attention is Attention.MHA_ASYM
        score += pool.head_groups != 1
        score += not pool.write_back_jit
        score += pool.heads != 1
    return score


def cost(case: Case) -> tuple[int, int, int, int, int]:
    size = case_size(case)
    return size.bytes, size.indices, size.layers, size.pools, complexity(case)


# ---- index helpers ----------------------------------------------------------------------------------------

def _remap(value: int, old_bound: int, new_bound: int, inside: Callable[[int], int]) -> int:
    """Map an index: in range through `inside`; out of range keeps its distance from the violated bound."""
    if value < 0:
        return value
    if value >= old_bound:
        return new_bound + (value - old_bound)
    return inside(value)


def _candidate(case: Case, **changes: Any) -> Case | None:
    try:
        return case.replace(**changes)
    except CaseError:
        return None


def _paired_length(case: Case) -> int:
    return min(len(case.host_indices), len(case.device_indices))


def _without_positions(case: Case, start: int, stop: int) -> Case | None:
    h, d = case.host_indices, case.device_indices
    return _candidate(case, host_indices=h[:start] + h[stop:], device_indices=d[:start] + d[stop:])


# ---- passes (each yields candidates, most aggressive first) ----------------------------------------------

def fewer_pools(case: Case) -> Iterator[Case | None]:
    if len(case.pools) > 1:
        yield _candidate(case, pools=case.pools[:1])
        for i in range(len(case.pools) - 1, -1, -1):
            yield _candidate(case, pools=case.pools[:i] + case.pools[i + 1 :])


def fewer_layers(case: Case) -> Iterator[Case | None]:
    counts = sorted({1, case.layers // 2, case.layers - 1} - {0, case.layers})
    for layers in counts:
        if case.scope is Scope.ALL_LAYERS:
            yield _candidate(case, layers=layers, layer=0)
        else:
            for layer in sorted({0, min(case.layer, layers - 1), layers - 1}):
                yield _candidate(case, layers=layers, layer=layer)
    if case.scope is Scope.ONE_LAYER and case.layer != 0:
        yield _candidate(case, layer=0)


def _block_removals(total: int, unit: int) -> Iterator[tuple[int, int]]:
    """(start, stop) position ranges, in units of `unit` positions, blocks halving from half the list."""
    units = total // unit
    block = max(1, units // 2)
    while block >= 1:
        for first in range(0, units - block + 1, block):
            yield first * unit, (first + block) * unit
        if block == 1:
            break
        block //= 2


def fewer_pages(case: Case) -> Iterator[Case | None]:
    m, ps = _paired_length(case), case.page_size
    if m >= 2 * ps:
        pages = m // ps
        # Keep only the last page, or only the first: the cheapest big cut.
        yield _candidate(case, host_indices=case.host_indices[(pages - 1) * ps :],
                         device_indices=case.device_indices[(pages - 1) * ps :])
        yield _without_positions(case, ps, m - m % ps)
        for start, stop in _block_removals(m - m % ps, ps):
            yield _without_positions(case, start, stop)


def fewer_tokens(case: Case) -> Iterator[Case | None]:
    m = _paired_length(case)
    if 1 < m <= 4 * max(case.page_size, 2):
        for start, stop in _block_removals(m, 1):
            yield _without_positions(case, start, stop)
    # Unpaired tail entries (a length mismatch): drop all but one.
    h, d = case.host_indices, case.device_indices
    if len(h) > len(d) + 1:
        yield _candidate(case, host_indices=h[: len(d) + 1])
    if len(d) > len(h) + 1:
        yield _candidate(case, device_indices=d[: len(h) + 1])


def smaller_page_size(case: Case) -> Iterator[Case | None]:
    ps = case.page_size
    for new in sorted({1, ps // 2} - {0, ps}):
        def inside(v: int, new: int = new) -> int:
            return (v // ps) * new + (v % ps) % new

        host_slots = case.host_pages * new
        device_rows = -(-case.device_rows // ps) * new
        h: list[int] = []
        d: list[int] = []
        m = _paired_length(case)
        for position in range(len(case.host_indices)):
            if position >= m or position % ps < new:
                h.append(_remap(case.host_indices[position], case.host_slots, host_slots, inside))
        for position in range(len(case.device_indices)):
            if position >= m or position % ps < new:
                d.append(_remap(case.device_indices[position], case.device_rows, device_rows, inside))
        yield _candidate(case, page_size=new, host_slots=host_slots, device_rows=device_rows,
                         host_indices=tuple(h), device_indices=tuple(d))


def _pool_candidates(pool: PoolSpec, layout: HostLayout) -> Iterator[PoolSpec]:
    if pool.attention is Attention.MHA_ASYM and layout in LAYOUTS_BY_ATTENTION[Attention.MHA]:
        yield PoolSpec(pool.name, Attention.MHA, pool.dtype, pool.heads, pool.head_dim, None,
                       pool.head_groups, pool.write_back_jit)
    if pool.heads > 1:
        groups = pool.head_groups
        for heads in sorted({1, pool.heads // 2} - {0, pool.heads}):
            yield PoolSpec(pool.name, pool.attention, pool.dtype, heads, pool.head_dim, pool.v_head_dim,
                           groups if heads % groups == 0 else 1, pool.write_back_jit)
    for dim in sorted({8, 16, pool.head_dim // 2} - {0}):
        if dim < pool.head_dim:
            v_dim = None if pool.v_head_dim is None else max(1, pool.v_head_dim * dim // pool.head_dim)
            yield PoolSpec(pool.name, pool.attention, pool.dtype, pool.heads, dim, v_dim, pool.head_groups,
                           pool.write_back_jit)
    wider_v = pool.v_head_dim is not None and pool.v_head_dim > pool.head_dim
    if pool.attention is Attention.MHA_ASYM and wider_v:
        yield PoolSpec(pool.name, pool.attention, pool.dtype, pool.heads, pool.head_dim, pool.head_dim,
                       pool.head_groups, pool.write_back_jit)
    if pool.dtype.itemsize > 1:
        yield PoolSpec(pool.name, pool.attention, KVDtype.FP8, pool.heads, pool.head_dim, pool.v_head_dim,
                       pool.head_groups, pool.write_back_jit)
    if not pool.write_back_jit:
        yield PoolSpec(pool.name, pool.attention, pool.dtype, pool.heads, pool.head_dim, pool.v_head_dim,
                       pool.head_groups, True)


def smaller_rows(case: Case) -> Iterator[Case | None]:
    for i, pool in enumerate(case.pools):
        for smaller in _pool_candidates(pool, case.layout):
            yield _candidate(case, pools=(*case.pools[:i], smaller, *case.pools[i + 1 :]))


def _renumber_pages(indices: tuple[int, ...], bound: int, ps: int, first_page: int) -> tuple[int, ...]:
    pages = sorted({v // ps for v in indices if 0 <= v < bound})
    new_page = {page: first_page + rank for rank, page in enumerate(pages)}
    return tuple(_remap(v, bound, bound, lambda v: new_page[v // ps] * ps + v % ps) for v in indices)


def compact_indices(case: Case) -> Iterator[Case | None]:
    ps = case.page_size
    device_first = 0 if any(0 <= v < ps for v in case.device_indices) else 1
    h = _renumber_pages(case.host_indices, case.host_slots, ps, 0)
    d = _renumber_pages(case.device_indices, case.device_rows, ps, device_first)
    yield _candidate(case, host_indices=h, device_indices=d)
    yield _candidate(case, host_indices=h)
    yield _candidate(case, device_indices=d)


def _ascending(indices: tuple[int, ...], bound: int, start: int) -> tuple[int, ...] | None:
    """In-range entries replaced by start, start+1, ... in order; out-of-range ones kept."""
    out = []
    following = start
    for v in indices:
        if 0 <= v < bound:
            out.append(following)
            following += 1
        else:
            out.append(v)
    return tuple(out) if following <= bound else None


def simpler_patterns(case: Case) -> Iterator[Case | None]:
    ps = case.page_size
    h = _ascending(case.host_indices, case.host_slots, 0)
    d = _ascending(case.device_indices, case.device_rows, ps)  # device page 0 is sglang's padding page
    if h is not None and d is not None:
        yield _candidate(case, host_indices=h, device_indices=d)
    if h is not None:
        yield _candidate(case, host_indices=h)
    if d is not None:
        yield _candidate(case, device_indices=d)
    # Pages in ascending host order, keeping each (host page, device page) pair together.
    m = _paired_length(case)
    chunks = [(case.host_indices[i : i + ps], case.device_indices[i : i + ps])
              for i in range(0, m - m % ps, ps)]
    ordered = sorted(chunks, key=lambda pair: pair[0][0])
    if ordered != chunks:
        tail_h, tail_d = case.host_indices[m - m % ps :], case.device_indices[m - m % ps :]
        yield _candidate(case, host_indices=tuple(v for c in ordered for v in c[0]) + tail_h,
                         device_indices=tuple(v for c in ordered for v in c[1]) + tail_d)


def tighter_pools(case: Case) -> Iterator[Case | None]:
    ps = case.page_size
    used_h = [v for v in case.host_indices if 0 <= v < case.host_slots]
    used_d = [v for v in case.device_indices if 0 <= v < case.device_rows]
    host_slots = max(ps, (max(used_h, default=0) // ps + 1) * ps)
    device_rows = max(ps, (max(used_d, default=0) // ps + 1) * ps)
    options = []
    if host_slots < case.host_slots:
        options.append((host_slots, case.device_rows))
    if device_rows < case.device_rows:
        options.append((case.host_slots, device_rows))
    if len(options) == 2:
        options.insert(0, (host_slots, device_rows))
    for slots, rows in options:
        h = tuple(_remap(v, case.host_slots, slots, lambda v: v) for v in case.host_indices)
        d = tuple(_remap(v, case.device_rows, rows, lambda v: v) for v in case.device_indices)
        yield _candidate(case, host_slots=slots, device_rows=rows, host_indices=h, device_indices=d)


def _program_length(case: Case) -> int:
    try:
        return len(sequence.program(case))
    except sequence.SequenceError:
        return 0


def shorter_sequences(case: Case) -> Iterator[Case | None]:
    """Fewer operations in a sequence case's program (oracles/sequence.py): none, then each half, then each
    single operation left out, so a failing sequence shrinks to its shortest failing form. Under request slots a
    back-up left out takes its ``requests`` entry with it, so the back-ups kept keep theirs."""
    try:
        ops = sequence.program(case)
        entries = sequence.slot_requests(case)
    except sequence.SequenceError:
        return
    if not ops:
        return
    whole = tuple(range(len(ops)))
    half = len(ops) // 2
    shorter = [(), whole[:half], whole[half:]] + [whole[:i] + whole[i + 1 :] for i in range(len(ops))]
    entry_of = {i: sum(op == sequence.BACKUP for op in ops[:i]) for i in whole}
    seen: set[tuple[int, ...]] = set()
    for kept in shorter:
        if kept in seen or len(kept) >= len(ops):
            continue
        seen.add(kept)
        knobs = dict(case.tuning)
        knobs[sequence.OPS_KEY] = sequence.format_program(tuple(ops[i] for i in kept))
        if sequence.request_slots(case):
            knobs[sequence.REQUESTS_KEY] = sequence.format_requests(tuple(
                entries[entry_of[i]] for i in kept if ops[i] == sequence.BACKUP and entry_of[i] < len(entries)))
        yield _candidate(case, tuning=make_tuning(knobs))


def defaults(case: Case) -> Iterator[Case | None]:
    if case.tuning:
        yield _candidate(case, tuning=())
        for i in range(len(case.tuning)):
            yield _candidate(case, tuning=case.tuning[:i] + case.tuning[i + 1 :])
    if case.host_index != IndexSpec() or case.device_index != IndexSpec():
        yield _candidate(case, host_index=IndexSpec(), device_index=IndexSpec())
        for side in ("host_index", "device_index"):
            spec: IndexSpec = getattr(case, side)
            if spec.dtype is not IndexSpec().dtype:
                yield _candidate(case, **{side: IndexSpec(IndexSpec().dtype, spec.device)})
            if spec.device is not IndexSpec().device:
                yield _candidate(case, **{side: IndexSpec(spec.dtype, IndexSpec().device)})
    if case.host_allocator is not HostAllocator.PIN_MEMORY:
        yield _candidate(case, host_allocator=HostAllocator.PIN_MEMORY)
    if case.seed != 0:
        yield _candidate(case, seed=0)


PASSES: tuple[Reduction, ...] = (
    shorter_sequences, fewer_pools, fewer_layers, fewer_pages, fewer_tokens, smaller_page_size, smaller_rows,
    compact_indices, simpler_patterns, tighter_pools, defaults,
)


# ---- the loop ---------------------------------------------------------------------------------------------

@dataclass
class Minimized:
    original: Case
    case: Case  # the smallest case found with the original signature
    result: Result  # its result
    signature: str
    original_size: CaseSize
    size: CaseSize
    runs: int = 0  # candidates executed
    accepted: int = 0  # candidates kept
    seconds: float = 0.0
    fixpoint: bool = False  # True: no pass could shrink further; False: the budget ran out first
    accepted_by_pass: dict[str, int] = field(default_factory=dict)
    # the conditions the minimized case needs to keep its signature (findings/trigger.py): what a known entry
    # recorded from it is scoped to
    trigger: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def ratio(before: int, after: int) -> float:
            return round(after / before, 6) if before else 1.0

        return {
            "signature": self.signature,
            "original_case_id": self.original.case_id,
            "case_id": self.case.case_id,
            "original": self.original_size.to_dict(),
            "minimized": self.size.to_dict(),
            "ratio": {"indices": ratio(self.original_size.indices, self.size.indices),
                      "bytes": ratio(self.original_size.bytes, self.size.bytes)},
            "runs": self.runs,
            "accepted": self.accepted,
            "accepted_by_pass": self.accepted_by_pass,
            "seconds": round(self.seconds, 3),
            "fixpoint": self.fixpoint,
        }


def kept_key(result: Result, case: Case) -> str:
    """What a reduction must keep: the bug identity, and for a rejection of valid input also which check fired
    (its normalized error text). The identity of such a rejection is one per path (identity.py), so without the
    text a smaller case could show another check of the same path: the reproducer would no longer show the
    rejection it was saved for."""
    key = signature(result, case)
    if result.outcome is Outcome.WRONGLY_REJECTED:
        key += "|" + error_cause(result.error)
    return key


class NotFailing(ValueError):
    """The case to minimize does not fail (there is no signature to keep)."""


def minimize(case: Case, run: RunCase, result: Result | None = None, max_runs: int = DEFAULT_MAX_RUNS,
             max_seconds: float = DEFAULT_MAX_SECONDS,
             on_step: Callable[[Minimized], None] | None = None) -> Minimized:
    """Shrink `case` while ``signature(run(candidate), candidate)`` stays the original's.

    `run` executes one case (an executor's ``run``); `result` is the case's known result (run again if
    omitted). The budget counts candidate runs and wall seconds, the trigger's runs too (``derive_trigger``: one
    per non-plain feature). Shrinking stops while those runs are still left (their seconds estimated at the mean
    run's), so the trigger is tried even when the shrink was cut short; only a run that overshoots the estimate
    leaves a feature untried, and it stays in the trigger. The best case so far is returned either way.
    `on_step` is called with the state after every candidate run (``runs``, ``accepted``, ``case``,
    ``seconds`` so far): the command's progress line.
    """
    started = time.perf_counter()
    if result is None:
        result = run(case)
    if not result.outcome.is_failure:
        raise NotFailing(f"case {case.case_id} does not fail ({result.outcome.value}); nothing to minimize")
    target = kept_key(result, case)
    state = Minimized(case, case, result, signature(result, case), case_size(case), case_size(case))
    tried: set[str] = {case.case_id}

    def budget_left() -> bool:
        return state.runs < max_runs and time.perf_counter() - started < max_seconds

    def shrink_budget_left() -> bool:
        """The budget less the trigger's runs: one per non-plain feature of the case so far, at the mean run's
        seconds. A long shrink (hundreds of indices) would otherwise spend everything and leave every knob of the
        case in the trigger, untried, so the entry would call the same bug new on the next case that differs in
        a knob the failure never needed."""
        reserve = trigger_runs(state.case)
        elapsed = time.perf_counter() - started
        per_run = elapsed / state.runs if state.runs else 0.0
        return state.runs + reserve < max_runs and elapsed + reserve * per_run < max_seconds

    def step() -> None:
        if on_step is not None:
            state.seconds = time.perf_counter() - started
            on_step(state)

    progress = True
    while progress and shrink_budget_left():
        progress = False
        for reduction in PASSES:
            # Re-run a pass on its own output until it stops shrinking, then move to the next pass.
            while shrink_budget_left():
                kept = _first_kept(reduction, state, run, target, tried, shrink_budget_left, step)
                if kept is None:
                    break
                progress = True
    state.fixpoint = not progress and shrink_budget_left()

    def same_bug(candidate: Case) -> bool:  # a few runs more: each non-plain feature put back to plain alone
        if not budget_left():
            return False  # no run left to show the feature is not needed: it stays (a narrower trigger)
        state.runs += 1
        outcome = run(candidate)
        # The reductions' key, not the identity alone: a relaxed case that another check of the same path
        # refuses shows another refusal, not that the feature is unneeded (the trigger would then cover every
        # valid input the path refuses, and hide new ones).
        return outcome.outcome.is_failure and kept_key(outcome, candidate) == target

    state.trigger = derive_trigger(state.case, same_bug)
    state.size = case_size(state.case)
    state.seconds = time.perf_counter() - started
    return state


def _first_kept(reduction: Reduction, state: Minimized, run: RunCase, target: str, tried: set[str],
                budget_left: Callable[[], bool], step: Callable[[], None]) -> Case | None:
    current_cost = cost(state.case)
    for candidate in reduction(state.case):
        if candidate is None or candidate.case_id in tried or cost(candidate) >= current_cost:
            continue
        if not budget_left():
            return None
        tried.add(candidate.case_id)
        state.runs += 1
        outcome = run(candidate)
        if outcome.outcome.is_failure and kept_key(outcome, candidate) == target:
            state.case, state.result = candidate, outcome
            state.accepted += 1
            state.accepted_by_pass[reduction.__name__] = state.accepted_by_pass.get(reduction.__name__, 0) + 1
            step()
            return candidate
        step()
    return None


def campaign_minimizer(executor: Any, max_runs: int = DEFAULT_MAX_RUNS,
                       max_seconds: float = DEFAULT_MAX_SECONDS) -> CampaignHook:
    """The hook `fuzz --minimize` installs (CampaignConfig.minimizer): minimize with the campaign's executor
    and record the sizes in the reproducer's "minimized" field."""
    def shrink(case: Case, result: Result) -> tuple[Case, Result, dict[str, Any]]:
        done = minimize(case, executor.run, result, max_runs=max_runs, max_seconds=max_seconds)
        return done.case, done.result, {"minimized": done.to_dict(), "trigger": done.trigger}

    return shrink
