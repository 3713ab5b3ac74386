"""Index variants: more transfers per generated geometry, at the speed of the kernels.

Drawing a case (geometry, knobs, indices; the mix's candidates and the pairwise pins) costs milliseconds of
Python, and a fresh case costs the worker an allocation and a fill of every storage. A kernel call costs
microseconds. So after each generated case the feed adds ``count`` variants of it: the same geometry, knobs and
storages, new index values and a new fill seed. The worker runs a variant on the storages the previous case of
the same geometry left behind (harness/pipeline/reuse.py): it re-fills only the source storages, so each
variant still moves freshly address-tagged bytes, and compares every byte of every storage as always.

A variant moves each side's index list somewhere else in its pool, in one of two ways, and keeps what the
contract looks at: the list's length, which entries are equal, each entry's offset inside its page, the runs a
page-granular kernel reads from the first entry of each page-sized chunk, in-range and out-of-range entries,
and page 0 (sglang's padding page on the device). Only entries in whole pages other than page 0 move; the
others (page 0, a partial last page, negative and out-of-range values) stay, and a list where one page-sized
chunk would mix moving and staying entries does not change at all.

* When every page-sized chunk of the list lies inside one page, each page the list touches goes to a distinct
  random page (a relabeling: the pages' order and spacing change).
* Otherwise (chunks that straddle pages), the moving entries shift together by a random whole number of pages
  that keeps them, and the rows a chunk's first entry covers, inside the pool.

So a variant is of its case's class in practice (a transfer stays a transfer; tests check the verdicts over
generated cases for every entry point); the runner predicts every variant anyway.

A variant is an ordinary case: its own id, JSON and reproducer. Its ``note`` names the case it came from.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from hicache_fuzz.harness.model.case import INDEX_LIMIT, Case

VARIANT_NOTE = "index variant"


def index_variant(case: Case, number: int, case_id: str | None = None) -> Case:
    """Variant `number` (1, 2, ...) of `case`: a pure function of the case's content and the number. `case_id`
    is the case's id when the caller has it (computing it hashes the whole case)."""
    case_id = case_id or case.case_id
    rng = random.Random(f"hicache-fuzz-variant:{case_id}:{number}")
    host = relabel_pages(case.host_indices, case.host_slots, case.page_size, rng)
    device = relabel_pages(case.device_indices, case.device_rows, case.page_size, rng)
    seed = rng.randrange(-INDEX_LIMIT + 1, INDEX_LIMIT)
    return case.replace(host_indices=host, device_indices=device, seed=seed,
                        note=f"{VARIANT_NOTE} {number} of {case_id}")


def index_variants(case: Case, count: int) -> list[Case]:
    """Variants 1..count of `case`."""
    case_id = case.case_id
    return [index_variant(case, number, case_id) for number in range(1, count + 1)]


def relabel_pages(values: Sequence[int], rows: int, page_size: int, rng: random.Random) -> tuple[int, ...]:
    """`values` (one side's index list, for a `rows`-row pool) moved as the module docstring says."""
    ps = page_size
    whole_pages = rows // ps
    if whole_pages <= 2 or not values:
        return tuple(values)
    v = np.asarray(values, dtype=np.int64)
    moving = (v >= ps) & (v < whole_pages * ps)
    if not moving.any():
        return tuple(values)
    # Page-sized chunks of the list (the last one padded with entries that count as neither).
    pad = -v.size % ps
    real = np.concatenate([np.ones(v.size, dtype=bool), np.zeros(pad, dtype=bool)]).reshape(-1, ps)
    chunk_moving = np.concatenate([moving, np.zeros(pad, dtype=bool)]).reshape(-1, ps)
    some = chunk_moving.any(axis=1)
    if (some & ~(chunk_moving | ~real).all(axis=1)).any():
        return tuple(values)  # a chunk mixing moving and staying entries: any move would change what it reads
    pages = v // ps
    chunk_pages = np.concatenate([pages, np.zeros(pad, dtype=np.int64)]).reshape(-1, ps)
    chunk_pages = np.where(real, chunk_pages, chunk_pages[:, :1])
    out = v.copy()
    if ((chunk_pages.min(axis=1) == chunk_pages.max(axis=1)) | ~some).all():
        touched = np.unique(pages[moving])
        draw = np.random.default_rng(rng.getrandbits(64))
        targets = draw.choice(whole_pages - 1, size=touched.size, replace=False).astype(np.int64) + 1
        out[moving] = targets[np.searchsorted(touched, pages[moving])] * ps + v[moving] % ps
    else:
        lowest = int(v[moving].min())
        highest = int(v[moving].max()) + ps - 1  # the rows a run covers
        down, up = lowest // ps - 1, (whole_pages * ps - 1 - highest) // ps
        out[moving] += rng.randint(-max(down, 0), max(up, 0)) * ps
    return tuple(out.tolist())
