"""sglang 0.5.23's host pool classes, in the oracle's terms: which host byte layout each one stores, for which
attention kinds, layouts and io backends, or why the oracle does not model it (docs/semantics.md, section 9).

A modelled class stores, for a case of its attention kind and layout, exactly the host storage that
``oracles/layouts.py`` describes (K half then V half for MHA, one latent half for MLA, layers counted with the
packed draft layers after the target's), and moves per token: backup writes host row ``h[i]`` of every layer from
device row ``d[i]``, load writes device row ``d[i]`` of every layer from host row ``h[i]``. So the single-transfer
oracle (``oracles/transfer.py``) judges every transfer of every modelled class.

An unmodelled class is listed with the reason: a case drawn for it is reported ``unsupported`` with that reason,
never guessed at.

Classes whose tensors are not the oracle's storage byte for byte say how the oracle reads them: the Mamba state pool
and the NVFP4 page-row pools in their entries' comments, the DSA indexer pool in its own section below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hicache_fuzz.harness.model.case import Attention, HostLayout

KERNEL, DIRECT = "kernel", "direct"
IO_BACKENDS = (KERNEL, DIRECT)

@dataclass(frozen=True)
class PoolClass:
    name: str  # sglang's class name
    module: str  # its module under sglang.srt.mem_cache.pool_host
    attention: Attention | None  # the pool spec's attention kind (None: not modelled)
    kernel_layouts: frozenset[HostLayout] = frozenset()  # layouts it moves with io backend `kernel`
    direct_layouts: frozenset[HostLayout] = frozenset()  # and with `direct`
    drafts: bool = True  # packs MTP draft layers after the target's
    unmodelled: str = ""  # why the oracle does not judge it ("" if it does)
    also: frozenset[Attention] = frozenset()  # other attention kinds whose storage is byte for byte the class's
    slot_pages: bool = False  # one slot per page: stores cases of page size 1 only
    kernel_row_align: int = 1  # the kernel io backend moves rows whose byte widths are multiples of this only
    kernel_page_row_align: int = 1  # ... and pages of one layer (page size x row bytes) of multiples of this only

    @property
    def modelled(self) -> bool:
        return not self.unmodelled

    @property
    def attentions(self) -> frozenset[Attention]:
        return frozenset({self.attention} if self.attention else ()) | self.also

    def layouts_for(self, io_backend: str) -> frozenset[HostLayout]:
        return self.direct_layouts if io_backend == DIRECT else self.kernel_layouts if io_backend == KERNEL else (
            frozenset())


_LF, _PF, _PFD, _PH = HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD

_CLASSES = (
    PoolClass("MHATokenToKVPoolHost", "mha", Attention.MHA, frozenset({_LF, _PF, _PH}), frozenset({_LF, _PFD})),
    PoolClass("MLATokenToKVPoolHost", "mla", Attention.MLA, frozenset({_LF, _PF}), frozenset({_LF, _PFD})),
    # K and V in two tensors of their own widths: page_first with the kernels, page_first_direct with direct
    PoolClass("AsymmetricMHATokenToKVPoolHost", "mha", Attention.MHA_ASYM, frozenset({_PF}), frozenset({_PFD})),
    # layer_first and the kernels only, sized from the device pool (no host capacity argument, no draft layers)
    PoolClass("HiSparseMHATokenToKVPoolHost", "mha", Attention.MHA, frozenset({_LF}), drafts=False),
    # K rows only, one tensor (L, S, H, D) in the layout's axis order: byte for byte a one-component pool, which
    # the oracle calls MLA (a row of H heads of D is a latent row of H*D); sized from its anchor pool, no guard
    # for layer ids outside the pool and no draft layers
    PoolClass("MHATokenToKOnlyPoolHost", "mha", Attention.MLA, frozenset({_LF, _PF}), frozenset({_LF, _PFD}),
              drafts=False),
    PoolClass("MHATokenToKVPoolMXFP8Host", "mha_mxfp8", None, unmodelled=(
        "besides its page_first fp8 K/V payload it moves per-page UE8M0 scale blocks (host tensors page x layer x "
        "bytes, from MHATokenToKVPoolMXFP8's interleaved scales, which exist at page size 128 with head dims "
        "divisible by 32); a case has no storage for the scale blocks")),
    # DeepSeek sparse attention's indexer pool: the indexer's K-with-scale bytes, one uint8 row of page_size * E
    # bytes per (layer, page) (E: index head dim + one fp32 scale per quant block), riding on the pages of an MLA
    # anchor host pool (its HostPoolDecl: indices_from_pool=KV, layout_source=KV). A page row read as page_size
    # token rows of E bytes is a one-component pool (the oracle's MLA kind); see the DSA section below for its
    # host tensors, pages and layers. Kernel io only for page rows of 8-byte multiples: otherwise sglang's pool
    # falls through to ``raise ValueError("Unsupported IO backend: kernel")`` at the first transfer, after the
    # anchor's share of that transfer has moved. That is no clean rejection in the contract's sense (not an
    # input the entry point refuses before moving bytes, but a pool geometry sglang accepts at construction and
    # then cannot move at all), so such cases are unsupported with this rule as the reason, as the Mamba and
    # NVFP4 pools' kernel row rules are.
    PoolClass("DSAIndexerPoolHost", "dsa", Attention.MLA, frozenset({_LF, _PF}), frozenset({_LF, _PFD}),
              kernel_page_row_align=8),
    PoolClass("QSAIndexerPoolHost", "qsa", None, unmodelled=(
        "a DeepSeek-V4 paged indexer pool; the oracle does not model its paged host layout")),
    # Per-request recurrent state: one slot (a page of size 1) per request, a temporal and a conv state per layer,
    # host tensors (S, L, 1, *shape) each: byte for byte an asymmetric page_first pool whose K row is the temporal
    # state and whose V row is the conv state (an MHA pool where the two widths are equal); page_first_direct is
    # the same bytes at page size 1. The controller's direct io moves page_first_direct only.
    # Its kernel io is transfer_mamba's JIT kernels, which check every state row for 16-byte (uint4) alignment.
    PoolClass("MambaPoolHost", "mamba", Attention.MHA_ASYM, frozenset({_PF, _PFD}), frozenset({_PFD}),
              also=frozenset({Attention.MHA}), slot_pages=True, kernel_row_align=16),
    PoolClass("UnifiedPageEnvelopeHostPool", "unified", None, unmodelled=(
        "pages of several pools share one envelope and are resolved through prepare_transfer_indices under a "
        "layout lease; the oracle does not model the envelope")),
    PoolClass("PageInterleaveHostPool", "page_interleave", None, unmodelled=(
        "a KV-sharded wrapper placing pages across owners; it needs a sharded placement and the hybrid "
        "controller's shard routing, which this backend does not build")),
    # MiniMax M3's NVFP4 KV cache as packed uint8 page rows: one row of page_size * E bytes per (layer, page),
    # whatever it packs (payloads and scales). A page row is page_size token rows of E bytes, so the host tensor
    # (L, P, row) is a one-component layer_first pool and (P, L, 1, row) (its page_first and page_first_direct)
    # the oracle's page_first_direct; whole pages move, so per token is exact. The index-K sidecar is sized from
    # its anchor host pool, the main pool from its device capacity. The kernel io backend (the page_row JIT
    # kernel) needs 128-byte-aligned page rows; loads of draft layers or layer ids outside the pool raise.
    PoolClass("MiniMaxM3Nvfp4IndexKPoolHost", "minimax_m3_nvfp4", Attention.MLA, frozenset({_LF, _PFD}),
              frozenset({_LF, _PFD}), drafts=False, kernel_page_row_align=128),
    PoolClass("MiniMaxM3Nvfp4MainKVPoolHost", "minimax_m3_nvfp4", Attention.MLA, frozenset({_LF, _PFD}),
              frozenset({_LF, _PFD}), drafts=False, kernel_page_row_align=128),
)

POOL_CLASSES: Mapping[str, PoolClass] = MappingProxyType({c.name: c for c in _CLASSES})
MODELLED = tuple(c.name for c in _CLASSES if c.modelled)
UNMODELLED = tuple(c.name for c in _CLASSES if not c.modelled)


def pool_class(name: str) -> PoolClass:
    try:
        return POOL_CLASSES[name]
    except KeyError:
        raise KeyError(f"unknown host pool class {name!r}; known: {', '.join(POOL_CLASSES)}") from None


def mismatch(cls: PoolClass, attention: Attention, layout: HostLayout, io_backend: str, draft_layers: int,
             page_size: int = 1, row_bytes: tuple[int, ...] = ()) -> str:
    """Why a case of this attention kind, layout, io backend, draft count, page size and row widths (bytes, one
    per component) is not one the class stores and moves ("" if it is)."""
    if not cls.modelled:
        return f"{cls.name}: {cls.unmodelled}"
    if attention not in cls.attentions:
        kinds = "/".join(sorted(a.value for a in cls.attentions))
        return f"{cls.name} holds {kinds} pools, not {attention.value}"
    if cls.slot_pages and page_size != 1:
        return f"{cls.name} holds one state slot per page (page size 1), not page size {page_size}"
    if layout not in cls.layouts_for(io_backend):
        return f"{cls.name} with io backend {io_backend} does not store the {layout.value} layout"
    if draft_layers and not cls.drafts:
        return f"{cls.name} packs no draft layers"
    if io_backend == KERNEL and any(row % cls.kernel_row_align for row in row_bytes):
        return (f"{cls.name} moves rows of {cls.kernel_row_align}-byte multiples with io backend kernel, not "
                f"{'/'.join(map(str, row_bytes))} bytes")
    if io_backend == KERNEL and any(row * page_size % cls.kernel_page_row_align for row in row_bytes):
        return (f"{cls.name} moves page rows of {cls.kernel_page_row_align}-byte multiples with io backend "
                f"kernel, not {page_size} x {'/'.join(map(str, row_bytes))} bytes")
    return ""


# ---- DSAIndexerPoolHost in the oracle's terms (pool_host/dsa.py; docs/semantics.md, 9.1) ---------------------
#
# * Pages. Host and device tensors hold one uint8 row of ``page_size * E`` bytes per (layer, page). The host
#   tensor has ``indexer_page_num(S, ps)`` pages per layer, more than the ``S / ps`` pages whose slots the anchor's
#   allocator hands out; the tail pages are never addressed (host indices stay below ``S``) and must keep their
#   bytes. The device buffers (``DSATokenToKVPool``'s index key cache) are sized by the same rule over the device
#   pool's size (``device_rows - ps``): ``device_rows / ps`` pages, one more at page size 1.
# * Host layouts. layer_first ``(L, P', ps * E)``: over its first ``S / ps`` pages of each layer, the oracle's
#   layer_first storage of that layer. page_first and page_first_direct alike ``(P', L, 1, ps * E)``: page-major,
#   so over its first ``S / ps`` pages the oracle's page_first_direct storage; a page_first case's token row
#   (layer l, slot t) is that storage's row: page ``t // ps``, layer ``l``, row ``t % ps`` in the page.
# * Moves are page-granular: token indices become page ids from the first token of each page
#   (``h[j * ps] // ps`` and ``d[j * ps] // ps``), section 5's PAGE_ALIGNED; with the whole aligned pages the
#   allocators hand out, that is per token.
# * Layers. Host layers are compact: the target device layers that own index keys (``owned_device_layers``: those
#   whose ``skip_topk_layers`` entry is false; a skipped layer reuses the previous layer's top-k and holds a 0-row
#   placeholder), then one tail layer per packed MTP draft pool. The case's layers are those host layers; a
#   skipped layer has no bytes, no host layer, and a load of it moves nothing.

def indexer_page_num(size: int, page_size: int) -> int:
    """Pages per layer of a DSA indexer tensor over a pool of `size` token slots: sglang's
    ``(size + page_size + 1) // page_size``, one page more than ``size / page_size`` (two at page size 1)."""
    return (size + page_size + 1) // page_size


def owned_device_layers(skip_topk_layers: tuple[bool, ...]) -> tuple[int, ...]:
    """The target device layers that own index keys, in order: host layer j is device layer
    ``owned_device_layers(...)[j]``."""
    return tuple(layer for layer, skip in enumerate(skip_topk_layers) if not skip)


def dsa_host_shape(layout: HostLayout, host_layers: int, slots: int, page_size: int,
                   row_bytes: int) -> tuple[int, ...]:
    """Shape of a DSA indexer host tensor (uint8) of `host_layers` layers over an anchor of `slots` slots."""
    pages, page_bytes = indexer_page_num(slots, page_size), page_size * row_bytes
    if layout is HostLayout.LAYER_FIRST:
        return host_layers, pages, page_bytes
    if layout in (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        return pages, host_layers, 1, page_bytes
    raise ValueError(f"DSAIndexerPoolHost has no {layout.value} layout")
