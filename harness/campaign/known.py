"""Known failures: the corpus entries marked ``"expect": "fail"``, each standing for one bug (the identity
recomputed from its case and observed result, campaign/identity.py) within its scope (campaign/scope.py).

A campaign failure whose identity is known here is counted and listed apart, never saved again and never
failing a run; an entry whose scope excludes this machine expects nothing to fail here.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass

from hicache_fuzz.harness.campaign.corpus import CorpusEntry
from hicache_fuzz.harness.campaign.scope import Environment, KnownScope
from hicache_fuzz.harness.model.platform import Machine


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
            out.append(KnownFailure(entry.bug, str(entry.path), entry.case.backend, entry.scope))
    return out


def known_bugs(entries: Iterable[CorpusEntry], environment: Environment) -> dict[str, str]:
    """What a campaign matches its failures against (CampaignConfig.known_signatures, plain JSON for shards):
    "<identity>" -> file for entries that apply to every backend, "<identity>@<backend>" -> file for entries
    scoped to some backends (campaign/loop.py looks up both)."""
    known: dict[str, str] = {}
    for failure in known_failures(entries, environment):
        for key in ([f"{failure.bug}@{b}" for b in failure.scope.backends] or [failure.bug]):
            known.setdefault(key, failure.file)
    return known


def match_known(known: dict[str, str], bug: str, backend: str) -> str:
    """The file of the known failure `bug` on `backend` stands for, or ""."""
    return known.get(bug) or known.get(f"{bug}@{backend}", "")
