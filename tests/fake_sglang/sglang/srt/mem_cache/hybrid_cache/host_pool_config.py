"""Fake: the packed draft layers' transfer ids after the target's, and the binding of host pool declarations to
transfer layers (sglang's prepare_host_pool_config: the KV root first, transfer layers of device layers that own no
buffer of a pool dropped from its mapping, packed draft tails kept, each draft's declaration of the same name as
the pool's packed draft device pool)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class HostPoolConfig:
    decl: Any
    layer_mapping: dict[int, int]
    transfer_layer_id_max: int
    packed_draft_device_pools: tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HostPoolGroupConfig:
    transfer_page_size: int
    pools: tuple[HostPoolConfig, ...]


def with_packed_draft_layer_mapping(layer_mapping: dict[int, int], *, transfer_layer_start: int,
                                    target_device_layer_num: int, draft_layer_num: int) -> dict[int, int]:
    return layer_mapping | {transfer_layer_start + d: target_device_layer_num + d for d in range(draft_layer_num)}


def prepare_host_pool_config(*, decls: tuple[Any, ...], full_layer_mapping: dict[int, int],
                             transfer_layer_id_max: int, transfer_page_size: int,
                             packed_draft_device_pools: tuple[Any, ...] = ()) -> HostPoolGroupConfig:
    roots = [d for d in decls if d.is_layout_root]
    if len(roots) != 1 or not roots[0].is_primary:
        raise ValueError("expected exactly one layout root, the primary KV pool")
    ordered = (roots[0], *[d for d in decls if not d.is_layout_root])
    target_layers = roots[0].device_pool.layer_num
    draft_decls = [{d.pool_name: d for d in pool.host_pool_decls()} for pool in packed_draft_device_pools]
    for drafts in draft_decls:
        if set(drafts) != {d.pool_name for d in decls}:
            raise ValueError("packed draft declares other host pools than the target")
    mapping = with_packed_draft_layer_mapping(full_layer_mapping, transfer_layer_start=transfer_layer_id_max,
                                              target_device_layer_num=target_layers,
                                              draft_layer_num=len(draft_decls))
    configs = []
    for decl in ordered:
        owned = decl.owned_device_layers
        layer_mapping = mapping if owned is None else {
            t: dev for t, dev in mapping.items() if dev >= target_layers or dev in set(owned)}
        configs.append(HostPoolConfig(decl=decl, layer_mapping=layer_mapping,
                                      transfer_layer_id_max=transfer_layer_id_max + len(draft_decls),
                                      packed_draft_device_pools=tuple(d[decl.pool_name].device_pool
                                                                      for d in draft_decls)))
    for config in configs[1:]:
        config.decl.host_pool_builder.validate(decl=config.decl, transfer_page_size=transfer_page_size,
                                               packed_draft_device_pools=config.packed_draft_device_pools)
    return HostPoolGroupConfig(transfer_page_size=transfer_page_size, pools=tuple(configs))
