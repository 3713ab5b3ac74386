"""Which corners of the case space a campaign really exercised, per backend, and where the holes are.

Only cases the backend actually ran count (passed, rejected as predicted, or failed); unsupported and
undefined cases never reached the implementation. Three views, all in the campaign report:

* ``coverage``: backend -> dimension -> bucket -> cases. Buckets are the finer ones of
  :mod:`hicache_fuzz.harness.generation.buckets` (page size 1 / powers of two / non-powers of two, page counts
  around the 64-page staging chunk, layers to 128, heads past 8, tokens past 65,536, ...). The dimension
  ``edge`` counts named edges reached (``page_size=npot``, ``tokens>=65536``, ``layers=126``, ...) and each
  ``pair:a*b`` dimension counts the bucket pairs of two dimensions seen together. All of it is plain counts,
  so shards and workers sum (merge.py).
* ``coverage_ranges``: backend -> dimension -> [min, max] of the drawn values (merge takes min and max).
* ``coverage_values``: backend -> dimension -> the distinct values drawn (:data:`VALUE_DIMENSIONS` of the Case,
  ``tuning.<knob>`` per tuning knob, and whatever ``Backend.coverage_labels`` names; merge takes the union):
  what a range hides, e.g. that a backend drew page sizes 1..256 but no non-power of two above 64.
* ``coverage_summary`` (derived): per backend the ranges, the edges reached and missed, and per dimension pair
  the pairs reached out of the pairs possible among the buckets seen (less combinations no case can have).

:data:`REQUIRED` / :data:`REQUIRED_DISTINCT` list the minimum every real-kernel backend must see in a campaign
worth reporting. A backend can declare a required bucket out of its reach (``Backend.coverage_exemptions``);
the exemption and its reason are reported instead of a gap, so an exemption is visible and never silent.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections import Counter, defaultdict
from collections.abc import Mapping
from itertools import combinations
from typing import Any

from hicache_fuzz.harness.generation.buckets import (
    HEAD_BUCKETS,
    HEAD_DIM_BUCKETS,
    LAYER_BUCKETS,
    PAGE_BYTES_BUCKETS,
    PAGE_SIZE_BUCKETS,
    PAGES_BUCKETS,
    POOL_ROW_BUCKETS,
    ROW_BUCKETS,
    TOKEN_BUCKETS,
    bucket_named,
    is_power_of_two,
    label_of,
)
from hicache_fuzz.harness.generation.pairwise import legal_pair
from hicache_fuzz.harness.model.case import Case, HostLayout
from hicache_fuzz.harness.model.outcome import Outcome, Result

NOT_EXECUTED = frozenset({Outcome.UNSUPPORTED, Outcome.UNDEFINED})

# dimension -> buckets a campaign must have executed at least once per backend (issue 6's "done means")
REQUIRED: dict[str, tuple[str, ...]] = {
    "attention": ("mha", "mla"),
    "page_size": ("1", "16-64"),
    "index_dtype": ("int32", "int64"),
    "index_device": ("cpu", "device"),
    "pages": ("63-65",),
}
# dimension -> how many distinct buckets a campaign must have executed per backend
REQUIRED_DISTINCT: dict[str, int] = {"dtype": 2}

# Dimensions whose bucket pairs are counted (the schedule's dimensions, direction/layout/scope apart).
PAIR_DIMENSIONS = ("direction", "scope", "layout", "attention", "dtype", "page_size", "pages", "layers", "heads",
                   "row_bytes", "page_bytes", "index_dtype", "index_device", "allocator", "pools")
# The riskiest triple, counted as one dimension: direction x layout x scope, and its pairs with page bytes.
TRIPLE = "dls"

# Edges: name -> what must hold. Scaled limits are the zoo's (kernels/zoo.py): 2^20 host bytes stand for
# 2^32, 2^24 device bytes for 2^31.
EDGES = ("page_size=1", "page_size=npot", "page_size>=128", "heads>8", "heads>=64", "head_dim>=512",
         "layers>=61", "layers=61", "layers=126", "layers=128", "tokens=0", "tokens>=65536", "pages>=129",
         "pool_rows>65536", "index=2^k-1", "index=2^k", "index=2^k+1", "index>=2^16", "partial_page",
         "row_bytes>32768", "host_bytes>=2^20", "device_component_bytes>=2^24", "pools=3")
# The Case dimensions whose distinct values coverage_values lists (case_distinct_values).
VALUE_DIMENSIONS = ("page_size", "layers", "heads", "head_dim", "row_bytes", "head_groups", "pools", "layout",
                    "direction", "scope", "attention", "dtype", "index_dtype", "index_device", "allocator")
Label = str | int | bool
RANGE_DIMENSIONS = ("page_size", "layers", "tokens", "pages", "heads", "head_dim", "row_bytes", "host_slots",
                    "device_rows", "max_index", "pools", "case_bytes")


def _pages(case: Case) -> int:
    return -(-case.n // case.page_size)


@functools.cache
def _near_powers_of_two(bits: int) -> tuple[frozenset[int], tuple[frozenset[int], ...]]:
    """The values 2^k + offset for 2 <= k <= bits, per offset -1, 0, +1, and all of them together."""
    per_offset = tuple(frozenset((1 << k) + offset for k in range(2, bits + 1)) for offset in (-1, 0, 1))
    return frozenset().union(*per_offset), per_offset


def _indices_near_powers_of_two(case: Case, biggest: int) -> tuple[bool, bool, bool]:
    """Whether some index (either side) is 2^k - 1, 2^k, 2^k + 1 (k >= 2; `biggest` bounds the indices, so no
    larger k can match). One pass per side through a small set of targets: cheaper than a set of the indices."""
    targets, per_offset = _near_powers_of_two(max(biggest, 1).bit_length())
    hits = targets.intersection(case.host_indices) | targets.intersection(case.device_indices)
    minus, exact, plus = (not near.isdisjoint(hits) for near in per_offset)
    return minus, exact, plus


def case_values(case: Case) -> dict[str, int]:
    """The numeric values of `case` whose ranges the report shows."""
    rows = [p.row_bytes(c) for p in case.pools for c in p.components]
    per_token = sum(rows)
    biggest = case.largest_index
    return {
        "page_size": case.page_size, "layers": case.layers, "tokens": case.n, "pages": _pages(case),
        "heads": max(p.heads for p in case.pools), "head_dim": max(p.head_dim for p in case.pools),
        "row_bytes": max(rows), "host_slots": case.host_slots, "device_rows": case.device_rows,
        "max_index": biggest, "pools": len(case.pools),
        "case_bytes": per_token * case.layers * (case.host_slots + case.device_rows),
    }


def case_distinct_values(case: Case) -> dict[str, tuple[Label, ...]]:
    """The values of `case` per :data:`VALUE_DIMENSIONS` (several where the pools or the two index sides
    differ), and its tuning knobs as ``tuning.<name>``."""
    rows = {p.row_bytes(c) for p in case.pools for c in p.components}
    out: dict[str, tuple[Label, ...]] = {
        "page_size": (case.page_size,), "layers": (case.layers,),
        "heads": tuple({p.heads for p in case.pools}), "head_dim": tuple({p.head_dim for p in case.pools}),
        "row_bytes": tuple(rows), "head_groups": tuple({p.head_groups for p in case.pools}),
        "pools": (len(case.pools),), "layout": (case.layout.value,), "direction": (case.direction.value,),
        "scope": (case.scope.value,), "attention": tuple({p.attention.value for p in case.pools}),
        "dtype": tuple({p.dtype.value for p in case.pools}),
        "index_dtype": tuple({case.host_index.dtype.value, case.device_index.dtype.value}),
        "index_device": tuple({case.host_index.device.value, case.device_index.device.value}),
        "allocator": (case.host_allocator.value,),
    }
    for name, value in case.tuning:
        out[f"tuning.{name}"] = (value,)
    return out


def _label_order(value: Label) -> tuple[str, Label]:
    return type(value).__name__, value


def case_edges(case: Case, values: dict[str, int]) -> list[str]:
    """The named edges `case` reaches, in :data:`EDGES` order; `values` is ``case_values(case)``."""
    ps, biggest, widest_row = case.page_size, values["max_index"], values["row_bytes"]
    host_bytes = widest_row * case.layers * case.host_slots
    device_component = widest_row * case.layers * case.device_rows
    near_minus, near_exact, near_plus = _indices_near_powers_of_two(case, biggest)
    checks = {
        "page_size=1": ps == 1, "page_size=npot": not is_power_of_two(ps), "page_size>=128": ps >= 128,
        "heads>8": values["heads"] > 8, "heads>=64": values["heads"] >= 64, "head_dim>=512": values["head_dim"] >= 512,
        "layers>=61": case.layers >= 61, "layers=61": case.layers == 61, "layers=126": case.layers == 126,
        "layers=128": case.layers == 128, "tokens=0": case.n == 0, "tokens>=65536": case.n >= 65536,
        "pages>=129": values["pages"] >= 129, "pool_rows>65536": max(case.host_slots, case.device_rows) > 65536,
        "index=2^k-1": near_minus, "index=2^k": near_exact, "index=2^k+1": near_plus,
        "index>=2^16": biggest >= 1 << 16, "partial_page": case.n % ps != 0,
        "row_bytes>32768": values["row_bytes"] > 32768, "host_bytes>=2^20": host_bytes >= 1 << 20,
        "device_component_bytes>=2^24": device_component >= 1 << 24, "pools=3": len(case.pools) >= 3,
    }
    return [name for name in EDGES if checks[name]]


def case_features(case: Case, values: dict[str, int] | None = None) -> dict[str, list[str]]:
    """The buckets `case` falls in, per dimension (a dimension may hold several, e.g. both index sides)."""
    values = values or case_values(case)
    rows = {p.row_bytes(c) for p in case.pools for c in p.components}
    return {
        "attention": sorted({p.attention.value for p in case.pools}),
        "dtype": sorted({p.dtype.value for p in case.pools}),
        "layout": [case.layout.value],
        "direction": [case.direction.value],
        "scope": [case.scope.value],
        TRIPLE: [f"{case.direction.value}/{case.layout.value}/{case.scope.value}"],
        "page_size": [label_of(PAGE_SIZE_BUCKETS, case.page_size)],
        "pages": [label_of(PAGES_BUCKETS, values["pages"])],
        "tokens": [label_of(TOKEN_BUCKETS, case.n)],
        "layers": [label_of(LAYER_BUCKETS, case.layers)],
        "heads": sorted({label_of(HEAD_BUCKETS, p.heads) for p in case.pools}),
        "head_dim": sorted({label_of(HEAD_DIM_BUCKETS, p.head_dim) for p in case.pools}),
        "row_bytes": sorted({label_of(ROW_BUCKETS, r) for r in rows}),
        "page_bytes": sorted({label_of(PAGE_BYTES_BUCKETS, r * case.page_size) for r in rows}),
        "pool_rows": [label_of(POOL_ROW_BUCKETS, max(case.host_slots, case.device_rows))],
        "index_dtype": sorted({case.host_index.dtype.value, case.device_index.dtype.value}),
        "index_device": sorted({case.host_index.device.value, case.device_index.device.value}),
        "allocator": [case.host_allocator.value],
        "pools": [str(len(case.pools))],
        "partial": ["partial" if case.n % case.page_size else "whole"],
    }


def pair_name(a: str, b: str) -> str:
    return f"pair:{a}*{b}"


def _page_bytes_possible(row: str, page_bytes: str, page_sizes: list[int]) -> bool:
    """Whether some row of bucket `row` times some page size of the range drawn lands in `page_bytes`."""
    try:
        row_bucket, page_bucket = bucket_named(ROW_BUCKETS, row), bucket_named(PAGE_BYTES_BUCKETS, page_bytes)
    except KeyError:  # a bucket of another version's report: assume possible
        return True
    return row_bucket.low * page_sizes[0] <= page_bucket.high and row_bucket.high * page_sizes[1] >= page_bucket.low


def _legal_coverage_pair(dim_a: str, a: str, dim_b: str, b: str, page_sizes: list[int] | None = None) -> bool:
    """Bucket pairs no case can have (coverage names): layouts an attention kind lacks, multi-head MLA, row
    bands whose pages cannot reach a page-bytes band with the page sizes drawn."""
    if {dim_a, dim_b} == {"row_bytes", "page_bytes"} and page_sizes:
        row, page = (a, b) if dim_a == "row_bytes" else (b, a)
        return _page_bytes_possible(row, page, page_sizes)
    if {dim_a, dim_b} == {"attention", "layout"}:
        attention, layout = (a, b) if dim_a == "attention" else (b, a)
        return legal_pair("attention", attention, "dls", f"x/{HostLayout(layout).value}/x")
    if {dim_a, dim_b} == {"attention", "heads"}:
        attention, heads = (a, b) if dim_a == "attention" else (b, a)
        return legal_pair("attention", attention, "heads", heads)
    return True


# (a, b, pair dimension name) of the pair dimensions, and the triple's pair with page bytes
_PAIR_NAMES = tuple((a, b, pair_name(a, b)) for a, b in combinations(PAIR_DIMENSIONS, 2))
_TRIPLE_PAIR_NAME = pair_name(TRIPLE, "page_bytes")
# Distinct feature sets a backend's pending tallies hold (~2 KB each) before add() expands them anyway.
PENDING_LIMIT = 10_000
# Geometries whose feature set add() remembers: index variants come right after their case, so a few suffice.
FEATURE_KEY_CACHE_LIMIT = 256

# A case's features as one hashable value: ((dimension, buckets), ...) in case_features' order.
FeatureKey = tuple[tuple[str, tuple[str, ...]], ...]


def feature_key(features: dict[str, list[str]]) -> FeatureKey:
    return tuple((dimension, tuple(buckets)) for dimension, buckets in features.items())


# The fields an index variant changes (variants.index_variant). case_features reads none of them but the host
# list's length, so every other field and that length determine a case's features: index variants share them.
VARIANT_FIELDS = frozenset({"host_indices", "device_indices", "seed", "note"})
_geometry = operator.attrgetter(*(f.name for f in dataclasses.fields(Case) if f.name not in VARIANT_FIELDS))


class Coverage:
    def __init__(self) -> None:
        self._counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.ranges: dict[str, dict[str, list[int]]] = defaultdict(dict)  # backend -> dim -> [min, max]
        self.exemptions: dict[str, dict[str, str]] = {}  # backend -> "dimension=bucket" -> why out of reach
        self._feature_keys: dict[tuple[Any, ...], FeatureKey] = {}  # (n, geometry) -> the features' key
        self.values: dict[str, dict[str, set[Label]]] = defaultdict(lambda: defaultdict(set))  # backend -> dim
        self._values_seen: dict[str, set[tuple[Any, ...]]] = defaultdict(set)  # geometries already in values
        # Cases added but not yet expanded into the counts: backend -> feature set / edge list -> cases. A case
        # adds hundreds of counts (the pairs) and index variants share their case's feature set, so add() only
        # tallies and the expansion runs once per distinct feature set when the counts are read.
        self._pending_features: dict[str, Counter[FeatureKey]] = defaultdict(Counter)
        self._pending_edges: dict[str, Counter[tuple[str, ...]]] = defaultdict(Counter)

    @property
    def counts(self) -> dict[str, dict[str, Counter[str]]]:
        """backend -> dimension -> bucket -> cases, every case added so far included."""
        self._flush()
        return self._counts

    def exempt(self, backend: str, exemptions: dict[str, str]) -> None:
        if exemptions:
            self.exemptions.setdefault(backend, {}).update(exemptions)

    def add(self, case: Case, result: Result, labels: Mapping[str, Label] | None = None) -> None:
        """Count an executed case; `labels` are its backend's coverage_labels (dimension -> value)."""
        if result.outcome in NOT_EXECUTED:
            return
        values = case_values(case)
        geometry = (case.n, _geometry(case))
        self._add_values(result.backend, case, geometry, labels)
        key = self._feature_keys.get(geometry)
        if key is None:
            key = feature_key(case_features(case, values))
            if len(self._feature_keys) >= FEATURE_KEY_CACHE_LIMIT:
                self._feature_keys.clear()
            self._feature_keys[geometry] = key
        tallies = self._pending_features[result.backend]
        tallies[key] += 1
        self._pending_edges[result.backend][tuple(case_edges(case, values))] += 1
        self._widen(result.backend, values)
        if len(tallies) >= PENDING_LIMIT:  # nothing read the counts for long: bound the memory pending holds
            self._flush()

    def _add_values(self, backend: str, case: Case, geometry: tuple[Any, ...],
                    labels: Mapping[str, Label] | None) -> None:
        distinct = self.values[backend]
        for dimension, label in (labels or {}).items():
            distinct[dimension].add(label)
        seen = self._values_seen[backend]
        if geometry in seen:  # index variants share their case's values: once per geometry
            return
        if len(seen) >= PENDING_LIMIT:
            seen.clear()
        seen.add(geometry)
        for dimension, found in case_distinct_values(case).items():
            distinct[dimension].update(found)

    def _flush(self) -> None:
        """Expand the pending tallies into the counts: what each case would have added, times its tally. Keys
        are met in the order the cases were added, so the counts' keys come in the same order as one case at
        a time would insert them (the feature dimensions of a backend first, then its edges)."""
        for backend, tallies in self._pending_features.items():
            counts = self._counts[backend]
            for key, times in tallies.items():
                for dimension, bucket in self._increments(key):
                    counts[dimension][bucket] += times
        for backend, edge_tallies in self._pending_edges.items():
            reached = self._counts[backend]["edge"]  # created even when no case reached an edge
            for edges, times in edge_tallies.items():
                for edge in edges:
                    reached[edge] += times
        self._pending_features.clear()
        self._pending_edges.clear()

    def _increments(self, key: FeatureKey) -> list[tuple[str, str]]:
        """(dimension, bucket) of every count a case with these features adds, pairs included. Called once per
        distinct feature set pending, not per case (index variants share their case's), and not cached: nearly
        every generated case has a feature set of its own, and a list of increments takes ~18 KB."""
        features = dict(key)
        increments = [(dimension, bucket) for dimension, buckets in key for bucket in buckets]
        increments += [(name, f"{x}|{y}") for a, b, name in _PAIR_NAMES for x in features[a] for y in features[b]]
        increments += [(_TRIPLE_PAIR_NAME, f"{features[TRIPLE][0]}|{y}") for y in features["page_bytes"]]
        return increments

    def _widen(self, backend: str, values: dict[str, int]) -> None:
        ranges = self.ranges[backend]
        for dimension, value in values.items():
            span = ranges.get(dimension)
            if span is None:
                ranges[dimension] = [value, value]
            else:  # compare before assigning: most values widen nothing
                if value < span[0]:
                    span[0] = value
                if value > span[1]:
                    span[1] = value

    def gaps(self, backend: str) -> list[str]:
        """Required buckets `backend` never executed, as 'dimension=bucket' (or 'dimension: k of n distinct'),
        less the ones the backend declared out of its reach."""
        seen = self.counts.get(backend, {})
        exempt = self.exemptions.get(backend, {})
        missing = [f"{dim}={bucket}" for dim, buckets in REQUIRED.items() for bucket in buckets
                   if not seen.get(dim, Counter())[bucket] and f"{dim}={bucket}" not in exempt]
        for dim, needed in REQUIRED_DISTINCT.items():
            distinct = sorted(b for b, n in seen.get(dim, Counter()).items() if n)
            if len(distinct) < needed and dim not in exempt:
                missing.append(f"{dim}: {len(distinct)} of {needed} distinct ({', '.join(distinct) or 'none'})")
        return missing

    def pairs(self, backend: str) -> dict[str, dict[str, int]]:
        """Per dimension pair: the bucket pairs reached and the pairs possible among the buckets seen in each
        dimension (a hole is a pair of values each seen, never together)."""
        seen = self.counts.get(backend, {})
        page_sizes = self.ranges.get(backend, {}).get("page_size")
        out: dict[str, dict[str, int]] = {}
        dimension_pairs = [*combinations(PAIR_DIMENSIONS, 2), (TRIPLE, "page_bytes")]
        for a, b in dimension_pairs:
            values_a = [x for x, n in seen.get(a, Counter()).items() if n]
            values_b = [y for y, n in seen.get(b, Counter()).items() if n]
            possible = sum(_legal_coverage_pair(a, x, b, y, page_sizes) for x in values_a for y in values_b)
            # cross products of multi-valued features (several pools) can pair buckets of different rows:
            # only legal pairs count, so reached <= possible
            reached = sum(1 for key, n in seen.get(pair_name(a, b), Counter()).items()
                          if n and _legal_coverage_pair(a, key.split("|")[0], b, key.split("|")[1], page_sizes))
            out[f"{a}*{b}"] = {"reached": reached, "possible": possible}
        return out

    def summary(self, backend: str) -> dict[str, Any]:
        """Ranges, edges reached and missed, and pairs reached / possible: what makes a hole visible."""
        edges = self.counts.get(backend, {}).get("edge", Counter())
        pairs = self.pairs(backend)
        return {
            "ranges": {dim: list(span) for dim, span in sorted(self.ranges.get(backend, {}).items())},
            "edges_reached": {e: edges[e] for e in EDGES if edges[e]},
            "edges_missed": [e for e in EDGES if not edges[e]],
            "pairs_reached": sum(p["reached"] for p in pairs.values()),
            "pairs_possible": sum(p["possible"] for p in pairs.values()),
            "pairs": pairs,
        }

    @classmethod
    def from_dicts(cls, parts: list[dict[str, Any]], exemptions: list[dict[str, Any]] | None = None,
                   ranges: list[dict[str, Any]] | None = None,
                   values: list[dict[str, Any]] | None = None) -> Coverage:
        """Sum the coverage of several reports (shards, workers); `exemptions` are their
        ``coverage_exemptions`` fields, `ranges` their ``coverage_ranges``, `values` their ``coverage_values``
        (older reports have none)."""
        total = cls()
        for part in parts:
            for backend, dims in part.items():
                for dim, buckets in dims.items():
                    total._counts[backend][dim].update({bucket: int(n) for bucket, n in buckets.items()})
        for declared in exemptions or []:
            for backend, mapping in declared.items():
                total.exempt(backend, {str(k): str(v) for k, v in mapping.items()})
        for part_ranges in ranges or []:
            for backend, dims in part_ranges.items():
                for dim, (low, high) in dims.items():
                    total._widen(backend, {dim: int(low)})
                    total._widen(backend, {dim: int(high)})
        for part_values in values or []:
            for backend, dims in part_values.items():
                for dim, found in dims.items():
                    total.values[backend][dim].update(v for v in found if isinstance(v, str | int))
        return total

    def to_dict(self) -> dict[str, Any]:
        return {backend: {dim: dict(sorted(c.items())) for dim, c in sorted(dims.items())}
                for backend, dims in sorted(self.counts.items())}

    def ranges_dict(self) -> dict[str, Any]:
        return {backend: {dim: list(span) for dim, span in sorted(dims.items())}
                for backend, dims in sorted(self.ranges.items())}

    def values_dict(self) -> dict[str, dict[str, list[Label]]]:
        return {backend: {dim: sorted(found, key=_label_order) for dim, found in sorted(dims.items())}
                for backend, dims in sorted(self.values.items())}

    def summary_dict(self) -> dict[str, Any]:
        return {backend: self.summary(backend) for backend in sorted(self.counts)}
