"""Corpus files: plain JSON, written before anything else can go wrong, never unpickled or evaluated.

Two kinds of file are read:

* a bare case (the object :meth:`Case.to_dict` writes), e.g. the seed corpus;
* a reproducer: ``{"format": "hicache-fuzz-reproducer", "version": 1, "case": {...}, "signature": ...,
  "observed": {result}}``, written for every failure at ``<corpus>/<signature>/<case_id>.json``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.identity import identify, signature
from hicache_fuzz.harness.findings.known_crash import trigger_was_run
from hicache_fuzz.harness.findings.scope import KnownScope, ScopeError
from hicache_fuzz.harness.findings.trigger import TriggerError, trigger_from_json
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.json_input import (
    InputError,
    child_path,
    expect_keys,
    expect_number,
    expect_object,
    expect_str,
    read_json_file,
    safe_name,
)
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.output_paths import write_json_atomic

REPRODUCER_FORMAT = "hicache-fuzz-reproducer"
REPRODUCER_VERSION = 1


class CorpusError(InputError):
    """A corpus file is unreadable or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class CorpusEntry:
    path: Path
    case: Case
    observed: Result | None  # what the campaign saw when it saved the file (None for bare cases)
    signature: str  # as recorded in the file (informative: identities are recomputed, see `bug`)
    # "pass" (default) or "fail": a known, unfixed bug whose replay must fail with the same bug identity
    # (see docs/reproducers.md, "Expected failures").
    expect: str = "pass"
    scope: KnownScope = field(default_factory=KnownScope)  # where an expected failure applies
    # the case conditions the recorded failure needs (findings/trigger.py); empty: recorded without one
    trigger: dict[str, str] = field(default_factory=dict)
    # True where the trigger was derived by running relaxed cases (a file written by the minimizer, which stores
    # its report under "minimized" beside the trigger): it is kept as recorded (findings/known.py)
    trigger_run: bool = False

    @property
    def any_crash_is_its_bug(self) -> bool:
        """A crash whose trigger was derived by running relaxed cases: any crash of a case within that trigger is
        this bug, whatever its symptom (findings/known_crash.py)."""
        return self.trigger_run and self.observed is not None and self.observed.outcome is Outcome.CRASH

    @property
    def bug(self) -> str:
        """The bug identity of the recorded failure, recomputed with today's identity rules (so an entry
        recorded under an older signature scheme still matches); the recorded signature when the file has
        no observed failure."""
        if self.observed is not None and self.observed.outcome.is_failure:
            return signature(self.observed, self.case)
        return self.signature


def reproducer_dict(case: Case, result: Result) -> dict[str, Any]:
    return {
        "format": REPRODUCER_FORMAT,
        "version": REPRODUCER_VERSION,
        "signature": (identity := identify(result, case)).bug,
        "variant": identity.variant,
        "case": case.to_dict(),
        "observed": result.to_dict(),
    }


def save_failure(corpus_dir: Path, case: Case, result: Result) -> Path:
    """Write the failing case and what was observed; returns the file's path."""
    path = child_path(corpus_dir, signature(result, case), f"{case.case_id}.json", where="corpus file")
    write_json_atomic(path, reproducer_dict(case, result))
    return path


# Top-level fields of a reproducer file (see docs/reproducers.md); anything else is a typo or another tool's file.
_REPRODUCER_KEYS = frozenset({"format", "version", "signature", "signature_key", "variant", "scope", "case",
                              "observed", "expect", "trigger",
                              "minimized", "gate_corpus_file"})
_OBSERVED_KEYS = frozenset({"case_id", "backend", "outcome", "expected_path", "path", "prediction", "error", "diff",
                            "summary", "seconds", "raised_at"})
_OBSERVED_REQUIRED = ("case_id", "backend", "outcome")


def load_entries(path: Path) -> list[CorpusEntry]:
    """The entries of one case or reproducer file: one per backend (a case may name one ``"backend"`` or list
    several under ``"backends"``). Every problem is a CorpusError naming the file and the field."""
    try:
        data = expect_object(read_json_file(path), "file")
        if data.get("format") == REPRODUCER_FORMAT:
            return _reproducer_entries(path, data)
        return [CorpusEntry(path, Case.from_dict(case_data), None, "") for case_data in _per_backend(data, "case")]
    except CorpusError:
        raise
    except InputError as exc:  # CaseError included
        text = str(exc)
        raise CorpusError(text if text.startswith(str(path)) else f"{path}: {text}") from None


def load_entry(path: Path) -> CorpusEntry:
    """The one entry of a file that names one backend (load_entries for files that list several)."""
    entries = load_entries(path)
    if len(entries) != 1:
        raise CorpusError(f"{path}: lists {len(entries)} backends; read it with load_entries")
    return entries[0]


def _reproducer_entries(path: Path, data: dict[str, Any]) -> list[CorpusEntry]:
    expect_keys(data, _REPRODUCER_KEYS, "reproducer")
    version = data.get("version")
    if type(version) is not int or version != REPRODUCER_VERSION:
        raise CorpusError(f"{path}: reproducer version {version!r}, expected {REPRODUCER_VERSION}")
    case_data = expect_object(data.get("case"), "reproducer.case")
    recorded = data.get("signature", "")
    # The signature names the reproducer's folder when corpora are merged: it must be one safe path component.
    recorded = safe_name(recorded, "reproducer.signature") if recorded != "" else ""
    for text_key in ("signature_key", "gate_corpus_file", "variant"):
        if text_key in data:
            expect_str(data[text_key], f"reproducer.{text_key}")
    if "minimized" in data:
        expect_object(data["minimized"], "reproducer.minimized")
    expect = expect_str(data.get("expect", "pass"), "reproducer.expect")
    if expect not in ("pass", "fail"):
        raise CorpusError(f"{path}: reproducer.expect must be \"pass\" or \"fail\", got {expect[:40]!r}")
    scope = KnownScope()
    if "scope" in data:
        if expect != "fail":
            raise CorpusError(f"{path}: reproducer.scope only applies to an expected failure (\"expect\": \"fail\")")
        try:
            scope = KnownScope.from_dict(data["scope"], "reproducer.scope")
        except ScopeError as exc:
            raise CorpusError(f"{path}: {exc}") from None
    trigger: dict[str, str] = {}
    if "trigger" in data:
        try:
            trigger = trigger_from_json(data["trigger"], "reproducer.trigger")
        except TriggerError as exc:
            raise CorpusError(f"{path}: {exc}") from None
    observed = _observed(data["observed"]) if data.get("observed") is not None else None
    trigger_run = trigger_was_run(data)
    return [CorpusEntry(path, Case.from_dict(one), observed, recorded, expect, scope, trigger, trigger_run)
            for one in _per_backend(case_data, "reproducer.case")]


def _per_backend(case_data: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A case dict per backend: ``"backend": NAME`` (one) or ``"backends": [NAME, ...]`` (each listed once)."""
    if "backends" not in case_data:
        return [case_data]
    if "backend" in case_data:
        raise InputError(f"{where}: give \"backend\" or \"backends\", not both")
    names = case_data["backends"]
    if not isinstance(names, list) or not names:
        raise InputError(f"{where}.backends: expected a non-empty list of backend names, got {names!r}"[:200])
    checked = [safe_name(name, f"{where}.backends[{i}]") for i, name in enumerate(names)]
    if len(set(checked)) != len(checked):
        raise InputError(f"{where}.backends: a backend is listed twice in {checked}")
    base = {key: value for key, value in case_data.items() if key != "backends"}
    return [{**base, "backend": name} for name in checked]


def _observed(value: Any) -> Result:
    data = expect_object(value, "reproducer.observed")
    expect_keys(data, _OBSERVED_KEYS, "reproducer.observed")
    outcome = expect_str(data.get("outcome"), "reproducer.observed.outcome")
    if outcome not in {o.value for o in Outcome}:
        raise InputError(f"reproducer.observed.outcome: {outcome[:40]!r} is not an outcome")
    missing = [key for key in _OBSERVED_REQUIRED if key not in data]
    if missing:  # what the failure was, and where: without them the reproducer is not one (replay, minimize alike)
        raise InputError(f"reproducer.observed: missing field(s) {missing}")
    texts = {key: expect_str(data.get(key, ""), f"reproducer.observed.{key}")
             for key in ("case_id", "backend", "expected_path", "path", "prediction", "error", "summary",
                         "raised_at")}
    return Result(outcome=Outcome(outcome), diff=expect_object(data.get("diff", {}), "reproducer.observed.diff"),
                  seconds=expect_number(data.get("seconds", 0.0), "reproducer.observed.seconds"), **texts)


def iter_case_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Every *.json under the given files and directories, in a stable order."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
        elif os.path.lexists(path):  # the loader says what is wrong with anything but a regular file
            yield path
        else:
            raise CorpusError(f"{path}: no such file or directory")


def load_corpus(paths: Iterable[Path]) -> list[CorpusEntry]:
    """Every entry of every corpus file under `paths` (files or folders), in a stable order."""
    return [entry for path in iter_case_files(paths) for entry in load_entries(path)]
