"""Two device pools of ``sglang-hicache`` beyond the packed per-layer pool, and the bytes around them that no case
storage holds (oracles/pool_layouts.py states the rules for both; docs/pools.md, "Device pool shapes").

* A layer-sharded MLA device pool (``layer_shard`` knob). In production it is ``LayerSplitDSATokenToKVPool``, a
  DSA pool whose constructor needs the model's DSA configuration and the CP group's communicator. The MLA host pool
  reads from it only what ``MLATokenToKVPool`` has: ``_mla_buffer_info`` (inherited) with the pool's
  ``layer_shard_enabled`` and ``_owned_local_layer_range()``, which it hands over as the owned range's buffer info.
  So the stand-in is a real ``MLATokenToKVPool`` over the stage's layers with the layer-shard fields
  ``LayerSplitDSATokenToKVPool.__init__`` sets and its ``_owned_local_layer_range`` (sglang's
  ``get_layer_shard_range`` over the pool's rank, size and layers). Production's pool holds 0-row placeholders for
  the other ranks' layers; the stand-in keeps them full, filled with a pattern that must survive the sequence
  (nothing of sglang's host pool may reach them).
* Token-major device rows (``device_rows=token_major``): sglang's own ``UnifiedKVPool`` (one uint8 buffer, one entry
  of every layer's rows per slot, built from sub-pool specs without a model configuration) and its
  ``UnifiedMHATokenToKVPool`` / ``UnifiedMLATokenToKVPool`` over it: the per-layer device tensors are its strided
  views, and the host pool gets them through the pool's own buffer info. The unified pool needs a second sub-pool
  at the buffer's other end (production's is a Mamba or SWA pool): a one-layer pool of the case's row, never
  used. The bytes of each entry past the layers' rows (the entry is rounded up to 32 bytes) must survive.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention, Case, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.kernels.sglang_hicache_settings import LayerShard

# The pattern's modulus: a prime, so that a byte moved from another offset differs.
PATTERN_MODULUS = 239


def shard_mla_pool(pool: Any, shard: LayerShard) -> Any:
    """`pool` (an ``MLATokenToKVPool`` of the stage's layers) made the layer-sharded pool of rank ``shard.rank``:
    the fields ``LayerSplitDSATokenToKVPool`` sets before building its buffers, and its owned-range method."""
    from sglang.srt.layers.cp.utils import get_layer_shard_range

    pool.layer_shard_rank, pool.layer_shard_size = shard.rank, shard.size
    pool.layer_shard_enabled = True

    def owned_local_layer_range() -> tuple[int, int]:
        return get_layer_shard_range(pool.layer_shard_rank, pool.layer_shard_size, pool.layer_num)

    pool._owned_local_layer_range = owned_local_layer_range
    pool.layer_shard_start = pool.start_layer + owned_local_layer_range()[0]
    return pool


# The MLA host tensor per layout in the case's host storage shape (with its own layer count), and the layer axis.
MLA_HOST_LAYER_AXIS = {HostLayout.LAYER_FIRST: 0, HostLayout.PAGE_FIRST: 1, HostLayout.PAGE_FIRST_DIRECT: 1}


def mla_host_shape(case: Case, layers: int, row: int) -> tuple[int, ...]:
    """The case's MLA host storage shape (uint8, rows of `row` bytes) with `layers` layers."""
    S, ps = case.host_slots, case.page_size
    return {HostLayout.LAYER_FIRST: (layers, S, row), HostLayout.PAGE_FIRST: (S, layers, row),
            HostLayout.PAGE_FIRST_DIRECT: (S // ps, layers, ps, row)}[case.layout]


def sharded_mla_host(kv_buffer: torch.Tensor, case: Case, shard: LayerShard, drafts: int,
                     row: int) -> tuple[torch.Tensor, int]:
    """sglang's host tensor of a layer-sharded MLA pool as uint8 in the case's shape with its own layers
    (``ceil(L / size)`` target layers, then `drafts`), and the layer axis."""
    layers = shard.host_target_layers + drafts
    return kv_buffer.view(torch.uint8).view(mla_host_shape(case, layers, row)), MLA_HOST_LAYER_AXIS[case.layout]


def sharded_mla_share(host: torch.Tensor, axis: int, shard: LayerShard,
                      drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the owned layers, the drafts) of a sharded MLA host view (sharded_mla_host): the rank's share, its first
    host layers and those from ``ceil(L / size)``."""
    return host.narrow(axis, 0, shard.owned), host.narrow(axis, shard.host_target_layers, drafts)


def unwritten_mla_host_layers(host: torch.Tensor, axis: int, shard: LayerShard) -> torch.Tensor | None:
    """The host layers of a sharded MLA host view no owned layer maps to (a rank owning fewer than
    ``ceil(L / size)``), None if there are none."""
    spare = shard.host_target_layers - shard.owned
    return host.narrow(axis, shard.owned, spare) if spare > 0 else None


def mla_split(head_dim: int) -> tuple[int, int]:
    """(kv_lora_rank, qk_rope_head_dim) of a latent row of `head_dim` elements: the rope part 64 wide where the row
    has room beside it (DeepSeek's), else half the row; both positive, as sglang's unified MLA spec requires (any
    split gives the same bytes)."""
    rope = 64 if head_dim > 64 else head_dim // 2
    return head_dim - rope, rope


def unified_sub_pools(layers: int) -> tuple[tuple[str, int, str], ...]:
    """The sub-pools of a case's unified pool as (name, layers, grow direction): the case's `layers` layers at the
    buffer's grow-down end, and the one-layer pool the unified pool needs at its other end (never used)."""
    return (("full", layers, "down"), ("pad", 1, "up"))


def unified_row_fields(spec: PoolSpec) -> dict[str, int]:
    """The row fields of the case's sub-pool spec (``MLASubPoolSpec`` / ``MHASubPoolSpec``): the latent row split
    (mla_split), or the heads and K/V head dims (V as wide as K but for the asymmetric kind)."""
    if spec.attention is Attention.MLA:
        lora, rope = mla_split(spec.head_dim)
        return {"kv_lora_rank": lora, "qk_rope_head_dim": rope}
    v_head_dim = spec.v_head_dim if spec.attention is Attention.MHA_ASYM and spec.v_head_dim else spec.head_dim
    return {"head_num": spec.heads, "head_dim": spec.head_dim, "v_head_dim": v_head_dim}


def unified_stores_bytes(spec: PoolSpec) -> bool:
    """Whether the sub-pool spec stores the rows as uint8 (fp8 rows, as sglang's unified pool requires), not in
    the KV dtype."""
    return spec.dtype is KVDtype.FP8


def token_major_pool(case: Case, spec: PoolSpec, layers: int, dtype: torch.dtype, device: torch.device,
                     start: int) -> Any:
    """The case's device pool as sglang's unified pool builds it: `layers` layers of the case's rows in one entry
    per slot, ``device_rows`` slots (size + page size)."""
    from sglang.srt.mem_cache.unified_memory_pool import (
        MHASubPoolSpec,
        MLASubPoolSpec,
        UnifiedKVPool,
        UnifiedMHATokenToKVPool,
        UnifiedMLATokenToKVPool,
    )

    mla = spec.attention is Attention.MLA
    spec_class, dtype_field = (MLASubPoolSpec, {}) if mla else (MHASubPoolSpec, {"kv_cache_dtype": dtype})
    specs = [spec_class(name=name, layer_num=n, grow_direction=direction, **unified_row_fields(spec),
                        store_dtype=torch.uint8 if unified_stores_bytes(spec) else dtype, **dtype_field)
             for name, n, direction in unified_sub_pools(layers)]
    name = specs[0].name
    unified = UnifiedKVPool(total_bytes=case.device_rows * specs[0].entry_bytes(), sub_pool_specs=specs,
                            device=str(device), enable_memory_saver=False, page_size=case.page_size)
    if mla:
        # no layer range of its own: sglang builds it for the first stage's ids (settings.device_rows)
        return UnifiedMLATokenToKVPool(unified_buffer=unified, sub_pool_name=name, kv_cache_dtype=dtype,
                                       page_size=case.page_size)
    return UnifiedMHATokenToKVPool(unified_buffer=unified, sub_pool_name=name, page_size=case.page_size,
                                   start_layer=start, end_layer=start + layers, enable_alt_stream=False)


def entry_padding(views: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the whole buffer as rows of one entry, the byte columns of an entry no view covers) of token-major views
    over one buffer, None if the entries hold nothing but the views' rows."""
    first = views[0]
    stride = first.stride(0) * first.element_size()
    raw = torch.empty(0, dtype=torch.uint8, device=first.device).set_(first.untyped_storage())
    base = raw.data_ptr()
    covered = torch.zeros(stride, dtype=torch.bool)
    for view in views:
        offset = (view.data_ptr() - base) % stride
        covered[offset : offset + view[0].numel() * view.element_size()] = True
    if bool(covered.all()):
        return None
    entries = raw[: raw.numel() // stride * stride].view(-1, stride)
    return entries, (~covered).nonzero().view(-1).to(first.device)


class OutsideBytes:
    """Bytes of sglang's tensors that no case storage holds and that the sequence must leave as they were: each
    region is filled with a pattern (a byte counting up, differently in each region) before the sequence and
    compared with it after."""

    def __init__(self) -> None:
        self.regions: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []  # (what, tensor, columns or None)
        self.before: list[torch.Tensor] = []

    def add(self, what: str, tensor: torch.Tensor, columns: torch.Tensor | None = None) -> None:
        """A region: the whole of `tensor`, or (`columns` given) those columns of every row of a 2-D `tensor`."""
        self.regions.append((what, tensor, columns))

    def _read(self, tensor: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        raw = tensor.view(torch.uint8)
        return raw.index_select(1, columns) if columns is not None else raw.reshape(-1).clone()

    def fill_and_snapshot(self) -> None:
        self.before = []
        for index, (_what, tensor, columns) in enumerate(self.regions):
            current = self._read(tensor, columns)
            count = torch.arange(current.numel(), device=current.device).view(current.shape)
            pattern = ((count * 7 + index * 31) % PATTERN_MODULUS).to(torch.uint8)
            if columns is not None:
                tensor.view(torch.uint8).index_copy_(1, columns, pattern)
            else:
                tensor.view(torch.uint8).copy_(pattern.view(tensor.view(torch.uint8).shape))
            self.before.append(pattern)

    def changed(self) -> str:
        """'' if every region holds its pattern, else the first that does not."""
        for (what, tensor, columns), before in zip(self.regions, self.before, strict=True):
            now = self._read(tensor, columns)
            if not torch.equal(now, before):
                differs = int((now != before).sum())
                return f"{what} changed ({differs} bytes), although no case storage holds them"
        return ""
