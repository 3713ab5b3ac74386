"""Known failures: the corpus entries marked ``"expect": "fail"``, each standing for one bug (the identity
recomputed from its case and observed result, findings/identity.py) within its scope: where it applies
(machine, sglang version, backends: findings/scope.py) and what triggers it (the case conditions its
reproducer needs: findings/trigger.py).

A campaign failure is known when an entry in scope here has its identity AND its case meets that entry's
trigger; it is then counted and listed apart, never saved again and never failing a run. The same identity
on a case outside every such trigger is a new failure. One widening, for crashes only: a crash whose case
meets the run-derived trigger of a known crash entry is that entry's crash whatever its symptom (a memory
fault shows differently with the sizes: findings/known_crash.py). This is the one rule; ``fuzz --known`` and
the gate both match through :func:`match_known`. An entry whose scope excludes this machine expects nothing to fail
here.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.corpus import CorpusEntry
from hicache_fuzz.harness.findings.known_crash import crash_inside_derived_trigger
from hicache_fuzz.harness.findings.scope import Environment, KnownScope
from hicache_fuzz.harness.findings.trigger import (
    derive_trigger,
    describe,
    in_trigger,
    outside_trigger,
    predicted_by_contract,
)
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform

# What a campaign matches its failures against (CampaignConfig.known_signatures; plain JSON, so it travels to
# shards): "<identity>" (entries for every backend) or "<identity>@<backend>" (entries scoped to some
# backends) -> the entries with that identity, each {"file": path, "trigger": {feature: value}}. A bare file
# path in place of the list stands for one entry without a trigger.
KnownMap = dict[str, Any]


def detect_environment(machine: Machine) -> Environment:
    """This machine as scopes see it: platform kind, GPU architecture, installed sglang version."""
    return Environment(machine.platform.kind, machine_arch(machine), installed_sglang_version())


def machine_arch(machine: Machine) -> str:
    """"sm90" on CUDA, the gfx name ("gfx942") on ROCm, "" on the CPU."""
    platform = machine.platform
    if platform.kind == "cpu":
        return ""
    if platform.kind == "rocm":
        import torch

        name = str(getattr(torch.cuda.get_device_properties(machine.device), "gcnArchName", ""))
        return name.split(":")[0]
    major, minor = platform.compute_capability or (0, 0)
    return f"sm{major}{minor}"


def installed_sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class KnownFailure:
    bug: str  # the identity the entry's recorded failure has today
    file: str
    backend: str
    scope: KnownScope
    trigger: dict[str, str] = field(default_factory=dict)


def entry_applies(entry: CorpusEntry, environment: Environment, backend: str | None = None) -> bool:
    """True if `entry` is an expected failure here: marked "fail" and in scope for this machine and for
    `backend` (the entry's own backend by default)."""
    return entry.expect == "fail" and entry.scope.applies(environment, backend or entry.case.backend)


def known_failures(entries: Iterable[CorpusEntry], environment: Environment) -> list[KnownFailure]:
    """The expected failures of `entries` that apply on this machine (for some backend)."""
    out = []
    for entry in entries:
        if entry.expect != "fail" or not entry.bug:
            continue
        if entry.scope.applies(environment, entry.scope.backends[0] if entry.scope.backends else entry.case.backend):
            out.append(KnownFailure(entry.bug, str(entry.path), entry.case.backend, entry.scope, entry.trigger))
    return out


def known_bugs(entries: Iterable[CorpusEntry], environment: Environment) -> KnownMap:
    """The KnownMap of the expected failures of `entries` that apply on this machine."""
    known: KnownMap = {}
    for failure in known_failures(entries, environment):
        record = {"file": failure.file, "trigger": dict(failure.trigger)}
        for key in ([f"{failure.bug}@{b}" for b in failure.scope.backends] or [failure.bug]):
            if record not in known.setdefault(key, []):
                known[key].append(record)
    return known


def known_records(known: KnownMap, bug: str, backend: str) -> list[dict[str, Any]]:
    """Every known entry with identity `bug` that applies to `backend` ({"file", "trigger"}), whatever the case."""
    out = []
    for key in (bug, f"{bug}@{backend}"):
        value = known.get(key)
        if isinstance(value, str):
            out.append({"file": value, "trigger": {}})
        elif isinstance(value, list):
            out.extend(value)
    return out


def known_files(known: KnownMap) -> list[str]:
    """The files of every entry of `known`."""
    return sorted({record["file"] for key in known for record in known_records(known, key, "")})


def known_trigger(known: KnownMap, bug: str, backend: str, file: str) -> dict[str, str]:
    """The trigger of the known entry `file` that accounted for a failure `bug` on `backend` (for reports)."""
    for record in known_records(known, bug, backend):
        if record["file"] == file:
            return dict(record["trigger"])
    return {}


def outside_triggers(known: KnownMap, bug: str, backend: str, case: Case) -> dict[str, dict[str, str]]:
    """For a new failure `bug` of `case`: each known entry with its identity -> the conditions of its trigger
    the case does not meet, with the case's own values (empty when no entry has the identity). What a report
    shows so that a reader sees why a known identity was called new."""
    return {str(record["file"]): outside_trigger(record["trigger"], case)
            for record in known_records(known, bug, backend)}


def match_known(known: KnownMap, bug: str, backend: str, case: Case, outcome: Outcome | None = None) -> str:
    """The file of the known entry that accounts for the failure `bug` of `case` on `backend`: same identity
    and a trigger the case meets; for a crash (`outcome`), also a known crash entry whose run-derived trigger
    the case meets, whatever the symptom (findings/known_crash.py); "" when none does (the failure is new)."""
    for record in known_records(known, bug, backend):
        if in_trigger(record["trigger"], case):
            return str(record["file"])
    if outcome is Outcome.CRASH:
        return crash_inside_derived_trigger(known_files(known), case)
    return ""



def recorded_trigger(entry: CorpusEntry, backend: Backend, platform: Platform) -> dict[str, str]:
    """The trigger of an expected failure (findings/trigger.py). One that a minimizer derived by running the case
    on the failing machine (``hicache-fuzz minimize``) is kept, once checked against the case. Otherwise, as the
    case cannot be run here: its non-plain features, less those the contract shows the failure does not need
    (for an identity the contract decides)."""
    if entry.observed is None or not entry.observed.outcome.is_failure:
        raise ValueError(f"{entry.path}: records no failure to derive a trigger from")
    if entry.trigger_run:
        if not in_trigger(entry.trigger, entry.case):
            raise ValueError(f"{entry.path}: its trigger ({describe(entry.trigger)}) is not met by its own case "
                             f"(it has {describe(outside_trigger(entry.trigger, entry.case))})")
        return dict(entry.trigger)
    return derive_trigger(entry.case, predicted_by_contract(backend, platform, entry.case, entry.observed))


def write_trigger(path: Path, trigger: dict[str, str]) -> None:
    """Store `trigger` in the reproducer file at `path`, keeping the file's indentation."""
    text = path.read_text()
    second = text.splitlines()[1] if text.count("\n") > 1 else ""
    indent = max(1, len(second) - len(second.lstrip(" ")))
    data = json.loads(text)
    data["trigger"] = dict(sorted(trigger.items()))
    path.write_text(json.dumps(data, indent=indent, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.findings.known FILE...``: record the trigger of each expected-failure
    reproducer from its case (recorded_trigger; the platform its failure was seen on: CUDA sm90 unless
    ``--platform rocm``)."""
    import argparse

    from hicache_fuzz.harness.findings.corpus import load_entry
    from hicache_fuzz.kernels.registry import load_registry

    parser = argparse.ArgumentParser(prog="python -m hicache_fuzz.harness.findings.known")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--platform", choices=["cuda", "rocm"], default="cuda")
    args = parser.parse_args(argv)
    platform = Platform("cuda", (9, 0)) if args.platform == "cuda" else Platform("rocm")
    registry = load_registry()
    for path in args.files:
        entry = load_entry(path)
        trigger = recorded_trigger(entry, registry.get(entry.case.backend), platform)
        write_trigger(path, trigger)
        print(f"{path}: trigger {describe(trigger)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
