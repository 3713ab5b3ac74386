"""Byte-level copies for the bug zoo: misplaced host chunks and skipped bytes of a row, the way a buggy kernel
would move them (shared by the mutants of :mod:`hicache_fuzz.kernels.zoo`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache_fuzz.harness.model.case import Direction
from hicache_fuzz.kernels.buffers import PoolBuffers
from hicache_fuzz.kernels.reference import ReferenceBackend


def host_chunk_starts(backend: ReferenceBackend, pool: PoolBuffers, component: str, layer: int,
                      host: list[int]) -> torch.Tensor:
    """Byte offsets into the host payload of every contiguous chunk of each host row: shape [n, chunks].

    A row is one chunk per head (heads may be scattered, e.g. page_head) or a single chunk (MLA
    page_unified). Derived from the strides of the reference's own typed host view.
    """
    rows = backend.host_rows(pool, component, layer)
    if rows.stride(-1) != 1:
        raise AssertionError("host rows must be contiguous in their innermost dimension")
    itemsize = rows.element_size()
    ps = pool.case.page_size
    h = torch.tensor(host, dtype=torch.int64)
    page, slot = h // ps, h % ps
    base = rows.storage_offset() * itemsize - pool.host.payload.storage_offset()
    starts = base + (page * rows.stride(0) + slot * rows.stride(1)) * itemsize
    if rows.dim() == 3:  # (P, ps, width): the row is one chunk
        return starts[:, None]
    heads = torch.arange(rows.shape[2], dtype=torch.int64) * rows.stride(2) * itemsize
    return starts[:, None] + heads[None, :]


def copy_bytes(backend: ReferenceBackend, pool: PoolBuffers, component: str, layer: int, host: list[int],
               device: list[int], *, remap_chunk_start: Callable[[torch.Tensor], torch.Tensor] | None = None,
               copied_columns: torch.Tensor | None = None) -> None:
    """A byte-level row copy that can misplace host chunks or skip bytes of a row, the way a kernel would.

    ``remap_chunk_start`` maps the true payload offsets of the host chunks to the ones the buggy kernel
    computes; ``copied_columns`` lists the byte positions (0..row_bytes-1, device row order) it copies.
    """
    if not host:
        return
    row_bytes = pool.spec.row_bytes(component)
    starts = host_chunk_starts(backend, pool, component, layer, host)
    if remap_chunk_start is not None:
        starts = remap_chunk_start(starts)
    n, chunks = starts.shape
    width = row_bytes // chunks
    host_bytes = (starts[:, :, None] + torch.arange(width, dtype=torch.int64)).reshape(n, row_bytes)
    columns = copied_columns if copied_columns is not None else torch.arange(row_bytes, dtype=torch.int64)
    payload = pool.host.payload
    dev = pool.device_layer(component, layer)
    d = torch.tensor(device, dtype=torch.int64, device=dev.device)
    cols_dev = columns.to(dev.device)
    if pool.case.direction is Direction.WRITE_BACK:
        payload[host_bytes[:, columns]] = dev[d][:, cols_dev].to(payload.device)
    else:
        dev[d[:, None], cols_dev[None, :]] = payload[host_bytes[:, columns]].to(dev.device)
