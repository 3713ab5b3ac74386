"""Combination coverage: a seeded covering array over the schedule dimensions, replayed by campaign index.

Uniform independent draws reach a rare combination (say direction x layout x scope with one page-bytes band)
in a fraction of a percent of cases. Instead, case i of a campaign takes its *buckets* from row i % K of a
pairwise covering array of K rows (K is about the product of the two largest dimensions, 126 for the default
space): every pair of values of two schedule dimensions is asked for in the first K cases (the budget fit may
break a size bucket; coverage counts what ran). The riskiest triple, direction x layout x scope, is one
composite dimension ("dls"), so every (direction, layout, scope) is asked to meet every page size, page count,
row band, ... within those K cases as well.

Rounds after the first (i >= K) replay the same array with its rows in a seeded order and the values of each
unconstrained dimension relabelled by a seeded permutation: a relabelled covering array still covers every
pair, so every round of K cases asks for all pairs again, with different combinations of the remaining
dimensions. This is the coverage-guided weighting made static: every bucket of every dimension gets 1/|values|
of the cases whatever its natural frequency, rare buckets included, and the weight of a case depends only on
(seed, i, the space), never on earlier results: campaigns shard, resume and replay by index unchanged.

Inside a bucket, the generator draws the concrete value (menu value or uniform in the bucket's range).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from hicache_fuzz.harness.generation.buckets import (
    HEAD_BUCKETS,
    LAYER_BUCKETS,
    PAGE_SIZE_BUCKETS,
    PAGES_BUCKETS,
    ROW_BUCKETS,
    labels_of_menu,
)
from hicache_fuzz.harness.model.case import LAYOUTS_BY_ATTENTION, Attention, HostLayout
from hicache_fuzz.harness.model.space import CaseSpace

Dims = tuple[tuple[str, tuple[str, ...]], ...]
# Dimensions whose values are constrained against each other: never relabelled between rounds.
CONSTRAINED = frozenset({"dls", "attention", "heads"})


def dls_value(direction: str, layout: str, scope: str) -> str:
    return f"{direction}/{layout}/{scope}"


@lru_cache(maxsize=64)
def schedule_dims(space: CaseSpace) -> Dims:
    """The schedule dimensions of `space` and their values (buckets), first value the simplest."""
    page_menu = space.page_sizes
    pages_menu = tuple(p for p in space.page_counts if p <= space.max_pages) or (1,)
    pages = labels_of_menu(PAGES_BUCKETS, pages_menu + ((130,) if space.max_pages >= 130 else ()))
    layers = labels_of_menu(LAYER_BUCKETS, space.layer_counts)
    heads = labels_of_menu(HEAD_BUCKETS, space.heads)
    rows = labels_of_menu(ROW_BUCKETS, space.row_bytes)
    layouts = [lay for lay in space.layouts if any(lay in LAYOUTS_BY_ATTENTION[a] for a in space.attentions)]
    dls = tuple(dls_value(d.value, lay.value, s.value)
                for d in space.directions for lay in layouts or space.layouts for s in space.scopes)
    # A placement menu with repeats is a weighting (sglang backends: mostly device indices); the schedule
    # would flatten it, so such a side is drawn from its menu instead of scheduled.
    host_devices = space.host_index_devices or space.index_devices
    device_devices = space.device_index_devices or space.index_devices
    host_devices = host_devices if len(set(host_devices)) == len(host_devices) else ()
    device_devices = device_devices if len(set(device_devices)) == len(device_devices) else ()
    dims: list[tuple[str, tuple[str, ...]]] = [
        ("dls", dls),
        ("attention", tuple(a.value for a in space.attentions)),
        ("dtype", tuple(d.value for d in space.dtypes)),
        ("page_size", labels_of_menu(PAGE_SIZE_BUCKETS, page_menu)),
        ("pages", pages),
        ("layers", layers),
        ("heads", heads),
        ("row", rows),
        ("index_dtypes", tuple(f"{h.value}/{d.value}" for h in space.index_dtypes for d in space.index_dtypes)),
        ("host_index_device", tuple(d.value for d in host_devices)),
        ("device_index_device", tuple(d.value for d in device_devices)),
        ("allocator", tuple(a.value for a in space.allocators)),
    ]
    # The pool count is not scheduled: every side pool adds per-case work (materialize, copy, compare per
    # pool), so groups keep their own share (15 %) instead of half the cases.
    return tuple((name, values) for name, values in dims if values)


def legal_pair(dim_a: str, a: str, dim_b: str, b: str) -> bool:
    """False for bucket pairs no case can have (a layout that does not exist for an attention kind, MLA with
    more than one head)."""
    if dim_a > dim_b:
        dim_a, a, dim_b, b = dim_b, b, dim_a, a
    if (dim_a, dim_b) == ("attention", "dls"):
        layout = HostLayout(b.split("/")[1])
        return layout in LAYOUTS_BY_ATTENTION[Attention(a)]
    if (dim_a, dim_b) == ("attention", "heads"):
        return a != Attention.MLA.value or b == "1"
    return True


def _pairs_of_row(dims: Dims, row: tuple[str, ...]) -> set[tuple[int, str, int, str]]:
    return {(i, row[i], j, row[j]) for i in range(len(dims)) for j in range(i + 1, len(dims))}


# Sized for a mixed campaign: each backend's transfer profile narrows the space per knob setting, so a
# campaign draws from dozens of distinct dimension sets (16 entries thrashed: 23 ms per rebuilt array).
@lru_cache(maxsize=512)
def covering_array(dims: Dims, seed: int) -> tuple[tuple[str, ...], ...]:
    """A pairwise covering array over `dims` (rows of one value per dimension), built greedily and seeded:
    each row starts from an uncovered pair and fills the other dimensions with the value covering the most
    uncovered pairs among the legal ones. Every legal pair occurs in some row."""
    rng = random.Random(f"hicache-fuzz-schedule:{seed}")
    count = len(dims)
    uncovered = {(i, a, j, b) for i in range(count) for j in range(i + 1, count)
                 for a in dims[i][1] for b in dims[j][1] if legal_pair(dims[i][0], a, dims[j][0], b)}
    rows: list[tuple[str, ...]] = []
    while uncovered:
        i, a, j, b = min(uncovered)
        row: dict[int, str] = {i: a, j: b}
        rest = [k for k in range(count) if k not in row]
        rng.shuffle(rest)
        for k in rest:
            name, values = dims[k]
            legal = [v for v in values if all(legal_pair(name, v, dims[m][0], row[m]) for m in row)] or list(values)
            best, best_gain = [legal[0]], -1
            for value in legal:
                gain = sum(((min(k, m), value if k < m else row[m], max(k, m), row[m] if k < m else value)
                            in uncovered) for m in row)
                if gain > best_gain:
                    best, best_gain = [value], gain
                elif gain == best_gain:
                    best.append(value)
            row[k] = best[rng.randrange(len(best))]
        full = tuple(row[k] for k in range(count))
        uncovered -= _pairs_of_row(dims, full)
        rows.append(full)
    return tuple(rows)


@lru_cache(maxsize=2048)
def _round(dims: Dims, seed: int, round_index: int) -> tuple[tuple[str, ...], ...]:
    """Round `round_index` of the schedule: the array itself first, then reordered and relabelled copies."""
    rows = covering_array(dims, seed)
    if round_index == 0:
        return rows
    rng = random.Random(f"hicache-fuzz-schedule:{seed}:round:{round_index}")
    relabel: list[dict[str, str]] = []
    for name, values in dims:
        shuffled = list(values)
        if name not in CONSTRAINED:
            rng.shuffle(shuffled)
        relabel.append(dict(zip(values, shuffled, strict=True)))
    order = list(range(len(rows)))
    rng.shuffle(order)
    return tuple(tuple(relabel[k][rows[r][k]] for k in range(len(dims))) for r in order)


_LAST_SPACE: list[Any] = []


def pins_for_index(space: CaseSpace, seed: int, index: int) -> dict[str, str]:
    """The buckets case `index` of a campaign with `seed` is drawn in: dimension -> bucket."""
    memo = _LAST_SPACE
    if memo and memo[0] is space:
        dims = memo[1]
    else:  # a campaign draws from one space object: skip hashing its fields on every case
        dims = schedule_dims(space)
        _LAST_SPACE[:] = [space, dims]
    size = len(covering_array(dims, seed))
    row = _round(dims, seed, index // size)[index % size]
    return {name: row[k] for k, (name, _) in enumerate(dims)}


def schedule_length(space: CaseSpace, seed: int) -> int:
    """K: the number of cases after which every legal pair of schedule buckets has been asked for."""
    return len(covering_array(schedule_dims(space), seed))
