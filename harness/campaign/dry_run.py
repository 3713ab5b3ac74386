"""A dry run (``fuzz --dry-run``): a campaign's cases generated and predicted on any machine, nothing run.

The campaign loop, feed, mix, index variants, backend schedule and scale tier are the real campaign's
(harness/campaign/loop.py and feed.py); only the executor differs: :class:`PredictingExecutor` gives each case
the outcome the runner would give it before running anything (unsupported, undefined) and, for the cases it
would run, the contract's prediction (a predicted rejection is ``rejected_as_predicted``, an accepted case
``pass`` on the planned path). Nothing is probed, imported from sglang, compiled or allocated, so the report
shows what a campaign on the modelled platform covers (``coverage``, ``coverage_ranges``, ``coverage_values``)
on a laptop, with or without sglang installed.

Time is modelled: the campaign's clock advances :data:`MODELLED_CASES_PER_SECOND` per case and
:data:`MODELLED_SCALE_CASE_SECONDS` per scale-tier case, so a time budget (``--max-total-time 60``) draws about as
many cases as a real campaign of that length on an H200, and the scale tier takes its share of modelled time.
The report's ``seconds`` are modelled seconds; ``dry_run.wall_seconds`` is what the dry run took.

With a :class:`CaseSaver` (``--save-cases DIR``, ``--where LABEL=VALUE``) the cases the dry run predicts would run
(not unsupported or undefined) and whose coverage labels match are written as case files, so the cases of one
feature (a pool class, an io backend) can be generated on a laptop and replayed on a GPU (``hicache-fuzz replay``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.pipeline.executor_base import Executor
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform, Verdict, predict

# A GPU campaign's rate: the H200's default 60-s campaign runs 1,000-1,335 cases/s (docs/engine.md).
MODELLED_CASES_PER_SECOND = 1000.0
# A scale-tier case (production sizes, harness/engine/scale.py) runs about a second on the H200.
MODELLED_SCALE_CASE_SECONDS = 1.0
# The accelerator a dry run models per platform: an H200 (sm90: the TMA backend's cases count) and an MI300.
MODELLED_PLATFORMS = {"cpu": Platform("cpu"), "cuda": Platform("cuda", (9, 0)), "rocm": Platform("rocm", (9, 4))}


# What --save-cases writes at most: a dry run of a long campaign generates millions of cases.
MAX_SAVED_CASES = 10_000


class CaseSaver:
    """Writes the predicted-to-run cases whose labels (the backend's coverage labels, plus ``backend``) equal every
    `where` value (compared as text; booleans as ``true``/``false``) into `folder`, one ``<case_id>.json`` each, up
    to MAX_SAVED_CASES."""

    def __init__(self, folder: Path, where: Mapping[str, str]) -> None:
        self.folder = folder
        self.where = dict(where)
        self.saved = 0
        self.matched = 0
        folder.mkdir(parents=True, exist_ok=True)

    def offer(self, case: Case, backend: Backend, result: Result) -> None:
        if result.outcome in (Outcome.UNSUPPORTED, Outcome.UNDEFINED):
            return
        labels = {"backend": backend.name, **backend.coverage_labels(case)}
        if any(_text(labels.get(key)) != value for key, value in self.where.items()):
            return
        self.matched += 1
        if self.saved < MAX_SAVED_CASES:
            (self.folder / f"{case.case_id}.json").write_text(case.to_json(indent=2) + "\n")
            self.saved += 1


def _text(value: object) -> str | None:
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def predicted_result(case: Case, backend: Backend, platform: Platform) -> Result:
    """What the runner's classification says about `case` before anything runs, the contract's prediction for
    the rest: the result of a campaign in which every implementation behaves as the contract says."""
    result = Result(case.case_id, backend.name, Outcome.UNSUPPORTED)
    reason = backend.unsupported_reason(case, platform)
    if reason is not None:
        result.summary = reason
        return result
    plan = backend.plan(case, platform)
    prediction = predict(case, plan.entry, platform)
    result.expected_path, result.prediction = plan.path, prediction.describe()
    if prediction.verdict is Verdict.UNDEFINED:
        result.outcome, result.summary = Outcome.UNDEFINED, prediction.describe()
    elif prediction.verdict is Verdict.REJECT:
        result.outcome, result.summary = Outcome.REJECTED_AS_PREDICTED, f"predicted rejection ({prediction.describe()})"
    else:
        result.outcome, result.path, result.summary = Outcome.PASS, plan.path, "predicted transfer (not run)"
    return result


class PredictingExecutor(Executor):
    """An executor that predicts instead of running (see the module docstring); its clock is modelled time."""

    # The loop hands scale-tier cases over as the batch's first cases (lone_first): they take their modelled
    # seconds, the others a case's share of the modelled rate.
    runs_lone_cases_aside = True
    runs_batches = True

    def __init__(self, backends: Sequence[Backend], platform: Platform, saver: CaseSaver | None = None) -> None:
        self.backends = {backend.name: backend for backend in backends}
        self.platform = platform
        self.saver = saver
        self.modelled_seconds = 0.0

    def clock(self) -> float:
        return self.modelled_seconds

    def run(self, case: Case) -> Result:
        return self.run_batch([case])[0]

    def run_batch(self, cases: Sequence[Case], lone_first: int = 0) -> list[Result]:
        results = []
        for position, case in enumerate(cases):
            backend = self.backends[case.backend]
            result = predicted_result(case, backend, self.platform)
            if self.saver is not None:
                self.saver.offer(case, backend, result)
            result.seconds = MODELLED_SCALE_CASE_SECONDS if position < lone_first else 1.0 / MODELLED_CASES_PER_SECOND
            self.modelled_seconds += result.seconds
            results.append(result)
        return results

    def close(self) -> None:
        return None
