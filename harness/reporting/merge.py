"""Merging campaigns: one report, one deduplicated corpus and one JUnit file from many workers or shards
(``hicache-fuzz merge``, :mod:`hicache_fuzz.harness.commands.merge`).

Inputs are campaign reports (``fuzz --json``, one per worker, shard, CI job or node) and corpus directories.
The merged report has the campaign report's keys, so whatever reads one reads the other:

* ``outcomes`` and ``paths`` are summed per backend; ``unique_failures`` are merged by signature (counts
  summed; the representative is the earliest (seed, index) occurrence);
* ``cases`` and ``failures_total`` are summed; ``seconds`` is the longest input (inputs are assumed to have
  run side by side) and ``cases_per_second`` the sum of the inputs' rates (their aggregate throughput);
* ``seed`` is the common seed (None when inputs used several, listed in ``seeds``); ``next_index`` is None,
  because each shard resumes at its own index: see ``merged_from``, one entry per input campaign;
* ``startup`` is the campaigns' start-up together: the first result of any of them, in seconds after the
  earliest launch they recorded (``fuzz --workers N`` measures from its own launch, the shards' spawn
  included); each campaign's own record stays in its ``merged_from`` entry.

Merging merged reports works (their ``merged_from`` entries are carried over), so per-node merges can be
merged again. Two inputs that ran the same case indices of the same seed on the same backend (for instance
N CI jobs that all forgot ``--shard``) would count every case N times: an error unless ``--allow-overlap``.

The merged corpus keeps every reproducer once (by case id, a content hash), at most ``--max-per-signature``
per failure signature, in the campaign's own layout ``<signature>/<case_id>.json``; bare case files land in
``cases/``. Folders whose names start with a dot (the workers' journals) are not corpus.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.corpus import CorpusEntry, CorpusError, load_entries
from hicache_fuzz.harness.model.json_input import (
    MAX_REPORT_FILE_BYTES,
    InputError,
    child_path,
    expect_int,
    expect_number,
    expect_object,
    expect_str,
    read_json_file,
)
from hicache_fuzz.harness.reporting.coverage import Coverage
from hicache_fuzz.harness.reporting.junit import JUnitCase

MERGED_FORMAT = "hicache-fuzz-merged-report"
# Keys of a campaign report that merge_reports combines; any other key is kept per input in merged_from.
_COMBINED_KEYS = frozenset({
    "format", "seed", "seeds", "shard", "shards", "backends", "platform", "cases", "seconds",
    "cases_per_second", "first_index", "next_index", "outcomes", "paths", "failures_total",
    "unique_failures", "case_ids", "merged_from", "overlaps", "seconds_total", "coverage", "coverage_gaps",
    "coverage_ranges", "coverage_values", "coverage_summary",
    "coverage_exemptions", "new_failure_signatures", "flaky_failure_signatures",
})


class MergeError(InputError):
    """Inputs that cannot be merged (unreadable, not a report, overlapping shards); exit code 2."""


# ---- reports ----------------------------------------------------------------------------------------------

def load_report(path: Path) -> dict[str, Any]:
    """A campaign (or merged) report, read through the input boundary and type-checked where merge relies on
    the types; MergeError names the file and the field."""
    try:
        data = read_json_file(path, MAX_REPORT_FILE_BYTES)
        if not isinstance(data, dict) or not {"cases", "outcomes", "unique_failures"} <= data.keys():
            raise MergeError(f"{path}: not a campaign report (needs cases, outcomes, unique_failures)")
        _check_report(data)
    except MergeError:
        raise
    except InputError as exc:
        text = str(exc)
        raise MergeError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    return data


def _optional(check: Any, value: Any, where: str) -> None:
    if value is not None:
        check(value, where)


def _check_counts(value: Any, where: str) -> None:
    for backend, counts in expect_object(value, where).items():
        for key, count in expect_object(counts, f"{where}.{backend}").items():
            if expect_int(count, f"{where}.{backend}.{key}") < 0:
                raise InputError(f"{where}.{backend}.{key}: negative count {count}")


def _check_string_list(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a list of strings")
    for i, item in enumerate(value):
        expect_str(item, f"{where}[{i}]")


def _check_report(data: Mapping[str, Any]) -> None:
    if expect_int(data["cases"], "report.cases") < 0:
        raise InputError(f"report.cases: negative ({data['cases']})")
    _check_counts(data["outcomes"], "report.outcomes")
    _check_counts(data.get("paths", {}), "report.paths")
    _optional(expect_int, data.get("seed"), "report.seed")
    for key in ("first_index", "next_index"):
        _optional(expect_int, data.get(key), f"report.{key}")
    for key in ("seconds", "cases_per_second"):
        _optional(expect_number, data.get(key), f"report.{key}")
    _check_string_list(data.get("backends", []), "report.backends")
    _check_string_list(data.get("case_ids", []), "report.case_ids")
    shard = data.get("shard")
    if shard is not None and not (isinstance(shard, list) and len(shard) == 2
                                  and all(type(x) is int for x in shard) and 0 <= shard[0] < shard[1]):
        raise InputError(f"report.shard: expected [K, N] with 0 <= K < N, got {shard!r}"[:200])
    if not isinstance(data["unique_failures"], list):
        raise InputError("report.unique_failures: expected a list")
    for i, failure in enumerate(data["unique_failures"]):
        where = f"report.unique_failures[{i}]"
        expect_object(failure, where)
        for key in ("signature", "backend", "outcome"):
            expect_str(failure.get(key), f"{where}.{key}")
        expect_int(failure.get("count", 1), f"{where}.count")
        _optional(expect_int, failure.get("first_index"), f"{where}.first_index")
        _optional(expect_int, failure.get("seed"), f"{where}.seed")
    merged_from = data.get("merged_from") or []
    if not isinstance(merged_from, list):
        raise InputError("report.merged_from: expected a list")
    for i, entry in enumerate(merged_from):
        where = f"report.merged_from[{i}]"
        expect_object(entry, where)
        shard_text = expect_str(entry.get("shard", ""), f"{where}.shard")
        k, _, n = shard_text.partition("/")
        if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
            raise InputError(f"{where}.shard: expected \"K/N\", got {shard_text[:40]!r}")
        expect_int(entry.get("cases", 0), f"{where}.cases")
        _optional(expect_int, entry.get("seed"), f"{where}.seed")
        for key in ("first_index", "next_index"):
            _optional(expect_int, entry.get(key), f"{where}.{key}")
        expect_number(entry.get("seconds", 0.0), f"{where}.seconds")
        _check_string_list(entry.get("backends", []), f"{where}.backends")


def report_files(paths: Iterable[Path]) -> list[Path]:
    """The given report files, and every campaign report under given folders (recursively; other JSON files,
    such as reproducers, are passed over), so that callers without a shell glob can name a folder."""
    files: list[Path] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        for candidate in sorted(path.rglob("*.json")):
            if any(part.startswith(".") for part in candidate.relative_to(path).parts):
                continue
            try:
                load_report(candidate)
            except MergeError:
                continue
            files.append(candidate)
    return files


def _leaf_entries(report: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """One entry per campaign that went into `report` (itself, or what it was merged from)."""
    if report.get("merged_from"):
        return [dict(entry) for entry in report["merged_from"]]
    entry = {key: value for key, value in report.items() if key not in _COMBINED_KEYS}
    shard = report.get("shard") or [0, 1]
    entry.update(source=source, seed=report.get("seed"), shard=f"{shard[0]}/{shard[1]}",
                 backends=list(report.get("backends", [])), platform=report.get("platform", ""),
                 cases=int(report.get("cases", 0)), seconds=float(report.get("seconds", 0.0)),
                 cases_per_second=float(report.get("cases_per_second", 0.0)),
                 first_index=report.get("first_index"), next_index=report.get("next_index"))
    return [entry]


def _shard_pair(text: str) -> tuple[int, int]:
    k, n = text.split("/")
    return int(k), int(n)


def _shares_an_index(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Did campaigns a and b both run some index i (same seed)? Each ran the i in [first_index, next_index)
    with i % n == k; the pattern of (i % n1, i % n2) repeats every lcm(n1, n2) indices, so one period of the
    common range decides it."""
    if None in (a.get("first_index"), a.get("next_index"), b.get("first_index"), b.get("next_index")):
        return True  # unknown ranges: assume the worst
    k1, n1 = _shard_pair(a["shard"])
    k2, n2 = _shard_pair(b["shard"])
    low = max(int(a["first_index"]), int(b["first_index"]))
    high = min(int(a["next_index"]), int(b["next_index"]))
    period = n1 * n2 // math.gcd(n1, n2)
    return any(i % n1 == k1 and i % n2 == k2 for i in range(low, min(high, low + period)))


def find_overlaps(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Pairs of campaigns that ran the same cases (same seed, index and backend), described."""
    overlaps = []
    for i, a in enumerate(entries):
        for b in entries[i + 1:]:
            if a.get("seed") != b.get("seed") or not set(a.get("backends", [])) & set(b.get("backends", [])):
                continue
            if int(a.get("cases", 0)) and int(b.get("cases", 0)) and _shares_an_index(a, b):
                overlaps.append(f"{_describe_entry(a)} and {_describe_entry(b)} ran seed {a.get('seed')}")
    return overlaps


def _describe_entry(entry: Mapping[str, Any]) -> str:
    return (f"{entry.get('source')} (shard {entry['shard']}, indices {entry.get('first_index')}.."
            f"{entry.get('next_index')})")


def _add_counts(total: dict[str, dict[str, int]], part: Mapping[str, Mapping[str, int]]) -> None:
    for backend, counts in part.items():
        into = total.setdefault(backend, {})
        for key, value in counts.items():
            into[key] = into.get(key, 0) + int(value)


def merge_reports(reports: Sequence[Mapping[str, Any]], sources: Sequence[str] | None = None,
                  allow_overlap: bool = False) -> dict[str, Any]:
    """One report from many; see the module docstring for how each key combines."""
    if not reports:
        raise MergeError("nothing to merge: no reports given")
    sources = list(sources) if sources is not None else [f"report {i}" for i in range(len(reports))]
    entries: list[dict[str, Any]] = []
    for report, source in zip(reports, sources, strict=True):
        entries.extend(_leaf_entries(report, source))
    overlaps = find_overlaps(entries)
    if overlaps and not allow_overlap:
        raise MergeError("inputs ran the same cases (give each job its own --shard K/N, or "
                         "--allow-overlap):\n  " + "\n  ".join(overlaps))
    outcomes: dict[str, dict[str, int]] = {}
    paths: dict[str, dict[str, int]] = {}
    failures: dict[str, dict[str, Any]] = {}
    backends: list[str] = []
    case_ids: list[str] = []
    for report in reports:
        _add_counts(outcomes, report.get("outcomes", {}))
        _add_counts(paths, report.get("paths", {}))
        backends.extend(b for b in report.get("backends", []) if b not in backends)
        case_ids.extend(report.get("case_ids", []))
        for failure in report.get("unique_failures", []):
            _merge_failure(failures, failure, report.get("seed"))
    seeds = sorted({e["seed"] for e in entries if e.get("seed") is not None})
    platforms = sorted({e["platform"] for e in entries if e.get("platform")})
    merged_failures = sorted(failures.values(), key=lambda f: (-int(f["count"]), f["signature"]))
    coverage = Coverage.from_dicts([r.get("coverage", {}) for r in reports],
                                   [r.get("coverage_exemptions", {}) for r in reports],
                                   [r.get("coverage_ranges", {}) for r in reports],
                                   [r.get("coverage_values", {}) for r in reports])
    return {
        "format": MERGED_FORMAT,
        "seed": seeds[0] if len(seeds) == 1 else None,
        "seeds": seeds,
        "shard": None,
        "shards": sorted({e["shard"] for e in entries}, key=_shard_pair),
        "backends": backends,
        "platform": platforms[0] if len(platforms) == 1 else "mixed: " + ", ".join(platforms),
        "cases": sum(int(e.get("cases", 0)) for e in entries),
        "seconds": round(max(float(e.get("seconds", 0.0)) for e in entries), 3),
        "seconds_total": round(sum(float(e.get("seconds", 0.0)) for e in entries), 3),
        "cases_per_second": round(sum(float(e.get("cases_per_second", 0.0)) for e in entries), 1),
        "first_index": min((int(e["first_index"]) for e in entries if e.get("first_index") is not None),
                           default=0),
        "next_index": None,
        "outcomes": outcomes,
        "paths": paths,
        "failures_total": sum(int(f["count"]) for f in merged_failures),
        "new_failure_signatures": [f["signature"] for f in merged_failures
                                   if not f.get("known") and not f.get("flaky")],
        "flaky_failure_signatures": [f["signature"] for f in merged_failures if f.get("flaky")],
        "unique_failures": merged_failures,
        "case_ids": case_ids,
        "coverage": coverage.to_dict(),
        "coverage_ranges": coverage.ranges_dict(),
        "coverage_values": coverage.values_dict(),
        "coverage_summary": coverage.summary_dict(),
        "coverage_gaps": {b: gaps for b in backends if (gaps := coverage.gaps(b))},
        "coverage_exemptions": {b: dict(e) for b, e in sorted(coverage.exemptions.items())},
        "overlaps": overlaps,
        "startup": merged_startup(entries),
        "merged_from": entries,
    }


def merged_startup(entries: Sequence[Mapping[str, Any]], launched_unix: float | None = None) -> dict[str, Any] | None:
    """The first result of any campaign (its engine's ``first_result_unix``), in seconds after `launched_unix`
    (the launch of the process that started them all) or else after the earliest launch a campaign recorded in
    its ``startup``. None when no launch is known."""
    def number(record: Any, key: str) -> float | None:
        value = record.get(key) if isinstance(record, Mapping) else None
        return float(value) if isinstance(value, int | float) and value > 0 else None

    launches = [t for e in entries if (t := number(e.get("startup"), "launched_unix")) is not None]
    launch = launched_unix if launched_unix is not None else min(launches, default=None)
    if launch is None:
        return None
    firsts = [t for e in entries if (t := number(e.get("engine"), "first_result_unix")) is not None]
    return {"launched_unix": round(launch, 3), "first_result_s": round(min(firsts) - launch, 3) if firsts else None,
            "campaigns": len(entries)}


def _merge_failure(failures: dict[str, dict[str, Any]], failure: Mapping[str, Any], seed: Any) -> None:
    """Add one report's failure class; the representative is the earliest (seed, index) occurrence, so the
    merged report does not depend on the order of its inputs."""
    # A known class and a new class of one identity (a case outside the known entry's trigger) stay apart.
    signature = str(failure["signature"]) + ("|known" if failure.get("known") else "") + (
        "|flaky" if failure.get("flaky") else "")
    candidate = {**failure, "seed": failure.get("seed", seed), "count": int(failure.get("count", 1))}
    known = failures.get(signature)
    if known is None:
        failures[signature] = candidate
        return
    candidate["count"] += known["count"]
    if _occurrence(candidate) < _occurrence(known):
        failures[signature] = candidate
    else:
        known["count"] = candidate["count"]


def _occurrence(failure: Mapping[str, Any]) -> tuple[int, int]:
    seed = failure.get("seed")
    return (int(seed) if seed is not None else -1, int(failure.get("first_index", 0)))


# ---- corpora ----------------------------------------------------------------------------------------------

@dataclass
class CorpusMerge:
    kept: dict[tuple[str, str], Path] = field(default_factory=dict)  # (signature, case_id) -> merged file
    duplicates: int = 0  # files whose case was already kept
    over_cap: int = 0  # distinct cases dropped by --max-per-signature
    unreadable: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # corpus folders that do not exist (a clean campaign makes none)


def corpus_files(corpus_dirs: Iterable[Path]) -> list[Path]:
    """Every *.json under the corpus folders, except in dot-folders (journals) and dot-files (temporaries)."""
    files: list[Path] = []
    for root in corpus_dirs:
        if root.is_file():
            files.append(root)
            continue
        if not root.is_dir():
            raise MergeError(f"{root}: no such corpus directory")
        files.extend(p for p in sorted(root.rglob("*.json"))
                     if not any(part.startswith(".") for part in p.relative_to(root).parts))
    return files


def merge_corpora(corpus_dirs: Sequence[Path], out_dir: Path, max_per_signature: int = 0,
                  keep_first: Iterable[tuple[str, str]] = ()) -> CorpusMerge:
    """Copy each distinct case once into `out_dir`; `keep_first` (signature, case_id) pairs (the merged
    report's representatives) are kept ahead of the rest when a signature is capped (0 = no cap)."""
    merge = CorpusMerge(missing=[str(d) for d in corpus_dirs if not d.exists()])
    corpus_dirs = [d for d in corpus_dirs if d.exists()]
    by_signature: dict[str, list[CorpusEntry]] = {}
    seen: set[tuple[str, str]] = set()
    for path in corpus_files(corpus_dirs):
        try:
            entry = load_entries(path)[0]  # a file is copied once, even when it lists several backends
        except CorpusError as exc:
            merge.unreadable.append(str(exc))
            continue
        key = (entry.signature, entry.case.case_id)
        if key in seen:
            merge.duplicates += 1
            continue
        seen.add(key)
        by_signature.setdefault(entry.signature, []).append(entry)
    preferred = set(keep_first)
    for signature, entries in sorted(by_signature.items()):
        entries.sort(key=lambda e: ((signature, e.case.case_id) not in preferred, e.case.case_id))
        capped = entries if not max_per_signature or not signature else entries[:max_per_signature]
        merge.over_cap += len(entries) - len(capped)
        for entry in capped:
            # The signature comes from the input file: child_path refuses any name that could leave out_dir.
            try:
                target = child_path(out_dir, signature or "cases", f"{entry.case.case_id}.json",
                                    where=f"{entry.path}: signature")
            except InputError as exc:
                merge.unreadable.append(str(exc))
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.path.resolve() != target.resolve():
                shutil.copyfile(entry.path, target)
            merge.kept[(signature, entry.case.case_id)] = target
    return merge


def point_failures_at(report: dict[str, Any], corpus: CorpusMerge) -> None:
    """Make each unique failure's `file` name its reproducer in the merged corpus (when it is there)."""
    for failure in report["unique_failures"]:
        kept = corpus.kept.get((failure["signature"], failure.get("first_case_id", "")))
        if kept is None:
            kept = next((path for (signature, _), path in sorted(corpus.kept.items())
                         if signature == failure["signature"]), None)
        if kept is not None:
            failure["file"] = str(kept)


# ---- JUnit ------------------------------------------------------------------------------------------------

def junit_cases(report: Mapping[str, Any], replay_hint: str = "hicache-fuzz replay") -> list[JUnitCase]:
    """One passing testcase per backend (its outcome counts) and one failing testcase per backend x failure
    signature (count, summary, reproducer, the replay command): meaningful however the run was split."""
    cases: list[JUnitCase] = []
    seeds = ", ".join(str(s) for s in report.get("seeds") or [report.get("seed")])
    failures_by_backend: dict[str, list[Mapping[str, Any]]] = {}
    for failure in report.get("unique_failures", []):
        failures_by_backend.setdefault(str(failure["backend"]), []).append(failure)
    backends = list(report.get("backends", []))
    backends.extend(b for b in failures_by_backend if b not in backends)
    for backend in backends:
        counts = report.get("outcomes", {}).get(backend, {})
        listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        cases.append(JUnitCase(
            name="campaign", classname=f"hicache_fuzz.{backend}",
            system_out=f"seed(s) {seeds}; {sum(counts.values())} cases: {listed or 'none'}",
            properties={"seeds": seeds, "cases": str(sum(counts.values())),
                        "shards": ", ".join(report.get("shards") or [])},
            skipped_message=None if counts else "no cases ran for this backend"))
        for failure in failures_by_backend.get(backend, []):
            reproducer = failure.get("file") or ""
            text = (f"{failure['count']} failing cases with signature {failure['signature']} "
                    f"({failure['outcome']}), first case {failure.get('first_case_id', '?')} at index "
                    f"{failure.get('first_index', '?')}, seed(s) {seeds}\n{failure.get('summary', '')}\n")
            if reproducer:
                text += f"reproducer: {reproducer}\nreplay: {replay_hint} {reproducer}\n"
            cases.append(JUnitCase(
                name=str(failure["signature"]), classname=f"hicache_fuzz.{backend}",
                failure_message=f"{failure['outcome']} x{failure['count']}: {failure.get('summary', '')}",
                failure_text=text, properties={"reproducer": reproducer, "count": str(failure["count"])}))
    return cases


def describe(report: Mapping[str, Any]) -> str:
    """The merged report in a few lines (the same shape as the fuzz command's summary)."""
    seeds = ", ".join(str(s) for s in report.get("seeds") or [report.get("seed")])
    lines = [f"seed(s) {seeds}, shards {', '.join(report.get('shards') or [])}: {report['cases']} cases "
             f"from {len(report.get('merged_from', []))} campaigns, "
             f"{report['cases_per_second']:,.1f} cases/s together"]
    startup = report.get("startup")
    if isinstance(startup, Mapping) and startup.get("first_result_s") is not None:
        lines.append(f"  first result {startup['first_result_s']:.1f} s after launch")
    for backend, counts in sorted(report["outcomes"].items()):
        lines.append(f"  {backend}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    failures = report["unique_failures"]
    if failures:
        lines.append(f"{report['failures_total']} failures, {len(failures)} unique:")
        for failure in failures:
            lines.append(f"  [{failure['signature']}] x{failure['count']} {failure.get('summary', '')}")
            if failure.get("file"):
                lines.append(f"      reproducer: {failure['file']}")
    else:
        lines.append("no failures")
    return "\n".join(lines)
