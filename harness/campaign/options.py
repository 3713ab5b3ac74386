"""Campaign from options: the one place a campaign is set up from what a command was asked.

fuzz, a parallel shard, gate, selftest and bench all describe their campaign as :class:`CampaignOptions`
and run it with :func:`run_from_options`, which builds the case space, the :class:`CampaignConfig` and, with
``minimize``, the minimizer hook.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.campaign.loop import CampaignConfig, CampaignReport, run_campaign
from hicache_fuzz.harness.engine.feed import EngineOptions
from hicache_fuzz.harness.findings.corpus import load_corpus
from hicache_fuzz.harness.findings.known import KnownMap, known_bugs
from hicache_fuzz.harness.findings.scope import Environment
from hicache_fuzz.harness.generation.space_file import apply_space
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.exit_codes import UsageError
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import Executor
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform

OnResult = Callable[[Case, Result, CampaignReport], None]


@dataclass
class CampaignOptions:
    """What a campaign runs: seed, budgets, shard, case space, where failures go and what is known."""

    seed: int
    max_cases: int | None = None  # all backends together; None = until the time budget
    max_seconds: float | None = None
    corpus: Path | None = None  # failures go here; None keeps them in the report only
    shard: tuple[int, int] = (0, 1)
    start_index: int = 0
    byte_budget: int | None = None  # largest case in bytes; None = the generator's default
    stop_on_first_failure: bool = False
    known_signatures: KnownMap = field(default_factory=dict)  # identity -> known entries (findings/known.py)
    minimize: bool = False  # minimize the first case of each new signature before saving it
    record_case_ids: bool = False
    engine: EngineOptions = field(default_factory=EngineOptions)  # batches, case mix, scale tier ("auto")
    stop_on_new_failure: bool = False  # stop at the first failure no known entry accounts for
    # CaseSpace fields changed by --space / --set, in plain JSON form (see harness/generation/space_file.py)
    space_overrides: dict[str, Any] = field(default_factory=dict)

    def space(self) -> CaseSpace:
        base = CaseSpace() if self.byte_budget is None else CaseSpace(byte_budget=self.byte_budget)
        return apply_space(base, self.space_overrides)

    def config(self, backend_names: list[str], executor: Executor) -> CampaignConfig:
        config = CampaignConfig(list(backend_names), self.seed, self.max_cases, self.max_seconds, self.corpus,
                                self.shard, self.start_index, self.space(), self.stop_on_first_failure,
                                known_signatures=dict(self.known_signatures), engine=self.engine,
                                stop_on_new_failure=self.stop_on_new_failure)
        if self.minimize:
            from hicache_fuzz.harness.campaign.minimize import campaign_minimizer

            config.minimizer = campaign_minimizer(executor)
        return config


def run_from_options(options: CampaignOptions, backends: list[Backend], platform: Platform, executor: Executor,
                     on_result: OnResult | None = None,
                     should_stop: Callable[[], bool] | None = None) -> CampaignReport:
    config = options.config([b.name for b in backends], executor)
    config.should_stop = should_stop
    report = run_campaign(config, backends, platform, executor, on_result, record_case_ids=options.record_case_ids)
    if options.space_overrides:  # case i depends on the space: the report says which, to replay by index
        report.extra["space_overrides"] = dict(options.space_overrides)
    return report


def parse_shard(text: str) -> tuple[int, int]:
    """--shard K/N -> (K, N)."""
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected K/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= k < n):
        raise UsageError(f"--shard {text!r}: need 0 <= K < N")
    return k, n


def load_known_failures(paths: Iterable[Path], environment: Environment) -> KnownMap:
    """The expected-failure entries under `paths` that apply on `environment`, by identity (fuzz --known;
    findings/known.py)."""
    paths = list(paths)
    for path in paths:
        if not os.path.lexists(path):  # anything else there (a FIFO, a symlink loop) is named by the loader
            raise UsageError(f"--known {path}: no such file or folder")
    return known_bugs(load_corpus(paths), environment)
