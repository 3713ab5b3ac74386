"""The expected result of a transfer, computed in pure PyTorch over uint8 views.

Two semantics families exist in sglang 0.5.23 (hicache_semantics.md 5.2-5.5):

* per-token: for every i, row h[i] of the host and row d[i] of the device correspond;
* page-granular: only the first index of each page counts and whole pages move. The staged write-back
  moves host rows ``h[j*ps] + t``; page_first_direct moves host page ``h[j*ps] // ps``; the page-unified
  write-back takes page ids on both sides.

Page-granular transfers are per-token transfers over *expanded* index lists, so the oracle expands the lists
(:func:`token_pairs`) and then runs one per-token scatter. The storages are named ``"<pool>/device"`` and
``"<pool>/host"`` and hold payload bytes only (guards are the comparator's business).
"""

from __future__ import annotations

from enum import Enum

import torch

from hicache_fuzz.harness.case import Case, Direction
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
    h = torch.tensor(case.host_indices, dtype=torch.int64)
    d = torch.tensor(case.device_indices, dtype=torch.int64)
    if semantics is Semantics.PER_TOKEN:
        return h, d
    ps = case.page_size
    pages = min(len(h), len(d)) // ps
    first_h, first_d = h[: pages * ps : ps], d[: pages * ps : ps]
    if semantics in (Semantics.PAGE_ALIGNED_HOST, Semantics.PAGE_ALIGNED):
        first_h = torch.div(first_h, ps, rounding_mode="floor") * ps
    if semantics is Semantics.PAGE_ALIGNED:
        first_d = torch.div(first_d, ps, rounding_mode="floor") * ps
    offsets = torch.arange(ps, dtype=torch.int64)
    return (first_h[:, None] + offsets).reshape(-1), (first_d[:, None] + offsets).reshape(-1)


def destination_side(case: Case) -> str:
    return "host" if case.direction is Direction.WRITE_BACK else "device"


def byte_pairs(case: Case, semantics: Semantics) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each pool: (source byte offsets, destination byte offsets), flat int64, aligned pairwise."""
    host_tokens, device_rows = token_pairs(case, semantics)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for pool in case.pools:
        src_parts: list[torch.Tensor] = []
        dst_parts: list[torch.Tensor] = []
        for layer in case.moved_layers:
            for component in pool.components:
                host = layouts.host_row_bytes(case, pool, component, layer, host_tokens).reshape(-1)
                dev = layouts.device_row_bytes(case, pool, component, layer, device_rows).reshape(-1)
                if case.direction is Direction.WRITE_BACK:
                    src_parts.append(dev)
                    dst_parts.append(host)
                else:
                    src_parts.append(host)
                    dst_parts.append(dev)
        empty = torch.empty(0, dtype=torch.int64)
        out[pool.name] = (torch.cat(src_parts) if src_parts else empty, torch.cat(dst_parts) if dst_parts else empty)
    return out


def expected_storages(case: Case, before: dict[str, torch.Tensor], semantics: Semantics) -> dict[str, torch.Tensor]:
    """The payload bytes of every storage after a correct transfer, given their bytes before it.

    `before` maps storage keys to flat uint8 CPU tensors; it is not modified. The source side is expected
    unchanged. Preconditions (indices in range, unique destinations) are the contract's to check first:
    with duplicate destinations the last pair wins here.
    """
    expected = {key: value.clone() for key, value in before.items()}
    src_side = "device" if case.direction is Direction.WRITE_BACK else "host"
    dst_side = destination_side(case)
    for pool_name, (src_bytes, dst_bytes) in byte_pairs(case, semantics).items():
        source = before[storage_key(pool_name, src_side)]
        expected[storage_key(pool_name, dst_side)][dst_bytes] = source[src_bytes]
    return expected


def addressed_destination_bytes(case: Case, semantics: Semantics) -> dict[str, torch.Tensor]:
    """Flat destination byte offsets each pool's transfer is allowed to write, keyed by storage."""
    dst_side = destination_side(case)
    return {storage_key(name, dst_side): dst for name, (_, dst) in byte_pairs(case, semantics).items()}
