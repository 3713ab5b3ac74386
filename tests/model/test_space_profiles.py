"""CaseSpace.profiles: a share of the indices draws from a narrowed copy of the space (harness/model/space.py)."""

from __future__ import annotations

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import HostLayout
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace, SpaceProfile
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache_settings import MXFP8_CLASS, case_settings

WIDE = SpaceProfile("wide-pages", per_mille=100, changes=(("layouts", (HostLayout.PAGE_FIRST,)), ("page_sizes", (7,))),
                    tuning=(("knob", ("b",)),))


def test_a_space_without_profiles_draws_every_index_from_itself() -> None:
    space = CaseSpace(tuning_menus=(("knob", ("a",)),))
    assert all(space.profile_at(i) is None for i in range(500))
    assert all(space.at_index(i) == space for i in range(50))


def test_a_profile_owns_its_share_of_indices_by_index_alone() -> None:
    space = CaseSpace(tuning_menus=(("knob", ("a",)), ("other", (1, 2))), profiles=(WIDE,))
    chosen = [i for i in range(10_000) if space.profile_at(i) is WIDE]
    assert 800 <= len(chosen) <= 1200  # 100 per mille
    assert chosen == [i for i in range(10_000) if space.narrowed(max_layers=9).profile_at(i) is WIDE]
    other_seed = [i for i in range(10_000) if space.narrowed(menu_seed=7).profile_at(i) is WIDE]
    assert 800 <= len(other_seed) <= 1200 and other_seed != chosen  # the campaign seed picks them too


def test_a_profiled_index_draws_from_the_narrowed_space_with_its_knobs_replaced() -> None:
    space = CaseSpace(tuning_menus=(("knob", ("a",)), ("other", (1, 2))), profiles=(WIDE,))
    index = next(i for i in range(1000) if space.profile_at(i) is WIDE)
    narrowed = space.at_index(index)
    assert narrowed.layouts == (HostLayout.PAGE_FIRST,) and narrowed.page_sizes == (7,)
    assert narrowed.max_page_size == 0 and not narrowed.schedule and narrowed.profiles == ()
    assert dict(narrowed.tuning_menus) == {"knob": ("b",), "other": (1, 2)}
    case = case_for_index(5, index, space)
    assert case.layout is HostLayout.PAGE_FIRST and case.tuning_value("knob") == "b"
    other = next(i for i in range(1000) if space.profile_at(i) is None)
    assert case_for_index(5, other, space).tuning_value("knob") == "a"


def test_profiles_take_consecutive_slots_in_their_order() -> None:
    first, second = SpaceProfile("first", 600), SpaceProfile("second", 600)
    space = CaseSpace(profiles=(first, second))
    assert {space.profile_at(i) for i in range(2000)} == {first, second}
    assert sum(space.profile_at(i) is first for i in range(5000)) > sum(space.profile_at(i) is second
                                                                         for i in range(5000))


def test_the_mxfp8_profile_makes_the_mxfp8_pool_a_drawn_class() -> None:
    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), Platform("cuda", (9, 0)))
    classes = [case_settings(case_for_index(1, i, space))[0] for i in range(3000)]
    assert classes.count(MXFP8_CLASS) >= 10


def test_each_pool_kind_profile_mostly_resolves_to_its_class() -> None:
    """The per-kind profiles of sglang-hicache (profiles()): most of a profile's indices draw a shape its class stores;
    the layer-shard profiles', a layer-sharded MLA case or a layer-sharded DSA indexer, the side-group profile's a
    group with side pools (each half the share of a kind's)."""
    from hicache_fuzz.kernels.sglang_hicache_settings import (
        CLASS_OF_KIND,
        DSA_CLASS,
        DSA_SHARD_PROFILE,
        LAYER_SHARD_PROFILE,
        SIDE_GROUPS_PROFILE,
        layer_shard,
        profiles,
        side_pools,
    )

    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), Platform("cuda", (9, 0)))
    assert {p.name for p in profiles(None)} == {*CLASS_OF_KIND, LAYER_SHARD_PROFILE.name, DSA_SHARD_PROFILE.name,
                                                 SIDE_GROUPS_PROFILE.name}
    assert space.profiles == profiles(None)
    hits: dict[str, list[bool]] = {p.name: [] for p in space.profiles}
    for index in range(4000):
        profile = space.profile_at(index)
        if profile is None:
            continue
        case = case_for_index(2, index, space)
        if profile is LAYER_SHARD_PROFILE:
            hits[profile.name].append(layer_shard(case) is not None)
        elif profile is DSA_SHARD_PROFILE:
            hits[profile.name].append(layer_shard(case) is not None and case_settings(case)[0] == DSA_CLASS)
        elif profile is SIDE_GROUPS_PROFILE:
            hits[profile.name].append(bool(side_pools(case)))
        else:
            hits[profile.name].append(case_settings(case)[0] == CLASS_OF_KIND[profile.name])
    for name, resolved in hits.items():
        least = 50 if name in (LAYER_SHARD_PROFILE.name, DSA_SHARD_PROFILE.name, SIDE_GROUPS_PROFILE.name) else 100
        assert len(resolved) >= least and sum(resolved) >= len(resolved) * 0.4, name


def test_each_campaign_seed_draws_request_schedules_of_its_own() -> None:
    """The HiSparse profile's ``requests`` values cost no compile, so they are no fixed menu: the space of campaign
    seed s draws from seed s's schedules, the same ones every time, and two seeds share few of them."""
    from hicache_fuzz.kernels.sglang_hicache_settings import HISPARSE, request_schedule_menu
    from hicache_fuzz.oracles import sequence

    backend = load_registry().get("sglang-hicache")

    def hisparse_menu(seed: int) -> tuple[str, ...]:
        space = backend.case_space(CaseSpace(menu_seed=seed), Platform("cuda", (9, 0)))
        profile = next(p for p in space.profiles if p.name == HISPARSE)
        return dict(profile.tuning)[sequence.REQUESTS_KEY]  # type: ignore[return-value]

    one, two = hisparse_menu(1), hisparse_menu(2)
    assert one == hisparse_menu(1) == request_schedule_menu(1)
    scheduled_one, scheduled_two = {v for v in one if v}, {v for v in two if v}
    assert len(scheduled_one) > 200 and len(scheduled_one & scheduled_two) < 5
