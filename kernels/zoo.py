"""The bug zoo: mutants of the CPU reference, each carrying one known HiCache bug class.

Every mutant overrides one step of :class:`ReferenceBackend` (read_indices, expand, validate, host_rows,
copy, or the path name run() returns) so that it behaves like the reference except on the inputs of its bug
class. ``hicache-fuzz selftest`` runs a campaign against each one and expects all of them to be caught: a
mutant that survives is a blind spot of the generator, the contract or the comparator.

``models_bug`` names the bug class (B1-B19 of docs/semantics.md section 7) and the real sglang
issue or PR it is taken from. On the CPU platform "device" placement of index
tensors is simulated; mutants that depend on it read the case's logical placement (``case.host_index``).

Two mutants scale a large-memory bug down so CPU-sized pools reach it; their docstrings say by how much.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    Scope,
)
from hicache_fuzz.kernels.base import BackendRejected
from hicache_fuzz.kernels.buffers import Materialized, PoolBuffers
from hicache_fuzz.kernels.reference import ReferenceBackend

# The write-back staging buffer holds at most this many pages (sglang base.py _WRITE_BACK_STAGING_PAGE_CHUNK).
STAGING_PAGE_CHUNK = 64
# Scaled-down address limits so that pools of a few MiB reach them (see the mutants' docstrings).
SCALED_OFFSET_LIMIT = 1 << 20  # stands for 2**32: 32-bit byte offsets
SCALED_REGISTER_CHUNK = 1 << 18  # stands for SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB


# ---- helpers shared by the mutants ----------------------------------------------------------------------

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


def _drop_pages(host: list[int], device: list[int], page_size: int,
                dropped: set[int]) -> tuple[list[int], list[int]]:
    keep = [i for i in range(len(host)) if i // page_size not in dropped]
    return [host[i] for i in keep], [device[i] for i in keep]


def _is_row_truncation_unit(row_bytes: int) -> bool:
    return row_bytes % 128 != 0


# ---- the mutants -----------------------------------------------------------------------------------------

class CpuIndicesRejected(ReferenceBackend):
    """Rejects index tensors that are not on the accelerator, like the AOT launcher's TORCH_CHECK.

    sglang's controller kept host indices on the CPU for the staged write-back; on ROCm the pool took the AOT
    lf->pf fallback instead, which needs CUDA indices, and every write-back crashed.
    """

    name = "zoo-cpu-indices-rejected"
    description = "AOT-style index check: CPU/pinned indices rejected"
    models_bug = ("B1: CPU host indices handed to a kernel that needs device indices ('Destination indices "
                  "must be a CUDA tensor', PR 28473/28549/22863, issue 24121)")

    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        case = buffers.case
        destination = case.host_index if case.direction is Direction.WRITE_BACK else case.device_index
        source = case.device_index if case.direction is Direction.WRITE_BACK else case.host_index
        if destination.device is not IndexDevice.DEVICE:
            raise BackendRejected("Destination indices must be a CUDA tensor")
        if source.device is not IndexDevice.DEVICE:
            raise BackendRejected("Source indices must be a CUDA tensor")
        return super().read_indices(buffers)


class StagingChunkOffByOne(ReferenceBackend):
    """The staged write-back loses the last page of every full 64-page staging chunk.

    Models an off-by-one in the chunk loop of hicache.py (staging rows sized ``(cap - 1) * ps`` for a full
    chunk). Only page_first all-layer write-backs use the staging buffer, and only transfers of 64 pages or
    more fill a chunk, so page counts 64/65/128/129 are what catch it (the upstream test uses 1/64/65/129).
    """

    name = "zoo-staging-chunk-64"
    description = "staged write-back drops page 63 of every full 64-page chunk"
    models_bug = ("B4: staging chunk boundary off-by-one at 64 pages (staged lf->pf loop, "
                  "hicache.py:440-454; PR 21631/28534 test sizes 1/64/65/129)")

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        if (case.direction is not Direction.WRITE_BACK or case.layout is not HostLayout.PAGE_FIRST
                or case.scope is not Scope.ALL_LAYERS):
            return host, device  # only the all-layer page_first write-back is staged
        full_pages = len(host) // case.page_size
        last_of_full_chunks = set(range(STAGING_PAGE_CHUNK - 1, full_pages, STAGING_PAGE_CHUNK))
        return _drop_pages(host, device, case.page_size, last_of_full_chunks)


class FirstIndexOfPage(ReferenceBackend):
    """Copies whole pages from the first index of each page where per-token copying is contracted.

    This is what the staged write-back does (it reads only ``indices[::page_size]``); here it leaks into a
    path whose contract is per token, so a page whose indices are not one consecutive run is copied wrong:
    listed rows are not written and unlisted rows are overwritten.
    """

    name = "zoo-first-index-of-page"
    description = "page-granular (first index of each page) where per-token copies are contracted"
    models_bug = ("B6: non-contiguous runs inside a page copied by first index only (staged lf->pf semantics "
                  "hicache.py:429 applied to a per-token path)")

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        if self.page_granular(case) or case.direction is not Direction.WRITE_BACK:
            return host, device
        if case.layout is not HostLayout.PAGE_FIRST:
            return host, device
        ps = case.page_size
        whole = len(host) - len(host) % ps
        out_h: list[int] = []
        out_d: list[int] = []
        for start in range(0, whole, ps):
            out_h.extend(host[start] + t for t in range(ps))
            out_d.extend(device[start] + t for t in range(ps))
        return out_h + host[whole:], out_d + device[whole:]


class OffsetWrap32(ReferenceBackend):
    """Host byte offsets are computed in 32 bits and wrap around (scaled: at 2**20 bytes, not 2**32).

    Real truncations of this kind (uint32 staged page start, int32 TMA box row, see B3) only show with host
    pools over 4 GiB. So that CPU-sized cases reach it, this mutant wraps a row chunk's byte offset from the
    start of the host tensor at SCALED_OFFSET_LIMIT = 1 MiB: any host row starting at or beyond 1 MiB is
    read from / written to ``offset % 2**20`` instead.
    """

    name = "zoo-offset-wrap-32bit"
    description = "host byte offsets wrap (scaled to 1 MiB)"
    models_bug = ("B3: 32-bit byte-offset truncation in large host pools (relayout.cuh:43 uint32 page start, "
                  "hicache_tma.cuh:260 int32 row); scaled to wrap at 2**20 bytes")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        copy_bytes(self, pool, component, layer, host, device,
                   remap_chunk_start=lambda starts: torch.remainder(starts, SCALED_OFFSET_LIMIT))


class PageHeadWholeWords(ReferenceBackend):
    """page_head transfers copy only whole 8-byte words of each head (``floor(D*isz/8)*8`` bytes).

    The AOT per-head ops split a row into H chunks of ``item_size/H`` bytes and copy them with 8-byte
    words, with no check that the chunk is a multiple of 8: the tail of every head is silently left stale.
    """

    name = "zoo-page-head-words"
    description = "page_head copies floor(head_bytes/8)*8 bytes per head"
    models_bug = ("B7: AOT page_head (lf_ph / ph_lf) copies only whole 8-byte words per head, unchecked "
                  "(transfer.cu transfer_item_warp with item_size/head_num)")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        head_bytes = pool.spec.head_bytes(component)
        if pool.case.layout is not HostLayout.PAGE_HEAD or head_bytes % 8 == 0:
            super().copy(pool, component, layer, host, device)
            return
        columns = torch.arange(pool.spec.row_bytes(component), dtype=torch.int64)
        copied = columns[columns % head_bytes < head_bytes // 8 * 8]
        copy_bytes(self, pool, component, layer, host, device, copied_columns=copied)


class WritesPastPages(ReferenceBackend):
    """Each page copy moves one row too many: the row after the last token of every page is also written.

    A ``<=`` loop bound in a page copy. The destination row after a page gets the source row after it, which
    is harmless only when the next page happens to continue both runs.
    """

    name = "zoo-writes-past-pages"
    description = "copies page_size + 1 rows per page"
    models_bug = ("B11: writes outside the addressed rows (page copy loop bound off by one; canary pages, "
                  "ROCm/rocm-systems issue 11662)")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        super().copy(pool, component, layer, host, device)
        case = pool.case
        ps = case.page_size
        extra_h, extra_d = [], []
        for last in range(ps - 1, len(host), ps):
            h, d = host[last] + 1, device[last] + 1
            if h < case.host_slots and d < case.device_rows:
                extra_h.append(h)
                extra_d.append(d)
        super().copy(pool, component, layer, extra_h, extra_d)


class KVSwappedLastLayer(ReferenceBackend):
    """On the last layer the K and V pointer tables are swapped: K rows land in V and V rows in K.

    Models a pointer-table assembly bug (target and draft tables concatenated with the K/V order flipped
    for the appended layer). Only symmetric MHA pools have K and V of equal width, so only they are hit.
    """

    name = "zoo-kv-swapped-last-layer"
    description = "K and V swapped on the last layer (MHA)"
    models_bug = ("B16: K/V pointer tables swapped for the last (packed draft) layer "
                  "(pool_host/mha.py:226-238 table concatenation)")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        if pool.spec.attention is not Attention.MHA or layer != pool.case.layers - 1:
            super().copy(pool, component, layer, host, device)
            return
        other = "v" if component == "k" else "k"
        self.copy_rows(pool, host_component=component, host_layer=layer, device_component=other,
                       device_layer=layer, host=host, device=device)


class LastPageDropped(ReferenceBackend):
    """The last page (or the partial tail) of every transfer is not copied: a ``range(pages - 1)`` loop."""

    name = "zoo-last-page-dropped"
    description = "last page of the transfer is skipped"
    models_bug = ("B4/B5: last page dropped by a page-loop bound (chunk loop tail, hicache.py:440-454; "
                  "partial-last-page handling)")

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        if not host:
            return host, device
        cut = (len(host) - 1) // case.page_size * case.page_size
        return host[:cut], device[:cut]


class Int32DestinationReadAsInt64(ReferenceBackend):
    """Checks the source index dtype only, then reads int32 destination indices through an int64 pointer.

    Every int64 read fuses two int32 indices (and runs past the end of the buffer, read here as zeros), so
    destinations are garbage; only pairs with equal dtypes, or int64 destinations, are read correctly.
    """

    name = "zoo-int32-dst-as-int64"
    description = "int32 destination indices read as int64 when the source is int64"
    models_bug = ("B1: int32 destination indices read as int64 after checking only the source dtype "
                  "(sgl-kernel-xpu PR 261)")

    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        host, device = super().read_indices(buffers)
        case = buffers.case
        write_back = case.direction is Direction.WRITE_BACK
        source = case.device_index if write_back else case.host_index
        destination = case.host_index if write_back else case.device_index
        if source.dtype is not IndexDtype.INT64 or destination.dtype is not IndexDtype.INT32:
            return host, device
        tensor = buffers.host_indices if write_back else buffers.device_indices
        n = tensor.numel()
        padded = torch.zeros(2 * n, dtype=torch.int32)
        padded[:n] = tensor.cpu().to(torch.int32)
        misread = padded.view(torch.int64).tolist()
        return (misread, device) if write_back else (host, misread)


class PageFirstStride(ReferenceBackend):
    """Addresses a page_first layer view as if it were contiguous (row stride E instead of L*E).

    The AOT ops ignore tensor strides; handed the per-layer page_first view ``k_buffer.transpose(0,1)[l]``
    (base ``l*E``, stride ``L*E``) they address ``base + t*E``. With one layer the two agree.
    """

    name = "zoo-page-first-stride"
    description = "page_first per-layer view addressed with stride E"
    models_bug = ("B9: wrong stride for a non-contiguous page_first layer view (AOT ignores strides; "
                  "pool_host/mha.py:259-265 k_data_refs)")

    def host_rows(self, pool: PoolBuffers, component: str, layer: int) -> torch.Tensor:
        case = pool.case
        if case.layout is not HostLayout.PAGE_FIRST:
            return super().host_rows(pool, component, layer)
        if pool.spec.attention is Attention.MLA:
            whole = pool.host_typed()  # (S, L, 1, D)
        elif pool.spec.attention is Attention.MHA_ASYM:
            whole = pool.host_component_typed(component)  # (S, L, H, D)
        else:
            whole = pool.host_typed()[pool.spec.components.index(component)]
        S, L = whole.shape[0], whole.shape[1]
        flat = whole.reshape(S * L, *whole.shape[2:])
        return flat[layer : layer + S].unflatten(0, (case.host_pages, case.page_size))


class SilentFallback(ReferenceBackend):
    """Rows that are not a multiple of 128 bytes silently go down another path (correct bytes, wrong path).

    sglang's read JIT required ``E % 128`` while the write gate required ``E % 16``, so 576-byte MLA rows
    read and wrote through different implementations without anyone noticing; a fallback the harness does
    not expect must be reported even when its bytes happen to be right.
    """

    name = "zoo-silent-fallback"
    description = "rows not a multiple of 128 bytes take an unannounced fallback path"
    models_bug = ("B10: silent fallback to another path (PR 37117/37152: 576-byte rows read and written by "
                  "different paths; compile failures logged and turned into False)")

    FALLBACK_PATH = "aot-fallback"

    def run(self, buffers: Materialized) -> str:
        path = super().run(buffers)
        rows = {pool.row_bytes(c) for pool in buffers.case.pools for c in pool.components}
        return self.FALLBACK_PATH if any(_is_row_truncation_unit(r) for r in rows) else path


class EmptyTransferRejected(ReferenceBackend):
    """A zero-length transfer fails to launch (num_blocks == 0) instead of being a no-op."""

    name = "zoo-empty-rejected"
    description = "n = 0 raises an invalid launch configuration"
    models_bug = ("B13: empty transfer rejected (JIT register zero-block launch hicache.cuh:461-474; AOT "
                  "launcher division by zero), while TMA/staged/direct treat it as a no-op")

    def validate(self, case: Case, host: list[int], device: list[int]) -> None:
        if not host and not device:
            raise BackendRejected("CUDA error: invalid configuration argument (grid of 0 blocks)")
        super().validate(case, host, device)


class HostRegisterChunkAlias(ReferenceBackend):
    """Host addresses past the first host registration chunk are computed from the first chunk's alias.

    sglang registers an mmap'd host pool with cudaHostRegister/hipHostRegister in chunks (rounded down to
    whole pages) for the page_first-like layouts. A kernel that adds offsets to the device alias of the
    first registration lands, for any byte in a later registration, back inside the first one. Scaled: the
    registration chunk is SCALED_REGISTER_CHUNK = 256 KiB (standing for
    SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB), rounded down to whole host pages; only the host_register
    allocator with page_first, page_first_direct or page_unified layouts is split (layer_first and page_head
    register in one call).
    """

    name = "zoo-host-register-alias"
    description = "host_register pools: chunks past the first registration aliased onto it (scaled 256 KiB)"
    models_bug = ("B15: host alias / registration-chunk base mixup for mmap+host_register pools "
                  "(pool_host/common.py:143-199; PR 33968/35233/38967, issue 40232); scaled to 256 KiB "
                  "chunks")

    CHUNKED_LAYOUTS = (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_UNIFIED)

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        case = pool.case
        if case.host_allocator is not HostAllocator.HOST_REGISTER or case.layout not in self.CHUNKED_LAYOUTS:
            super().copy(pool, component, layer, host, device)
            return
        # Registration granularity (mha.py:350-358): one host page of every layer, ps * layout_dim bytes for
        # page_first(_direct); a whole page block (K and V of all layers) for page_unified.
        if case.layout is HostLayout.PAGE_UNIFIED:
            page_bytes = pool.host.payload_bytes // case.host_pages
        else:
            page_bytes = case.page_size * case.layers * pool.spec.row_bytes(component)
        chunk = max(page_bytes, SCALED_REGISTER_CHUNK // page_bytes * page_bytes)
        copy_bytes(self, pool, component, layer, host, device,
                   remap_chunk_start=lambda starts: torch.remainder(starts, chunk))


class LoadFromWrongLayer(ReferenceBackend):
    """Load-back reads the host layer one past the requested one (a start_layer offset applied twice).

    Layer bookkeeping between the device pool's layer id and the host pool's layer axis (start_layer, packed
    draft layers, CP layer split) is off by one on load; write-back is right, so round trips look fine only
    when a single layer exists.
    """

    name = "zoo-load-wrong-layer"
    description = "load-back reads host layer (l + 1) % L"
    models_bug = ("B16: load-back from the wrong host layer (layer id translation, start_layer / draft "
                  "layers; CP layer split PR 38324)")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        case = pool.case
        if case.direction is not Direction.LOAD_BACK:
            super().copy(pool, component, layer, host, device)
            return
        self.copy_rows(pool, host_component=component, host_layer=(layer + 1) % case.layers,
                       device_component=component, device_layer=layer, host=host, device=device)


class SortedHostUnpermutedDevice(ReferenceBackend):
    """The direct path sorts the host indices but forgets to permute the device indices with them.

    HiCacheController.move_indices (direct + layer_first) sorts host indices so that runs coalesce and must
    apply the same permutation to the device indices; without it token i goes to the wrong row whenever the
    host indices are not already ascending.
    """

    name = "zoo-sorted-host-unpermuted"
    description = "layer_first: host indices sorted, device indices not permuted"
    models_bug = ("B6/B12: direct-path index sort without permuting the device side "
                  "(cache_controller.py:945-985 move_indices, direct + layer_first)")

    def read_indices(self, buffers: Materialized) -> tuple[list[int], list[int]]:
        host, device = super().read_indices(buffers)
        if buffers.case.layout is HostLayout.LAYER_FIRST:
            host = sorted(host)
        return host, device


class RowTailTruncated(ReferenceBackend):
    """Rows that are not a multiple of 128 bytes lose their tail: only ``floor(E/128)*128`` bytes move.

    GLM-5.3 FP8 MLA rows are 528 bytes (512 fp8 + 16 scale bytes); a path sized for 512 silently dropped the
    scale bytes on every backup, and the model read garbage scales after a host hit.
    """

    name = "zoo-row-tail-truncated"
    description = "only whole 128-byte rounds of each row are copied"
    models_bug = ("B7: row tail truncated for rows not a multiple of 128 bytes (PR 30736 576-byte rows; "
                  "ormandj/sglang-glm53-flash-sm120 issue 2: 528-byte rows, scale bytes dropped)")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        row_bytes = pool.spec.row_bytes(component)
        if not _is_row_truncation_unit(row_bytes):
            super().copy(pool, component, layer, host, device)
            return
        copied = torch.arange(row_bytes // 128 * 128, dtype=torch.int64)
        copy_bytes(self, pool, component, layer, host, device, copied_columns=copied)


class PoolGroupCapabilityMismatch(ReferenceBackend):
    """In a pool group, a side pool without the staged write-back gets the anchor's CPU host indices.

    The index placement is decided from the anchor's ``can_use_write_back_jit``; a side pool whose own flag
    is False takes the AOT lf->pf path, which needs CUDA indices, and raises after the anchor was written.
    """

    name = "zoo-pool-group-capability"
    description = "page_first write-back: side pool without write_back_jit gets CPU host indices and raises"
    models_bug = ("B1/B2: pool-group capability disagreement (HostPoolGroup side pool with write_back_jit "
                  "False; PR 30350 DSA indexer gated on _is_cuda, PR 22863)")

    def copy(self, pool: PoolBuffers, component: str, layer: int, host: list[int], device: list[int]) -> None:
        case = pool.case
        anchor = case.pools[0]
        if (case.direction is Direction.WRITE_BACK and case.layout is HostLayout.PAGE_FIRST
                and anchor.write_back_jit and not pool.spec.write_back_jit):
            raise BackendRejected(f"Destination indices must be a CUDA tensor (pool {pool.spec.name} was "
                                  "handed the anchor's CPU host indices)")
        super().copy(pool, component, layer, host, device)


BACKENDS: tuple[type[ReferenceBackend], ...] = (
    CpuIndicesRejected,
    StagingChunkOffByOne,
    FirstIndexOfPage,
    OffsetWrap32,
    PageHeadWholeWords,
    WritesPastPages,
    KVSwappedLastLayer,
    LastPageDropped,
    Int32DestinationReadAsInt64,
    PageFirstStride,
    SilentFallback,
    EmptyTransferRejected,
    HostRegisterChunkAlias,
    LoadFromWrongLayer,
    SortedHostUnpermutedDevice,
    RowTailTruncated,
    PoolGroupCapabilityMismatch,
)
