"""Hypothesis-driven differential property: every drawn case, on every selected backend, does what the oracle
says (or is refused as the contract predicts). Shrinking works on the generator's decisions.

Settings come from the Hypothesis profile (tests/conftest.py: ``ci`` derandomized, ``nightly`` 10**4
examples). Parametrized on a fixed round number, so collection is the same in every xdist worker and the
rounds spread over the workers (each round is its own Hypothesis test, exploring on its own).
A failing case is saved as a reproducer before the assertion, so it survives even if shrinking is cut short.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache_fuzz.harness.campaign.strategies import cases
from hicache_fuzz.harness.engine.campaign_case import backend_space, campaign_case
from hicache_fuzz.harness.findings.corpus import save_failure
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import Executor

from .conftest import FuzzTarget

ROUNDS = int(os.environ.get("HICACHE_FUZZ_HYPOTHESIS_ROUNDS", "2"))


@pytest.mark.parametrize("round_number", range(ROUNDS))
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_drawn_cases_match_the_oracle(round_number: int, fuzz_target: FuzzTarget, fuzz_executor: Executor,
                                      data: st.DataObject) -> None:
    platform = fuzz_target.machine.platform
    backend = data.draw(st.sampled_from(fuzz_target.backends), label="backend")
    base = CaseSpace() if fuzz_target.byte_budget is None else CaseSpace(byte_budget=fuzz_target.byte_budget)
    space = backend.case_space(base.narrowed(backend=backend.name), platform)
    case = data.draw(cases(space), label="case")
    result = fuzz_executor.run(case)
    if result.outcome.is_failure:
        saved = save_failure(fuzz_target.corpus, case, result)
        pytest.fail(f"{backend.name}: {result.outcome.value}: {result.summary or result.error}\n"
                    f"replay: hicache-fuzz replay {saved}", pytrace=False)


def test_generator_and_campaign_agree_on_backend_spaces(fuzz_target: FuzzTarget) -> None:
    """The seeded campaign draws from the same narrowed space as the property above (a cheap sanity check
    that a backend's case_space accepts the base space it is given)."""
    platform = fuzz_target.machine.platform
    for backend in fuzz_target.backends:
        base = CaseSpace(byte_budget=fuzz_target.byte_budget or 1 << 20)
        case = campaign_case(1, 0, backend, backend_space(backend, base, platform, seed=1), platform)
        assert case.backend == backend.name
