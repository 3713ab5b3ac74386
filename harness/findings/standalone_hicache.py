"""The standalone script of an ``sglang-hicache`` reproducer: one Python file needing only torch and sglang that
builds the case's host pool class and controller as ``kernels/sglang_hicache_drive.py`` does, runs the case's
sequence (its steps written in as lists, from ``oracles/sequence.py``), keeps its own copy of what every byte must
be after each transfer (per-token row copies in sglang's own tensor shapes), and compares all of sglang's pool
tensors with it after every transfer. A case with request slots holds them in its own copy of the HiSparse
coordinator's request table, through the pool's ``alloc_paged_token_slots`` and ``allocated_host_indices``, and
checks every grant and every freed list against the steps. A case with a side pool (``side_pool``) builds it as
the drive does (kernels/sglang_hicache_side.py: the same class, constructor arguments and group entry beside the
anchor's) and keeps its own copy of the side pool's bytes too; under ``side_transfer`` each transfer names it in
``extra_pools`` as the drive does, and the script checks the host slots the group's ``resolve_host_transfers``
grants and ``release_transfers`` frees against the oracle's side steps (oracles/side_transfers.py, written in as
lists). A case with token-major device rows (``device_rows=token_major``) builds the target's device pool as the
drive does (kernels/sglang_hicache_device.py: sglang's ``UnifiedKVPool`` with the case's sub-pool and a one-layer
one at the buffer's other end, and ``UnifiedMHATokenToKVPool`` / ``UnifiedMLATokenToKVPool`` over it), fills the
whole buffer, and keeps its copy of it in the slot entry layout the oracle states (oracles/pool_layouts.py,
``token_major_entry``, written in as numbers): after every transfer the whole buffer is compared, so a row moved
into another slot's entry, another layer's or component's row, or the entry bytes past the rows is named there.
Exit 0: every step right; 1: the first wrong step and byte (or slot) are printed; 3: sglang cannot run here. The
storages' fill is the script's own (seeded random bytes), not the harness's.
"""

from __future__ import annotations

from typing import Any

from hicache_fuzz.harness.model.case import Attention, Case
from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels.sglang_hicache_settings import (
    TOKEN_MAJOR,
    case_settings,
    controller_kind,
    device_rows,
    k_only_heads,
    layer_shard,
    side_pool,
    side_pools,
    side_refusals,
    side_transfer,
    target_rows_strided,
)
from hicache_fuzz.kernels.sglang_hicache_side import SIDE_HEAD_DIM
from hicache_fuzz.oracles import sequence, side_transfers
from hicache_fuzz.oracles.pool_layouts import pool_class, token_major_entry

BACKEND = "sglang-hicache"
_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32", "fp8": "torch.float8_e4m3fn"}


# The classes the script builds: those whose constructors take a KV device pool. The Mamba and NVFP4 page-row pools
# are built from buffer infos: their reproducers replay from the JSON file (a Mamba side pool the script does build).
SCRIPTED_CLASSES = frozenset({"MHATokenToKVPoolHost", "MLATokenToKVPoolHost", "AsymmetricMHATokenToKVPoolHost",
                              "HiSparseMHATokenToKVPoolHost", "MHATokenToKOnlyPoolHost"})


def unscripted_reason(case: Case) -> str | None:
    """Why the case has no standalone script (None: it has one)."""
    name = case_settings(case)[0]
    if name not in SCRIPTED_CLASSES:
        return f"{name}: the standalone script builds the KV host pools only; replay the JSON reproducer"
    if layer_shard(case) is not None:
        return "a layer-sharded MLA pool (a stand-in for the layer-split DSA device pool): replay the JSON reproducer"
    if target_rows_strided(case) and case_settings(case)[3]:
        return ("token-major target rows beside packed draft layers, which the host pool must refuse when it is "
                "built (the script does not model refusals): replay the JSON reproducer")
    if len(side_pools(case)) > 1:
        return (f"a group of {len(side_pools(case))} side pools ({side_pool(case)}): the script builds one side pool "
                f"beside the anchor; replay the JSON reproducer")
    if side_refusals(case):
        return ("a side pool that refuses back-ups (side_transfer full: the write returns None, every grant given "
                "back): the script does not model refused writes; replay the JSON reproducer")
    return None


def hicache_script(case: Case, reproducer: dict[str, Any]) -> str:
    name, io_backend, start, drafts = case_settings(case)
    spec = case.pools[0]
    steps = [(s.op, list(s.host_indices), list(s.device_indices), s.request, s.start)
             for s in sequence.plan_steps(case)]
    observed = reproducer.get("observed", {})
    summary = str(observed.get("summary") or observed.get("error") or "(not recorded)").splitlines()[0]
    module = pool_class(name).module
    side = side_pool(case)
    fields = {
        "case_id": case.case_id,
        "signature": str(reproducer.get("signature", "")) or "(none recorded)",
        "observed": summary.replace('"""', "'''").replace("\\", "/"),
        "cls": name,
        "module": module,
        "controller": controller_kind(case),
        "io": io_backend,
        "layout": case.layout.value,
        "ps": case.page_size,
        "layers": case.layers,
        "drafts": drafts,
        "start": start,
        "size": case.device_rows - case.page_size,
        "host_slots": case.host_slots,
        "dtype": _DTYPES[spec.dtype.value],
        "mla": spec.attention is Attention.MLA,
        "heads": spec.heads,
        "head_dim": spec.head_dim,
        "v_head_dim": spec.v_head_dim,
        "k_heads": k_only_heads(spec)[0],
        "k_dim": k_only_heads(spec)[1],
        "prologue": [list(chunk) for chunk in sequence.prologue(case)],
        "steps": steps,
        "requests": sequence.request_slots(case),
        "request_rows": sequence.REQUEST_ROWS,
        "seed": case.seed,
        "side": side,
        "side_moves": side_transfer(case),
        "side_dim": SIDE_HEAD_DIM,
        "side_steps": _side_steps(case),
        "side_note": (f"\nIts group also holds a side pool, {side}, "
                      + ("which every transfer names (extra_pools)." if side_transfer(case) else
                         "which no transfer names: its bytes must stay.")) if side else "",
        **_unified_fields(case),
    }
    return _SCRIPT.format(**fields)


def _unified_fields(case: Case) -> dict[str, Any]:
    """The script's constants of a token-major case: the unified pool's arguments as the drive builds it
    (kernels/sglang_hicache_device.py) and its slot entry as the oracle states it (oracles/pool_layouts.py,
    ``token_major_entry``); empty ones for packed rows."""
    spec = case.pools[0]
    if device_rows(case) != TOKEN_MAJOR:
        return {"unified": False, "sub_pools": [], "row_fields": {}, "store_dtype": None, "entry": 0,
                "offsets": [], "row_bytes": [], "components": [], "device_note": ""}
    target = case.layers - case_settings(case)[3]
    row_bytes = tuple(spec.row_bytes(c) for c in spec.components)
    entry, offsets = token_major_entry(target, row_bytes)
    return {"unified": True, "sub_pools": [list(sub) for sub in devices.unified_sub_pools(target)],
            "row_fields": devices.unified_row_fields(spec),
            "store_dtype": "torch.uint8" if devices.unified_stores_bytes(spec) else _DTYPES[spec.dtype.value],
            "entry": entry, "offsets": [list(per) for per in offsets], "row_bytes": list(row_bytes),
            "components": list(spec.components),
            "device_note": ("\nIts device pool is sglang's unified pool (--enable-unified-memory): the target layers' "
                            "rows are views of one\nbuffer whose slot entry holds every layer's rows; the whole "
                            "buffer is checked, the entry bytes past the rows included.")}


def _side_steps(case: Case) -> dict[int, tuple[list[int], list[int]]]:
    """The steps that name the side pool, as the drive names it: step number -> (its host slots, its device rows):
    every back-up under ``side_transfer`` (the side allocator's grant), a load or evict of an entry backed up by the
    sequence (that grant). Empty where the side pool moves nothing."""
    if not side_transfer(case):
        return {}
    return {number: (list(s.host_slots[0]), list(s.device_rows))
            for number, s in enumerate(side_transfers.side_steps(case))
            if s.op == sequence.BACKUP or s.host_slots[0]}


_SCRIPT = '''#!/usr/bin/env python3
"""Standalone reproducer {case_id}: sglang-hicache sequence ({signature}).

Observed: {observed}
Builds {cls} through its own constructor, drives it with the {controller} controller (io backend {io}) through
the steps below, and checks every pool byte after every transfer. Needs only torch and sglang.{side_note}{device_note}
Exit 0: every step right; 1: a step moved wrong bytes (the first is printed); 3: sglang cannot run here.
Generated by hicache-fuzz (harness/findings/standalone_hicache.py) from {case_id}.json next to this file.
"""

import contextlib
import sys
import threading
from types import SimpleNamespace

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: only for the CI's fake sglang
CLASS, CONTROLLER, IO, LAYOUT = "{cls}", "{controller}", "{io}", "{layout}"
PS, LAYERS, DRAFTS, START, SIZE, HOST_SLOTS = {ps}, {layers}, {drafts}, {start}, {size}, {host_slots}
DTYPE, MLA, HEADS, HEAD_DIM, V_HEAD_DIM = {dtype}, {mla}, {heads}, {head_dim}, {v_head_dim}
K_HEADS, K_DIM = {k_heads}, {k_dim}  # a K-only pool's split of the row (any split gives the same bytes)
TARGET = LAYERS - DRAFTS
PROLOGUE = {prologue}  # frees after one grant of the whole host pool: the allocator's free list, in order
STEPS = {steps}  # (operation, host slots, device rows, request, first token), step 0 first
# Host slots held by requests in the HiSparse coordinator's request table (its req_to_host_pool and allocated
# lengths), granted by the pool's alloc_paged_token_slots and freed through allocated_host_indices
REQUESTS, REQUEST_ROWS = {requests}, {request_rows}
# The group's side pool beside the anchor ("": none), rows of one head of SIDE_DIM elements, and whether the
# transfers name it (extra_pools) with host slots from its own allocator
SIDE, SIDE_MOVES, SIDE_DIM = "{side}", {side_moves}, {side_dim}
# The steps that name the side pool: step -> (its host slots: a back-up's grant by its own allocator, the loaded or
# evicted entry's grant; its device rows)
SIDE_STEPS = {side_steps}
# Token-major device rows (UNIFIED): the target's device pool is sglang's unified pool, built from sub-pool specs
# (name, layers, grow direction: the KV pool, and the one-layer pool the unified pool needs at the buffer's other end,
# never used) with these row fields and store dtype. Slot d's entry is the ENTRY bytes from d * ENTRY; in it, the row
# of component COMPONENTS[c] of target layer l is the ROW_BYTES[c] bytes from OFFSETS[c][l]; no row holds the rest
UNIFIED, STORE_DTYPE = {unified}, {store_dtype}
SUB_POOLS, ROW_FIELDS = {sub_pools}, {row_fields}
ENTRY, OFFSETS, ROW_BYTES, COMPONENTS = {entry}, {offsets}, {row_bytes}, {components}


def device_pool(layers, start):
    if CLASS == "MHATokenToKOnlyPoolHost":  # K rows only: the case's row as K_HEADS heads of K_DIM
        from sglang.srt.mem_cache.memory_pool import MHATokenToKOnlyPool
        return MHATokenToKOnlyPool(SIZE, PS, DTYPE, K_HEADS, K_DIM, layers, str(DEVICE), False, start_layer=start,
                                   end_layer=start + layers)
    if MLA:
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
        rope = 64 if HEAD_DIM > 64 else 0
        return MLATokenToKVPool(SIZE, PS, DTYPE, HEAD_DIM - rope, rope, layers, str(DEVICE), False,
                                start_layer=start, end_layer=start + layers)
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    return MHATokenToKVPool(SIZE, PS, DTYPE, HEADS, HEAD_DIM, layers, str(DEVICE), False, v_head_dim=V_HEAD_DIM,
                            start_layer=start, end_layer=start + layers, enable_alt_stream=False)


def unified_device_pool(start):  # the target's layers as views of one buffer (--enable-unified-memory)
    from sglang.srt.mem_cache import unified_memory_pool as unified
    spec_class, dtype_field = (unified.MLASubPoolSpec, {{}}) if MLA else (unified.MHASubPoolSpec,
                                                                        {{"kv_cache_dtype": DTYPE}})
    specs = [spec_class(name=name, layer_num=layers, grow_direction=direction, **ROW_FIELDS, store_dtype=STORE_DTYPE,
                        **dtype_field) for name, layers, direction in SUB_POOLS]
    buffer = unified.UnifiedKVPool(total_bytes=(SIZE + PS) * specs[0].entry_bytes(), sub_pool_specs=specs,
                                   device=str(DEVICE), enable_memory_saver=False, page_size=PS)
    if MLA:  # no layer range of its own: sglang builds it for the first stage's layer ids
        return unified.UnifiedMLATokenToKVPool(unified_buffer=buffer, sub_pool_name=specs[0].name,
                                               kv_cache_dtype=DTYPE, page_size=PS)
    return unified.UnifiedMHATokenToKVPool(unified_buffer=buffer, sub_pool_name=specs[0].name, page_size=PS,
                                           start_layer=start, end_layer=start + TARGET, enable_alt_stream=False)


class DeviceAllocator:  # the scheduler's device allocator: grants the rows each load names
    def __init__(self, pool):
        self.pool, self.grants = pool, []

    def get_kvcache(self):
        return self.pool

    def alloc(self, need_size):
        return self.grants.pop(0)

    def set_hicache_transfer_done_event(self, key, event):
        return None


class StatePoolStandIn:  # the device Mamba pool: its host pool reads only the buffer info, the controller the rest
    layer_transfer_counter = None

    def __init__(self, info, device):
        self.info, self.layer_num, self.device = info, TARGET, device
        self.start_layer, self.end_layer = START, START + TARGET

    def register_layer_transfer_counter(self, counter):
        self.layer_transfer_counter = counter


def side_pool(anchor_host, device):
    """The side pool beside the anchor as sglang's assembler builds it: its group name, device and host pool, and
    tensors ([component][layer] on the device, [component] on the host)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    if SIDE == "MHATokenToKOnlyPoolHost":  # sized from the anchor host pool
        from sglang.srt.mem_cache.memory_pool import MHATokenToKOnlyPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKOnlyPoolHost
        pool = MHATokenToKOnlyPool(SIZE, PS, DTYPE, 1, SIDE_DIM, TARGET, str(device), False, start_layer=START,
                                   end_layer=START + TARGET)
        host = MHATokenToKOnlyPoolHost(pool, anchor_host, LAYOUT, True, "cpu", "default")
        return SimpleNamespace(name=PoolName.INDEXER, device_pool=pool, host=host, device=[list(pool.k_buffer)],
                               halves=[host.k_buffer])
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    state = torch.zeros((TARGET, SIZE + PS, 1, SIDE_DIM), dtype=DTYPE, device=device)
    info = MambaStateBufferInfo(temporal=state, conv=(state.clone(),))
    # int(SIZE * ratio) + 1 slots: a moving side pool gets the anchor's HOST_SLOTS, which its grants assume
    ratio = (HOST_SLOTS - 0.5) / SIZE if SIDE_MOVES else 2.0
    host = MambaPoolHost(info, ratio, 0, device_capacity=SIZE, pin_memory=True, device="cpu",
                         allocator_type="default", layout=LAYOUT)
    return SimpleNamespace(name=PoolName.MAMBA, device_pool=StatePoolStandIn(info, device), host=host,
                           device=[list(info.temporal), list(info.conv[0])],
                           halves=[host.temporal_buffer, host.conv_buffer[0]])


def build():
    from sglang.srt.mem_cache.pool_host import {module} as host_module
    target = unified_device_pool(START) if UNIFIED else device_pool(TARGET, START)
    drafts = [device_pool(1, 0) for _ in range(DRAFTS)]
    cls = getattr(host_module, CLASS)
    if CLASS == "MHATokenToKOnlyPoolHost":
        # built over the device pool itself (its class has no device pool provider) and sized from its anchor
        # pool, of which only page size and capacity are read
        anchor = SimpleNamespace(page_size=PS, size=HOST_SLOTS, page_num=HOST_SLOTS // PS)
        return target, drafts, cls(target, anchor, LAYOUT, True, "cpu", "default")
    info = target.get_device_pool_infos()[0].buffer_info
    draft_infos = [p.get_device_pool_infos()[0].buffer_info for p in drafts]
    common = dict(device_capacity_tokens=SIZE, start_layer=START, end_layer=START + TARGET)
    if CLASS == "HiSparseMHATokenToKVPoolHost":
        host = cls(info, (HOST_SLOTS - PS + 0.5) / SIZE, PS, **common)
    elif MLA:
        host = cls(info, 2.0, 0, PS, LAYOUT, True, "cpu", "default", None, draft_infos, target_layer_num=TARGET,
                   host_token_capacity=HOST_SLOTS, **common)
    else:
        host = cls(info, 2.0, 0, PS, LAYOUT, True, "cpu", "default", draft_buffer_infos=draft_infos,
                   host_token_capacity=HOST_SLOTS, **common)
    return target, drafts, host


def controller_for(allocator, target, drafts, host, side):
    if CONTROLLER == "base":
        from sglang.srt.managers.cache_controller import HiCacheController
        return HiCacheController(allocator, host, PS, None, threading.Event(), write_policy="write_through",
                                 io_backend=IO)
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.host_pool_config import with_packed_draft_layer_mapping
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup
    mapping = with_packed_draft_layer_mapping({{layer: layer for layer in range(TARGET)}},
                                              transfer_layer_start=TARGET, target_device_layer_num=TARGET,
                                              draft_layer_num=DRAFTS)
    entry = build_pool_entry(name=PoolName.KV, host_pool=host, device_pool=target, layer_mapping=mapping,
                             transfer_layer_id_max=TARGET + DRAFTS, is_anchor=True,
                             packed_draft_device_pools=tuple(drafts))
    entries = [entry]
    if side is not None:  # stage-local layer mapping, no draft layers
        entries.append(build_pool_entry(name=side.name, host_pool=side.host, device_pool=side.device_pool,
                                        layer_mapping={{layer: layer for layer in range(TARGET)}},
                                        transfer_layer_id_max=TARGET, is_anchor=False))
    return HybridCacheController(allocator, HostPoolGroup(entries), PS, None, threading.Event(),
                                 write_policy="write_through", io_backend=IO, transfer_layer_id_max=TARGET)


def device_layers(target, drafts):  # [component][layer] -> (rows, heads, dim), target layers then drafts
    names = ["k_buffer"] if CLASS == "MHATokenToKOnlyPoolHost" else ["kv_buffer"] if MLA else ["k_buffer", "v_buffer"]
    return [list(getattr(target, n)) + [getattr(d, n)[0] for d in drafts] for n in names]


def unified_buffer(target):  # the whole buffer under a unified pool's views, as bytes
    view = device_layers(target, [])[0][0]
    return torch.empty(0, dtype=torch.uint8, device=view.device).set_(view.untyped_storage())


def unified_layout_problem(target, raw):  # where sglang's views are not the entry layout above ("" if nowhere)
    if raw.numel() != (SIZE + PS) * ENTRY:
        return f"the unified buffer holds {{raw.numel()}} bytes, not {{SIZE + PS}} entries of {{ENTRY}}"
    for c, per in enumerate(device_layers(target, [])):
        for layer, view in enumerate(per):
            at, step = view.data_ptr() - raw.data_ptr(), view.stride(0) * view.element_size()
            if (at, step) != (OFFSETS[c][layer], ENTRY):
                return (f"its {{COMPONENTS[c]}} view of layer {{layer}} starts at byte {{at}} and steps {{step}} "
                        f"bytes, not {{OFFSETS[c][layer]}} and {{ENTRY}}")
    return ""


def unified_rows(model_raw):  # the model's rows of every target layer: [component][layer] -> (rows, heads, bytes)
    heads = 1 if MLA else HEADS
    return [[torch.as_strided(model_raw, (SIZE + PS, heads, width // heads), (ENTRY, width // heads, 1), start)
             for start in OFFSETS[c]] for c, width in enumerate(ROW_BYTES)]


def unified_difference(want, got, rows):  # the first wrong byte of the unified buffer, named by its slot's entry
    got = got.cpu()
    wrong = want.view(-1, ENTRY) != got.view(-1, ENTRY)
    where = wrong.nonzero()
    if not where.numel():
        return None
    slot, at = int(where[0][0]), int(where[0][1])
    part = next((f"the {{COMPONENTS[c]}} row of layer {{layer}}, byte {{at - start}}" for c, per in enumerate(OFFSETS)
                 for layer, start in enumerate(per) if start <= at < start + ROW_BYTES[c]),
                f"entry byte {{at}}, past the layers' rows (no row holds it)")
    slots = wrong.any(1).nonzero().view(-1).tolist()
    i = slot * ENTRY + at
    return (f"unified device buffer, slot {{slot}}{{'' if slot in rows else ' (not a row this step addresses)'}}, "
            f"{{part}}: expected 0x{{int(want[i]):02x}} got 0x{{int(got[i]):02x}}; {{int(wrong.sum())}} bytes differ, "
            f"in slots {{slots[:8]}}")


def copy_bytes(dst, src):  # a row's bytes, whatever the two tensors' dtypes
    dst.view(torch.uint8).copy_(src.view(torch.uint8))


def host_halves(host):
    if CLASS == "MHATokenToKOnlyPoolHost":
        return [host.k_buffer]
    return [host.kv_buffer] if MLA else [host.k_buffer, host.v_buffer]


def host_row(half, layer, token):  # the (heads, dim) row of one token and layer in sglang's host layout
    if LAYOUT == "layer_first":
        return half[layer, token]
    if LAYOUT == "page_first":
        return half[token, layer]
    if LAYOUT == "page_first_direct":
        return half[token // PS, layer, token % PS]
    return half[token // PS, :, token % PS, layer]  # page_head


def side_row(half, layer, slot):  # a side pool's (heads, dim) row: the Mamba pool's state is page-first always
    return half[slot, layer, 0] if SIDE == "MambaPoolHost" else host_row(half, layer, slot)


def side_transfer(side, host_slots, device_rows=None):  # the side pool named in a transfer's extra_pools
    from sglang.srt.mem_cache.hicache_storage import PoolTransfer
    slots = None if host_slots is None else torch.tensor(host_slots, dtype=torch.int64)
    return PoolTransfer(name=side.name, host_indices=slots, device_indices=device_rows)


def side_copies(model_dev, model_host, op, slots, rows):  # one step's copies of the side pool, on the model
    for c, per in enumerate(model_dev):
        for layer in range(TARGET):
            for h, d in zip(slots, rows):
                if op == "backup":
                    copy_bytes(side_row(model_host[c], layer, h), per[layer][d])
                else:
                    copy_bytes(per[layer][d], side_row(model_host[c], layer, h))


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def request_step(host, target, table, lengths, op, slots, rows, request, start):
    """One step as the HiSparse coordinator makes it; a message if sglang's slots are not the step's."""
    device_rows = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    if op == "release":
        freed = host.allocated_host_indices(table, request, lengths[request])
        got = freed.tolist()
        if freed.numel() > 0:
            host.free(freed)
        table[request, :] = -1
        lengths[request] = 0
        if got != slots:
            return f"allocated_host_indices returned {{got[:8]}} ({{len(got)}}), want {{slots[:8]}} ({{len(slots)}})"
        return None
    if op == "load":
        for layer in range(START, START + TARGET):
            host.load_to_device_per_layer(target, table[request, start : start + len(slots)], device_rows, layer,
                                          io_backend="kernel")
        return None
    granted = host.alloc_paged_token_slots(table, lengths, request, start, len(slots))
    if granted.dtype != torch.int64 or granted.tolist() != slots:
        return f"alloc_paged_token_slots returned {{granted.dtype}} {{granted.tolist()[:8]}}, want int64 {{slots[:8]}}"
    if op == "backup" and slots:
        host.backup_from_device_all_layer(target, granted, device_rows, io_backend="kernel")
    return None


def first_difference(want, got, what):
    a, b = want.reshape(-1).view(torch.uint8), got.reshape(-1).view(torch.uint8)
    where = (a != b).nonzero()
    if where.numel():
        i = int(where[0])
        return f"{{what}}: byte {{i}} expected 0x{{int(a[i]):02x}} got 0x{{int(b[i]):02x}}"
    return None


def first_wrong(model_dev, dev, model_host, halves, pool, first_layer=0):  # a pool's tensors against the model's
    for c, per in enumerate(dev):
        for layer in range(first_layer, len(per)):
            what = f"{{pool}}device component {{c}} layer {{layer}}"
            problem = first_difference(model_dev[c][layer], per[layer].cpu(), what)
            if problem:
                return problem
    for c, half in enumerate(halves):
        problem = first_difference(model_host[c], half.cpu(), f"{{pool}}host component {{c}}")
        if problem:
            return problem
    return None


def main():
    try:
        target, drafts, host = build()
        side = side_pool(host, target.device) if SIDE else None
    except ImportError as exc:
        print(f"cannot run here: {{exc}}")
        return 3
    if SIDE_MOVES and side.host.size != HOST_SLOTS:
        print(f"cannot run here: the {{SIDE}} side pool has {{side.host.size}} host slots, its grants assume "
              f"{{HOST_SLOTS}}")
        return 3
    raw = unified_buffer(target) if UNIFIED else None
    problem = unified_layout_problem(target, raw) if UNIFIED else ""
    if problem:
        print(f"cannot run here: this script models sglang 0.5.23's unified pool entry, and {{problem}}")
        return 3
    allocator = DeviceAllocator(target)
    controller = controller_for(allocator, target, drafts, host, side)
    generator = torch.Generator().manual_seed({seed})
    dev, halves = device_layers(target, drafts), host_halves(host)
    side_dev, side_halves = (side.device, side.halves) if side is not None else ([], [])
    if UNIFIED:  # the whole buffer stands for the target layers' views (the entry bytes past the rows included)
        filled = [raw] + [t for per in dev for t in per[TARGET:]]
    else:
        filled = [t for per in dev for t in per]
    for tensor in filled + [t for per in side_dev for t in per] + halves + side_halves:  # every byte, and the model's
        bytes_ = tensor.view(torch.uint8)
        bytes_.copy_(torch.randint(0, 256, bytes_.shape, dtype=torch.uint8, generator=generator))
    model_raw = raw.cpu().clone() if UNIFIED else None
    model_dev = [[t.detach().cpu().clone() for t in per] for per in dev]
    if UNIFIED:  # the target layers' rows in the model's buffer, where the entry layout puts them
        model_dev = [rows + per[TARGET:] for rows, per in zip(unified_rows(model_raw), model_dev)]
    model_host = [h.detach().cpu().clone() for h in halves]
    model_side_dev = [[t.detach().cpu().clone() for t in per] for per in side_dev]
    model_side_host = [h.detach().cpu().clone() for h in side_halves]
    host.alloc(host.available_size())
    for chunk in PROLOGUE:
        host.free(torch.tensor(chunk, dtype=torch.int64))
    table = torch.full((REQUEST_ROWS, HOST_SLOTS + PS), -1, dtype=torch.int64, device=DEVICE)
    lengths = torch.zeros(REQUEST_ROWS, dtype=torch.int64)
    for number, (op, slots, rows, request, start) in enumerate(STEPS):
        side_slots, side_rows = SIDE_STEPS.get(number, ([], []))
        if REQUESTS:
            problem = request_step(host, target, table, lengths, op, slots, rows, request, start)
            if problem:
                print(f"FAIL at step {{number}} ({{op}} of request {{request}}): {{problem}}")
                return 1
            if op in ("reserve", "release") or not rows:
                continue
        if op == "evict":
            controller.evict_host(torch.tensor(slots, dtype=torch.int64))
            if side_slots:  # the entry's side slots, released as sglang releases independently allocated ones
                released = controller.mem_pool_host.release_transfers([side_transfer(side, side_slots)])
                if released != len(side_slots):
                    print(f"FAIL at step {{number}} (evict): release_transfers freed {{released}} of the {{SIDE}} side "
                          f"pool's {{len(side_slots)}} slots of the evicted entry")
                    return 1
            continue
        if op == "backup":
            if not REQUESTS:
                device_rows = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
                if number in SIDE_STEPS:  # queued: the side pool's grant is checked before the copies use it
                    transfer = side_transfer(side, None, device_rows)
                    granted = controller.write(device_rows, extra_pools=[transfer], flush=False)
                    got = None if transfer.host_indices is None else transfer.host_indices.tolist()
                    if granted is not None and got != side_slots:
                        print(f"FAIL at step {{number}} (backup): resolve_host_transfers granted the {{SIDE}} side "
                              f"pool host slots {{got if got is None else got[:8]}}, want {{side_slots[:8]}}")
                        return 1
                    controller.start_writing()
                else:
                    granted = controller.write(device_rows)
                controller.ack_write_queue.pop().finish_event.synchronize()
                print(f"step {{number}} backup: granted host slots {{granted.tolist()[:8]}}"
                      + (f", side slots {{side_slots[:8]}}" if number in SIDE_STEPS else ""))
            for c, per in enumerate(model_dev):
                for layer in range(LAYERS):
                    for h, d in zip(slots, rows):
                        copy_bytes(host_row(model_host[c], layer, h), per[layer][d])
        else:
            cpu_slots = torch.tensor(slots, dtype=torch.int64)
            device_rows = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
            h_idx, d_idx = controller.move_indices(cpu_slots, device_rows)
            if CLASS == "HiSparseMHATokenToKVPoolHost" and not REQUESTS:  # loaded by its coordinator's loop
                for layer in range(START, START + TARGET):
                    host.load_to_device_per_layer(target, h_idx, d_idx, layer, io_backend="kernel")
            elif not REQUESTS:  # (with request slots request_step loaded the request's row)
                allocator.grants.append(device_rows)
                if side_slots:  # the slots the entry's back-up granted the side pool, to the load's rows
                    controller.load(cpu_slots, extra_pools=[side_transfer(side, side_slots, device_rows)])
                else:
                    controller.load(cpu_slots)
                controller.start_loading()
                controller.ack_load_queue.pop().finish_event.synchronize()
            if CLASS != "HiSparseMHATokenToKVPoolHost" and CONTROLLER == "base":
                # the draft layers, as the hybrid controller loads them; on a stream of their own, as sglang's
                # loads always run (its page_first_direct op fails on the legacy default stream)
                stream = torch.cuda.Stream() if DEVICE.type == "cuda" else None
                if stream is not None:
                    stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    for depth, draft in enumerate(drafts):
                        host.load_to_device_per_layer(draft, h_idx, d_idx, TARGET + depth, IO, is_draft=True)
            print(f"step {{number}} load: host slots {{slots[:8]}} -> device rows {{rows[:8]}}"
                  + (f", side slots {{side_slots[:8]}}" if side_slots else ""))
            for c, per in enumerate(model_dev):
                for layer in range(LAYERS):
                    for h, d in zip(slots, rows):
                        copy_bytes(per[layer][d], host_row(model_host[c], layer, h))
        side_copies(model_side_dev, model_side_host, op, side_slots, side_rows)
        sync()
        problem = ((unified_difference(model_raw, raw, rows) if UNIFIED else None)
                   or first_wrong(model_dev, dev, model_host, halves, "", TARGET if UNIFIED else 0)
                   or first_wrong(model_side_dev, side_dev, model_side_host, side_halves, f"{{SIDE}} side pool "))
        if problem:
            print(f"FAIL at step {{number}} ({{op}}): {{problem}}")
            return 1
    print("PASS: every byte right after every step")
    return 0


def test_{case_id}():
    assert main() == 0


if __name__ == "__main__":
    sys.exit(main())
'''
