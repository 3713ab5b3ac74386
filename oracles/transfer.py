"""The expected result of a transfer, computed over uint8 views (numpy on the CPU, torch on a device).

Two semantics families exist in sglang 0.5.23 (docs/semantics.md section 5):

* per-token: for every i, row h[i] of the host and row d[i] of the device correspond;
* page-granular: only the first index of each page counts and whole pages move. The staged write-back
  moves host rows ``h[j*ps] + t``; page_first_direct moves host page ``h[j*ps] // ps``; the page-unified
  write-back takes page ids on both sides.

Page-granular transfers are per-token transfers over *expanded* index lists, so the oracle expands the lists
(:func:`token_pairs`) and then runs one per-token scatter. The scatter moves whole chunks (rows, or head
chunks of split layouts) as words of the widest size that every chunk start is a multiple of
(:func:`chunk_copies`); the per-byte form (:func:`byte_pairs`) is derived from the same chunks. The storages
are named ``"<pool>/device"`` and ``"<pool>/host"`` and hold payload bytes only (guards are the comparator's
business).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch

from hicache_fuzz.harness.model.case import Case, Direction
from hicache_fuzz.oracles import layouts


class Semantics(str, Enum):
    PER_TOKEN = "per_token"
    PAGE_RUNS = "page_runs"  # staged lf->pf: first index of each page, runs not aligned
    PAGE_ALIGNED_HOST = "page_aligned_host"  # page_first_direct: host page = first host index // ps
    PAGE_ALIGNED = "page_aligned"  # page-unified write-back: page ids on both sides


def storage_key(pool_name: str, side: str) -> str:
    return f"{pool_name}/{side}"


def token_pairs(case: Case, semantics: Semantics) -> tuple[torch.Tensor, torch.Tensor]:
    """(host tokens, device rows) that correspond under `semantics`, as int64 tensors of equal length.

    For page-granular semantics the lists are truncated to whole pages (a partial last page is a contract
    violation, judged elsewhere) and expanded to every token of every page.
    """
    host_tokens, device_rows = token_pairs_numpy(case, semantics)
    return torch.from_numpy(host_tokens), torch.from_numpy(device_rows)


def token_pairs_numpy(case: Case, semantics: Semantics) -> tuple[np.ndarray, np.ndarray]:
    """:func:`token_pairs` as int64 numpy arrays (the oracle's own form: numpy calls cost less than torch's)."""
    h = np.asarray(case.host_indices, dtype=np.int64)
    d = np.asarray(case.device_indices, dtype=np.int64)
    if semantics is Semantics.PER_TOKEN:
        return h, d
    ps = case.page_size
    pages = min(len(h), len(d)) // ps
    first_h, first_d = h[: pages * ps : ps], d[: pages * ps : ps]
    if semantics in (Semantics.PAGE_ALIGNED_HOST, Semantics.PAGE_ALIGNED):
        first_h = first_h // ps * ps
    if semantics is Semantics.PAGE_ALIGNED:
        first_d = first_d // ps * ps
    offsets = np.arange(ps, dtype=np.int64)
    return (first_h[:, None] + offsets).reshape(-1), (first_d[:, None] + offsets).reshape(-1)


def destination_side(case: Case) -> str:
    return "host" if case.direction is Direction.WRITE_BACK else "device"


@dataclass(frozen=True)
class ChunkCopy:
    """Equal-width chunk moves inside one pool: for every i, the `width` bytes at destination_starts[i] of the
    pool's destination payload become the `width` bytes at source_starts[i] of its source payload."""

    pool: str
    source_starts: np.ndarray  # int64 [m], payload byte offsets
    destination_starts: np.ndarray  # int64 [m]
    width: int


def chunk_copies(case: Case, semantics: Semantics) -> list[ChunkCopy]:
    """The whole transfer as a few chunk copies (one per pool and chunk width), in pair order.

    Host rows come as chunks (layouts.host_row_chunks); device rows are contiguous, so each is split into the
    same number of chunks. Different (layer, component) pairs never share destination bytes, so grouping them
    keeps "the last pair wins" for repeated destinations within one (layer, component).
    """
    host_tokens, device_rows = token_pairs_numpy(case, semantics)
    layers = np.asarray(case.moved_layers, dtype=np.int64)
    write_back = case.direction is Direction.WRITE_BACK
    copies: list[ChunkCopy] = []
    for pool in case.pools:
        by_width: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for component in pool.components:
            host_starts, width = layouts.host_row_chunks(case, pool, component, layers, host_tokens)
            device_starts, _ = layouts.device_row_chunks(case, pool, component, layers, device_rows)
            chunks = host_starts.shape[-1]
            if chunks > 1:
                device_starts = device_starts + np.arange(chunks, dtype=np.int64) * width
            sources, destinations = by_width.setdefault(width, ([], []))
            sources.append((device_starts if write_back else host_starts).reshape(-1))
            destinations.append((host_starts if write_back else device_starts).reshape(-1))
        for width, (sources, destinations) in by_width.items():
            source = sources[0] if len(sources) == 1 else np.concatenate(sources)
            destination = destinations[0] if len(destinations) == 1 else np.concatenate(destinations)
            copies.append(ChunkCopy(pool.name, source, destination, width))
    return copies


def apply_chunk_copies(case: Case, copies: list[ChunkCopy], sources: dict[str, torch.Tensor],
                       destinations: dict[str, torch.Tensor]) -> None:
    """Perform `copies` in place on `destinations` (payload tensors keyed by storage) reading `sources`.

    Source and destination of one copy must be different tensors on one device. CPU tensors are moved with
    numpy (cheaper per call); others with torch indexing on their own device.
    """
    src_side = "device" if case.direction is Direction.WRITE_BACK else "host"
    dst_side = destination_side(case)
    for copy in copies:
        if copy.source_starts.size == 0:
            continue
        source = sources[storage_key(copy.pool, src_side)]
        destination = destinations[storage_key(copy.pool, dst_side)]
        _move_chunks(source, copy.source_starts, destination, copy.destination_starts, copy.width)


def _move_chunks(source: torch.Tensor, source_starts: np.ndarray, destination: torch.Tensor,
                 destination_starts: np.ndarray, width: int) -> None:
    # Move whole `unit`-byte words: the largest unit dividing the width and every start, so both payloads can
    # be viewed as [-1, unit] rows (a byte-by-byte gather is the unit == 1 fallback).
    unit = math.gcd(width, int(np.gcd.reduce(source_starts)), int(np.gcd.reduce(destination_starts)))
    per_chunk = width // unit
    source_rows, destination_rows = source_starts // unit, destination_starts // unit
    if per_chunk > 1:
        step = np.arange(per_chunk, dtype=np.int64)
        source_rows = (source_rows[:, None] + step).reshape(-1)
        destination_rows = (destination_rows[:, None] + step).reshape(-1)
    if source.device.type == "cpu" and destination.device.type == "cpu":
        source_words = source.numpy()[: source.numel() // unit * unit].reshape(-1, unit)
        destination_words = destination.numpy()[: destination.numel() // unit * unit].reshape(-1, unit)
        destination_words[destination_rows] = source_words[source_rows]
        return
    device = destination.device
    source_view = source[: source.numel() // unit * unit].view(-1, unit)
    destination_view = destination[: destination.numel() // unit * unit].view(-1, unit)
    gathered = source_view[_rows_on(source_rows, source.device)]
    destination_view[_rows_on(destination_rows, device)] = gathered.to(device)


# Row lists up to this size are staged in pinned memory (torch's caching host allocator keeps a block until the
# copy from it ran, so the host does not wait for the GPU); larger ones are copied from where they are: pinning
# megabytes of fresh sizes costs more than the wait (it tripled the oracle's stage on a GPU).
PINNED_ROWS_MAX_BYTES = 1 << 18


def _rows_on(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    values = torch.from_numpy(rows)
    if values.nbytes <= PINNED_ROWS_MAX_BYTES:
        values = values.pin_memory()
    return values.to(device, non_blocking=True)


def byte_pairs(case: Case, semantics: Semantics) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each pool: (source byte offsets, destination byte offsets), flat int64, aligned pairwise."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
        pool.name: (torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)) for pool in case.pools
    }
    for copy in chunk_copies(case, semantics):
        source = torch.from_numpy(layouts.chunk_bytes(copy.source_starts[:, None], copy.width).reshape(-1))
        destination = torch.from_numpy(layouts.chunk_bytes(copy.destination_starts[:, None], copy.width).reshape(-1))
        previous_source, previous_destination = out[copy.pool]
        out[copy.pool] = (torch.cat([previous_source, source]), torch.cat([previous_destination, destination]))
    return out


def expected_storages(case: Case, before: dict[str, torch.Tensor], semantics: Semantics) -> dict[str, torch.Tensor]:
    """The payload bytes of every storage after a correct transfer, given their bytes before it.

    `before` maps storage keys to flat uint8 tensors; it is not modified. The source side is expected
    unchanged. Preconditions (indices in range, unique destinations) are the contract's to check first:
    with duplicate destinations the last pair wins here (on the CPU).
    """
    expected = {key: value.clone() for key, value in before.items()}
    apply_chunk_copies(case, chunk_copies(case, semantics), before, expected)
    return expected


def addressed_destination_bytes(case: Case, semantics: Semantics) -> dict[str, torch.Tensor]:
    """Flat destination byte offsets each pool's transfer is allowed to write, keyed by storage."""
    dst_side = destination_side(case)
    return {storage_key(name, dst_side): dst for name, (_, dst) in byte_pairs(case, semantics).items()}
