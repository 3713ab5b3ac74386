"""The sglang backends draw every dimension over its whole legal range; only compiled rows come from menus, and each
campaign seed rotates its own sample of those (jit-warm --seed builds exactly that sample)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from hicache_fuzz.harness.engine.campaign_case import backend_space, campaign_case
from hicache_fuzz.harness.generation.buckets import is_power_of_two
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace, rotating_sample
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_jit import GROWTH_ROWS, JIT_ROTATING_ROWS
from hicache_fuzz.kernels.sglang_page_unified import PAGE_UNIFIED_GROWTH_ROWS, PAGE_UNIFIED_ROTATING_ROWS
from hicache_fuzz.kernels.sglang_pool import POOL_ROTATING_ROWS
from hicache_fuzz.kernels.sglang_staged import STAGED_ROTATING_ROWS

H200 = Platform("cuda", (9, 0))
MI300 = Platform("rocm", (9, 4))
SGLANG = ("sglang-jit", "sglang-jit-register", "sglang-jit-tma", "sglang-staged", "sglang-page-unified", "sglang-aot",
          "sglang-pool", "sglang-hicache")
ROTATING = {
    "sglang-jit": (JIT_ROTATING_ROWS, GROWTH_ROWS),
    "sglang-jit-register": (JIT_ROTATING_ROWS, GROWTH_ROWS),
    "sglang-jit-tma": (JIT_ROTATING_ROWS, GROWTH_ROWS),
    "sglang-staged": (STAGED_ROTATING_ROWS, GROWTH_ROWS),
    "sglang-page-unified": (PAGE_UNIFIED_ROTATING_ROWS, PAGE_UNIFIED_GROWTH_ROWS),
    "sglang-pool": (POOL_ROTATING_ROWS, GROWTH_ROWS),
}


@pytest.mark.parametrize("name", SGLANG)
@pytest.mark.parametrize("platform", [H200, MI300], ids=["cuda", "rocm"])
def test_no_range_is_narrowed_that_costs_no_compile(name: str, platform: Platform) -> None:
    """Page sizes, layers, tokens and pool sizes are the reference's ranges on every sglang backend."""
    full = CaseSpace()
    space = backend_space(load_registry().get(name), full, platform, seed=3)
    assert (space.page_sizes, space.max_page_size) == (full.page_sizes, full.max_page_size)
    assert (space.layer_counts, space.max_layers) == (full.layer_counts, full.max_layers)
    assert (space.heads, space.page_counts, space.max_pages, space.max_tokens) == (
        full.heads, full.page_counts, full.max_pages, full.max_tokens)


@pytest.mark.parametrize("name", SGLANG)
def test_drawn_page_sizes_reach_past_128_with_non_powers_of_two(name: str) -> None:
    backend = load_registry().get(name)
    space = backend_space(backend, CaseSpace(), H200, seed=1)
    sizes = {campaign_case(1, index, backend, space, H200).page_size for index in range(600)}
    assert max(sizes) >= 128
    assert len([p for p in sizes if not is_power_of_two(p)]) >= 10
    assert len([p for p in sizes if p > 64 and not is_power_of_two(p)]) >= 3


def test_the_aot_backend_has_no_row_menu() -> None:
    """Its ops are prebuilt: rows come from the whole menu and from geometries, as on the reference."""
    space = backend_space(load_registry().get("sglang-aot"), CaseSpace(), H200, seed=1)
    assert space.row_bytes == CaseSpace().row_bytes and space.head_dims == CaseSpace().head_dims


def test_a_rotating_sample_is_a_pure_function_and_a_handful_of_seeds_covers_the_menu() -> None:
    menu = tuple(range(100, 130))
    assert rotating_sample(menu, None, 8) == menu
    assert rotating_sample(menu, 5, 8) == rotating_sample(menu, 5, 8)
    assert len(set(rotating_sample(menu, 5, 8))) == 8
    assert rotating_sample(menu, 5, 8) != rotating_sample(menu, 6, 8)
    for first in (0, 7, 123456789):
        covered = {row for seed in range(first, first + math.ceil(len(menu) / 8)) for row in
                   rotating_sample(menu, seed, 8)}
        assert covered == set(menu)


@pytest.mark.parametrize("name", sorted(ROTATING))
def test_each_seed_grows_by_its_own_sample_and_a_few_seeds_grow_by_all_of_it(name: str) -> None:
    backend = load_registry().get(name)
    rotating, count = ROTATING[name]
    every = backend_space(backend, CaseSpace(), H200)  # no seed: the whole menu
    assert every.row_bytes_growth == rotating
    grown: set[int] = set()
    for seed in range(11, 11 + math.ceil(len(rotating) / count)):
        space = backend_space(backend, CaseSpace(), H200, seed)
        assert space.row_bytes_growth == rotating_sample(rotating, seed, count)
        assert space.menu_seed == seed and space.grow_every > 0
        grown |= set(space.row_bytes_growth)
    assert grown == set(rotating)


def test_case_i_depends_only_on_seed_index_and_space() -> None:
    backend = load_registry().get("sglang-staged")
    late = 10 * 150 + 3  # past several growth stages
    four, five = (backend_space(backend, CaseSpace(), H200, seed) for seed in (4, 5))
    assert campaign_case(4, late, backend, four, H200) == campaign_case(4, late, backend, four, H200)
    assert campaign_case(4, late, backend, four, H200) != campaign_case(5, late, backend, five, H200)


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_jit_warm_with_a_seed_builds_exactly_what_that_seed_draws(monkeypatch: Any, seed: int | None) -> None:
    from hicache_fuzz.harness.commands import jit_warm
    from hicache_fuzz.kernels import compile_books

    backend = load_registry().get("sglang-staged")
    asked: list[CaseSpace] = []
    monkeypatch.setattr(type(backend), "compile_jobs", lambda self, space, platform: asked.append(space) or [
        lambda: None])
    monkeypatch.setattr(compile_books, "run_jobs", lambda jobs, workers=None: 0.0)
    monkeypatch.setattr("hicache_fuzz.harness.pipeline.setup.available_backend", lambda reg, name, machine: backend)
    args = argparse.Namespace(platform="cpu", backend_plugin=[], backend=["sglang-staged"], jobs=None, seed=seed)
    assert jit_warm.run(args) == 0
    campaign = backend_space(backend, CaseSpace(), Platform("cpu"), seed)
    drawable = {row for index in (0, 10**9) for row in campaign.at_index(index).row_bytes}
    assert set(asked[0].row_bytes) == drawable
    if seed is None:
        assert set(STAGED_ROTATING_ROWS) <= drawable
    else:
        assert not set(STAGED_ROTATING_ROWS) <= drawable
