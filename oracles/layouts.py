"""Where every byte lives: the one place that knows the host and device layouts.

Every other part of hicache-fuzz (materialize, the oracle, the mismatch locator) asks this module where the
bytes of a (component, layer, token) row are. Facts: docs/semantics.md sections 1 and 2.

Storage model (per pool):

* Device: one byte storage holding, for each component c in pool.components, ``layers`` blocks of
  ``device_rows`` rows of ``row_bytes(c)`` bytes. Row (c, l, r) starts at
  ``device_base(c) + (l * device_rows + r) * row_bytes(c)``.
* Host: one byte storage in the pool's host layout. MHA pools have a K half then a V half (the V half starts
  after ``layers * host_slots * row_bytes('k')`` bytes) except page_unified, which interleaves K and V per
  page. A row is one contiguous chunk, except page_head and MHA page_unified, which split it into one chunk
  per head (``head_bytes`` each) scattered through the page.

All offsets are int64 byte offsets into the payload (guard bytes excluded).
"""

from __future__ import annotations

import numpy as np
import torch

from hicache_fuzz.harness.model.case import Attention, Case, HostLayout, PoolSpec


def component_index(pool: PoolSpec, component: str) -> int:
    return pool.components.index(component)


# ---- sizes -------------------------------------------------------------------------------------------

def device_component_bytes(case: Case, pool: PoolSpec, component: str) -> int:
    return case.layers * case.device_rows * pool.row_bytes(component)


def device_base(case: Case, pool: PoolSpec, component: str) -> int:
    base = 0
    for c in pool.components:
        if c == component:
            return base
        base += device_component_bytes(case, pool, c)
    raise KeyError(component)


def device_bytes(case: Case, pool: PoolSpec) -> int:
    return sum(device_component_bytes(case, pool, c) for c in pool.components)


def host_component_bytes(case: Case, pool: PoolSpec, component: str) -> int:
    return case.layers * case.host_slots * pool.row_bytes(component)


def host_base(case: Case, pool: PoolSpec, component: str) -> int:
    """Start of `component`'s half of the host storage (0 for layouts that interleave K and V)."""
    if case.layout is HostLayout.PAGE_UNIFIED:
        return 0
    base = 0
    for c in pool.components:
        if c == component:
            return base
        base += host_component_bytes(case, pool, c)
    raise KeyError(component)


def host_bytes(case: Case, pool: PoolSpec) -> int:
    return sum(host_component_bytes(case, pool, c) for c in pool.components)


# ---- shapes of the typed views that backends receive (sglang's own tensor shapes) -------------------

def host_shape(case: Case, pool: PoolSpec) -> tuple[int, ...]:
    """Shape of the typed host tensor in sglang's convention (pool_host/mha.py, mla.py)."""
    L, S, ps, P = case.layers, case.host_slots, case.page_size, case.host_pages
    H, D, G = pool.heads, pool.head_dim, pool.head_groups
    layout = case.layout
    if pool.attention is Attention.MLA:
        return {
            HostLayout.LAYER_FIRST: (L, S, 1, D),
            HostLayout.PAGE_FIRST: (S, L, 1, D),
            HostLayout.PAGE_FIRST_DIRECT: (P, L, ps, 1, D),
            HostLayout.PAGE_UNIFIED: (P, L, ps, D),
        }[layout]
    if pool.attention is Attention.MHA_ASYM:
        raise ValueError("asymmetric pools have separate K and V host tensors; use host_component_shape")
    return {
        HostLayout.LAYER_FIRST: (2, L, S, H, D),
        HostLayout.PAGE_FIRST: (2, S, L, H, D),
        HostLayout.PAGE_FIRST_DIRECT: (2, P, L, ps, H, D),
        HostLayout.PAGE_HEAD: (2, P, H, ps, L, D),
        HostLayout.PAGE_UNIFIED: (P, G, L, 2, ps, H // G, D),
    }[layout]


def host_component_shape(case: Case, pool: PoolSpec, component: str) -> tuple[int, ...]:
    """Shape of one component's host tensor for layouts with separate K/V halves."""
    L, S, ps, P = case.layers, case.host_slots, case.page_size, case.host_pages
    H = pool.heads
    D = pool.head_bytes(component) // pool.dtype.itemsize
    if case.layout is HostLayout.PAGE_UNIFIED:
        raise ValueError("page_unified interleaves K and V; use host_shape")
    return {
        HostLayout.LAYER_FIRST: (L, S, H, D),
        HostLayout.PAGE_FIRST: (S, L, H, D),
        HostLayout.PAGE_FIRST_DIRECT: (P, L, ps, H, D),
        HostLayout.PAGE_HEAD: (P, H, ps, L, D),
    }[case.layout]


# ---- chunk maps (the layout math) and the byte maps derived from them ---------------------------------
#
# A row is a few contiguous chunks (one for most layouts, one per head for page_head and MHA page_unified).
# The chunk form is the only place the layout arithmetic lives; it is vectorized over layers as well as
# tokens and uses numpy because per-operation overhead dominates the small cases a fuzzer mostly runs. The
# byte form (one int64 offset per byte) is derived from it for the locator and for tests.

def host_row_chunks(case: Case, pool: PoolSpec, component: str, layers: np.ndarray,
                    tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """Chunk starts (int64, shape [len(layers), n, chunks]) of host rows (component, layers[j], tokens[i]) and
    the chunk width in bytes; chunks are in row order, so a row's bytes are its chunks one after another."""
    t = tokens.astype(np.int64, copy=False)[None, :]
    layer = layers.astype(np.int64, copy=False)[:, None]
    L, S, ps = case.layers, case.host_slots, case.page_size
    E = pool.row_bytes(component)
    Dh = pool.head_bytes(component)
    H = pool.heads
    base = host_base(case, pool, component)
    layout = case.layout
    page, slot = t // ps, t % ps
    if layout is HostLayout.LAYER_FIRST:
        return (base + (layer * S + t) * E)[:, :, None], E
    if layout is HostLayout.PAGE_FIRST:
        return (base + (t * L + layer) * E)[:, :, None], E
    if layout is HostLayout.PAGE_FIRST_DIRECT or (
        layout is HostLayout.PAGE_UNIFIED and pool.attention is Attention.MLA
    ):
        return (base + (page * L * ps + layer * ps + slot) * E)[:, :, None], E
    heads = np.arange(H, dtype=np.int64)[None, None, :]
    page3, slot3, layer3 = page[:, :, None], slot[:, :, None], layer[:, :, None]
    if layout is HostLayout.PAGE_HEAD:
        # per head h: (((page*H + h)*ps + slot) * L + layer) * Dh
        return base + ((page3 * H + heads) * ps + slot3) * L * Dh + layer3 * Dh, Dh
    if layout is HostLayout.PAGE_UNIFIED:
        G = pool.head_groups
        per_group = H // G
        group, head_in_group = heads // per_group, heads % per_group
        c = component_index(pool, component)
        block = (((page3 * G + group) * L + layer3) * 2 + c) * ps + slot3
        return block * per_group * Dh + head_in_group * Dh, Dh
    raise AssertionError(layout)


def device_row_chunks(case: Case, pool: PoolSpec, component: str, layers: np.ndarray,
                      rows: np.ndarray) -> tuple[np.ndarray, int]:
    """Chunk starts (int64, shape [len(layers), n, 1]) of device rows (component, layers[j], rows[i]) and the
    chunk width (the row width: device rows are contiguous)."""
    E = pool.row_bytes(component)
    layer = layers.astype(np.int64, copy=False)[:, None]
    base = device_base(case, pool, component) + layer * case.device_rows * E
    return (base + rows.astype(np.int64, copy=False)[None, :] * E)[:, :, None], E


def page_unified_chunk(case: Case, pool: PoolSpec, layer_range: tuple[int, int],
                       group: int) -> tuple[int, int] | None:
    """Byte (offset, length), within one page block of a page_unified pool, of the L3 chunk of head group `group`
    over the layers [start, end) of `layer_range`: the bytes of every row (component, layer in the range, token of
    the page) restricted to the group's heads (MLA: whole rows, one group). None where the range names no chunk:
    an empty range, one outside the pool's layers, or a group outside its head groups.

    Taken from the host row chunks of page 0 (a page block starts at offset 0 of its page): within one head group's
    block the offsets grow with (layer, component, slot, head), so the chunk's first byte is that of its first row's
    first head and its last that of its last row's last head. That the layout keeps the chunk as one run is checked
    here: the span must hold exactly the chunk's bytes."""
    start, end = layer_range
    groups = pool.head_groups
    if not (0 <= start < end <= case.layers and 0 <= group < groups):
        return None
    ps = case.page_size
    first, width = host_row_chunks(case, pool, pool.components[0], np.array([start]), np.array([0]))
    last, _ = host_row_chunks(case, pool, pool.components[-1], np.array([end - 1]), np.array([ps - 1]))
    per_group = first.shape[-1] // groups  # chunks a group's row splits into: its heads (MHA), one (MLA)
    offset = int(first[0, 0, group * per_group])
    length = int(last[0, 0, (group + 1) * per_group - 1]) + width - offset
    moved = (end - start) * len(pool.components) * ps * per_group * width
    if length != moved:
        raise AssertionError(f"oracle: the page_unified chunk of layers {layer_range}, group {group} spans {length} "
                             f"bytes for {moved} bytes of rows: not one run")
    return offset, length


def chunk_bytes(starts: np.ndarray, width: int) -> np.ndarray:
    """[..., chunks] chunk starts -> [..., chunks * width] byte offsets, chunk by chunk."""
    offsets = starts[..., None] + np.arange(width, dtype=np.int64)
    return offsets.reshape(*starts.shape[:-1], starts.shape[-1] * width)


def host_row_bytes(case: Case, pool: PoolSpec, component: str, layer: int, tokens: torch.Tensor) -> torch.Tensor:
    """Byte offsets (int64, shape [n, row_bytes]) of host rows (component, layer, tokens[i])."""
    starts, width = host_row_chunks(case, pool, component, np.array([layer], dtype=np.int64), _numpy(tokens))
    return torch.from_numpy(chunk_bytes(starts[0], width))


def device_row_bytes(case: Case, pool: PoolSpec, component: str, layer: int, rows: torch.Tensor) -> torch.Tensor:
    """Byte offsets (int64, shape [n, row_bytes]) of device rows (component, layer, rows[i])."""
    starts, width = device_row_chunks(case, pool, component, np.array([layer], dtype=np.int64), _numpy(rows))
    return torch.from_numpy(chunk_bytes(starts[0], width))


def row_bytes_of(case: Case, pool: PoolSpec, side: str, component: str, layer: int,
                 rows: torch.Tensor) -> torch.Tensor:
    """host_row_bytes or device_row_bytes, by storage side ("host" or "device")."""
    return (host_row_bytes if side == "host" else device_row_bytes)(case, pool, component, layer, rows)


def rows_of_side(case: Case, side: str) -> int:
    """How many rows (host slots or device rows) one layer of one component has on `side`."""
    return case.host_slots if side == "host" else case.device_rows


def _numpy(indices: torch.Tensor) -> np.ndarray:
    return indices.detach().to("cpu", torch.int64).numpy()
