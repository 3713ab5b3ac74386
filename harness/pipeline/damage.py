"""Damage: what a mismatching transfer did to the destination, as a relation between expected and observed
rows, not as raw offsets. It is what a failure's bug identity is built from (findings/identity.py).

The address-tagged fill makes every byte self-describing: byte ``i`` of a storage filled with salt ``s`` is
byte ``i % 8`` of ``splitmix64((i // 8) ^ s)``, and splitmix64 can be inverted (up to the two bits its
arithmetic shifts lose). So a wrong destination row can be traced back to the storage, component, layer and
row its bytes came from, and compared with where the oracle says they should have come from:

* ``stale``: the row still holds its pre-transfer fill (a missing write);
* ``partial-row``: the row starts right and ends stale (a truncated copy);
* ``wrong-page`` / ``wrong-token-in-page``: the bytes of another row of the right component and layer;
* ``wrong-layer``, ``swapped-kv`` (another component), ``wrong-pool``: what the names say;
* ``shifted-bytes``: the right row, at the wrong byte offset;
* ``copied-from-destination``: bytes of the destination's own pre-transfer fill from another place;
* ``corrupt``: bytes that come from no storage of the case;
* ``out-of-range-write``: bytes changed outside every addressed row, ``guard-overwrite``: in the guards,
  ``source-modified``: the source storage changed.

When several apply, the primary class is the first in ``DAMAGE_PRIORITY``: the most specific evidence wins.
Its family (``DAMAGE_FAMILY``: missing, misplaced, corrupt, source-modified) is what the bug identity keeps;
the classes go into the finer variant key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hicache_fuzz.harness.model.case import Case, Direction, PoolSpec
from hicache_fuzz.harness.pipeline.fill import SPLITMIX_MULTIPLIER_1, SPLITMIX_MULTIPLIER_2, salt
from hicache_fuzz.kernels.buffers import GUARD_BYTES
from hicache_fuzz.oracles import layouts

DAMAGE_PRIORITY = (
    "source-modified", "guard-overwrite", "out-of-range-write", "wrong-pool", "swapped-kv", "wrong-layer",
    "wrong-page", "wrong-token-in-page", "shifted-bytes", "copied-from-destination", "untraced", "partial-row",
    "stale", "corrupt",
)
# The family of each class: what a bug identity keeps. A misdirected write lands inside or outside the
# addressed rows, in another page or another layer, depending on the case's geometry; the family does not.
DAMAGE_FAMILY = {
    "source-modified": "source-modified",
    "guard-overwrite": "misplaced", "out-of-range-write": "misplaced", "wrong-pool": "misplaced",
    "swapped-kv": "misplaced", "wrong-layer": "misplaced", "wrong-page": "misplaced",
    "wrong-token-in-page": "misplaced", "shifted-bytes": "misplaced", "copied-from-destination": "misplaced",
    "untraced": "misplaced",  # bytes of another place, in a stretch too short to say which
    "corrupt": "corrupt",
    "partial-row": "missing", "stale": "missing",
}
SAMPLED_ROWS = 32  # differing rows traced per storage: enough to see the pattern, cheap on huge storages
TRACE_LIMIT_BYTES = 64 << 20  # storages larger than this are classified without row tracing

_MASK = (1 << 64) - 1
_INVERSE_1 = pow(SPLITMIX_MULTIPLIER_1 & _MASK, -1, 1 << 64)
_INVERSE_2 = pow(SPLITMIX_MULTIPLIER_2 & _MASK, -1, 1 << 64)


@dataclass(frozen=True)
class RowOrigin:
    """Where a row's bytes came from: a storage key and the (component, layer, row, byte) in it."""

    storage: str
    component: str
    layer: int
    row: int
    byte: int


# ---- the fill, forwards and backwards (unsigned 64-bit Python ints) ------------------------------------------

def _signed_shift_xor(x: int, shift: int) -> int:
    signed = x - (1 << 64) if x >> 63 else x
    return (x ^ (signed >> shift)) & _MASK


def fill_word(word_index: int, fill_salt: int) -> int:
    """The 8 bytes (as an unsigned little-endian int) fill_pattern writes at word `word_index`."""
    x = (word_index ^ fill_salt) & _MASK
    x = (x * SPLITMIX_MULTIPLIER_1) & _MASK
    x = _signed_shift_xor(x, 31)
    x = (x * SPLITMIX_MULTIPLIER_2) & _MASK
    return _signed_shift_xor(x, 29)


def _unshift_xor(y: int, shift: int) -> list[int]:
    """Every x with x ^ (x >>arith shift) == y: the top bit is lost, so try both."""
    found = []
    for top in (0, 1):
        x = top << 63
        for bit in range(62, -1, -1):
            source = bit + shift
            shifted = (x >> source) & 1 if source <= 63 else top
            x |= (((y >> bit) & 1) ^ shifted) << bit
        if _signed_shift_xor(x, shift) == y:
            found.append(x)
    return found


def word_preimages(word: int) -> list[int]:
    """Every (word_index ^ salt) that fill_word maps to `word`."""
    out = []
    for x4 in _unshift_xor(word, 29):
        for x2 in _unshift_xor((x4 * _INVERSE_2) & _MASK, 31):
            out.append((x2 * _INVERSE_1) & _MASK)
    return out


# ---- classification --------------------------------------------------------------------------------------

def storage_salts(case: Case) -> dict[str, int]:
    """The fill salt of every storage of `case`, by storage key (materialize's recipe)."""
    source_side = "device" if case.direction is Direction.WRITE_BACK else "host"
    return {f"{pool.name}/{side}": salt(case.seed, number, pool.name, side,
                                        "source" if side == source_side else "destination")
            for number, pool in enumerate(case.pools) for side in ("device", "host")}


def classify_damage(case: Case, expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor],
                    addressed: dict[str, torch.Tensor], differing: list[str]) -> dict[str, Any]:
    """The damage classes of a mismatch (CPU raw storages, guards included; `differing`: the keys of the
    storages that differ): the primary class, every class seen, and which components were hit."""
    source_side = "device" if case.direction is Direction.WRITE_BACK else "host"
    tracer = _Tracer(case, actual)
    classes: set[str] = set()
    damaged_components: set[str] = set()
    pool_components: set[str] = set()
    for key in differing:
        want, got = expected[key], actual[key]
        if got.shape != want.shape:
            classes.add("corrupt")
            continue
        differs = got != want
        if not bool(differs.any()):
            continue
        pool_name, side = key.split("/")
        if side == source_side:
            classes.add("source-modified")
            continue
        payload_bytes = want.numel() - 2 * GUARD_BYTES
        if bool(differs[:GUARD_BYTES].any() or differs[GUARD_BYTES + payload_bytes :].any()):
            classes.add("guard-overwrite")
        payload_diff = differs[GUARD_BYTES : GUARD_BYTES + payload_bytes]
        allowed = torch.zeros(payload_bytes, dtype=torch.bool)
        offsets = addressed.get(key)
        if offsets is not None:
            allowed[offsets[(offsets >= 0) & (offsets < payload_bytes)]] = True
        if bool((payload_diff & ~allowed).any()):
            classes.add("out-of-range-write")
        pool = next(p for p in case.pools if p.name == pool_name)
        pool_components.update(pool.components)
        for component, layer, row, row_offsets in _differing_rows(case, pool, side, payload_diff & allowed):
            damaged_components.add(component)
            if want.numel() <= TRACE_LIMIT_BYTES:
                row_class = _row_class(case, tracer, key, want, got, row_offsets)
                if row_class in ("corrupt", "untraced"):  # bytes gathered from scattered chunks: compare rows
                    row_class = _neighbour_class(case, pool, side, (component, layer, row), want,
                                                 got[row_offsets + GUARD_BYTES]) or row_class
                classes.add(row_class)
    if not classes:
        classes.add("corrupt")
    primary = next(c for c in DAMAGE_PRIORITY if c in classes)
    coverage = "all-components" if damaged_components >= pool_components else "some-components"
    return {"family": DAMAGE_FAMILY[primary], "class": primary,
            "classes": sorted(classes, key=DAMAGE_PRIORITY.index),
            "components": sorted(damaged_components), "component_coverage": coverage}


def _differing_rows(case: Case, pool: PoolSpec, side: str,
                    payload_diff: torch.Tensor) -> Iterator[tuple[str, int, int, torch.Tensor]]:
    """Up to SAMPLED_ROWS (component, layer, row, payload offsets of the row) whose addressed bytes differ."""
    count = layouts.rows_of_side(case, side)
    all_rows = torch.arange(count, dtype=torch.int64)
    found = 0
    for component in pool.components:
        for layer in range(case.layers):
            offsets = layouts.row_bytes_of(case, pool, side, component, layer, all_rows)
            for row in payload_diff[offsets].any(dim=1).nonzero().flatten().tolist():
                yield component, layer, row, offsets[row]
                found += 1
                if found >= SAMPLED_ROWS:
                    return


def _row_class(case: Case, tracer: _Tracer, key: str, want: torch.Tensor, got: torch.Tensor,
               row_offsets: torch.Tensor) -> str:
    raw = row_offsets + GUARD_BYTES
    observed, expected = got[raw], want[raw]
    correct = observed == expected
    stale = torch.from_numpy(fill_bytes_at(raw.numpy(), tracer.salts[key])) == observed
    if bool((correct | stale).all()):  # nothing but right bytes and never-written bytes: a missing write
        return "partial-row" if bool(correct.any()) else "stale"
    # Some bytes came from elsewhere: trace the first contiguous run of the row to where it was filled.
    run = _contiguous_prefix(row_offsets)
    observed_origin, expected_origin = tracer.origin(observed[:run]), tracer.origin(expected[:run])
    if observed_origin is None or expected_origin is None:
        # Too short to trace (under 8 contiguous bytes), or bytes of no storage of the case.
        return "untraced" if run < 16 else "corrupt"
    if observed_origin.storage == key:
        return "copied-from-destination"
    if observed_origin.storage.split("/")[0] != expected_origin.storage.split("/")[0]:
        return "wrong-pool"
    if observed_origin.storage != expected_origin.storage:
        return "copied-from-destination"
    if observed_origin.component != expected_origin.component:
        return "swapped-kv"
    if observed_origin.layer != expected_origin.layer:
        return "wrong-layer"
    if observed_origin.row != expected_origin.row:
        same_page = observed_origin.row // case.page_size == expected_origin.row // case.page_size
        return "wrong-token-in-page" if same_page else "wrong-page"
    if observed_origin.byte != expected_origin.byte:
        return "shifted-bytes"
    return "corrupt"  # the right first bytes, wrong bytes later in the row


def _neighbour_class(case: Case, pool: PoolSpec, side: str, where: tuple[str, int, int], want: torch.Tensor,
                    observed: torch.Tensor) -> str | None:
    """Whether a row holds what the oracle put in a neighbouring row of the same destination: the same row of
    another component, another layer, or a nearby row. It finds misplaced rows that tracing cannot (rows
    gathered from per-head chunks scattered through a page_head or page_unified host page)."""
    component, layer, row = where
    rows = layouts.rows_of_side(case, side)

    def row_of(c: str, lay: int, r: int) -> torch.Tensor | None:
        if not (0 <= r < rows and pool.row_bytes(c) == observed.numel()):
            return None
        index = torch.tensor([r], dtype=torch.int64)
        offsets = layouts.row_bytes_of(case, pool, side, c, lay, index)
        return want[offsets[0] + GUARD_BYTES]

    candidates = [("swapped-kv", c, layer, row) for c in pool.components if c != component]
    candidates += [("wrong-layer", component, other, row) for other in range(case.layers) if other != layer]
    candidates += [("wrong-token-in-page" if abs(delta) < case.page_size else "wrong-page", component, layer,
                    row + delta) for delta in (-1, 1, -case.page_size, case.page_size)]
    for name, c, lay, r in candidates:
        neighbour = row_of(c, lay, r)
        if neighbour is not None and torch.equal(neighbour, observed):
            return name
    return None


def fill_bytes_at(raw_offsets: np.ndarray, fill_salt: int) -> np.ndarray:
    """The fill's byte at each raw offset of a storage filled with `fill_salt` (vectorized fill_word)."""
    with np.errstate(over="ignore"):
        x = (raw_offsets // 8).astype(np.int64) ^ np.int64(fill_salt)
        x = x * np.int64(SPLITMIX_MULTIPLIER_1)
        x ^= x >> 31
        x = x * np.int64(SPLITMIX_MULTIPLIER_2)
        x ^= x >> 29
    shifts = ((raw_offsets % 8) * 8).astype(np.uint64)
    return ((x.view(np.uint64) >> shifts) & np.uint64(0xFF)).astype(np.uint8)


def _contiguous_prefix(offsets: torch.Tensor, limit: int = 16) -> int:
    """How many of the first `limit` offsets run contiguously (a traceable stretch of one chunk)."""
    head = offsets[:limit]
    if head.numel() < 2:
        return int(head.numel())
    steps = (head[1:] - head[:-1]) == 1
    return 1 + int(steps.long().cumprod(0).sum())


class _Tracer:
    """Traces bytes back to the storage and row they were filled into."""

    def __init__(self, case: Case, actual: dict[str, torch.Tensor]) -> None:
        self.case = case
        self.salts = storage_salts(case)
        self.sizes = {key: tensor.numel() for key, tensor in actual.items()}
        self._owners: dict[str, tuple[torch.Tensor, list[str], int]] = {}

    def origin(self, run: torch.Tensor) -> RowOrigin | None:
        """Where a run of up to 16 bytes came from, if it is one stretch of one storage's fill. The run must
        hold a whole aligned word of its source: at least 8 bytes, and 15 for any alignment."""
        data = bytes(run[:16].tolist())
        for shift in range(len(data) - 7):
            word = int.from_bytes(data[shift : shift + 8], "little")
            for preimage in word_preimages(word):
                for key, fill_salt in self.salts.items():
                    start = ((preimage ^ fill_salt) & _MASK) * 8 - shift
                    if not 0 <= start <= self.sizes[key] - len(data):
                        continue
                    filled = fill_bytes_at(np.arange(start, start + len(data), dtype=np.int64), fill_salt)
                    if filled.tobytes() == data:
                        return self._locate(key, start)
        return None

    def _locate(self, key: str, raw_offset: int) -> RowOrigin:
        owners, components, row_bytes = self._owner_map(key)
        payload_offset = raw_offset - GUARD_BYTES
        if not 0 <= payload_offset < owners.numel() or int(owners[payload_offset]) < 0:
            return RowOrigin(key, "?", -1, -1, raw_offset)  # a guard byte, or padding no row owns
        code = int(owners[payload_offset])
        rows = self.case.host_slots if key.endswith("/host") else self.case.device_rows
        code, byte = divmod(code, row_bytes)
        code, row = divmod(code, rows)
        component, layer = divmod(code, self.case.layers)
        return RowOrigin(key, components[component], layer, row, byte)

    def _owner_map(self, key: str) -> tuple[torch.Tensor, list[str], int]:
        """payload offset -> code of (component, layer, row, byte in row), built once per storage."""
        if key not in self._owners:
            pool_name, side = key.split("/")
            pool = next(p for p in self.case.pools if p.name == pool_name)
            count = layouts.rows_of_side(self.case, side)
            rows = torch.arange(count, dtype=torch.int64)
            row_bytes = max(pool.row_bytes(c) for c in pool.components)
            owners = torch.full((self.sizes[key] - 2 * GUARD_BYTES,), -1, dtype=torch.int64)
            for number, component in enumerate(pool.components):
                for layer in range(self.case.layers):
                    offsets = layouts.row_bytes_of(self.case, pool, side, component, layer, rows)
                    width = offsets.shape[1]
                    codes = ((number * self.case.layers + layer) * count + rows).unsqueeze(1) * row_bytes
                    owners[offsets] = codes + torch.arange(width, dtype=torch.int64)
            self._owners[key] = (owners, list(pool.components), row_bytes)
        return self._owners[key]
