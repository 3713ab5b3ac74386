"""The measurements of ``hicache-fuzz bench`` (the command itself is :mod:`hicache_fuzz.harness.commands.bench`):
how fast the harness checks transfers, and how fast the checked kernels move bytes.

CPU (``--cpu``):

* the whole per-case pipeline on SMALL cases on one core (``torch.set_num_threads(1)``), with the time split
  into generate -> predict -> materialize -> backend -> oracle -> compare -> classify (the runner's own stage
  clock, see ``runner.run_case(stage_seconds=...)``), and verified bytes/s on LARGE cases;
* time-to-kill of every bug-zoo mutant (cases and seconds to the first failure), through
  ``hicache-fuzz selftest``'s own code.

GPU (``--gpu``):

* cases/s of the same pipeline against the real sglang JIT backends (in process, oracle and comparison on the
  device, host memory from the process arena), after compiling their menus up front;
* kernel bandwidth is :mod:`hicache_fuzz.harness.commands.bench_bandwidth`.

Small cases are :data:`SMALL_SPACE` (64 KiB per case, at most 4 layers and 8 pages); large cases are
:data:`LARGE_SPACE`. Throughput is reported per wall second and per CPU second of this process (the second
is the fair one-core figure on a shared machine).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache_fuzz.harness.commands import selftest
from hicache_fuzz.harness.engine.campaign_case import backend_space, campaign_case
from hicache_fuzz.harness.engine.engine_stats import NOT_RUN, variety_key
from hicache_fuzz.harness.model.case import (
    Case,
)
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.buffers import GUARD_BYTES
from hicache_fuzz.oracles import layouts

SMALL_SPACE = CaseSpace(byte_budget=64 << 10, layer_counts=(1, 2, 3, 4), page_counts=(1, 2, 3, 4, 8), max_pages=8)
LARGE_SPACE = CaseSpace(byte_budget=32 << 20, layer_counts=(4, 8), page_counts=(64, 128), max_pages=160,
                        invalid_rate=0.0)
# The in-process GPU pipeline leaves out zero-length transfers: sglang 0.5.23's register kernel launched with
# no indices leaves a pending CUDA error that poisons the process (a known finding in corpus/sglang), which only
# an isolating worker survives. Campaigns (`fuzz`, isolated) keep them.
GPU_SMALL_SPACE = SMALL_SPACE.narrowed(empty_rate=0.0)
STAGES = ("generate", "predict", "materialize", "backend", "oracle", "compare", "classify")
COMPARED = frozenset({Outcome.PASS, Outcome.MISMATCH, Outcome.UNEXPECTED_PATH})
GPU_PIPELINE_BACKENDS = ("sglang-jit", "sglang-staged")


@dataclass
class PipelineResult:
    name: str
    backend: str
    device: str
    threads: int
    cases: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cases_per_second: float = 0.0
    cases_per_cpu_second: float = 0.0
    # generated cases that ran, each once (engine_stats.variety_key): every case here is a fresh draw of one
    # backend, so this equals cases unless draws repeat; a campaign's cases multiply it (docs/engine.md)
    distinct_cases: int = 0
    distinct_cases_per_second: float = 0.0
    compared_cases: int = 0
    verified_bytes: int = 0  # raw storage bytes (guards included) compared in full
    verified_bytes_per_second: float = 0.0
    stage_us_per_case: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: int = 0  # generated but left out (skip_empty)


def storage_bytes(case: Case) -> int:
    """Bytes of every raw storage of `case` (device and host, guards included): what a full compare reads."""
    return sum(layouts.device_bytes(case, p) + layouts.host_bytes(case, p) + 4 * GUARD_BYTES for p in case.pools)


def moved_bytes(case: Case) -> int:
    """Payload bytes a transfer of `case` moves (every moved layer, component and pool; indices as listed)."""
    rows = min(len(case.host_indices), len(case.device_indices))
    return rows * len(case.moved_layers) * sum(p.row_bytes(c) for p in case.pools for c in p.components)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def measure_pipeline(name: str, backend: Backend, space: CaseSpace, machine: Machine, seconds: float, seed: int,
                     max_cases: int | None = None, warm_up_cases: int = 20,
                     skip_empty: bool = False) -> PipelineResult:
    """Run generate + run_case over consecutive campaign indices for `seconds` (or `max_cases`).

    `skip_empty` leaves out cases with an empty index list (counted in ``skipped``, not timed): in process
    on a GPU, sglang's zero-length register launch poisons the context (see GPU_SMALL_SPACE)."""
    result = PipelineResult(name, backend.name, str(machine.device), torch.get_num_threads())
    stages: dict[str, float] = {}
    outcomes: Counter[str] = Counter()

    def wanted(case: Case) -> bool:
        return not skip_empty or bool(case.host_indices and case.device_indices)

    # The backend's space once, as run_campaign holds it; the menu stays at its start (no growth compiles).
    drawn_from = backend_space(backend, space, machine.platform, seed).narrowed(row_bytes_growth=(), grow_every=0)
    distinct: set[int] = set()
    index = 0
    warmed = 0
    while warmed < warm_up_cases:  # first-call costs (imports, allocator growth) are not throughput
        case = campaign_case(seed, index, backend, drawn_from, machine.platform)
        index += 1
        if wanted(case):
            run_case(case, backend, machine.platform, machine.device)
            warmed += 1
    started, cpu_started = time.perf_counter(), time.process_time()
    while True:
        elapsed = time.perf_counter() - started
        if elapsed >= seconds or (max_cases is not None and result.cases >= max_cases):
            break
        generate_started = time.perf_counter()
        case = campaign_case(seed, index, backend, drawn_from, machine.platform)
        stages["generate"] = stages.get("generate", 0.0) + time.perf_counter() - generate_started
        if not wanted(case):
            result.skipped += 1
            index += 1
            continue
        try:
            outcome = run_case(case, backend, machine.platform, machine.device, None, stages).outcome
        except Exception as exc:  # a device error escaping the runner: counted, and the run goes on if it can
            outcome = Outcome.CRASH
            result.errors.append(f"case {case.case_id}: {type(exc).__name__}: {exc}"[:300])
            if not _device_usable(machine):
                result.errors.append("device unusable after the error; measurement stopped")
                break
        outcomes[outcome.value] += 1
        result.cases += 1
        if outcome not in NOT_RUN:
            distinct.add(variety_key(case))
        if outcome in COMPARED:
            result.compared_cases += 1
            result.verified_bytes += storage_bytes(case)
        index += 1
    result.wall_seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu_started
    result.cases_per_second = result.cases / result.wall_seconds if result.wall_seconds else 0.0
    result.cases_per_cpu_second = result.cases / result.cpu_seconds if result.cpu_seconds else 0.0
    result.distinct_cases = len(distinct)
    result.distinct_cases_per_second = len(distinct) / result.wall_seconds if result.wall_seconds else 0.0
    result.verified_bytes_per_second = result.verified_bytes / result.wall_seconds if result.wall_seconds else 0.0
    result.stage_us_per_case = {s: round(stages.get(s, 0.0) / max(result.cases, 1) * 1e6, 1) for s in STAGES}
    result.outcomes = dict(outcomes)
    return result


def _device_usable(machine: Machine) -> bool:
    if machine.device.type == "cpu":
        return True
    try:
        torch.cuda.synchronize(machine.device)
        return True
    except Exception:
        return False


# ---- time to kill -----------------------------------------------------------------------------------------

def measure_zoo(platform: str, backend_plugins: list[str], seconds_per_mutant: float, max_cases_per_mutant: int,
                seed: int) -> dict[str, Any]:
    """Time-to-kill per zoo mutant via ``hicache-fuzz selftest``'s own code (its table is printed as it runs)."""
    options = selftest.SelftestOptions(seed, max_cases_per_mutant, seconds_per_mutant, reference_cases=0)
    report = selftest.run_selftest(options, ExecutionOptions(platform, list(backend_plugins), isolate="no"))
    rows = [{"mutant": r["mutant"], "bug_class": r["bug_class"], "killed": r["killed"], "cases": r["cases"],
             "seconds": round(r["seconds"], 3), "outcome": r.get("outcome", "")} for r in report["mutants"]]
    return {"source": "hicache-fuzz selftest", "seed": seed, "rows": rows, **_kill_summary(rows)}


def _kill_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    killed = [r for r in rows if r["killed"]]
    if not killed:
        return {"killed": 0, "mutants": len(rows)}
    return {"killed": len(killed), "mutants": len(rows),
            "median_seconds_to_kill": round(statistics.median(r["seconds"] for r in killed), 3),
            "median_cases_to_kill": statistics.median(r["cases"] for r in killed),
            "worst_seconds_to_kill": round(max(r["seconds"] for r in killed), 3),
            "worst_mutant": max(killed, key=lambda r: r["seconds"])["mutant"]}
