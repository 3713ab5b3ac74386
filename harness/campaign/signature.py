"""Failure signatures: what makes two failures "the same bug", for dedup, corpus folders and the minimizer.

A signature is a hash of the key (backend, path taken, outcome kind, role):

* rejections, crashes and hangs: the role is the normalized error (first line; numbers, addresses, paths
  and quoted values stripped), so "host index 4097 out of range" and "host index 12 out of range" merge;
* wrongly accepted inputs: the normalized reasons the contract gave for rejecting;
* unexpected paths: which path ran instead of the planned one;
* mismatches: where the first differing byte is, described by its *role* rather than its address, when the
  case is known: anchor or side pool, destination or source storage, K/V component, guard or payload,
  inside or outside the addressed rows, which of the moved layers differ (every one, only the first, only
  the last, some, or an unmoved one), which page of the transfer it is (every page, the first, the last, an
  inner one, an unaddressed one, device padding page 0), and whether the byte was left stale (never
  written) or overwritten with a wrong value.

The Python stack is deliberately not part of it (ClusterFuzz's lesson: the harness'
own frames would merge distinct bugs or split one). Roles are relative to the transfer, not absolute
numbers, so that the minimizer can shrink a case without changing its signature, and a signature survives
being found again on a different geometry.

Without the case (``signature(result)``) a mismatch's role is the coarse (storage side, component, region,
inside/outside) only; campaigns, the corpus and the minimizer always pass the case.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import torch

from hicache_fuzz.harness.model.case import Case, Direction
from hicache_fuzz.harness.model.outcome import Outcome, Result

_ADDRESSES = re.compile(r"0x[0-9a-fA-F]+")
_PATHS = re.compile(r"(?:/[\w.+-]+){2,}")
_NUMBERS = re.compile(r"[-+]?\d+(?:\.\d+)?")
_QUOTED = re.compile(r"'[^']*'")


def normalize_error(error: str) -> str:
    """First line of an error with addresses, paths, numbers and quoted values replaced by placeholders."""
    first_line = error.strip().splitlines()[0] if error.strip() else ""
    text = _ADDRESSES.sub("ADDR", first_line)
    text = _PATHS.sub("PATH", text)
    text = _QUOTED.sub("'S'", text)
    return _NUMBERS.sub("N", text)[:160]


# ---- mismatch roles ---------------------------------------------------------------------------------

def _layer_role(case: Case, component: str, rows_per_layer: dict[str, int]) -> str:
    """Which layers of `component` differ, relative to the layers the transfer moves."""
    differing = sorted(int(key.split("/")[1]) for key in rows_per_layer if key.split("/")[0] == component)
    moved = list(case.moved_layers)
    if not differing:
        return "no-layer"
    if any(layer not in moved for layer in differing):
        return "unmoved-layer"
    if differing == moved:
        return "every-moved-layer"
    if differing == [moved[-1]]:
        return "last-layer-only"
    if differing == [moved[0]]:
        return "first-layer-only"
    return "some-layers"


def _transfer_pages(indices: Sequence[int], page_size: int) -> list[int]:
    """Pages the index list touches, in transfer order (first occurrence)."""
    seen: dict[int, None] = {}
    for index in indices:
        seen.setdefault(index // page_size, None)
    return list(seen)


def _page_role(case: Case, side: str, row: int, component: str, rows_per_layer: dict[str, int]) -> str:
    """Which page of the transfer the first differing row belongs to."""
    indices = case.host_indices if side == "host" else case.device_indices
    pages = _transfer_pages(indices, case.page_size)
    page = row // case.page_size
    if page not in pages:
        return "padding-page" if side == "device" and page == 0 else "unaddressed-page"
    # Every addressed row of every differing layer wrong: the first differing row's page says nothing more.
    addressed_rows = len(set(indices))
    counts = [n for key, n in rows_per_layer.items() if key.split("/")[0] == component]
    if counts and all(n >= addressed_rows for n in counts):
        return "every-page"
    # A single-page transfer's page counts as its last: tail bugs (64/65/129 pages) are the common class,
    # and this way a last-page bug keeps its role when the minimizer shrinks it to one page.
    if page == pages[-1]:
        return "last-page"
    if page == pages[0]:
        return "first-page"
    return "inner-page"


def _splitmix_byte(raw_offset: int, salt: int) -> int:
    """The byte materialize's fill_pattern put at `raw_offset` of a storage filled with `salt` (the same
    arithmetic, in wrapping int64 torch ops, so it matches bit for bit)."""
    x = torch.tensor([raw_offset // 8], dtype=torch.int64) ^ salt
    x = x * -7046029254386353131
    x = x ^ (x >> 31)
    x = x * -4658895280553007687
    x = x ^ (x >> 29)
    return int(x.view(torch.uint8)[raw_offset % 8])


def _written_role(case: Case, pool_number: int, side: str, raw_offset: int, actual_byte: int) -> str:
    """'stale' if the differing destination byte still holds its pre-transfer fill, else 'overwritten'."""
    from hicache_fuzz.harness.pipeline.fill import salt as _salt  # the fill's salt recipe: one definition, reused

    source_side = "device" if case.direction is Direction.WRITE_BACK else "host"
    role = "source" if side == source_side else "destination"
    pool = case.pools[pool_number]
    before = _splitmix_byte(raw_offset, _salt(case.seed, pool_number, pool.name, side, role))
    return "stale" if before == actual_byte else "overwritten"


def mismatch_role(result: Result, case: Case | None) -> str:
    storages = result.diff.get("storages", [])
    if not storages:
        return "mismatch"
    first = storages[0]
    pool_name, _, side = str(first.get("storage", "?/?")).partition("/")
    location = first.get("location", {})
    component = str(location.get("component", "?"))
    region = str(first.get("region", "?"))
    where = "outside" if first.get("outside_addressed") else "inside"
    if case is None:
        return f"{side}:{component}:{region}:{where}"
    names = [p.name for p in case.pools]
    if pool_name not in names:
        return f"{side}:{component}:{region}:{where}"
    pool_number = names.index(pool_name)
    pool_role = "anchor" if pool_number == 0 else "side"
    destination = "host" if case.direction is Direction.WRITE_BACK else "device"
    side_role = "dst" if side == destination else "src"
    rows_per_layer = {str(k): int(v) for k, v in first.get("rows_per_layer", {}).items()}
    parts = [f"{pool_role}-{side_role}", component, region, where]
    if region == "payload" and "layer" in location:
        parts.append(_layer_role(case, component, rows_per_layer))
        row = location.get("token", location.get("row"))
        if isinstance(row, int):
            parts.append(_page_role(case, side, row, component, rows_per_layer))
    if side_role == "dst" and where == "inside" and isinstance(first.get("first_offset"), int):
        parts.append(_written_role(case, pool_number, side, int(first["first_offset"]),
                                   int(first.get("actual_byte", -1))))
    return ":".join(parts)


def failure_role(result: Result, case: Case | None = None) -> str:
    if result.outcome is Outcome.MISMATCH:
        return mismatch_role(result, case)
    if result.outcome in (Outcome.WRONGLY_REJECTED, Outcome.CRASH, Outcome.HANG):
        return normalize_error(result.error)
    if result.outcome is Outcome.WRONGLY_ACCEPTED:
        return normalize_error(result.prediction)
    if result.outcome is Outcome.UNEXPECTED_PATH:
        return f"{result.expected_path}->{result.path}"
    return ""


def signature_key(result: Result, case: Case | None = None) -> str:
    """The readable key the signature hashes: backend|path|outcome|role."""
    path = result.path or result.expected_path
    return "|".join((result.backend, path, result.outcome.value, failure_role(result, case)))


def signature(result: Result, case: Case | None = None) -> str:
    """A short, filesystem-safe, stable name for the failure's class: ``<backend>-<outcome>-<hash>``.

    Pass the case whenever it is known (mismatch roles need it); every caller in hicache-fuzz does.
    """
    digest = hashlib.sha1(signature_key(result, case).encode()).hexdigest()[:10]
    safe_backend = re.sub(r"[^A-Za-z0-9_.-]", "_", result.backend)
    return f"{safe_backend}-{result.outcome.value}-{digest}"
