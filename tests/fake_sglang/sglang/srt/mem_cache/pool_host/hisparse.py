"""Fake ``HiSparseHostPoolMixin`` (pool_host/hisparse.py): the HiSparse coordinator's page-granular host slots of a
request. ``alloc_paged_token_slots`` grows the request's row of the coordinator's table to whole pages (taking only
the pages it lacks from the pool's allocator) and returns the slots of the asked tokens; ``allocated_host_indices``
returns every slot the row holds (its -1 entries dropped).

``FAKE_SGLANG_POOL_BUG`` plants one of four bugs (those of sglang's mutants in these two functions):

* ``hisparse_len_row``: the new allocated length is written to the row before the request's (``[req - 1]``);
* ``hisparse_pages_squared``: the pages lacking are counted as tokens times the page size (page_size^2 too many);
* ``hisparse_empty_int32``: a request for no tokens returns an empty int32 tensor;
* ``hisparse_slot0``: ``allocated_host_indices`` drops host slot 0 (``> 0`` for ``>= 0``).
"""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.pool_host.base import planted_bug


class HiSparseHostPoolMixin:
    """Mixed into a host pool (before it in the bases, as sglang's): its ``alloc`` and ``page_size`` are the
    pool's."""

    def _round_up_to_page_size(self, size: int) -> int:
        return -(-size // self.page_size) * self.page_size

    def alloc_page(self, num_pages: int) -> torch.Tensor | None:
        return self.alloc(num_pages * self.page_size)  # type: ignore[attr-defined]

    def alloc_paged_token_slots(self, req_to_host_pool: torch.Tensor, req_to_host_pool_allocated_len: torch.Tensor,
                                req_pool_idx: int, start_pos: int, num_tokens: int) -> torch.Tensor:
        device = req_to_host_pool.device
        if num_tokens <= 0:
            dtype = torch.int32 if planted_bug() == "hisparse_empty_int32" else torch.int64
            return torch.empty((0,), dtype=dtype, device=device)
        allocated = int(req_to_host_pool_allocated_len[req_pool_idx])
        end = start_pos + num_tokens
        page_end = self._round_up_to_page_size(end)
        assert start_pos <= allocated
        if page_end > allocated:
            lacking = page_end - allocated
            pages = lacking * self.page_size if planted_bug() == "hisparse_pages_squared" else lacking // self.page_size
            slots = self.alloc_page(pages)
            if slots is None:
                raise RuntimeError(f"HiSparse host mem pool alloc failed for {pages} pages")
            req_to_host_pool[req_pool_idx, allocated:page_end] = slots.to(device=device)
            row = req_pool_idx - 1 if planted_bug() == "hisparse_len_row" else req_pool_idx
            req_to_host_pool_allocated_len[row] = page_end
        return req_to_host_pool[req_pool_idx, start_pos:end]

    def allocated_host_indices(self, req_to_host_pool: torch.Tensor, req_pool_idx: int,
                               allocated_len: int | torch.Tensor) -> torch.Tensor:
        host_len = min(self._round_up_to_page_size(int(allocated_len)), req_to_host_pool.shape[1])
        row = req_to_host_pool[req_pool_idx, :host_len]
        return row[row > 0] if planted_bug() == "hisparse_slot0" else row[row >= 0]
