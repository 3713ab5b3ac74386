"""Generate cases: one decision procedure, driven either by a seeded RNG (fast campaigns) or by Hypothesis
(shrinkable property tests, see :mod:`hicache_fuzz.harness.campaign.strategies`).

The procedure draws the case's byte budget and sizes before rows and contents (page size, layers, pages, then
pools, then index patterns), picks from menus whose first entry is the simplest (so Hypothesis shrinks toward
small, plain cases), and leans toward the places bugs live: page size 1 and non-powers of two, 63/64/65 and
128/129 pages, 61/126 layers, more than 8 heads, transfers just past 65,536 tokens, pools of 2^k rows with
indices at 2^k - 1, 2^k, 2^k + 1, the last page of a pool, index 0, reversed and duplicate source pages,
non-contiguous or misaligned runs inside a page, valid partial last pages, row sizes around each entry point's
rules, int32 indices, CPU vs device indices per side, indices exactly at a side's bound.

Each numeric dimension is drawn inside a bucket (:mod:`hicache_fuzz.harness.generation.buckets`); in campaigns
the buckets come from the pairwise schedule (:mod:`hicache_fuzz.harness.generation.pairwise`), so combinations
are reached early. A :class:`CaseSpace` bounds what is drawn; backends narrow it to what they implement
(``Backend.case_space``); docs/generation.md describes all of it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from enum import Enum
from typing import Protocol, TypeVar

from hicache_fuzz.harness.generation.buckets import (
    HEAD_BUCKETS,
    LAYER_BUCKETS,
    OPEN,
    PAGE_SIZE_BUCKETS,
    PAGES_BUCKETS,
    ROW_BUCKETS,
    Bucket,
    bucket_named,
    label_of,
    labels_of_menu,
    menu_in_bucket,
)
from hicache_fuzz.harness.generation.pairwise import pins_for_index
from hicache_fuzz.harness.model.case import (
    LAYOUTS_BY_ATTENTION,
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)
from hicache_fuzz.harness.model.space import HEAD_GROUPS_MENU, CaseSpace
from hicache_fuzz.oracles.contract import boundary_indices

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


def _in_bucket(chooser: Chooser, buckets: tuple[Bucket, ...], label: str, menu: tuple[int, ...], limit: int,
               range_chance: float = 0.3) -> int:
    """A value of bucket `label`: a menu value in it, or (range_chance, when `limit` > 0) a uniform draw from the
    bucket's range up to `limit`; falls back to the whole menu if the bucket holds nothing."""
    bucket = bucket_named(buckets, label)
    in_menu = menu_in_bucket(buckets, label, menu)
    high = min(bucket.high, limit)
    if limit > 0 and high >= bucket.low and (not in_menu or chooser.chance(range_chance)):
        for _ in range(8):
            value = chooser.integer(bucket.low, high)
            if bucket.accepts(value):
                return value
    return chooser.choice(in_menu or list(menu))


def _pick(chooser: Chooser, pins: Mapping[str, str], name: str, values: Sequence[str]) -> str:
    pinned = pins.get(name)
    return pinned if pinned is not None and pinned in values else chooser.choice(values)


E = TypeVar("E", bound=Enum)


def _pick_member(chooser: Chooser, pins: Mapping[str, str], name: str, members: Sequence[E]) -> E:
    """The pinned member of `members` (str enums equal their values), or a draw from them."""
    pinned = pins.get(name)
    if pinned is not None and pinned in members:
        return members[list(members).index(pinned)]  # type: ignore[arg-type]
    return chooser.choice(members)


def _heads_for(chooser: Chooser, space: CaseSpace, elements: int, heads_label: str | None) -> int:
    """A head count dividing `elements`, in bucket `heads_label` when one does."""
    divisors = [h for h in space.heads if elements % h == 0]
    if heads_label is not None:
        wanted = bucket_named(HEAD_BUCKETS, heads_label)
        fitting = [h for h in divisors if wanted.contains(h)]
        if fitting:
            return chooser.choice(fitting)
    return chooser.choice(divisors or [1])


def _pool(chooser: Chooser, space: CaseSpace, attention: Attention, layout: HostLayout, name: str,
          pins: Mapping[str, str], row_cap: int) -> PoolSpec:
    """One pool: from the row menu (rows around every entry point's rule) or, when the space has head dims,
    from a geometry (heads x head_dim x itemsize, as real models have). The first attempts keep the pinned
    dtype, row band and head bucket and rows of at most `row_cap` bytes (so the case's budget holds the drawn
    sizes); the next ones keep only the cap, the last ones nothing."""
    row_label, heads_label = pins.get("row"), pins.get("heads")
    pinned_dtype = next((d for d in space.dtypes if d.value == pins.get("dtype")), None)
    # No row of the pinned band fits under the cap: skip the attempts that keep both.
    first = 12 if row_label is not None and bucket_named(ROW_BUCKETS, row_label).low > row_cap else 0
    for attempt in range(first, 36):
        strict = attempt < 12  # the pinned buckets and the row cap
        capped = attempt < 24  # the row cap only
        dtype = pinned_dtype if strict and pinned_dtype is not None else chooser.choice(space.dtypes)
        heads_wanted = heads_label if strict else None
        if space.head_dims and chooser.chance(0.5):
            head_dim = chooser.choice(space.head_dims)
            if attention is Attention.MLA:
                heads = 1
            else:
                label = heads_wanted or chooser.choice(labels_of_menu(HEAD_BUCKETS, space.heads))
                heads = _in_bucket(chooser, HEAD_BUCKETS, label, space.heads, 128)
            row = heads * head_dim * dtype.itemsize
            if (capped and row > row_cap) or (
                    strict and row_label is not None and label_of(ROW_BUCKETS, row) != row_label):
                continue
            elements = heads * head_dim
        else:
            rows: Sequence[int] = space.row_bytes
            if strict and row_label is not None:
                rows = menu_in_bucket(ROW_BUCKETS, row_label, space.row_bytes) or rows
            row = chooser.choice(rows)
            if row % dtype.itemsize or (capped and row > row_cap):
                continue
            elements = row // dtype.itemsize
            heads = 1 if attention is Attention.MLA else _heads_for(chooser, space, elements, heads_wanted)
            head_dim = elements // heads
        if attention is Attention.MLA:
            return PoolSpec(name=name, attention=attention, dtype=dtype, heads=1, head_dim=elements)
        groups = 1
        if layout is HostLayout.PAGE_UNIFIED:
            groups = chooser.choice([g for g in HEAD_GROUPS_MENU if heads % g == 0])
        v_head_dim = None
        if attention is Attention.MHA_ASYM:
            v_head_dim = chooser.choice([d for d in (head_dim // 2, head_dim * 2, head_dim + 8) if d > 0])
        return PoolSpec(name=name, attention=attention, dtype=dtype, heads=heads, head_dim=head_dim,
                        v_head_dim=v_head_dim, head_groups=groups)
    return PoolSpec(name=name, attention=attention, dtype=KVDtype.FP8, heads=1, head_dim=128,
                    v_head_dim=64 if attention is Attention.MHA_ASYM else None)


def _bytes_per_token_layer(pools: Sequence[PoolSpec]) -> int:
    return sum(p.row_bytes(c) for p in pools for c in p.components)


def _pages_in_bucket(chooser: Chooser, space: CaseSpace, label: str, page_size: int, affordable_tokens: int) -> int:
    """A page count in bucket `label`; the open bucket is log-uniform up to what the budget affords over the
    narrowest rows (at most max_tokens), and a third of its draws land on the 65,536-token edge (65,535 /
    65,536 / 65,537 tokens, the CUDA grid limit) when the budget affords it."""
    cap = max(1, min(space.max_pages, space.max_tokens // page_size))
    bucket = bucket_named(PAGES_BUCKETS, label)
    if bucket.high < OPEN:
        return min(cap, _in_bucket(chooser, PAGES_BUCKETS, label, space.page_counts, space.max_pages, 0.3))
    if cap < bucket.low:
        return cap
    if chooser.chance(0.33) and affordable_tokens >= 1 << 16:
        tokens = (1 << 16) + chooser.choice((-1, 0, 1))
        return min(cap, max(bucket.low, -(-tokens // page_size)))
    return _log_uniform(chooser, bucket.low, max(bucket.low, min(cap, affordable_tokens // page_size)))


def _log_uniform(chooser: Chooser, low: int, high: int) -> int:
    """An integer in [low, high] whose bit length is uniform (every power-of-two band equally likely)."""
    low, high = max(1, low), max(1, low, high)
    bits = chooser.integer(low.bit_length(), high.bit_length())
    return max(low, min(high, chooser.integer(1 << (bits - 1), (1 << bits) - 1)))


def _case_budget(chooser: Chooser, space: CaseSpace) -> tuple[int, bool]:
    """The byte budget of one case, from the space's size distribution (see CaseSpace), and whether it is
    from the tail."""
    small = min(space.small_budget, space.byte_budget)
    if space.tail_rate and space.tail_factor > 1 and chooser.chance(space.tail_rate):
        return _log_uniform(chooser, space.byte_budget, space.byte_budget * space.tail_factor), True
    if small < space.byte_budget and not chooser.chance(space.small_rate):
        return _log_uniform(chooser, small, space.byte_budget), False
    return _log_uniform(chooser, min(small, 4 << 10), small), False


def draw_case(chooser: Chooser, space: CaseSpace, pins: Mapping[str, str] | None = None) -> Case:
    """One case from `space`, every decision taken through `chooser`; `pins` (schedule dimension -> bucket,
    see :mod:`hicache_fuzz.harness.generation.pairwise`) fix the buckets the schedule asks for, the rest is drawn.
    The steps below draw in a fixed order: the same chooser answers give the same case."""
    pins = pins or {}
    direction, scope, layout, attention = _draw_kind(chooser, space, pins)
    pool_count = _draw_pool_count(chooser, space, pins)
    budget, tail, page_size, layers, pages, long_transfer = _draw_sizes(chooser, space, pins, attention, pool_count)
    pools = _draw_pools(chooser, space, pins, attention, layout, pool_count, budget, (page_size, layers, pages),
                        long_transfer)
    layers, page_size, pages, host_pages, device_pages = _fit_budget(chooser, space, pools, budget, tail,
                                                                     (page_size, layers, pages))
    layer = chooser.integer(0, layers - 1) if scope is Scope.ONE_LAYER else 0
    host_indices, device_indices = _draw_indices(chooser, space, direction, pages, page_size, host_pages,
                                                 device_pages)
    if "index_dtypes" in pins:
        host_text, _, device_text = pins["index_dtypes"].partition("/")
        host_dtype, device_dtype = IndexDtype(host_text), IndexDtype(device_text)
    else:
        host_dtype, device_dtype = chooser.choice(space.index_dtypes), chooser.choice(space.index_dtypes)
    # placement menus with repeats are weights: drawn from the menu as it is
    host_device = _pick_member(chooser, pins, "host_index_device", space.host_index_devices or space.index_devices)
    device_device = _pick_member(chooser, pins, "device_index_device",
                                 space.device_index_devices or space.index_devices)
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
        host_index=IndexSpec(host_dtype, host_device),
        device_index=IndexSpec(device_dtype, device_device),
        host_allocator=_pick_member(chooser, pins, "allocator", space.allocators),
        backend=space.backend,
        tuning=make_tuning(tuning),
        seed=chooser.integer(0, 2**31 - 1),
    )
    if chooser.chance(space.invalid_rate):
        case = _inject_violation(chooser, case)
    return case


def _draw_kind(chooser: Chooser, space: CaseSpace,
               pins: Mapping[str, str]) -> tuple[Direction, Scope, HostLayout, Attention]:
    """Direction, scope, host layout and attention kind (a layout no attention kind of the space has moves)."""
    dls = pins.get("dls")
    if dls is not None:
        d, lay, s = dls.split("/")
        direction, layout, scope = Direction(d), HostLayout(lay), Scope(s)
    else:
        direction, scope = chooser.choice(space.directions), chooser.choice(space.scopes)
        layout = chooser.choice(space.layouts)
    attentions = [a for a in space.attentions if layout in LAYOUTS_BY_ATTENTION[a]]
    if attentions:
        attention = _pick_member(chooser, pins, "attention", attentions)
    else:  # no attention kind of the space has this layout: keep the attention, move the layout
        attention = chooser.choice(space.attentions)
        layout = chooser.choice([lay for lay in space.layouts if lay in LAYOUTS_BY_ATTENTION[attention]]
                                or [HostLayout.PAGE_FIRST])
    return direction, scope, layout, attention


def _draw_pool_count(chooser: Chooser, space: CaseSpace, pins: Mapping[str, str]) -> int:
    if pins.get("pools") is not None:
        pool_count = 1 if pins["pools"] == "1" else chooser.integer(2, max(2, space.max_pools))
    else:
        pool_count = 1 if space.max_pools <= 1 or not chooser.chance(0.15) else chooser.integer(2, space.max_pools)
    return min(pool_count, max(1, space.max_pools))


def _draw_sizes(chooser: Chooser, space: CaseSpace, pins: Mapping[str, str], attention: Attention,
                pool_count: int) -> tuple[int, bool, int, int, int, bool]:
    """The case's byte budget (and whether it is a tail case), page size, layers, pages and whether it is a
    long transfer (past the 65,535-token grid limit)."""
    budget, tail = _case_budget(chooser, space)
    page_label = _pick(chooser, pins, "page_size", labels_of_menu(PAGE_SIZE_BUCKETS, space.page_sizes))
    page_size = _in_bucket(chooser, PAGE_SIZE_BUCKETS, page_label, space.page_sizes, space.max_page_size)
    layer_label = _pick(chooser, pins, "layers", labels_of_menu(LAYER_BUCKETS, space.layer_counts))
    layers = _in_bucket(chooser, LAYER_BUCKETS, layer_label, space.layer_counts, space.max_layers)
    pages_menu = tuple(p for p in space.page_counts if p <= space.max_pages) or (1,)
    page_labels = labels_of_menu(PAGES_BUCKETS, pages_menu + ((130,) if space.max_pages >= 130 else ()))
    # In an honour_rate share of the cases the schedule's buckets raise the budget (up to byte_budget / 4) to what
    # their smallest values need, so the scheduled combination survives; otherwise (and beyond that) the
    # fit below breaks buckets, keeping the case small.
    pinned_pages = bucket_named(PAGES_BUCKETS, pins["pages"]).low if "pages" in pins else 1
    pinned_row = bucket_named(ROW_BUCKETS, pins["row"]).low if "row" in pins else 8
    components = 1 if attention is Attention.MLA else 2
    needed = 2 * (pinned_pages + 1) * page_size * layers * max(8, pinned_row) * components
    if chooser.chance(space.honour_rate):
        budget = max(budget, min(space.byte_budget // 4, 2 * needed))
    affordable_tokens = budget // (2 * 8 * layers)  # two sides of 8-byte rows: the cheapest a token gets
    pages = _pages_in_bucket(chooser, space, _pick(chooser, pins, "pages", page_labels), page_size,
                             affordable_tokens)
    long_transfer = space.long_rate > 0 and space.max_tokens > 1 << 16 and chooser.chance(space.long_rate)
    if long_transfer:
        # Past the 65,535-token grid limit, over narrow rows and few layers: the budget rises to what that
        # costs (up to the tail budget) instead of the fit cutting the transfer.
        pages = -(-((1 << 16) + chooser.choice((-1, 0, 1, page_size))) // page_size)
        layers = min(layers, chooser.choice((1, 2)))
        budget = max(budget, min(space.byte_budget * max(1, space.tail_factor),
                                 2 * (pages + 4) * page_size * layers * 16 * pool_count))
    if space.empty_rate and chooser.chance(space.empty_rate):
        pages = 0
    pages = min(pages, space.max_pages)

    return budget, tail, page_size, layers, pages, long_transfer


def _draw_pools(chooser: Chooser, space: CaseSpace, pins: Mapping[str, str], attention: Attention,
                layout: HostLayout, pool_count: int, budget: int, geometry: tuple[int, int, int],
                long_transfer: bool) -> list[PoolSpec]:
    page_size, layers, pages = geometry
    # Sizes before rows: either the rows fit the drawn sizes (long transfers over narrow rows, many layers),
    # or the sizes give way to the drawn rows in the budget fit below; which one varies from case to case.
    slots_per_layer = 2 * (pages + 3) * page_size * layers * (1 if attention is Attention.MLA else 2) * pool_count
    sizes_first = long_transfer or chooser.chance(0.5)
    row_cap = max(8, budget // max(1, slots_per_layer)) if sizes_first else max(64, budget // 64)
    pools = [_pool(chooser, space, attention, layout, "kv", pins, row_cap)]
    for i in range(1, pool_count):
        side_attention = attention if layout not in LAYOUTS_BY_ATTENTION[Attention.MLA] else chooser.choice(
            [a for a in space.attentions if layout in LAYOUTS_BY_ATTENTION[a]] or [attention])
        side = _pool(chooser, space, side_attention, layout, f"side{i}", {}, row_cap)
        pools.append(replace(side, write_back_jit=chooser.chance(0.5)))

    return pools


def _fit_budget(chooser: Chooser, space: CaseSpace, pools: list[PoolSpec], budget: int, tail: bool,
                geometry: tuple[int, int, int]) -> tuple[int, int, int, int, int]:
    """Host and device pool sizes around the transfer, then the geometry shrunk until the case fits its budget:
    (layers, page size, pages, host pages, device pages)."""
    page_size, layers, pages = geometry
    per_token = _bytes_per_token_layer(pools)
    host_slack, device_slack = chooser.integer(0, 3), chooser.integer(1, 3)
    # Tail cases make their size count: half of them put it in one big pool (a device component past the
    # scaled 2^31-byte limit of the zoo, a host pool past 2^20 rows).
    big_pool = (space.big_pool_rate and chooser.chance(space.big_pool_rate)) or (tail and chooser.chance(0.5))

    def total(layers: int, page_size: int, pages: int, host_slack: int, device_slack: int) -> int:
        slots = (pages + host_slack) * page_size + (pages + device_slack) * page_size
        return slots * layers * per_token

    if big_pool:
        # A pool far larger than the transfer, sized around a power of two of rows, so that indices near 2^k
        # (and past 2^16 rows) are reachable at the cost of the pool's bytes only.
        room = budget // max(1, layers * per_token) - 2 * pages * page_size
        if room > 64:
            bits = room.bit_length() - 1 if tail else chooser.integer(6, room.bit_length() - 1)
            extra_pages = ((1 << bits) + chooser.choice((-1, 0, 1, page_size))) // page_size + 1
            if chooser.chance(0.5):
                host_slack = max(host_slack, extra_pages)
            else:
                device_slack = max(device_slack, extra_pages)

    # Fit the budget: first inside the scheduled buckets (a smaller value of the same bucket), then across.
    layer_floor = bucket_named(LAYER_BUCKETS, label_of(LAYER_BUCKETS, layers)).low
    pages_floor = max(1, bucket_named(PAGES_BUCKETS, label_of(PAGES_BUCKETS, pages)).low) if pages else 0
    def fits() -> bool:
        return total(layers, page_size, pages, host_slack, device_slack) <= budget

    while not fits() and (host_slack > 3 or device_slack > 3):
        host_slack, device_slack = min(host_slack, max(0, host_slack // 2)), max(1, device_slack // 2)
    while not fits() and layers > layer_floor:
        layers = max(layer_floor, layers // 2)
    while not fits() and pages > pages_floor:
        pages = max(pages_floor, pages // 2)
    # Across buckets, in a drawn order, so that which scheduled bucket gives way varies from case to case.
    for dimension in chooser.choice(_SHRINK_ORDERS):
        while not fits() and dimension == "layers" and layers > 1:
            layers = max(1, layers // 2)
        while not fits() and dimension == "page_size" and page_size > 1:
            page_size = max(1, page_size // 2)
        while not fits() and dimension == "pages" and pages > 1:
            pages = max(1, pages // 2)
    host_pages = max(1, pages + host_slack)
    device_pages = pages + device_slack  # device page 0 is sglang's padding page
    return layers, page_size, pages, host_pages, device_pages


def _draw_indices(chooser: Chooser, space: CaseSpace, direction: Direction, pages: int, page_size: int,
                  host_pages: int, device_pages: int) -> tuple[list[int], list[int]]:
    host_pages_chosen = _page_ids(chooser, host_pages, pages, first=0, page_size=page_size)
    device_pages_chosen = _page_ids(chooser, device_pages, pages, first=1 if not chooser.chance(0.05) else 0,
                                    page_size=page_size)
    # Repeated source pages are legal and deterministic (unlike repeated destinations).
    source_is_device = direction is Direction.WRITE_BACK
    if pages > 1 and chooser.chance(0.1):
        src = device_pages_chosen if source_is_device else host_pages_chosen
        src[chooser.integer(1, pages - 1)] = src[0]
    host_indices = _expand(chooser, host_pages_chosen, page_size, space.irregular_rate, host_pages * page_size)
    device_indices = _expand(chooser, device_pages_chosen, page_size, space.irregular_rate,
                             device_pages * page_size)
    if page_size > 1 and host_indices and space.partial_rate and chooser.chance(space.partial_rate):
        # A partial last page: valid for per-token entry points, a rejection for page-granular ones (the
        # contract decides per entry point).
        cut = chooser.integer(1, page_size - 1)
        del host_indices[-cut:], device_indices[-cut:]
    return host_indices, device_indices


_SHRINK_ORDERS = (("layers", "page_size", "pages"), ("pages", "layers", "page_size"),
                  ("page_size", "pages", "layers"), ("layers", "pages", "page_size"))
SHUFFLE_LIMIT = 4096  # page ids: shuffled picks up to this many pages, runs beyond (cost stays per page)


def _near_powers_of_two(available: int, first: int, page_size: int) -> list[int]:
    """Pages holding the tokens 2^k - 1, 2^k, 2^k + 1 (largest k first) inside [first, available)."""
    pages: list[int] = []
    k = (available * page_size).bit_length()
    while k >= 1:
        for token in ((1 << k) - 1, 1 << k, (1 << k) + 1):
            page = token // page_size
            if first <= page < available and page not in pages:
                pages.append(page)
        k -= 1
    return pages


def _page_ids(chooser: Chooser, available: int, count: int, first: int, page_size: int = 1) -> list[int]:
    """`count` distinct page ids from [first, available), in a biased order."""
    span = available - first
    count = max(0, min(count, span))
    if count == 0:
        return []
    patterns = ("shuffled", "ascending", "descending", "ends", "powers")
    pattern = chooser.choice(patterns if count <= SHUFFLE_LIMIT else patterns[1:3])
    if pattern == "ascending":
        start = first + chooser.integer(0, span - count)
        return list(range(start, start + count))
    if pattern == "descending":
        start = first + chooser.integer(0, span - count)
        return list(range(start + count - 1, start - 1, -1))
    picked: list[int] = []
    if pattern == "ends":
        picked = [available - 1] + ([first] if count > 1 and first != available - 1 else [])
    elif pattern == "powers":
        picked = _near_powers_of_two(available, first, page_size)[:count]
    taken = set(picked)
    if span <= 4 * count:
        rest = [p for p in range(first, available) if p not in taken]
        while len(picked) < count:
            picked.append(rest.pop(chooser.integer(0, len(rest) - 1)))
        return picked
    while len(picked) < count:  # sparse picks from a large pool: rejection beats listing the pool
        page = chooser.integer(first, available - 1)
        if page not in taken:
            taken.add(page)
            picked.append(page)
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


VIOLATIONS = ("host_oob", "device_oob", "length", "partial_page", "duplicate_dst", "negative", "bound", "bound")


def _inject_violation(chooser: Chooser, case: Case) -> Case:
    """One deliberate contract violation, so rejections get exercised as well as transfers. ``bound`` puts an
    index exactly at one side's bound (contract.boundary_indices) where every entry point reads it, the first
    entry of a page-sized chunk: an entry point that checks that side must reject it (contract.BOUNDS_CHECKS),
    which tests the check's off-by-ones; elsewhere the contract calls it undefined and it is not run."""
    h, d = list(case.host_indices), list(case.device_indices)
    kind = chooser.choice(VIOLATIONS)
    if not h and kind != "length":
        kind = "length"
    if kind == "bound":
        host = chooser.chance(0.5) or not d
        values, size, spec = (h, case.host_slots, case.host_index) if host else (d, case.device_rows,
                                                                                 case.device_index)
        chunks = len(values) // case.page_size
        position = case.page_size * chooser.integer(0, chunks - 1) if chunks else chooser.integer(0, len(values) - 1)
        values[position] = chooser.choice(boundary_indices(size, spec.dtype))
    elif kind == "host_oob":
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
    space = space.at_index(index)
    pins = pins_for_index(space, seed, index) if space.schedule else None
    return draw_case(RandomChooser(rng), space, pins)
