"""A deliberately simple, loop-by-loop model of HiCache transfers, written from the sglang shapes alone.

It shares nothing with hicache_fuzz.oracles except the Case type: host tensors are numpy arrays in sglang's
documented shapes (docs/semantics.md section 2), rows are read and written one token at a time, and the
page-granular rules are spelled out per page. The oracle must agree with it on every case.
"""

from __future__ import annotations

import numpy as np

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, PoolSpec


def host_shape_and_key(case: Case, pool: PoolSpec, component: str) -> tuple[tuple[int, ...], int]:
    L, S, ps, P = case.layers, case.host_slots, case.page_size, case.host_slots // case.page_size
    H, G = pool.heads, pool.head_groups
    D = pool.head_bytes(component)  # numpy arrays of bytes: the last axis is the head's bytes
    layout = case.layout
    if pool.attention is Attention.MLA:
        return {HostLayout.LAYER_FIRST: (L, S, D), HostLayout.PAGE_FIRST: (S, L, D),
                HostLayout.PAGE_FIRST_DIRECT: (P, L, ps, D), HostLayout.PAGE_UNIFIED: (P, L, ps, D)}[layout], 0
    if layout is HostLayout.PAGE_UNIFIED:
        return (P, G, L, 2, ps, H // G, D), 0
    return {HostLayout.LAYER_FIRST: (L, S, H, D), HostLayout.PAGE_FIRST: (S, L, H, D),
            HostLayout.PAGE_FIRST_DIRECT: (P, L, ps, H, D), HostLayout.PAGE_HEAD: (P, H, ps, L, D)}[layout], 1


def host_arrays(case: Case, pool: PoolSpec, payload: np.ndarray) -> dict[str, np.ndarray]:
    """Split a host payload into per-component arrays (views) in sglang's shapes."""
    out = {}
    offset = 0
    if case.layout is HostLayout.PAGE_UNIFIED and pool.attention is not Attention.MLA:
        shape, _ = host_shape_and_key(case, pool, "k")
        whole = payload.reshape(shape)
        return {"k": whole[:, :, :, 0], "v": whole[:, :, :, 1]}
    for component in pool.components:
        shape, _ = host_shape_and_key(case, pool, component)
        size = int(np.prod(shape))
        out[component] = payload[offset : offset + size].reshape(shape)
        offset += size
    return out


def get_host_row(case: Case, pool: PoolSpec, array: np.ndarray, layer: int, token: int) -> np.ndarray:
    ps = case.page_size
    page, slot = token // ps, token % ps
    layout = case.layout
    if pool.attention is Attention.MLA:
        if layout is HostLayout.LAYER_FIRST:
            return array[layer, token]
        if layout is HostLayout.PAGE_FIRST:
            return array[token, layer]
        return array[page, layer, slot]
    if layout is HostLayout.LAYER_FIRST:
        return array[layer, token].reshape(-1)
    if layout is HostLayout.PAGE_FIRST:
        return array[token, layer].reshape(-1)
    if layout is HostLayout.PAGE_FIRST_DIRECT:
        return array[page, layer, slot].reshape(-1)
    if layout is HostLayout.PAGE_HEAD:
        return np.concatenate([array[page, h, slot, layer] for h in range(pool.heads)])
    # page_unified: array is (P, G, L, ps, H/G, D) for this component
    return array[page, :, layer, slot].reshape(-1)


def set_host_row(case: Case, pool: PoolSpec, array: np.ndarray, layer: int, token: int, row: np.ndarray) -> None:
    ps = case.page_size
    page, slot = token // ps, token % ps
    layout = case.layout
    if pool.attention is Attention.MLA:
        if layout is HostLayout.LAYER_FIRST:
            array[layer, token] = row
        elif layout is HostLayout.PAGE_FIRST:
            array[token, layer] = row
        else:
            array[page, layer, slot] = row
        return
    heads = row.reshape(pool.heads, -1)
    if layout is HostLayout.LAYER_FIRST:
        array[layer, token] = heads
    elif layout is HostLayout.PAGE_FIRST:
        array[token, layer] = heads
    elif layout is HostLayout.PAGE_FIRST_DIRECT:
        array[page, layer, slot] = heads
    elif layout is HostLayout.PAGE_HEAD:
        for h in range(pool.heads):
            array[page, h, slot, layer] = heads[h]
    else:
        array[page, :, layer, slot] = heads.reshape(pool.head_groups, pool.heads // pool.head_groups, -1)


def pairs(case: Case, page_runs: bool) -> list[tuple[int, int]]:
    """(host token, device row) pairs; the page-granular forms spelled out page by page."""
    ps = case.page_size
    h, d = list(case.host_indices), list(case.device_indices)
    page_first_direct = case.layout is HostLayout.PAGE_FIRST_DIRECT
    unified_write = case.layout is HostLayout.PAGE_UNIFIED and case.direction is Direction.WRITE_BACK
    if not (page_runs or page_first_direct or unified_write):
        return list(zip(h, d, strict=True))
    out = []
    for j in range(len(h) // ps):
        host_first, device_first = h[j * ps], d[j * ps]
        if page_first_direct or unified_write:
            host_first = (host_first // ps) * ps
        if unified_write:
            device_first = (device_first // ps) * ps
        for t in range(ps):
            out.append((host_first + t, device_first + t))
    return out


def naive_expected(case: Case, device: dict[str, np.ndarray], host: dict[str, np.ndarray],
                   page_runs: bool = False) -> None:
    """Apply the transfer in place to per-pool payload arrays: device[name] is (components, L, R, E) bytes."""
    layers = [case.layer] if case.scope.value == "one_layer" else range(case.layers)
    for pool in case.pools:
        host_parts = host_arrays(case, pool, host[pool.name])
        dev = device[pool.name]
        offset = 0
        dev_parts = {}
        for component in pool.components:
            E = pool.row_bytes(component)
            size = case.layers * case.device_rows * E
            dev_parts[component] = dev[offset : offset + size].reshape(case.layers, case.device_rows, E)
            offset += size
        for layer in layers:
            for component in pool.components:
                for token, row in pairs(case, page_runs):
                    if case.direction is Direction.WRITE_BACK:
                        value = dev_parts[component][layer, row].copy()
                        set_host_row(case, pool, host_parts[component], layer, token, value)
                    else:
                        dev_parts[component][layer, row] = get_host_row(case, pool, host_parts[component], layer,
                                                                        token)
