"""Corpus files: plain JSON, written before anything else can go wrong, never unpickled or evaluated.

Two kinds of file are read:

* a bare case (the object :meth:`Case.to_dict` writes), e.g. the seed corpus;
* a reproducer: ``{"format": "hicache-fuzz-reproducer", "version": 1, "case": {...}, "signature": ...,
  "observed": {result}}``, written for every failure at ``<corpus>/<signature>/<case_id>.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.campaign.identity import identify, signature
from hicache_fuzz.harness.campaign.scope import KnownScope, ScopeError
from hicache_fuzz.harness.model.case import Case, CaseError
from hicache_fuzz.harness.model.outcome import Result

REPRODUCER_FORMAT = "hicache-fuzz-reproducer"
REPRODUCER_VERSION = 1


class CorpusError(ValueError):
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

    @property
    def bug(self) -> str:
        """The bug identity of the recorded failure, recomputed with today's identity rules (so an entry
        recorded under an older signature scheme still matches); the recorded signature when the file has
        no observed failure."""
        if self.observed is not None and self.observed.outcome.is_failure:
            return signature(self.observed, self.case)
        return self.signature


def write_json_atomic(path: Path, data: Any) -> None:
    """Write, fsync and rename: a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    path = corpus_dir / signature(result, case) / f"{case.case_id}.json"
    write_json_atomic(path, reproducer_dict(case, result))
    return path


def load_entry(path: Path) -> CorpusEntry:
    """The one entry of a corpus file (a reproducer, or a bare case naming one backend)."""
    entries = load_entries(path)
    if len(entries) != 1:
        raise CorpusError(f"{path}: lists {len(entries)} backends; read it with load_entries")
    return entries[0]


def load_entries(path: Path) -> list[CorpusEntry]:
    """The entries of a corpus file: one for a reproducer or a bare case with ``"backend"``, one per backend
    for a bare case with ``"backends": [...]`` (how corpus/seeds stores a case once for every backend it
    applies to; docs/corpus.md)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CorpusError(f"{path}: expected a JSON object")
    try:
        if data.get("format") == REPRODUCER_FORMAT:
            if data.get("version") != REPRODUCER_VERSION:
                raise CorpusError(f"{path}: reproducer version {data.get('version')!r}, expected {REPRODUCER_VERSION}")
            case_data = data.get("case")
            if not isinstance(case_data, dict):
                raise CorpusError(f"{path}: reproducer has no case object")
            case = Case.from_dict(case_data)
            observed = Result.from_dict(data["observed"]) if isinstance(data.get("observed"), dict) else None
            expect = str(data.get("expect", "pass"))
            if expect not in ("pass", "fail"):
                raise CorpusError(f"{path}: expect must be \"pass\" or \"fail\", got {expect!r}")
            scope = KnownScope.from_dict(data["scope"], f"{path}: scope") if "scope" in data else KnownScope()
            if "scope" in data and expect != "fail":
                raise CorpusError(f"{path}: a scope only applies to an expected failure (\"expect\": \"fail\")")
            return [CorpusEntry(path, case, observed, str(data.get("signature", "")), expect, scope)]
        return [CorpusEntry(path, Case.from_dict(case_data), None, "") for case_data in _per_backend(path, data)]
    except CaseError as exc:
        raise CorpusError(f"{path}: {exc}") from None
    except ScopeError as exc:  # its message already names the file
        raise CorpusError(str(exc)) from None
    except (KeyError, ValueError, TypeError) as exc:
        raise CorpusError(f"{path}: malformed reproducer ({exc})") from None


def _per_backend(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    """A bare case's data once per backend: ``"backends": [names]`` stands for one case per name."""
    if "backends" not in data:
        return [data]
    backends = data["backends"]
    if "backend" in data:
        raise CorpusError(f"{path}: give \"backend\" or \"backends\", not both")
    if (not isinstance(backends, list) or not backends
            or not all(isinstance(name, str) and name for name in backends) or len(set(backends)) != len(backends)):
        raise CorpusError(f"{path}: \"backends\" must be a non-empty list of distinct backend names")
    rest = {key: value for key, value in data.items() if key != "backends"}
    return [{**rest, "backend": name} for name in backends]


def load_corpus(paths: Iterable[Path]) -> list[CorpusEntry]:
    """Every entry of every corpus file under `paths` (files or folders), in a stable order."""
    return [entry for path in iter_case_files(paths) for entry in load_entries(path)]


def iter_case_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Every *.json under the given files and directories, in a stable order."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
        elif path.exists():
            yield path
        else:
            raise CorpusError(f"{path}: no such file or directory")
