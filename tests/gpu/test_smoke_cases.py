"""CPU check of the GPU smoke cases (tests/gpu/smoke_cases.py): each is a valid case for a registered sglang
backend, with only tuning knobs that backend declares, so the GPU test's cases
cannot rot where no GPU runs them."""

from __future__ import annotations

from collections import Counter

from hicache_fuzz.harness.model.case import validate
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.registry import load_registry
from tests.gpu.smoke_cases import smoke_cases


def test_every_smoke_case_is_valid_for_a_registered_backend() -> None:
    registry, platform = load_registry(), require("cpu").platform
    cases = smoke_cases()
    for case in cases:
        validate(case)
        menus = dict(registry.get(case.backend).case_space(CaseSpace(), platform).tuning_menus)
        for knob, value in case.tuning:
            assert knob in menus, (case.backend, knob, value)
    assert len({case.case_id for case in cases}) == len(cases)  # distinct: the GPU test ids come from them
    assert set(Counter(case.backend for case in cases)) == {
        "sglang-jit", "sglang-jit-register", "sglang-jit-tma", "sglang-staged", "sglang-page-unified",
        "sglang-pool", "sglang-aot"}
