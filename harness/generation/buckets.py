"""Buckets: the coarse values of each numeric dimension that the schedule draws and the coverage report counts.

One bucket per region a bug class can hide in: page size 1, small and large powers of two, non-powers of two;
page counts around the 64-page staging chunk; layer counts up to production depths; heads past 8 per rank;
row sizes per copy-round band. Generation and coverage share these definitions, so "the schedule asked for
bucket b" and "coverage counted bucket b" mean the same set of values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, eq=False)  # module constants: identity is equality, and hashing is cheap (caches)
class Bucket:
    label: str
    low: int  # inclusive
    high: int  # inclusive (huge for open-ended buckets)
    accepts: Callable[[int], bool] = lambda value: True  # extra rule (power of two or not)

    def contains(self, value: int) -> bool:
        return self.low <= value <= self.high and self.accepts(value)


OPEN = 1 << 62


def _not_pow2(value: int) -> bool:
    return not is_power_of_two(value)


PAGE_SIZE_BUCKETS = (
    Bucket("1", 1, 1),
    Bucket("2-8", 2, 8, is_power_of_two),
    Bucket("16-64", 16, 64, is_power_of_two),
    Bucket("128+", 128, OPEN, is_power_of_two),
    Bucket("npot<16", 3, 15, _not_pow2),
    Bucket("npot16+", 17, OPEN, _not_pow2),
)
PAGES_BUCKETS = (
    Bucket("0", 0, 0), Bucket("1", 1, 1), Bucket("2-62", 2, 62), Bucket("63-65", 63, 65),
    Bucket("66-129", 66, 129), Bucket("130+", 130, OPEN),
)
LAYER_BUCKETS = (
    Bucket("1", 1, 1), Bucket("2-4", 2, 4), Bucket("5-16", 5, 16), Bucket("17-64", 17, 64),
    Bucket("65-128", 65, 128), Bucket("129+", 129, OPEN),
)
HEAD_BUCKETS = (Bucket("1", 1, 1), Bucket("2-8", 2, 8), Bucket("9-32", 9, 32), Bucket("33-128", 33, 128),
                Bucket("129+", 129, OPEN))
ROW_BUCKETS = (Bucket("<128", 1, 127), Bucket("128-1023", 128, 1023), Bucket("1K-8K", 1024, 8191),
               Bucket("8K+", 8192, OPEN))
TOKEN_BUCKETS = (Bucket("0", 0, 0), Bucket("1-63", 1, 63), Bucket("64-1023", 64, 1023),
                 Bucket("1K-16K", 1024, 16383), Bucket("16K-65535", 16384, 65535), Bucket("65536+", 65536, OPEN))
HEAD_DIM_BUCKETS = (Bucket("<64", 1, 63), Bucket("64-128", 64, 128), Bucket("129-256", 129, 256),
                    Bucket("257-576", 257, 576), Bucket("577+", 577, OPEN))
PAGE_BYTES_BUCKETS = (Bucket("<1K", 0, 1023), Bucket("1K-16K", 1024, 16383), Bucket("16K-128K", 16384, 131071),
                      Bucket("128K+", 131072, OPEN))
POOL_ROW_BUCKETS = (Bucket("<=256", 1, 256), Bucket("257-65536", 257, 65536), Bucket(">65536", 65537, OPEN))


def label_of(buckets: Sequence[Bucket], value: int) -> str:
    for bucket in buckets:
        if bucket.contains(value):
            return bucket.label
    return f"other:{value}"


def bucket_named(buckets: Sequence[Bucket], label: str) -> Bucket:
    for bucket in buckets:
        if bucket.label == label:
            return bucket
    raise KeyError(label)


@lru_cache(maxsize=512)
def labels_of_menu(buckets: tuple[Bucket, ...], menu: tuple[int, ...]) -> tuple[str, ...]:
    """The buckets a menu reaches, in the order of their first menu value (so the first is the simplest)."""
    seen: list[str] = []
    for value in menu:
        label = label_of(buckets, value)
        if label not in seen:
            seen.append(label)
    return tuple(seen)


@lru_cache(maxsize=2048)
def menu_in_bucket(buckets: tuple[Bucket, ...], label: str, menu: tuple[int, ...]) -> tuple[int, ...]:
    """The menu values inside bucket `label` (cached: menus and buckets are fixed per space)."""
    bucket = bucket_named(buckets, label)
    return tuple(v for v in menu if bucket.contains(v))
