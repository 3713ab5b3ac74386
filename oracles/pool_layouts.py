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
and the NVFP4 page-row pools in their entries' comments, the DSA indexer pool and the MXFP8 pool's scale blocks in
their own sections below.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hicache_fuzz.harness.model.case import Attention, Case, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.oracles.transfer import Semantics

KERNEL, DIRECT = "kernel", "direct"
IO_BACKENDS = (KERNEL, DIRECT)
MXFP8_PAGE_SIZE = 128  # the page size at which the MXFP8 device pool stores interleaved scales (see its section)
MXFP8_BLOCK = 32  # fp8 elements per UE8M0 scale byte
UNIFIED_ENTRY_ALIGN = 32  # a unified pool's slot entry is rounded up to this many bytes (the token-major section)

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
    only_page_size: int = 0  # stores cases of this page size only (0: any)
    row_align: int = 1  # stores rows (bytes per component) of multiples of this only, whatever the io backend

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
    # MXFP8 block-scaled MHA: the fp8 K/V payload is MHATokenToKVPoolHost's page_first storage (a row of E bytes
    # is E fp8 elements, so a case of any dtype describes it by its row bytes), and beside it one UE8M0 scale
    # block per (page, layer) and component, which the MXFP8 section below puts in the oracle's terms. Page
    # size 128 only (the device pool's interleaved scale layout exists there only), rows of whole 32-element
    # scale blocks, page_first with the kernel io backend only, no packed draft layers.
    PoolClass("MHATokenToKVPoolMXFP8Host", "mha_mxfp8", Attention.MHA, frozenset({_PF}), drafts=False,
              only_page_size=MXFP8_PAGE_SIZE, row_align=MXFP8_BLOCK),
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
    if cls.only_page_size and page_size != cls.only_page_size:
        return f"{cls.name} exists at page size {cls.only_page_size} only, not {page_size}"
    if any(row % cls.row_align for row in row_bytes):
        return f"{cls.name} holds rows of {cls.row_align}-byte multiples, not {'/'.join(map(str, row_bytes))} bytes"
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


def skips_topk(layer: int, freq: int) -> bool:
    """Whether global layer `layer` of a DSA model with ``index_topk_freq`` `freq` reuses the previous layer's top-k
    and so owns no index keys: sglang's default ``dsa_layer_skips_topk``, ``max(layer - 1, 0) % freq != 0`` (layers
    0 and 1 always own theirs)."""
    return max(layer - 1, 0) % freq != 0


def index_layers_in(first: int, end: int, freq: int) -> int:
    """How many global layers in ``[first, end)`` own index keys (:func:`skips_topk`), counted without a loop: layer 0,
    and every layer ``g >= 1`` with ``(g - 1) % freq == 0``."""
    if end <= first:
        return 0
    low, high = max(first, 1) - 1, end - 1  # the g - 1 of layers g >= 1 in the range
    multiples = max(0, (high + freq - 1) // freq - (low + freq - 1) // freq)
    return (first <= 0 < end) + multiples


def dsa_host_shape(layout: HostLayout, host_layers: int, slots: int, page_size: int,
                   row_bytes: int) -> tuple[int, ...]:
    """Shape of a DSA indexer host tensor (uint8) of `host_layers` layers over an anchor of `slots` slots."""
    pages, page_bytes = indexer_page_num(slots, page_size), page_size * row_bytes
    if layout is HostLayout.LAYER_FIRST:
        return host_layers, pages, page_bytes
    if layout in (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        return pages, host_layers, 1, page_bytes
    raise ValueError(f"DSAIndexerPoolHost has no {layout.value} layout")


# ---- MHATokenToKVPoolMXFP8Host's scale blocks in the oracle's terms (pool_host/mha_mxfp8.py; semantics.md, 9.1) --
#
# * Where they live. The device pool (``MHATokenToKVPoolMXFP8``) keeps, per layer and component, one UE8M0 byte per
#   32 fp8 elements of a token row. At page size 128 it stores them in FA4's interleaved layout, one tensor per
#   layer of shape ``mxfp8_device_scale_shape`` = (pages, heads, 32, page_size // 32, head_dim // 32): a page's
#   scales are one contiguous block of ``mxfp8_scale_page_bytes(E)`` = 128 * E / 32 = 4 * E bytes (E: the
#   component's fp8 row, heads * head_dim bytes), whatever the heads split. The host pool keeps the blocks
#   page-major, one uint8 tensor per component of shape ``mxfp8_host_scale_shape`` = (host pages, layers, block).
# * As a pool of the oracle's own. A block read as 128 token rows of E / 32 bytes (whatever the interleaving puts
#   where: every move copies whole blocks): the device tensors of K, layer after layer, then those of V are the
#   oracle's device storage of an MHA pool of E / 32-byte rows, and the K host tensor then the V host tensor its
#   page_first_direct host storage (page, layer, 128 rows). So the scale storages of a case are the storages of
#   ``mxfp8_scale_case(case)``: the case's index lists and sequence over that pool.
# * Moves are page-granular, page ids on both sides from the first token of each page (``indices[::128] // 128``):
#   a back-up writes host block (h[j*128] // 128, layer l) from device block d[j*128] // 128 of every layer l, a
#   load of layer l the reverse for that layer only: section 5's PAGE_ALIGNED (``MXFP8_SCALE_SEMANTICS``). With the
#   whole aligned pages the allocators hand out, that is the same page moves as the payload's per-token ones.
# * Layers: the target layers only (the pool packs no draft layers); a load of a layer id outside them moves no
#   payload byte and no scale byte.
# * Construction rules: the class entry's (page size 128, page_first with io kernel, no packed draft layers, rows
#   of 32-byte multiples, equal K and V widths) are sglang's construction-time refusals (the host pool's layout,
#   draft, page-size and staged-JIT checks, the device pool's head dim check, get_mha_host_pool_cls' asymmetric
#   check). They are rules, not rejections to judge: the server meets them once, at start-up, and a refusal aborts
#   it, so no transfer is made outside them (semantics.md 9.1).

MXFP8_SCALE_SEMANTICS = Semantics.PAGE_ALIGNED


def mxfp8_scale_row_bytes(row_bytes: int) -> int:
    """Scale bytes per token of a component whose fp8 row is `row_bytes` bytes (elements): one per 32."""
    return row_bytes // MXFP8_BLOCK


def mxfp8_scale_page_bytes(row_bytes: int) -> int:
    """Bytes of one page's scale block of one layer and component: sglang's ``k_sf_page_bytes`` (the numel of one
    page of the interleaved tensor)."""
    return MXFP8_PAGE_SIZE * mxfp8_scale_row_bytes(row_bytes)


def mxfp8_device_scale_shape(device_rows: int, heads: int, head_dim: int) -> tuple[int, ...]:
    """One layer's device scale tensor over a device pool of `device_rows` rows (size + page size): the
    interleaved layout's (pages, heads, 32, page_size // 32, head_dim // 32)."""
    return (device_rows // MXFP8_PAGE_SIZE, heads, MXFP8_BLOCK, MXFP8_PAGE_SIZE // MXFP8_BLOCK,
            head_dim // MXFP8_BLOCK)


def mxfp8_host_scale_shape(host_slots: int, layers: int, row_bytes: int) -> tuple[int, ...]:
    """One component's host scale tensor (uint8): (host pages, layers, block)."""
    return host_slots // MXFP8_PAGE_SIZE, layers, mxfp8_scale_page_bytes(row_bytes)


def mxfp8_scale_case(case: Case) -> Case:
    """The scale storages of an MXFP8 case (its pool: the fp8 payload, K and V rows of E bytes) as a case of the
    oracle's own: an MHA pool of E / 32-byte rows in the page_first_direct layout, with the case's layers, page size,
    capacities, index lists and program (see the section above). Judged with ``MXFP8_SCALE_SEMANTICS``."""
    spec = case.pools[0]
    if spec.attention is not Attention.MHA or case.page_size != MXFP8_PAGE_SIZE:
        raise ValueError(f"an MXFP8 pool holds MHA rows at page size {MXFP8_PAGE_SIZE}, not {spec.attention.value} "
                         f"at page size {case.page_size}")
    row = mxfp8_scale_row_bytes(spec.row_bytes("k"))
    scales = PoolSpec(name=f"{spec.name}-scales", attention=Attention.MHA, dtype=KVDtype.FP8, heads=1, head_dim=row)
    return case.replace(layout=HostLayout.PAGE_FIRST_DIRECT, pools=(scales,))


# ---- A layer-sharded MLA host pool in the oracle's terms (pool_host/mla.py; hybrid_pool_assembler.py) ---------
#
# * Where it exists. A DSA MLA model under prefill context parallelism splits each pipeline stage's L device layers
#   over the CP ranks (``LayerSplitDSATokenToKVPool``): rank r of n stores the contiguous local layers
#   ``layer_shard_range(r, n, L)`` (the first ``L % n`` ranks one layer more), the other layers are 0-row
#   placeholders. Its MLA host pool is built over the owned range's buffer info (``_mla_buffer_info``) with
#   ``layer_shard_enabled`` and ``target_layer_num = ceil(L / n)``: every rank's host pool has the same shape.
# * Host layers. Compact: owned layer ``s + j`` is host layer j. Host layers from the owned count up to
#   ``ceil(L / n)`` are never written (a rank owning fewer layers than that leaves them). Packed draft i is host
#   layer ``ceil(L / n) + i``, transfer id ``L + i``: drafts take no part in the sharding.
# * The case is the rank's share: its layers are the owned layers, then the drafts, on both sides (case layer j is
#   device layer ``s + j`` and host layer j; case draft i is the draft device pool i and host layer
#   ``ceil(L / n) + i``). Every transfer of the case is then the single-transfer oracle's. Bytes outside the case
#   keep their values: the other ranks' device layers (full buffers in this harness, sglang's host pool never sees
#   them) and the host layers no owned layer maps to.
# * Transfers of other layer ids (the other ranks' layers, ids past the stage) move nothing: the pool ignores them.
# * What moves them: the layer-shard branch of the back-up, one owned layer after another then the drafts, with
#   the JIT one-layer kernel where it takes the row, else (layer_first only) sgl_kernel's transfer_kv_per_layer_mla;
#   with direct io, transfer_kv_direct (layer_first only). Loads are wired on every layout.
# * What it refuses (``mla_shard_backup_refusal``). sglang builds the pool on page_first without the JIT kernel and on
#   page_first_direct, and raises ValueError at every back-up there, at the first owned layer, before a byte moves
#   ("... with page_first layout requires the JIT one-layer kernel.", "... does not support layout:
#   page_first_direct", "Layer-sharded direct HiCache backup only supports layer_first layout, ..."). Whether
#   page_first is refused hangs on the pool's ``can_use_jit``: ``can_use_hicache_jit_kernel`` over the latent row's
#   bytes and the page size (the TMA kernel where its chunk of rows tiles the page, else the register kernel's
#   copy rounds; contract.hicache_jit_takes_row). The contract predicts the refusal (``EntryPoint.MLA_SHARDED``):
#   a case whose sequence backs up there must be rejected; a load-back case whose program has no back-up moves.

def layer_shard_range(rank: int, size: int, layers: int) -> tuple[int, int]:
    """[start, end) of the local layers rank `rank` of `size` owns among `layers`: contiguous ranges, as even as
    possible, the first ``layers % size`` ranks one layer more."""
    base, extra = divmod(layers, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard_stage_layers(owned: int, size: int, rank: int, remainder: int) -> int:
    """The stage's layer count L with ``L % size == remainder`` of which rank `rank` owns `owned` layers (each
    remainder gives one: the rank owns the even share, one more where it is among the first `remainder` ranks)."""
    if not (owned >= 1 and 0 <= rank < size and 0 <= remainder < size):
        raise ValueError(f"no stage where rank {rank} of {size} owns {owned} layers with remainder {remainder}")
    return (owned - (rank < remainder)) * size + remainder


def shard_host_target_layers(stage_layers: int, size: int) -> int:
    """The target layers of every rank's MLA host pool: ``ceil(L / size)``."""
    return -(-stage_layers // size)


def mla_shard_backup_refusal(layout: HostLayout, jit: bool) -> str:
    """Why sglang's layer-sharded MLA host pool must refuse a back-up on `layout`, `jit` whether the JIT one-layer
    kernel takes its row at its page size ('' if it moves it). The io backend adds nothing: the pool moves
    page_first with kernel io only and page_first_direct with direct io only (the server's start-up resolution),
    and refuses page_first_direct with either."""
    if layout is HostLayout.LAYER_FIRST or (layout is HostLayout.PAGE_FIRST and jit):
        return ""
    if layout is HostLayout.PAGE_FIRST:
        return ("the layer-sharded MLA back-up on page_first needs the JIT one-layer kernel, which does not take this "
                "row at this page size (sglang raises ValueError at every back-up)")
    return (f"the layer-sharded MLA back-up moves layer_first (and page_first with the JIT kernel) only, not "
            f"{layout.value} (sglang raises ValueError at every back-up)")


# ---- A layer-sharded DSA indexer pool in the oracle's terms (pool_host/dsa.py; dsa_cache_layer_split.py) --------
#
# * Where it exists. Under prefill context parallelism a DSA MLA model's device pool is one
#   ``LayerSplitDSATokenToKVPool``: the MLA KV rows and the indexer's index buffers of the stage's L layers, split
#   alike over the CP ranks (rank r of n owns ``layer_shard_range(r, n, L)`` of both; the other layers, and the owned
#   layers that skip top-k, hold 0-row index placeholders). Its host pools are the layer-sharded MLA pool (section
#   above) and the indexer, built by the indexer's declaration over the same device pool. MTP draft pools take no
#   part in the sharding (draft workers keep the full cache).
# * Host layers. Compact, and only the owned layers that own index keys: the indexer's host layer j is the j-th
#   layer of the owned range that does not skip top-k (``dsa_shard_index_layers``), then packed draft i at host
#   layer ``that count + i`` (transfer id ``L + i``). Unlike the MLA anchor (``ceil(L / n)`` target layers) the
#   indexer leaves no host layer unwritten.
# * The case is the rank's indexer share: its layers are those host layers (the owned index layers, then the drafts),
#   on both sides. Its stage follows from them: the smallest L with ``L % n`` the remainder whose rank-r range holds
#   that many index layers (``dsa_shard_stage_layers``; each owned layer more moves the range's end by one layer
#   and its start by r, so the count steps by at most one and every count is met). The MLA anchor is the
#   layer-sharded MLA pool of that stage, judged in the section above's terms (the rank's owned layers).
# * Transfers of other layer ids (the other ranks' layers, the owned layers that skip top-k, -1, L) move nothing.
# * Back-ups go layer by layer (owned index layers, then the drafts) and exist on layer_first only: the kernel io's
#   per-layer op, or transfer_kv_direct. On page_first and page_first_direct sglang builds the pool and raises
#   ValueError at every back-up, before the indexer moves a byte (``dsa_shard_backup_refusal``). The contract
#   predicts that refusal: a sharded DSA case whose sequence backs up on those layouts must be rejected
#   (``EntryPoint.DSA_SHARDED``); its loads move as the unsharded indexer's.

@functools.lru_cache(maxsize=4096)
def dsa_shard_stage_layers(index_layers: int, size: int, rank: int, remainder: int, first_layer: int,
                           freq: int) -> int:
    """The stage's layer count L (``L % size == remainder``, from global layer `first_layer`) whose rank-`rank`
    share holds exactly `index_layers` layers that own index keys under ``index_topk_freq`` `freq`: the smallest
    such. ValueError if none (a split of more ranks than the knob draws)."""
    if index_layers < 1 or freq < 1 or first_layer < 0:
        raise ValueError(f"no DSA stage of {index_layers} index layers at layer {first_layer}, freq {freq}")
    for owned in range(1, freq * (index_layers + 2) + size + 1):
        stage = shard_stage_layers(owned, size, rank, remainder)
        start, end = layer_shard_range(rank, size, stage)
        if index_layers_in(first_layer + start, first_layer + end, freq) == index_layers:
            return stage
    raise ValueError(f"no stage where rank {rank} of {size} (remainder {remainder}) owns {index_layers} index "
                     f"layers from layer {first_layer} with index_topk_freq {freq}")


def dsa_shard_index_layers(skip_topk_layers: tuple[bool, ...], start: int, end: int) -> tuple[int, ...]:
    """The stage-local device layers of a layer-sharded indexer's host layers, in order: the owned range
    ``[start, end)``'s layers that own index keys."""
    return tuple(layer for layer in range(start, end) if not skip_topk_layers[layer])


def dsa_shard_backup_refusal(layout: HostLayout) -> str:
    """Why the layer-sharded DSA indexer must refuse a back-up on `layout` ('' if it moves it)."""
    if layout is HostLayout.LAYER_FIRST:
        return ""
    return (f"the layer-sharded DSA indexer backs up layer_first only, not {layout.value} (sglang raises ValueError "
            f"at every back-up)")


# ---- Token-major (strided) device rows in the oracle's terms (unified_memory_pool.py; pool_host/base.py) --------
#
# * Where they exist. Under --enable-unified-memory every KV sub-pool lives in one uint8 buffer whose slot entry
#   holds all of a token's rows (``UnifiedKVPool``: K_0 V_0 K_1 V_1 ... for MHA, the latent rows for MLA, the entry
#   rounded up to 32 bytes), and the device pool's per-layer tensors are views of it: row d of layer l is entry d at
#   layer l's offset, so consecutive rows are an entry apart, not a row apart. The host pool records that stride
#   when it is built (``_init_device_row_stride``) and its transfers must step device rows by it.
# * The oracle does not change: the case's device storage holds the logical rows (row d of layer l: the bytes of
#   layer l's view at row d), the host layouts are the same, and every transfer moves the same rows.
# * Refusals. The MHA and MLA host pools refuse the sgl_kernel ops that address device rows as index x row width
#   (``_require_packed_device_rows``: NotImplementedError before the op runs): the per-token AOT ops where the JIT
#   kernel does not take the row (layer_first, page_first), every page_head op, and the page_first_direct direct
#   ops. The refusal is right: such an op would read and write rows inside other entries. It is late, though: the
#   pool is built and then refuses its first transfer, so, as the DSA indexer's kernel row rule above, such cases
#   are unsupported with the rule as the reason. The JIT kernels (a device stride of its own) and the layer_first
#   direct op (tensor slices) take the rows, and the staged page_first write-back, which reads whole device pages,
#   is not selected for them (the pool turns it off).
# * The asymmetric MHA pool refuses nothing: its page_first kernel io goes through the per-token AOT ops whatever the
#   device stride. The contract expects the rows moved; a run that moves others is a finding.
# * Which views are strided. A view is strided where the entry is wider than its row: always for MHA (an entry holds
#   every layer's K and V rows), for MLA unless the pool has one layer whose row is a multiple of 32 bytes (the entry
#   is then that row, the view contiguous, and the host pool takes the rows as packed: ``token_major_rows_strided``).
# * Packed MTP draft layers. A draft model's layers never live in a unified pool of their own (the draft worker builds
#   none): they are fused into the target's entries (``UnifiedDraftKVPool``, HiCache's fused draft mode, served by
#   page-envelope host pools this oracle does not model) or the draft keeps a private packed pool. sglang refuses the
#   second with HiCache at start-up (the unified Mamba- and SWA-hybrid pools need the EAGLE draft fused, and the fused
#   mode needs DFLASH), and the MHA and MLA host pools refuse it too: handed token-major target rows and packed draft
#   rows (``draft_buffer_infos``), ``_init_device_row_stride`` raises NotImplementedError in the constructor, before
#   any byte moves (the device buffers "do not share one row stride"). That refusal is the host pool's guard against
#   moving draft rows by the target's stride, and a clean one: the contract predicts it
#   (``EntryPoint.MIXED_ROW_STRIDES``, ``MIXED_ROW_STRIDES_REFUSAL``) where the target rows are strided; a target of
#   contiguous views beside packed drafts is packed rows throughout, and moves.

MIXED_ROW_STRIDES_REFUSAL = ("the host pool refuses device rows of mixed strides: token-major target rows beside "
                             "packed draft rows (NotImplementedError when it is built)")


def token_major_entry(layers: int, row_bytes: tuple[int, ...]) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """A unified pool's slot entry of `layers` layers of these rows (bytes per component: K and V for MHA, the
    latent row for MLA): (its bytes, the byte offset in it of each component's row of each layer,
    ``[component][layer]``). Each layer's rows follow the previous layer's, its components in order (K_0 V_0 K_1
    V_1 ...); the entry is rounded up to UNIFIED_ENTRY_ALIGN bytes, and the bytes past the last row belong to no
    row."""
    per_layer = sum(row_bytes)
    offsets = tuple(tuple(layer * per_layer + sum(row_bytes[:component]) for layer in range(layers))
                    for component in range(len(row_bytes)))
    return -(-layers * per_layer // UNIFIED_ENTRY_ALIGN) * UNIFIED_ENTRY_ALIGN, offsets


def token_major_rows_strided(target_layers: int, row_bytes: tuple[int, ...]) -> bool:
    """Whether a unified pool's per-layer views of `target_layers` layers of these rows (bytes per component) step
    their rows by more than a row: the entry (token_major_entry) is wider than one row. Always for MHA (the entry
    holds a K and a V row); for MLA unless one layer's row is the whole entry."""
    return token_major_entry(target_layers, row_bytes)[0] != row_bytes[0]


def strided_rows_refusal(name: str, layout: HostLayout, io_backend: str, jit: bool) -> str:
    """The sgl_kernel op class `name` refuses to run on token-major device rows for this layout and io backend,
    `jit` whether the JIT kernel takes the row ('' if the pool moves them)."""
    if name == "AsymmetricMHATokenToKVPoolHost":
        return ""
    mla = "_mla" if name == "MLATokenToKVPoolHost" else ""
    if layout is HostLayout.PAGE_HEAD:
        op = "transfer_kv_per_layer_ph_lf / transfer_kv_all_layer_lf_ph"
    elif layout is HostLayout.PAGE_FIRST_DIRECT and io_backend == DIRECT:
        op = "transfer_kv_per_layer_direct_pf_lf / transfer_kv_all_layer_direct_lf_pf"
    elif io_backend == KERNEL and not jit and layout is HostLayout.LAYER_FIRST:
        op = f"transfer_kv_per_layer{mla} / transfer_kv_all_layer{mla}"
    elif io_backend == KERNEL and not jit and layout is HostLayout.PAGE_FIRST:
        op = f"transfer_kv_per_layer{mla}_pf_lf / transfer_kv_all_layer{mla}_lf_pf"
    else:
        return ""
    return (f"{name} refuses {op} on token-major device rows (NotImplementedError at the first transfer: the op "
            f"steps device rows by the row width); the refusal is right, and late")
