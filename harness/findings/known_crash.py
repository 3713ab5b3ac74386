"""Known crashes as predicates on cases: which generated cases a known crash reproducer expects to crash.

A corpus entry marked ``"expect": "fail"`` whose observed outcome is a crash gives a predicate: same backend, same
host layout (any, where an index list is empty: a zero-length launch fails before any layout is read), same
emptiness of each index list, and the entry's trigger met (the case conditions its failure needs,
findings/trigger.py). Two users:

* the campaign engine (engine/feed.py, engine/scheduler.py) runs the cases a known crash predicts once, without
  index variants and last in their batch, since a crash can end the worker;
* the known-failure rule (findings/known.py, :func:`known.match_known`) for a crash whose symptom differs from
  the entry's own. A memory fault shows differently with the sizes of the case: one sglang bug ends a
  two-index reproducer with "CUDA error: invalid argument" and a larger case with the worker killed by SIGSEGV,
  and an error's text is part of a crash's identity (findings/identity.py). So a crash inside the trigger of a
  known crash entry is that entry's crash, whatever its symptom, **provided the trigger was derived by running
  relaxed cases** (``hicache-fuzz minimize`` on the failing machine: the entry's ``minimized`` record): only
  then does the trigger say which conditions the crash needs. An entry whose trigger was not derived that way
  (empty, or read from the contract alone) vouches for its own identity only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.trigger import describe as describe_trigger
from hicache_fuzz.harness.findings.trigger import in_trigger
from hicache_fuzz.harness.model.case import Case


@dataclass(frozen=True)
class CrashFeatures:
    """What a known crash reproducer predicts of a case besides its trigger."""

    backend: str
    layout: str
    host_empty: bool
    device_empty: bool

    def describe(self) -> str:
        empty = [side for side, flag in (("host", self.host_empty), ("device", self.device_empty)) if flag]
        where = f"{self.backend} {self.layout}" if self.layout else f"{self.backend}, any layout"
        return where + (f", empty {' and '.join(empty)} indices" if empty else "")


def crash_features(case: Case) -> CrashFeatures:
    """The case's features as a known crash predicts them ("" for the layout where an index list is empty)."""
    host_empty, device_empty = not case.host_indices, not case.device_indices
    layout = "" if host_empty or device_empty else case.layout.value
    return CrashFeatures(case.backend, layout, host_empty, device_empty)


@dataclass(frozen=True)
class KnownCrash:
    """A known crash reproducer as a predicate on cases: its case's features and its trigger (empty: none
    recorded). `derived`: the trigger was derived by running relaxed cases (module docstring); `file`: the
    entry, for reports."""

    features: CrashFeatures
    trigger: tuple[tuple[str, str], ...] = ()
    derived: bool = False
    file: str = ""

    def predicts(self, features: CrashFeatures, case: Case) -> bool:
        """Whether this crash is predicted for `case`, whose crash_features are `features`."""
        return features == self.features and in_trigger(dict(self.trigger), case)

    def describe(self) -> str:
        return self.features.describe() + (f" ({describe_trigger(dict(self.trigger))})" if self.trigger else "")


def trigger_was_run(data: dict[str, Any]) -> bool:
    """Whether a reproducer's trigger was derived by running relaxed cases: it was minimized with its trigger."""
    return "trigger" in data and isinstance(data.get("minimized"), dict)


def known_crashes(files: Iterable[str]) -> set[KnownCrash]:
    """The predicates of the known crash reproducers among `files` (plain JSON; unreadable ones are skipped)."""
    found = set()
    for file in files:
        try:
            data = json.loads(Path(file).read_text())
            if data.get("observed", {}).get("outcome") == "crash":
                trigger = data.get("trigger") or {}
                found.add(KnownCrash(crash_features(Case.from_dict(data["case"])),
                                     tuple(sorted((str(k), str(v)) for k, v in trigger.items())),
                                     trigger_was_run(data), str(file)))
        except Exception:  # a known-failure file that does not parse predicts nothing
            continue
    return found


@lru_cache(maxsize=16)
def _known_crashes_of(files: tuple[tuple[str, int], ...]) -> frozenset[KnownCrash]:
    return frozenset(known_crashes(file for file, _ in files))


def _modified_ns(file: str) -> int:
    try:
        return os.stat(file).st_mtime_ns
    except OSError:
        return 0


def crash_inside_derived_trigger(files: Collection[str], case: Case) -> str:
    """The file of a known crash entry among `files` with a run-derived trigger that predicts `case`, or ""
    (the rule for a crash whose symptom differs from the entry's: module docstring). The entries are read again
    only when a file changed (a minimizer rewriting its trigger in place)."""
    features = crash_features(case)
    stamped = tuple(sorted((file, _modified_ns(file)) for file in files))
    for crash in sorted(_known_crashes_of(stamped), key=lambda c: c.file):
        if crash.derived and crash.predicts(features, case):
            return crash.file
    return ""


def predicted_crash(case: Case, known: Collection[KnownCrash]) -> bool:
    """Whether some known crash reproducer predicts that `case` may crash its worker."""
    features = crash_features(case)  # once per case: the feed asks for every case it generates
    return any(crash.predicts(features, case) for crash in known)
