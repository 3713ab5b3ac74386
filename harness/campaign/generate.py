"""Generate cases: one decision procedure, driven either by a seeded RNG (fast campaigns) or by Hypothesis
(shrinkable property tests, see :mod:`hicache_fuzz.harness.campaign.strategies`).

The procedure draws sizes before contents (geometry, then page count, then index patterns), picks from menus
whose first entry is the simplest (so Hypothesis shrinks toward small, plain cases), and leans toward the
places bugs live: 1/63/64/65/128/129 pages, the last page of a pool, index 0, reversed and duplicate source
pages, non-contiguous or misaligned runs inside a page, transfers straddling 128 KiB, row sizes around each
entry point's rules, int32 indices, CPU vs device indices per side.

A :class:`CaseSpace` bounds what is drawn; backends narrow it to what they implement (``Backend.case_space``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from hicache_fuzz.harness.model.case import (
    LAYOUTS_BY_ATTENTION,
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)
from hicache_fuzz.harness.model.space import CaseSpace

T = TypeVar("T")

class Chooser(Protocol):
    """The source of every decision: a seeded RNG or a Hypothesis draw."""

    def choice(self, options: Sequence[T]) -> T: ...
    def integer(self, low: int, high: int) -> int: ...  # inclusive
    def chance(self, probability: float) -> bool: ...


class RandomChooser:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def chance(self, probability: float) -> bool:
        return self.rng.random() < probability


@dataclass
class _Geometry:
    attention: Attention
    layout: HostLayout
    pools: list[PoolSpec] = field(default_factory=list)


def _pool(chooser: Chooser, space: CaseSpace, attention: Attention, layout: HostLayout, name: str) -> PoolSpec:
    for _ in range(64):
        dtype = chooser.choice(space.dtypes)
        row = chooser.choice(space.row_bytes)
        if row % dtype.itemsize:
            continue
        elements = row // dtype.itemsize
        if attention is Attention.MLA:
            return PoolSpec(name=name, attention=attention, dtype=dtype, heads=1, head_dim=elements)
        heads = chooser.choice([h for h in space.heads if elements % h == 0] or [1])
        head_dim = elements // heads
        groups = 1
        if layout is HostLayout.PAGE_UNIFIED:
            groups = chooser.choice([g for g in (1, 2, 4) if heads % g == 0])
        v_head_dim = None
        if attention is Attention.MHA_ASYM:
            v_head_dim = chooser.choice([d for d in (head_dim // 2, head_dim * 2, head_dim + 8) if d > 0])
        return PoolSpec(name=name, attention=attention, dtype=dtype, heads=heads, head_dim=head_dim,
                        v_head_dim=v_head_dim, head_groups=groups)
    return PoolSpec(name=name, attention=attention, dtype=KVDtype.FP8, heads=1, head_dim=128,
                    v_head_dim=64 if attention is Attention.MHA_ASYM else None)


def _bytes_per_token_layer(pools: Sequence[PoolSpec]) -> int:
    return sum(p.row_bytes(c) for p in pools for c in p.components)


def draw_case(chooser: Chooser, space: CaseSpace) -> Case:
    """One case from `space`, every decision taken through `chooser`."""
    direction = chooser.choice(space.directions)
    scope = chooser.choice(space.scopes)
    attention = chooser.choice(space.attentions)
    layouts = [lay for lay in space.layouts if lay in LAYOUTS_BY_ATTENTION[attention]] or [HostLayout.PAGE_FIRST]
    layout = chooser.choice(layouts)
    pool_count = 1 if space.max_pools <= 1 or not chooser.chance(0.15) else chooser.integer(2, space.max_pools)
    pools = [_pool(chooser, space, attention, layout, "kv")]
    for i in range(1, pool_count):
        side_attention = attention if layout not in LAYOUTS_BY_ATTENTION[Attention.MLA] else chooser.choice(
            [a for a in space.attentions if layout in LAYOUTS_BY_ATTENTION[a]] or [attention])
        side = _pool(chooser, space, side_attention, layout, f"side{i}")
        pools.append(replace(side, write_back_jit=chooser.chance(0.5)))

    page_size = chooser.choice(space.page_sizes)
    layers = chooser.choice(space.layer_counts)
    pages = chooser.choice(space.page_counts) if chooser.chance(0.7) else chooser.integer(0, space.max_pages)
    if space.empty_rate and chooser.chance(space.empty_rate):
        pages = 0
    pages = min(pages, space.max_pages)
    # Fit the byte budget by shrinking the dimensions that matter least for the bug classes first.
    per_token = _bytes_per_token_layer(pools)
    host_slack, device_slack = chooser.integer(0, 3), chooser.integer(1, 3)

    def total(layers: int, page_size: int, pages: int) -> int:
        slots = (pages + host_slack) * page_size + (pages + device_slack) * page_size
        return slots * layers * per_token

    while total(layers, page_size, pages) > space.byte_budget and layers > 1:
        layers = max(1, layers // 2)
    while total(layers, page_size, pages) > space.byte_budget and page_size > 1:
        page_size = max(1, page_size // 2)
    while total(layers, page_size, pages) > space.byte_budget and pages > 1:
        pages = max(1, pages // 2)
    host_pages = max(1, pages + host_slack)
    device_pages = pages + device_slack  # device page 0 is sglang's padding page
    layer = chooser.integer(0, layers - 1) if scope is Scope.ONE_LAYER else 0

    host_pages_chosen = _page_ids(chooser, host_pages, pages, first=0)
    device_pages_chosen = _page_ids(chooser, device_pages, pages, first=1 if not chooser.chance(0.05) else 0)
    # Repeated source pages are legal and deterministic (unlike repeated destinations).
    source_is_device = direction is Direction.WRITE_BACK
    if pages > 1 and chooser.chance(0.1):
        src = device_pages_chosen if source_is_device else host_pages_chosen
        src[chooser.integer(1, pages - 1)] = src[0]
    host_indices = _expand(chooser, host_pages_chosen, page_size, space.irregular_rate, host_pages * page_size)
    device_indices = _expand(chooser, device_pages_chosen, page_size, space.irregular_rate,
                             device_pages * page_size)
    tuning = {name: chooser.choice(menu) for name, menu in space.tuning_menus}
    case = Case(
        direction=direction,
        scope=scope,
        layout=layout,
        pools=tuple(pools),
        layers=layers,
        page_size=page_size,
        device_rows=device_pages * page_size,
        host_slots=host_pages * page_size,
        layer=layer,
        host_indices=tuple(host_indices),
        device_indices=tuple(device_indices),
        host_index=IndexSpec(chooser.choice(space.index_dtypes),
                             chooser.choice(space.host_index_devices or space.index_devices)),
        device_index=IndexSpec(chooser.choice(space.index_dtypes),
                               chooser.choice(space.device_index_devices or space.index_devices)),
        host_allocator=chooser.choice(space.allocators),
        backend=space.backend,
        tuning=make_tuning(tuning),
        seed=chooser.integer(0, 2**31 - 1),
    )
    if chooser.chance(space.invalid_rate):
        case = _inject_violation(chooser, case)
    return case


def _page_ids(chooser: Chooser, available: int, count: int, first: int) -> list[int]:
    """`count` distinct page ids from [first, available), in a biased order."""
    pool = list(range(first, available))
    count = min(count, len(pool))
    pattern = chooser.choice(("shuffled", "ascending", "descending", "ends"))
    if pattern == "ascending":
        start = chooser.integer(0, len(pool) - count)
        return pool[start : start + count]
    if pattern == "descending":
        start = chooser.integer(0, len(pool) - count)
        return list(reversed(pool[start : start + count]))
    picked: list[int] = []
    if pattern == "ends" and count:
        picked = [pool[-1]] + ([pool[0]] if count > 1 and pool[0] != pool[-1] else [])
    rest = [p for p in pool if p not in picked]
    while len(picked) < count:
        picked.append(rest.pop(chooser.integer(0, len(rest) - 1)))
    return picked


def _expand(chooser: Chooser, page_ids: list[int], page_size: int, irregular_rate: float, limit: int) -> list[int]:
    """Token indices of whole pages, sometimes with irregular runs inside a page (still unique, in range)."""
    tokens = [p * page_size + t for p in page_ids for t in range(page_size)]
    if page_size > 1 and page_ids and chooser.chance(irregular_rate):
        page = chooser.integer(0, len(page_ids) - 1)
        base = page * page_size
        kind = chooser.choice(("swap", "shift"))
        if kind == "swap":
            a, b = chooser.integer(0, page_size - 1), chooser.integer(0, page_size - 1)
            tokens[base + a], tokens[base + b] = tokens[base + b], tokens[base + a]
        else:
            # a run starting mid-page: shift the whole page by k tokens when the target rows are free
            k = chooser.integer(1, page_size - 1)
            shifted = [t + k for t in tokens[base : base + page_size]]
            taken = set(tokens) - set(tokens[base : base + page_size])
            if all(0 <= t < limit and t not in taken for t in shifted):
                tokens[base : base + page_size] = shifted
    return tokens


def _inject_violation(chooser: Chooser, case: Case) -> Case:
    """One deliberate contract violation, so rejections get exercised as well as transfers."""
    h, d = list(case.host_indices), list(case.device_indices)
    kind = chooser.choice(("host_oob", "device_oob", "length", "partial_page", "duplicate_dst", "negative"))
    if not h and kind != "length":
        kind = "length"
    if kind == "host_oob":
        h[chooser.integer(0, len(h) - 1)] = case.host_slots + chooser.choice((0, 1, case.page_size))
    elif kind == "device_oob":
        d[chooser.integer(0, len(d) - 1)] = case.device_rows + chooser.choice((0, 1, case.page_size))
    elif kind == "length":
        if h:
            h.pop()
        else:
            h.append(0)
    elif kind == "partial_page":
        h.pop()
        d.pop()
    elif kind == "duplicate_dst":
        dst = h if case.direction is Direction.WRITE_BACK else d
        if len(dst) > 1:
            dst[-1] = dst[0]
    else:
        (h if chooser.chance(0.5) else d)[0] = -1
    return case.replace(host_indices=tuple(h), device_indices=tuple(d))


def case_for_index(seed: int, index: int, space: CaseSpace) -> Case:
    """The `index`-th case of a campaign with `seed`: independent of every other index, so campaigns can be
    sharded and resumed by index range without generating the cases before them."""
    rng = random.Random(f"hicache-fuzz:{seed}:{index}")
    return draw_case(RandomChooser(rng), space.at_index(index))
