"""The sglang call of a standalone reproducer for ``sglang-pool``: real device and host pools, an optional
HostPoolGroup, the controller's index placement, then ``backup_from_device_all_layer`` /
``load_to_device_per_layer``, as ``kernels/sglang_pool.py`` drives them. The pools get the case's bytes copied
in before the transfer and copied back into the case's storages after it, so the script compares the same
storages as for every other backend.
"""

from __future__ import annotations

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.oracles.contract import Platform

_SGLANG_DTYPES = {KVDtype.BF16: "torch.bfloat16", KVDtype.FP16: "torch.float16", KVDtype.FP32: "torch.float32",
                  KVDtype.FP8: "torch.float8_e4m3fn"}


def pool_call(case: Case, platform: Platform) -> str:
    size = case.device_rows - case.page_size
    lines = [
        "from types import MethodType, SimpleNamespace",
        "",
        "from sglang.srt.managers.cache_controller import HiCacheController",
        "from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool",
        "from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry",
        "from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost",
        "from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost",
        "",
        f"size = {size}  # device pool rows = size + page_size (rows [0, page_size) are the padding page)",
        "pools = {}  # name: (device pool, host pool, the device pool's per-layer buffers per K/V)",
    ]
    for spec in case.pools:
        lines += _pool_lines(case, spec)
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
        'controller = SimpleNamespace(io_backend="kernel", mem_pool_host=facade, device=DEVICE)',
        "controller.move_indices = MethodType(HiCacheController.move_indices, controller)",
        "controller._move_op_indices = MethodType(HiCacheController._move_op_indices, controller)",
    ]
    controller = case.tuning_value("controller", "hybrid")
    if case.direction is Direction.LOAD_BACK:
        lines.append("placed = [controller.move_indices(host_idx, dev_idx) for _ in pools]")
    elif controller == "base":
        lines += ["op = SimpleNamespace(host_indices=host_idx, device_indices=dev_idx, pool_transfers=None)",
                  "placed = [HiCacheController._move_write_operation(controller, op)[:2] for _ in pools]"]
    else:
        lines += ["# the hybrid controller: pools on the staged path keep CPU host indices, the others get moved ones",
                  'staged = [getattr(h, "can_use_write_back_jit", False) for _, h, _ in pools.values()]']
        if case.layout is HostLayout.PAGE_FIRST:
            lines += ["placed = [(host_idx.cpu(), dev_idx) if flag and any(staged) else "
                      "controller.move_indices(host_idx, dev_idx) for flag in staged]"]
        else:
            lines.append("placed = [controller.move_indices(host_idx, dev_idx) for _ in pools]")
    lines += ["try:",
              "    for (device_pool, host_pool, _), (h, d) in zip(pools.values(), placed):"]
    if case.direction is Direction.WRITE_BACK:
        lines.append('        host_pool.backup_from_device_all_layer(device_pool, h, d, "kernel")')
    else:
        lines += [f"        for layer in {list(case.moved_layers)}:",
                  '            host_pool.load_to_device_per_layer(device_pool, h, d, layer, "kernel")']
    lines += ["finally:",
              '    if DEVICE.type == "cuda":',
              "        torch.cuda.synchronize()",
              "    copy_bytes(into_sglang=False)",
              "    for _, host_pool, _ in pools.values():  # unregister the pinned host buffers",
              '        if hasattr(host_pool, "destroy"):',
              "            host_pool.destroy()"]
    return "\n".join(lines)


def _pool_lines(case: Case, spec: PoolSpec) -> list[str]:
    """The script lines that build one of the case's device pools and its host pool."""
    ps, layers = case.page_size, case.layers
    lines: list[str] = []
    dtype = _SGLANG_DTYPES[spec.dtype]
    indent = " " * 33
    info = "device_pool.get_device_pool_infos()[0].buffer_info"
    host_args = [f'{info}, 2.0, 0, {ps}, "{case.layout.value}",',
                 f'{indent}pin_memory=True, device="cpu", device_capacity_tokens=size, start_layer=0, '
                 f"end_layer={layers - 1},"]
    if spec.attention is Attention.MLA:
        rope = 64 if spec.head_dim > 64 else 0
        lines += [f"device_pool = MLATokenToKVPool(size, {ps}, {dtype}, {spec.head_dim - rope}, {rope}, {layers}, "
                  "str(DEVICE), False)",
                  "host_pool = MLATokenToKVPoolHost(" + host_args[0], host_args[1],
                  f'{indent}target_layer_num={layers}, pool_label="{spec.name}", '
                  f"host_token_capacity={case.host_slots})",
                  "buffers = [device_pool.kv_buffer]"]
    else:
        lines += [f"device_pool = MHATokenToKVPool(size, {ps}, {dtype}, {spec.heads}, {spec.head_dim}, {layers}, "
                  "str(DEVICE), False,",
                  "                               enable_alt_stream=False)",
                  "host_pool = MHATokenToKVPoolHost(" + host_args[0], host_args[1],
                  f'{indent}pool_label="{spec.name}", host_token_capacity={case.host_slots})',
                  "buffers = [device_pool.k_buffer, device_pool.v_buffer]"]
    if not spec.write_back_jit:
        lines.append("host_pool.can_use_write_back_jit = False  # a side pool without the staged path")
    lines.append(f'pools["{spec.name}"] = (device_pool, host_pool, buffers)')
    return lines
