"""``DSAIndexerPoolHost`` for ``sglang-hicache``: DeepSeek sparse attention's indexer host pool, built and grouped as
sglang's DSA stack builds it, beside its MLA anchor in the HybridCacheController's HostPoolGroup.

In production one device pool (``DSATokenToKVPool``) holds the MLA KV rows and the indexer's K-with-scale bytes and
declares two host pools (``host_pool_decls``): the KV pool (layout root and index anchor) and the indexer
(``make_dsa_indexer_pool_decl``: ``indices_from_pool=KV``, ``layout_source=KV``, ``owned_device_layers`` = the layers
that do not skip top-k). ``_DsaStrategy.build`` binds the declarations to transfer layers
(``prepare_host_pool_config``), builds the KV host pool, then the indexer's through the declaration's own builder,
groups both (``HostPoolGroup`` of ``build_pool_entry`` entries) under a ``HybridCacheController``; the radix tree
hands the indexer to every ``write`` and ``load`` as a sidecar transfer (``PoolTransfer(INDEXER,
indices_from_pool=KV)``), whose indices the controller takes from the KV transfer. This module does the same with
sglang's own declaration, config binding, builder, entry builder and transfer type.

What the case describes (oracles/pool_layouts.py, the DSA section): its one pool is the indexer, a one-component
pool of E-byte token rows, E = ``page_bytes / page_size``; its layers are the indexer's host layers (the target
layers that own index keys, then the packed draft layers). The tensors hold ``indexer_page_num`` pages per layer
(more than the case's): the case's storages are their first pages, read through views (``case_pairs``), and the
tail pages must keep their bytes. The MLA anchor is built with the case's row width over every target layer of the
stage (skipped ones included) and is judged too: it is filled with a pattern before the sequence and must hold
after it what the oracle computes for it (the case with the anchor's layer count).

Layer-sharded (``layer_shard`` knob; oracles/pool_layouts.py, the layer-sharded DSA section): production's device
pool is one ``LayerSplitDSATokenToKVPool`` whose KV rows and index buffers are split alike over the CP ranks. The
anchor is the layer-sharded MLA pool of the stage (kernels/sglang_hicache_device.py) and the stand-in takes its
layer-shard fields (``layer_shard_enabled``, rank, size, start, ``_owned_local_layer_range``), so that sglang's
indexer host pool keeps the owned range's index layers only. The case's layers are those index layers (then the
drafts); the anchor is judged over the rank's share, and the other ranks' layers (index buffers and anchor rows,
kept full here where production's are 0-row placeholders) and the anchor's unwritten host layers must keep their
bytes.

Stand-ins:

* ``DSADevicePoolStandIn`` for ``DSATokenToKVPool``. Its constructor needs the model's DSA configuration (an index
  head dim of 128, 64-token physical pages on CUDA, page size 1 or multiples of 16 on ROCm, the parallel context's
  DCP size); the host pool, its declaration, builder and config read only the fields the stand-in has (page size,
  index page size and format, ``skip_topk_layers``, layer range, device, store dtype, ``layer_shard_enabled``, the
  per-layer index buffers sized as its index key cache sizes them, 0-row placeholders for skipped layers) and its
  ``host_pool_decls`` (``DSATokenToKVPool``'s: the KV pool's own declaration, then the indexer's). The KV rows live
  in a real ``MLATokenToKVPool`` beside it (the one object of production split in two: the KV declaration and the
  anchor entry name the MLA pool, the indexer's name the stand-in).
* The index format: ``index_head_dim = quant_block_size = E - 4`` (one fp32 scale per token, as DeepSeek V3.2's
  128 + 4 bytes) and ``index_kpool = 1``, so that sglang's own byte count gives the case's E.
* The group's entries: ``_build_pool_entries``'s loop (the declaration's builder with allocator type ``default``,
  then ``build_pool_entry``), since that function reads the allocator type from the server's published settings.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Case, HostLayout
from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels.buffers import PoolBuffers
from hicache_fuzz.kernels.sglang_hicache_settings import LayerShard, dsa_index_layers, layer_shard
from hicache_fuzz.oracles import pool_layouts, sequence
from hicache_fuzz.oracles.contract import EntryPoint, semantics_of
from hicache_fuzz.oracles.transfer import storage_key

DSA = "DSAIndexerPoolHost"


def index_format(row_bytes: int) -> tuple[int, int]:
    """(index_head_dim, quant_block_size) whose DSA bytes per token (``head_dim + head_dim // block * 4``) are
    `row_bytes`: one 4-byte scale per token where the row has room for one, else none."""
    if row_bytes > 4:
        return row_bytes - 4, row_bytes - 4
    return row_bytes, row_bytes + 1


class DSADevicePoolStandIn:
    """``DSATokenToKVPool`` as far as the indexer's declaration, config, builder, host pool and the controller read it
    (see the module doc), beside the real MLA pool `kv_pool` that holds the KV rows."""

    layer_transfer_counter: Any = None
    layer_shard_enabled = False

    def __init__(self, kv_pool: Any, row_bytes: int, skip_topk_layers: tuple[bool, ...]) -> None:
        from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

        if len(skip_topk_layers) != kv_pool.layer_num:
            raise ValueError(f"harness: {len(skip_topk_layers)} skip_topk_layers flags for {kv_pool.layer_num} layers")
        if kv_pool.layer_shard_enabled:
            # production's one LayerSplitDSATokenToKVPool: its index buffers are split over the ranks as its KV rows
            self.layer_shard_enabled = True
            self.layer_shard_rank, self.layer_shard_size = kv_pool.layer_shard_rank, kv_pool.layer_shard_size
            self.layer_shard_start = kv_pool.layer_shard_start
            self._owned_local_layer_range = kv_pool._owned_local_layer_range
        self.kv_pool = kv_pool
        self.page_size = self.index_page_size = kv_pool.page_size
        self.index_kpool = 1
        self.index_head_dim, self.quant_block_size = index_format(row_bytes)
        self.skip_topk_layers = list(skip_topk_layers)
        self.layer_num, self.start_layer, self.end_layer = kv_pool.layer_num, kv_pool.start_layer, kv_pool.end_layer
        self.device, self.store_dtype, self.size = kv_pool.device, kv_pool.store_dtype, kv_pool.size
        pages = pool_layouts.indexer_page_num(kv_pool.size, self.page_size)
        self.index_k_with_scale_buffer = [
            torch.zeros((0 if skip else pages, self.page_size * row_bytes),
                        dtype=DSATokenToKVPool.index_k_with_scale_buffer_dtype, device=kv_pool.device)
            for skip in skip_topk_layers]

    def register_layer_transfer_counter(self, counter: Any) -> None:
        self.layer_transfer_counter = counter

    def host_pool_decls(self) -> tuple[Any, ...]:
        """``DSATokenToKVPool.host_pool_decls``: the KV pool's declaration, then the indexer's unless no layer holds
        index keys."""
        from sglang.srt.mem_cache.pool_host.dsa import make_dsa_indexer_pool_decl

        kv_decls = tuple(self.kv_pool.host_pool_decls())
        if not self.index_k_with_scale_buffer or all(self.skip_topk_layers):
            return kv_decls
        return (*kv_decls, make_dsa_indexer_pool_decl(self))


class DsaGroup:
    """A DSA case's objects: the indexer's device pool stand-ins and host pool, the MLA anchor's device pools and
    host pool, the declarations bound to transfer layers (``HostPoolGroupConfig``), the stage-local device layers
    of the case's layers and the layer shard (from the oracle's terms), and the bytes that must keep their values
    (the indexer's tail pages, a sharded case's other layers) or match the oracle (the anchor)."""

    def __init__(self, device: DSADevicePoolStandIn, drafts: list[DSADevicePoolStandIn], host: Any,
                 anchor_device: Any, anchor_drafts: list[Any], anchor_host: Any, config: Any,
                 layers: tuple[int, ...], shard: LayerShard | None) -> None:
        self.device, self.drafts, self.host = device, drafts, host
        self.anchor_device, self.anchor_drafts, self.anchor_host = anchor_device, anchor_drafts, anchor_host
        self.config = config
        self.layers, self.shard = layers, shard
        self.outside_before: list[torch.Tensor] = []
        self.anchor_before: dict[str, torch.Tensor] = {}


def load_module() -> Any:
    """sglang's ``pool_host.dsa``, its AOT op names pointing at callable ops (it binds them at import)."""
    import sglang.srt.mem_cache.pool_host.dsa as module

    from hicache_fuzz.kernels.sglang_pool import _rebind_placeholder_ops

    _rebind_placeholder_ops(module)
    return module


def build_indexer(case: Case, anchor_device: Any, anchor_drafts: list[Any], anchor_host: Any,
                  skip: tuple[bool, ...]) -> DsaGroup:
    """The indexer of a DSA case over the MLA anchor's device pools and host pool: the declarations bound as
    ``_DsaStrategy.build`` binds them, the host pool through the indexer declaration's own builder."""
    from sglang.srt.mem_cache.hybrid_cache.host_pool_config import prepare_host_pool_config

    load_module()
    spec = case.pools[0]
    row = spec.row_bytes(spec.components[0])
    device = DSADevicePoolStandIn(anchor_device, row, skip)
    drafts = [DSADevicePoolStandIn(pool, row, (False,)) for pool in anchor_drafts]
    target = anchor_device.layer_num
    config = prepare_host_pool_config(decls=device.host_pool_decls(), full_layer_mapping={i: i for i in range(target)},
                                      transfer_layer_id_max=target, transfer_page_size=case.page_size,
                                      packed_draft_device_pools=tuple(drafts))
    if len(config.pools) != 2:
        raise RuntimeError(f"harness: the DSA declarations bound to {len(config.pools)} host pools, not KV + indexer")
    indexer = config.pools[1]
    host = indexer.decl.host_pool_builder.build(decl=indexer.decl, anchor_host=anchor_host, allocator_type="default",
                                                packed_draft_device_pools=indexer.packed_draft_device_pools)
    return DsaGroup(device, drafts, host, anchor_device, anchor_drafts, anchor_host, config, dsa_index_layers(case),
                    layer_shard(case))


def group_entries(mods: Any, group: DsaGroup) -> list[Any]:
    """The HostPoolGroup's entries, as ``_build_pool_entries`` makes them: KV anchor first, then the indexer."""
    entries = []
    for pool_config in group.config.pools:
        decl = pool_config.decl
        entries.append(mods.build_pool_entry(
            name=decl.pool_name, host_pool=group.anchor_host if decl.is_layout_root else group.host,
            device_pool=decl.device_pool, layer_mapping=pool_config.layer_mapping,
            transfer_layer_id_max=pool_config.transfer_layer_id_max, is_anchor=decl.is_primary,
            packed_draft_device_pools=pool_config.packed_draft_device_pools))
    return entries


def sidecar_transfers(group: DsaGroup) -> list[Any]:
    """The sidecar transfers the radix tree hands ``write`` and ``load`` (fresh ones: the controller fills in their
    indices): one per declared pool that is not the primary, from its ``sidecar_spec``."""
    from sglang.srt.mem_cache.hicache_storage import PoolTransfer

    specs = [c.decl.sidecar_spec() for c in group.config.pools if not c.decl.is_primary]
    return [PoolTransfer(name=s.pool_name, hit_policy=s.hit_policy, indices_from_pool=s.indices_from_pool)
            for s in specs]


def skipped_layers(group: DsaGroup) -> list[int]:
    """Target device layers without index keys: their loads must move nothing."""
    return [layer for layer, skip in enumerate(group.device.skip_topk_layers) if skip]


# ---- the case's bytes <-> sglang's tensors ---------------------------------------------------------------

def _layer_buffers(group: DsaGroup) -> list[torch.Tensor]:
    """The index buffers of the case's layers: the target layers that own index keys (of the rank's range where the
    case is layer-sharded), then the drafts."""
    return [group.device.index_k_with_scale_buffer[layer] for layer in group.layers] + [
        p.index_k_with_scale_buffer[0] for p in group.drafts]


def case_pairs(pool: PoolBuffers, group: DsaGroup) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, theirs) views of equal shape: each case layer's device rows and the case's host storage over the
    first pages of sglang's tensors (oracles/pool_layouts.py, the DSA section)."""
    case = pool.case
    ps, rows, slots, layers = case.page_size, case.device_rows, case.host_slots, case.layers
    row = pool.spec.row_bytes(pool.spec.components[0])
    buffers = _layer_buffers(group)
    if len(buffers) != layers:
        raise RuntimeError(f"harness: the DSA indexer has {len(buffers)} layers with index keys, the case {layers}")
    out = [(pool.device_layer(pool.spec.components[0], layer), buffer[: rows // ps].view(rows, row))
           for layer, buffer in enumerate(buffers)]
    host = group.host.index_k_with_scale_buffer
    want = pool_layouts.dsa_host_shape(case.layout, layers, slots, ps, row)
    if tuple(host.shape) != want:
        raise RuntimeError(f"harness: sglang's DSA indexer host tensor is {tuple(host.shape)}, the oracle's {want}")
    pages, payload = slots // ps, pool.host.payload
    if case.layout is HostLayout.LAYER_FIRST:
        out.append((payload.view(layers, slots, row), host[:, :pages].view(layers, slots, row)))
    elif case.layout is HostLayout.PAGE_FIRST:
        # page-major in sglang, token-major in the case: token row (l, t) is page t // ps, layer l, row t % ps
        out.append((payload.view(pages, ps, layers, row), host[:pages].view(pages, layers, ps, row).transpose(1, 2)))
    else:
        out.append((payload.view(pages, layers, ps, row), host[:pages].view(pages, layers, ps, row)))
    return out


def _outside(case: Case, group: DsaGroup) -> list[tuple[str, torch.Tensor]]:
    """(what, tensor) of sglang's bytes that are neither the case's nor its anchor's: the pages past the case's
    (device pages past ``device_rows / ps`` at page size 1, host pages past ``host_slots / ps``), and for a
    layer-sharded case the other ranks' index buffers and anchor rows and the anchor's unwritten host layers."""
    device_pages, host_pages = case.device_rows // case.page_size, case.host_pages
    past = "(past the case's pages, never addressed)"
    regions = [(f"{DSA} device layer {layer} pages from {device_pages} {past}", b[device_pages:])
               for layer, b in enumerate(_layer_buffers(group)) if b.shape[0] > device_pages]
    host = group.host.index_k_with_scale_buffer
    tail = host[:, host_pages:] if case.layout is HostLayout.LAYER_FIRST else host[host_pages:]
    regions.append((f"{DSA} host pages from {host_pages} {past}", tail))
    shard = group.shard
    if shard is None:
        return regions
    owned = range(shard.start, shard.start + shard.owned)
    not_owned = f"(rank {shard.rank} of {shard.size} does not own it)"
    regions += [(f"{DSA} device layer {layer} {not_owned}", buffer)
                for layer, buffer in enumerate(group.device.index_k_with_scale_buffer)
                if layer not in owned and buffer.numel()]
    regions += [(f"the MLA anchor's device layer {layer} {not_owned}", buffer.view(torch.uint8))
                for layer, buffer in enumerate(group.anchor_device.kv_buffer) if layer not in owned]
    spare = devices.unwritten_mla_host_layers(*_sharded_anchor_host(case, group, shard), shard)
    if spare is not None:
        regions.append((f"the MLA anchor's host layers {shard.owned}..{shard.host_target_layers - 1} (no owned "
                        f"layer maps to them)", spare))
    return regions


# ---- bytes that are not the case's: the indexer's tail pages, a sharded case's other layers, the MLA anchor --

def _anchor_tensors(group: DsaGroup) -> list[torch.Tensor]:
    """Every tensor of the anchor: its per-layer device tensors (target layers, then drafts) and its host tensor."""
    return [*group.anchor_device.kv_buffer, *[p.kv_buffer[0] for p in group.anchor_drafts],
            group.anchor_host.kv_buffer]


def _sharded_anchor_host(case: Case, group: DsaGroup, shard: LayerShard) -> tuple[torch.Tensor, int]:
    row = case.pools[0].row_bytes(case.pools[0].components[0])
    return devices.sharded_mla_host(group.anchor_host.kv_buffer, case, shard, len(group.anchor_drafts), row)


def _anchor_storages(case: Case, group: DsaGroup) -> dict[str, torch.Tensor]:
    """CPU copies of the anchor's bytes as the oracle's payloads of the anchor case: every layer of the stage, or
    the rank's share of a layer-sharded one (its owned device layers and their host layers, then the drafts)."""
    shard = group.shard
    device = list(group.anchor_device.kv_buffer)
    if shard is None:
        host = group.anchor_host.kv_buffer.view(torch.uint8).reshape(-1).cpu().clone()
    else:
        device = device[shard.start : shard.start + shard.owned]
        view, axis = _sharded_anchor_host(case, group, shard)
        host = torch.cat([part.cpu() for part in devices.sharded_mla_share(view, axis, shard,
                                                                             len(group.anchor_drafts))],
                         dim=axis).reshape(-1)
    device += [p.kv_buffer[0] for p in group.anchor_drafts]
    name = case.pools[0].name
    return {storage_key(name, "device"): torch.cat([t.view(torch.uint8).reshape(-1).cpu() for t in device]),
            storage_key(name, "host"): host}


def anchor_case(case: Case, group: DsaGroup) -> Case:
    """The case the anchor is: the case's pool, index lists and program over the anchor's layers (every target
    layer of the stage, or the rank's owned layers of a layer-sharded one, then the drafts)."""
    target = group.shard.owned if group.shard is not None else len(group.anchor_device.kv_buffer)
    return case.replace(layers=target + len(group.anchor_drafts))


def _pattern(tensor: torch.Tensor, modulus: int, offset: int = 0, step: int = 1) -> torch.Tensor:
    count = torch.arange(tensor.numel(), device=tensor.device)
    return ((count * step + offset) % modulus).to(torch.uint8).view(tensor.shape)


def fill_and_snapshot(case: Case, group: DsaGroup) -> None:
    """Fill the anchor, then the bytes outside the case and its anchor (_outside), with patterns a stray or missing
    write would change (a byte counting up, differently in every tensor), then record them."""
    for index, tensor in enumerate(_anchor_tensors(group)):
        flat = tensor.view(torch.uint8).view(-1)
        flat.copy_(_pattern(flat, 251, index, 7))
    outside = [tensor for _what, tensor in _outside(case, group)]
    for tensor in outside:
        tensor.copy_(_pattern(tensor, 241))
    group.outside_before = [t.clone() for t in outside]
    group.anchor_before = _anchor_storages(case, group)


def check(case: Case, group: DsaGroup) -> str:
    """'' if the bytes outside the case and its anchor kept their values and the anchor holds what the oracle
    computes for it after the case's sequence, else what differs."""
    for (what, tensor), before in zip(_outside(case, group), group.outside_before, strict=True):
        if not torch.equal(tensor, before):
            return f"{what} changed"
    anchor = anchor_case(case, group)
    expected = {key: value.clone() for key, value in group.anchor_before.items()}
    sequence.apply_sequence(anchor, expected, semantics_of(EntryPoint.REFERENCE, anchor))
    actual = _anchor_storages(case, group)
    for key, want in expected.items():
        if not torch.equal(actual[key], want):
            differs = (actual[key] != want).nonzero()
            return (f"the MLA anchor's {key.split('/')[1]} bytes differ from the oracle's after the sequence (first "
                    f"at byte {int(differs[0])}, {len(differs)} bytes)")
    return ""
