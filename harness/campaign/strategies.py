"""Hypothesis strategies over the one case generator, and Hypothesis-first failure search.

``cases(space)`` runs :func:`hicache_fuzz.harness.generation.generate.draw_case` with a :class:`HypothesisChooser`, so
property tests draw exactly what campaigns draw, and Hypothesis' shrinker works on the decisions: menus
shrink to their first (simplest) entry, integers to their lower bound, chances to "no" (the plain case).
draw_case decides sizes (geometry, page count) before contents (index patterns), so shrinking moves toward
small, plain cases.

Small composable strategies for tests that want one concept: :func:`pool_specs` (a geometry) and
:func:`page_patterns` (an ordering of page ids).

:func:`find_failure` lets Hypothesis search and shrink first; :func:`find_and_minimize` then applies the
domain passes of :mod:`hicache_fuzz.harness.campaign.minimize` keeping the shrunk failure's signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from hicache_fuzz.harness.campaign.minimize import Minimized, RunCase, minimize
from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.generation.generate import draw_case
from hicache_fuzz.harness.model.case import Attention, Case, KVDtype, PoolSpec
from hicache_fuzz.harness.model.space import CaseSpace

T = TypeVar("T")

# Chances are drawn as one integer in [0, CHANCE_STEPS): it shrinks to 0, which means "no".
CHANCE_STEPS = 256


class HypothesisChooser:
    """A generate.Chooser whose every decision is a Hypothesis draw (so it shrinks)."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def choice(self, options: Sequence[T]) -> T:
        drawn: T = self.draw(st.sampled_from(list(options)))
        return drawn

    def integer(self, low: int, high: int) -> int:
        return int(self.draw(st.integers(low, high)))

    def chance(self, probability: float) -> bool:
        return int(self.draw(st.integers(0, CHANCE_STEPS - 1))) >= CHANCE_STEPS - round(probability * CHANCE_STEPS)


@st.composite
def cases(draw: Any, space: CaseSpace | None = None) -> Case:
    """A case from `space` (default CaseSpace()), every decision a shrinkable draw."""
    return draw_case(HypothesisChooser(draw), space or CaseSpace())


@st.composite
def pool_specs(draw: Any, attention: Attention = Attention.MHA, row_bytes: Sequence[int] = (128, 256, 576, 656),
               dtypes: Sequence[KVDtype] = (KVDtype.BF16, KVDtype.FP8)) -> PoolSpec:
    """One pool geometry: a row size from the menu, split into heads for MHA (MLA: one latent row)."""
    dtype = draw(st.sampled_from(list(dtypes)))
    row = draw(st.sampled_from([r for r in row_bytes if r % dtype.itemsize == 0] or [dtype.itemsize * 64]))
    elements = row // dtype.itemsize
    if attention is Attention.MLA:
        return PoolSpec(attention=attention, dtype=dtype, heads=1, head_dim=elements)
    heads = draw(st.sampled_from([h for h in (1, 2, 4, 8) if elements % h == 0]))
    v_head_dim = None
    if attention is Attention.MHA_ASYM:
        v_head_dim = draw(st.sampled_from([d for d in (elements // heads // 2, elements // heads * 2) if d > 0]))
    return PoolSpec(attention=attention, dtype=dtype, heads=heads, head_dim=elements // heads, v_head_dim=v_head_dim)


@st.composite
def page_patterns(draw: Any, available: int, count: int) -> list[int]:
    """`count` distinct page ids from range(available): ascending first (simplest), then descending, shuffled."""
    count = min(count, available)
    kind = draw(st.sampled_from(["ascending", "descending", "shuffled"]))
    if kind == "ascending":
        start = draw(st.integers(0, available - count))
        return list(range(start, start + count))
    if kind == "descending":
        start = draw(st.integers(0, available - count))
        return list(reversed(range(start, start + count)))
    return list(draw(st.permutations(list(range(available))))[:count])


# ---- Hypothesis first, then the domain passes -----------------------------------------------------------

def find_failure(run: RunCase, space: CaseSpace, max_examples: int = 200, target_signature: str | None = None,
                 database: Any = None) -> Case | None:
    """The smallest failing case Hypothesis finds and shrinks (None if none in `max_examples`).

    With `target_signature`, only failures of that signature count, so shrinking cannot drift to another bug.
    """
    def fails(case: Case) -> bool:
        result = run(case)
        if not result.outcome.is_failure:
            return False
        return target_signature is None or signature(result, case) == target_signature

    search = settings(max_examples=max_examples, deadline=None, database=database, derandomize=True,
                      suppress_health_check=list(HealthCheck))
    try:
        return find(cases(space), fails, settings=search)
    except NoSuchExample:
        return None


def find_and_minimize(run: RunCase, space: CaseSpace, max_examples: int = 200, max_runs: int = 300,
                      max_seconds: float = 60.0) -> Minimized | None:
    """Hypothesis search and shrink, then the minimizer's passes with the shrunk failure's signature."""
    shrunk = find_failure(run, space, max_examples)
    if shrunk is None:
        return None
    return minimize(shrunk, run, max_runs=max_runs, max_seconds=max_seconds)
