"""Which corners of the case space a campaign really exercised, per backend.

Only cases the backend actually ran count (passed, rejected as predicted, or failed); unsupported and
undefined cases never reached the implementation. The buckets are the dimensions bugs live in (page counts
around the 64-page staging chunk, page size 1 vs >= 16, index dtype and placement per side, ...), and
:data:`REQUIRED` / :data:`REQUIRED_DISTINCT` list the minimum every real-kernel backend must see in a campaign
worth reporting. A backend can declare a required bucket out of its reach (``Backend.coverage_exemptions``,
e.g. int32 indices for a backend that only takes what sglang's allocators produce); the exemption and its
reason are reported instead of a gap, so an exemption is visible and never silent.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result

NOT_EXECUTED = frozenset({Outcome.UNSUPPORTED, Outcome.UNDEFINED})

# dimension -> buckets a campaign must have executed at least once per backend (issue 6's "done means")
REQUIRED: dict[str, tuple[str, ...]] = {
    "attention": ("mha", "mla"),
    "page_size": ("1", "16+"),
    "index_dtype": ("int32", "int64"),
    "index_device": ("cpu", "device"),
    "pages": ("63-65",),
}
# dimension -> how many distinct buckets a campaign must have executed per backend
REQUIRED_DISTINCT: dict[str, int] = {"dtype": 2}


def _pages_bucket(pages: int) -> str:
    if pages <= 1:
        return str(pages)
    if pages < 63:
        return "2-62"
    if pages <= 65:
        return "63-65"
    return "66-127" if pages < 128 else "128+"


def case_features(case: Case) -> dict[str, list[str]]:
    """The buckets `case` falls in, per dimension (a dimension may hold several, e.g. both index sides)."""
    ps = case.page_size
    return {
        "attention": sorted({p.attention.value for p in case.pools}),
        "dtype": sorted({p.dtype.value for p in case.pools}),
        "layout": [case.layout.value],
        "direction": [case.direction.value],
        "scope": [case.scope.value],
        "page_size": ["1" if ps == 1 else "16+" if ps >= 16 else "2-8"],
        "pages": [_pages_bucket(case.n // ps)],
        "index_dtype": sorted({case.host_index.dtype.value, case.device_index.dtype.value}),
        "index_device": sorted({case.host_index.device.value, case.device_index.device.value}),
        "allocator": [case.host_allocator.value],
        "pools": [str(len(case.pools))],
    }


class Coverage:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.exemptions: dict[str, dict[str, str]] = {}  # backend -> "dimension=bucket" -> why out of reach

    def exempt(self, backend: str, exemptions: dict[str, str]) -> None:
        if exemptions:
            self.exemptions.setdefault(backend, {}).update(exemptions)

    def add(self, case: Case, result: Result) -> None:
        if result.outcome in NOT_EXECUTED:
            return
        for dimension, buckets in case_features(case).items():
            for bucket in buckets:
                self.counts[result.backend][dimension][bucket] += 1

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

    @classmethod
    def from_dicts(cls, parts: list[dict[str, Any]], exemptions: list[dict[str, Any]] | None = None) -> Coverage:
        """Sum the coverage of several reports (shards, workers); `exemptions` are their
        ``coverage_exemptions`` fields."""
        total = cls()
        for part in parts:
            for backend, dims in part.items():
                for dim, buckets in dims.items():
                    total.counts[backend][dim].update({bucket: int(n) for bucket, n in buckets.items()})
        for declared in exemptions or []:
            for backend, mapping in declared.items():
                total.exempt(backend, {str(k): str(v) for k, v in mapping.items()})
        return total

    def to_dict(self) -> dict[str, Any]:
        return {backend: {dim: dict(sorted(c.items())) for dim, c in sorted(dims.items())}
                for backend, dims in sorted(self.counts.items())}
