"""The sglang call of a standalone reproducer for ``sglang-pool``: real device and host pools, an optional
HostPoolGroup, the controller's index placement, then the pool transfer calls. Everything handed to sglang is
printed from kernels/sglang_pool_calls.py, the definitions ``kernels/sglang_pool.py`` runs. The pools get the
case's bytes copied in before the transfer and copied back into the case's storages after it, so the script
compares the same storages as for every other backend.
"""

from __future__ import annotations

from collections.abc import Iterable

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels.sglang_pool_calls import (
    BUFFER_INFO,
    Placement,
    PoolConstruction,
    io_backend,
    placement,
    pool_construction,
    pool_transfers,
)
from hicache_fuzz.oracles.contract import Platform


def pool_call(case: Case, platform: Platform) -> str:
    built = [(spec.name, pool_construction(case, spec)) for spec in case.pools]
    io = io_backend(case)  # the controller's and every transfer's, as kernels/sglang_pool.py runs them
    lines = [
        "from types import MethodType, SimpleNamespace",
        "",
        "from sglang.srt.managers.cache_controller import HiCacheController",
        "from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry",
        *class_imports(made for _, made in built),
        "",
        "pools = {}  # name: (device pool, host pool, the device pool's per-layer buffers per K/V)",
    ]
    for name, made in built:
        lines += _pool_lines(name, made)
    lines += [
        "",
        "",
        "def copy_bytes(into_sglang):  # the case's storages <-> sglang's pool tensors",
        "    for name, (device_pool, host_pool, buffers) in pools.items():",
        "        for c, per_layer in enumerate(buffers):",
        "            for layer, theirs in enumerate(per_layer):",
        '                mine = typed(raw, name, "device")[c, layer].view(torch.uint8)',
        "                theirs = theirs.view(torch.uint8)",
        "                if into_sglang:",
        "                    theirs.view(-1).copy_(mine.reshape(-1))",
        "                else:",
        "                    mine.copy_(theirs.view(mine.shape))",
        '        mine, theirs = payload(raw, name, "host"), host_pool.kv_buffer.view(torch.uint8).view(-1)',
        "        if into_sglang:",
        "            theirs.copy_(mine)",
        "        else:",
        "            mine.copy_(theirs)",
        "",
        "",
        "copy_bytes(into_sglang=True)",
    ]
    if len(case.pools) > 1:
        lines += ["facade = HostPoolGroup([PoolEntry(name=name, host_pool=h, device_pool=d, layer_mapper=lambda x: x,",
                  "                                  is_primary_index_anchor=(i == 0))",
                  "                        for i, (name, (d, h, _)) in enumerate(pools.items())])"]
    else:
        lines.append(f'facade = pools["{case.pools[0].name}"][1]')
    lines += [
        "# The controller's index placement, on a stand-in controller (the real methods, called unbound)",
        f'controller = SimpleNamespace(io_backend="{io}", mem_pool_host=facade, device=DEVICE)',
        "controller.move_indices = MethodType(HiCacheController.move_indices, controller)",
        "controller._move_op_indices = MethodType(HiCacheController._move_op_indices, controller)",
        *_placement_lines(placement(case)),
        "try:",
        "    for (device_pool, host_pool, _), (h, d) in zip(pools.values(), placed):",
    ]
    for method, layer in pool_transfers(case):
        layer_arg = "" if layer is None else f"{layer}, "
        lines.append(f'        host_pool.{method}(device_pool, h, d, {layer_arg}"{io}")')
    lines += ["finally:",
              '    if DEVICE.type == "cuda":',
              "        torch.cuda.synchronize()",
              "    copy_bytes(into_sglang=False)",
              "    for _, host_pool, _ in pools.values():  # unregister the pinned host buffers",
              '        if hasattr(host_pool, "destroy"):',
              "            host_pool.destroy()"]
    return "\n".join(lines)


def class_imports(constructions: Iterable[PoolConstruction]) -> list[str]:
    """The script's import lines of the device and host pool classes the constructions build, one per module."""
    classes: dict[str, set[str]] = {}
    for made in constructions:
        for constructor in (made.device_pool, made.host_pool):
            classes.setdefault(constructor.module, set()).add(constructor.cls)
    return [f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(classes.items())]


def _placement_lines(rule: Placement) -> list[str]:
    if rule is Placement.MOVE_ALL:
        return ["placed = [controller.move_indices(host_idx, dev_idx) for _ in pools]"]
    if rule is Placement.BASE_WRITE:
        return ["op = SimpleNamespace(host_indices=host_idx, device_indices=dev_idx, pool_transfers=None)",
                "placed = [HiCacheController._move_write_operation(controller, op)[:2] for _ in pools]"]
    return ["# the hybrid controller: pools on the staged path keep CPU host indices, the others get moved ones",
            'staged = [getattr(h, "can_use_write_back_jit", False) for _, h, _ in pools.values()]',
            "placed = [(host_idx.cpu(), dev_idx) if flag and any(staged) else "
            "controller.move_indices(host_idx, dev_idx) for flag in staged]"]


def _pool_lines(name: str, made: PoolConstruction) -> list[str]:
    """The script lines that build one of the case's device pools and its host pool."""
    lines = [*made.device_pool.source("device_pool"), *made.host_pool.source("host_pool", BUFFER_INFO),
             "buffers = [" + ", ".join(f"device_pool.{attribute}" for attribute in made.components) + "]"]
    if not made.write_back_jit:
        lines.append("host_pool.can_use_write_back_jit = False  # a side pool without the staged path")
    lines.append(f'pools["{name}"] = (device_pool, host_pool, buffers)')
    return lines
