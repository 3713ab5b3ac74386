"""What a campaign's engine did: throughput, byte-compared share, verified bytes, time per stage, scale reached.

The fields land in the ``fuzz --json`` report (and :func:`summary_lines` gives the console lines):

* ``cases_per_second`` (the report's own), ``byte_compared_transfers`` and ``byte_compared_per_second``: cases
  whose transfer ran and whose storages were compared byte for byte (pass, mismatch, unexpected path; at least
  one token moved); ``transfer_share`` of all cases; ``mix_target`` and ``mix_reached`` per class;
* ``verified_bytes`` and ``verified_gb_per_second``: whole raw storages (guards included) compared, summed over
  the byte-compared transfers and the rejections (whose storages are compared against their state before);
* ``stages``: seconds per stage: ``generate`` (the feed thread, hidden behind execution unless ``wait``),
  ``wait`` (the campaign waiting for cases), ``execute`` (batch round trips), ``record`` (classification
  bookkeeping, reproducers), ``calibrate`` (mix profiles), ``scale_generate``, and the worker's own per-stage
  clock (``worker_*``: predict, materialize, backend, oracle, compare, classify);
* ``backend_ms_per_case``: the worker's run_case time per ordinary case, per backend (where time goes);
* ``slowest_cases``: the SLOWEST_KEPT ordinary cases with the longest run_case time (seconds, backend, case id,
  campaign index): a batch is recorded when its slowest group is done, so one case of seconds stalls the whole
  pool, and these name it (the seed and the index regenerate the case);
* ``engine.variants_per_case`` and ``engine.storages_reused``: index variants after each generated case, and
  the cases that ran on storages kept from the case before them (engine/variants.py, pipeline/reuse.py);
* what the executor counted comes from its declared ``run_figures()`` (pipeline/executor_base.py): the worker's
  stage clock, ``engine.batch_losses``, ``engine.cases_replayed_alone``, ``engine.storages_reused``,
  ``engine.worker_processes``; ``engine.gpu_sharing`` from its ``sharing``; ``engine.cpu_only``: the campaign's
  platform is the CPU;
* ``scale``: the largest sizes reached by byte-compared transfers (:class:`ScaleReach`); ``scale_runs``: each
  scale case's shape, its own seconds and the campaign second it was recorded at, so that the console can say
  which of the timeline's stalls a scale case ran in;
* ``distinct_cases`` and ``distinct_cases_per_second``: generated cases that ran, each counted once however many
  backends ran it (:func:`variety_key`), index variants not counted: the campaign's variety, beside its volume
  (``cases_per_second`` counts every variant on every backend; docs/engine.md says how one multiplies into the
  other).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any

from hicache_fuzz.harness.engine.mix import Mix
from hicache_fuzz.harness.engine.scale import ScaleReach
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.pipeline.executor_base import Executor
from hicache_fuzz.kernels.buffers import GUARD_BYTES, register_chunk_bytes
from hicache_fuzz.oracles import layouts

SLOWEST_KEPT = 5
BYTE_COMPARED = frozenset({Outcome.PASS, Outcome.MISMATCH, Outcome.UNEXPECTED_PATH})
NOT_RUN = frozenset({Outcome.UNSUPPORTED, Outcome.UNDEFINED})
_VARIETY_FIELDS = tuple(f.name for f in fields(Case) if f.name not in ("backend", "note"))


def variety_key(case: Case) -> int:
    """A hash of everything `case` is but the backend it was drawn for (and its note): the same case on
    several backends is one case of variety."""
    return hash(tuple(getattr(case, name) for name in _VARIETY_FIELDS))


def storage_bytes(case: Case) -> int:
    """Raw bytes of every storage of `case` (payloads and guards): what one whole compare reads."""
    payload = sum(layouts.device_bytes(case, p) + layouts.host_bytes(case, p) for p in case.pools)
    return payload + 4 * GUARD_BYTES * len(case.pools)


@dataclass
class EngineStats:
    mix: Mix | None
    byte_compared: int = 0
    rejections_checked: int = 0
    verified_bytes: int = 0
    execute_seconds: float = 0.0
    record_seconds: float = 0.0
    scale_cases: int = 0
    scale_shapes: dict[str, int] = field(default_factory=dict)
    # (campaign seconds when recorded, its own seconds, shape) per scale case: which stalls it could explain
    scale_runs: list[tuple[float, float, str]] = field(default_factory=list)
    classes: Counter[str] = field(default_factory=Counter)
    reach: ScaleReach = field(default_factory=ScaleReach)
    first_result_unix: float = 0.0  # wall clock of the first result (start-up to first case, from outside)
    per_backend: dict[str, list[float]] = field(default_factory=dict)  # backend -> [cases, seconds in run_case]
    distinct: set[int] = field(default_factory=set)  # variety_key of the generated cases that ran
    slowest: list[tuple[float, str, str, int]] = field(default_factory=list)  # a min-heap of SLOWEST_KEPT

    def add(self, case: Case, result: Result, scale_case: bool, generated: bool = True, index: int = -1) -> None:
        """Count `result`; `generated` is False for an index variant (harness/engine/variants.py)."""
        if not self.first_result_unix:
            self.first_result_unix = time.time()
        if generated and result.outcome not in NOT_RUN:
            self.distinct.add(variety_key(case))
        if not scale_case:  # where the time of ordinary cases goes, per backend (the worker's run_case clock)
            row = self.per_backend.setdefault(result.backend, [0, 0.0])
            row[0] += 1
            row[1] += result.seconds
            # The case id hashes the whole case: only a case kept among the slowest pays for it (this runs in
            # the campaign parent for every result).
            if len(self.slowest) < SLOWEST_KEPT:
                heapq.heappush(self.slowest, (result.seconds, result.backend, case.case_id, index))
            elif result.seconds > self.slowest[0][0]:
                heapq.heapreplace(self.slowest, (result.seconds, result.backend, case.case_id, index))
        compared = result.outcome in BYTE_COMPARED and bool(case.host_indices)
        if compared:
            self.byte_compared += 1
            self.verified_bytes += storage_bytes(case)
            self.reach.add(case)
            self.classes["transfer"] += 1
        elif result.outcome is Outcome.REJECTED_AS_PREDICTED:
            self.rejections_checked += 1
            self.verified_bytes += storage_bytes(case)
            self.classes["reject"] += 1
        elif result.outcome in BYTE_COMPARED:
            self.classes["empty"] += 1
        else:
            self.classes[result.outcome.value] += 1

    def to_dict(self, seconds: float, feed: Any, scale: Any, executor: Executor,
                batches_ahead: int = 0, cpu_only: bool = False) -> dict[str, Any]:
        """The report's engine fields; `cpu_only`: the campaign runs on the CPU platform (in process or in
        workers), so the console leaves out what only a GPU run has."""
        cases = sum(self.classes.values())
        ran = executor.run_figures()
        stages = {
            "generate": feed.clock.generate_seconds,
            "wait": feed.clock.wait_seconds,
            "execute": self.execute_seconds,
            "record": self.record_seconds,
            "calibrate": feed.clock.calibrate_seconds,
            "scale_generate": feed.clock.scale_generate_seconds,
        }
        for stage, spent in ran.stage_seconds.items():
            stages[f"worker_{stage}"] = spent
        self.reach.scale_cases = self.scale_cases
        self.reach.scale_seconds = scale.seconds if scale is not None else 0.0
        self.reach.shapes = dict(self.scale_shapes)
        return {
            "engine": {
                "batch": feed.batch,
                "mix_target": self.mix.to_dict() if self.mix is not None else None,
                "mix_reached": {k: round(v / cases, 4) for k, v in sorted(self.classes.items())} if cases else {},
                "scale_tier": None if scale is None else {"share": scale.share, "skipped": scale.skipped[:20]},
                "batch_losses": ran.batch_losses,
                "cases_replayed_alone": ran.cases_replayed_alone,
                "first_result_unix": round(self.first_result_unix, 3),
                "worker_processes": ran.worker_processes,
                "variants_per_case": getattr(feed, "variants", 0),  # the most any backend got
                "variants_by_backend": dict(getattr(feed, "variants_by_backend", {})),
                # cases a known crash reproducer predicts run without index variants (engine/feed.py)
                "no_variants_for": sorted({f.describe() for f in getattr(feed, "crash_suspects", ())}),
                # K per backend: it ran every K-th campaign index (EngineOptions.backend_every)
                "backend_every": dict(getattr(feed, "every", {})),
                "batches_ahead": batches_ahead,
                "storages_reused": ran.storages_reused,
                "gpu_sharing": executor.sharing.to_dict() if executor.sharing is not None else None,
                # the console leaves out what only a GPU run has (host registration, index variants, reuse)
                "cpu_only": cpu_only,
            },
            "distinct_cases": len(self.distinct),
            "distinct_cases_per_second": round(len(self.distinct) / seconds, 1) if seconds > 0 else 0.0,
            "cases_per_distinct_case": round(cases / len(self.distinct), 2) if self.distinct else 0.0,
            "byte_compared_transfers": self.byte_compared,
            "rejections_checked": self.rejections_checked,
            "transfer_share": round(self.byte_compared / cases, 4) if cases else 0.0,
            "byte_compared_per_second": round(self.byte_compared / seconds, 1) if seconds > 0 else 0.0,
            "verified_bytes": self.verified_bytes,
            "verified_gb_per_second": round(self.verified_bytes / seconds / 1e9, 3) if seconds > 0 else 0.0,
            "stages": {k: round(v, 3) for k, v in stages.items()},
            "backend_ms_per_case": {name: round(1000 * spent / count, 3) for name, (count, spent)
                                    in sorted(self.per_backend.items()) if count},
            "scale": self.reach.to_dict(register_chunk_bytes()),
            "slowest_cases": [{"seconds": round(seconds, 3), "backend": backend, "case_id": case_id, "index": index}
                              for seconds, backend, case_id, index in sorted(self.slowest, reverse=True)],
            "scale_runs": [{"recorded_s": round(recorded, 3), "seconds": round(spent, 3), "shape": shape}
                           for recorded, spent, shape in self.scale_runs],
        }


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Console lines for a campaign report's engine fields (empty if it has none)."""
    if "byte_compared_transfers" not in report:
        return []
    scale = report["scale"]
    stages = ", ".join(f"{k} {v:.1f}" for k, v in report["stages"].items() if v >= 0.05)
    cpu_only = bool(report["engine"].get("cpu_only"))
    gpu_engine = "" if cpu_only else (
        f"; batch {report['engine']['batch']}, {_variants_text(report['engine'])} index variants per "
        f"generated case, {report['engine'].get('storages_reused', 0)} cases on reused storages"
        f"{_every_text(report['engine'])}")
    registration = "" if cpu_only else (
        f" ({scale['registration_chunks_of_largest_host_storage']} registration chunks of "
        f"{scale['host_register_chunk_bytes'] >> 20} MiB)")
    lines = [
        f"  engine: {report['byte_compared_transfers']} byte-compared transfers "
        f"({report['transfer_share']:.0%} of cases, {report['byte_compared_per_second']:,.1f}/s), "
        f"{report['rejections_checked']} rejections checked, verified {report['verified_gb_per_second']:.2f} GB/s"
        f"{gpu_engine}",
        f"  stages (s): {stages}",
        "  ms per case by backend (worker clock, scale cases apart): "
        + ", ".join(f"{k} {v:.2f}" for k, v in report.get("backend_ms_per_case", {}).items()),
        f"  scale reached: device pool {scale['largest_device_pool_rows']:,} rows, host offset "
        f"{scale['largest_host_byte_offset']:,} B{registration}, transfer "
        f"{scale['longest_transfer_tokens']:,} tokens, {scale['max_layers']} layers, page sizes not a power of two "
        f"{_some_sizes(scale['page_sizes_not_power_of_two'])}; scale tier {scale['scale_cases']} cases in "
        f"{scale['scale_seconds']:.1f} s",
    ]
    if "distinct_cases" in report:
        lines.append(f"  variety: {report['distinct_cases']:,} distinct generated cases ran "
                     f"({report['distinct_cases_per_second']:,.1f}/s), {report['cases_per_distinct_case']:.1f} cases "
                     f"each over backends{'' if cpu_only else ' and index variants'}")
    dry = report.get("dry_run")
    if dry:
        lines.append(f"  dry run: nothing ran (outcomes are predictions, seconds modelled at "
                     f"{dry['modelled_cases_per_second']:,.0f} cases/s); generated in {dry['wall_seconds']:.1f} s")
        for backend, assumed in sorted((dry.get("assumptions") or {}).items()):
            lines.append(f"  dry run assumes for {backend}: {'; '.join(assumed)}")
    stalls = timeline_stalls(report.get("timeline") or [], float(report.get("cases_per_second") or 0.0))
    if stalls:
        longest = max(stalls, key=lambda stall: stall[1] - stall[0])
        overlapping = scale_runs_in_stalls(report.get("scale_runs") or [], stalls)
        lines.append(f"  stalls (under {STALL_SHARE:.0%} of the campaign's rate): {len(stalls)}, "
                     f"{sum(end - start for start, end in stalls):.1f} s in all, longest "
                     f"{longest[1] - longest[0]:.1f} s from {longest[0]:.1f} s; {overlapping} of them with a "
                     f"scale case running")
    slowest = report.get("slowest_cases") or []
    if slowest:
        lines.append("  slowest cases: " + ", ".join(f"{row['seconds']:.2f} s {row['backend']} {row['case_id']} "
                                                     f"(index {row['index']})" for row in slowest[:3]))
    sharing = report["engine"].get("gpu_sharing")
    if sharing:
        lines.append(f"  gpu sharing: {sharing['mode']} ({sharing['reason']})"
                     + (f"; fell back to contexts: {sharing['fell_back']}" if sharing.get("fell_back") else "")
                     + (f"; {sharing['collateral_count']} cases lost to another MPS client's fault (ran clean "
                        "alone)" if sharing.get("collateral_count") else ""))
    return lines


SIZES_SHOWN = 8  # the console names this many page sizes; the JSON report keeps the whole list


def _some_sizes(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    if len(sizes) <= SIZES_SHOWN:
        return ", ".join(map(str, sizes))
    return f"{len(sizes)} ({', '.join(map(str, sizes[:SIZES_SHOWN]))}, ... {sizes[-1]})"


STALL_SHARE = 0.25  # a stretch of the timeline recorded at under this share of the campaign's mean rate


def timeline_stalls(samples: list[dict[str, float]], rate: float) -> list[tuple[float, float]]:
    """(start, end) seconds of the stretches between timeline samples that recorded cases at under STALL_SHARE
    of `rate` (the campaign's cases/s), adjacent ones merged. A stall is the whole pipeline waiting on one thing
    (e.g. a one-case batch queued behind a scale case holds every batch recorded after it); the mean rate hides
    it, the timeline shows it."""
    stalls: list[tuple[float, float]] = []
    for before, after in pairwise(samples):
        seconds = after["t"] - before["t"]
        if seconds <= 0 or rate <= 0 or (after["cases"] - before["cases"]) / seconds >= STALL_SHARE * rate:
            continue
        if stalls and stalls[-1][1] == before["t"]:
            stalls[-1] = (stalls[-1][0], after["t"])
        else:
            stalls.append((before["t"], after["t"]))
    return stalls


def scale_runs_in_stalls(scale_runs: list[dict[str, Any]], stalls: list[tuple[float, float]]) -> int:
    """How many `stalls` overlap a scale case's run (recorded_s - seconds .. recorded_s, campaign seconds). A scale
    case is recorded when its batch is, so its run is known to within the batch ahead of it."""
    runs = [(float(run["recorded_s"]) - float(run["seconds"]), float(run["recorded_s"])) for run in scale_runs]
    return sum(any(start < run_end and run_start < end for run_start, run_end in runs) for start, end in stalls)


def _variants_text(engine: dict[str, Any]) -> str:
    """"3", or "3 (sglang-pool 15)" where backends got different counts."""
    by_backend: dict[str, int] = engine.get("variants_by_backend") or {}
    counts = sorted(set(by_backend.values()))
    withheld = engine.get("no_variants_for") or []
    none_for = f" (none for cases a known crash predicts: {'; '.join(withheld)})" if withheld else ""
    if len(counts) <= 1:
        return str(counts[0] if counts else engine.get("variants_per_case", 0)) + none_for
    common = min(counts, key=lambda n: (-list(by_backend.values()).count(n), n))
    others = ", ".join(f"{name} {n}" for name, n in sorted(by_backend.items()) if n != common)
    return f"{common} ({others}){none_for}"


def _every_text(engine: dict[str, Any]) -> str:
    """"; sglang-pool every 6th index" for the backends that did not run every index ("" if all did)."""
    sparse = {name: k for name, k in sorted((engine.get("backend_every") or {}).items()) if k > 1}
    if not sparse:
        return ""
    return "; " + ", ".join(f"{name} every {k}th index" for name, k in sparse.items())
