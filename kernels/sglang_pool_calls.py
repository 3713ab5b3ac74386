"""One definition of what ``sglang-pool`` hands sglang: the pools' constructor calls, the io backend, the controller's
index placement rule and the pool transfer calls, as data that the backend runs (kernels/sglang_pool.py) and a
standalone reproducer prints (harness/findings/standalone_pool.py). So the script builds the same pools with the
same arguments and makes the same calls as the campaign did, by construction. ``sglang-page-unified`` builds its
page_unified host pools with the same constructor calls (kernels/sglang_page_unified.py,
harness/findings/standalone_page_unified.py).

A constructor argument is a plain value (int, float, str, bool), a torch dtype (:class:`TorchDtype`) or the
device the case runs on (:data:`DEVICE_NAME`, ``str(device)``). A host pool's first argument is always its device
pool's buffer info (``device_pool.get_device_pool_infos()[0].buffer_info``), as sglang's assembler passes it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.oracles import pool_layouts


@dataclass(frozen=True)
class TorchDtype:
    name: str  # the attribute of ``torch``: "bfloat16", "float8_e4m3fn", ...

    def value(self, device: torch.device) -> Any:
        return getattr(torch, self.name)

    def source(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True)
class DeviceName:
    def value(self, device: torch.device) -> Any:
        return str(device)

    def source(self) -> str:
        return "str(DEVICE)"


DEVICE_NAME = DeviceName()
Value = int | float | str | bool | TorchDtype | DeviceName

_DTYPES = {KVDtype.BF16: TorchDtype("bfloat16"), KVDtype.FP16: TorchDtype("float16"),
           KVDtype.FP32: TorchDtype("float32"), KVDtype.FP8: TorchDtype("float8_e4m3fn")}


def _value(value: Value, device: torch.device) -> Any:
    return value.value(device) if isinstance(value, TorchDtype | DeviceName) else value


def _source(value: Value) -> str:
    if isinstance(value, TorchDtype | DeviceName):
        return value.source()
    return json.dumps(value) if isinstance(value, str) else repr(value)  # double quotes, as the script's own


@dataclass(frozen=True)
class Constructor:
    """``module.cls(*args, **kwargs)``: ``module`` is where sglang defines the class (the script imports it from
    there; the backend looks it up in the pool modules it loaded)."""

    module: str
    cls: str
    args: tuple[Value, ...]
    kwargs: tuple[tuple[str, Value], ...]

    def call(self, cls: Any, device: torch.device, *leading: Any) -> Any:
        return cls(*leading, *(_value(a, device) for a in self.args),
                   **{key: _value(a, device) for key, a in self.kwargs})

    def source(self, target: str, *leading: str, width: int = 110) -> list[str]:
        """``target = cls(...)`` as script lines of at most about `width` columns, continuation lines aligned
        under the first argument."""
        parts = [*leading, *(_source(a) for a in self.args), *(f"{key}={_source(a)}" for key, a in self.kwargs)]
        opening = f"{target} = {self.cls}("
        if not parts:
            return [opening + ")"]
        lines: list[str] = []
        line = opening
        for i, part in enumerate(parts):
            piece = part + (")" if i == len(parts) - 1 else ",")
            if line == opening:
                line += piece
            elif len(line) + 1 + len(piece) > width:
                lines.append(line)
                line = " " * len(opening) + piece
            else:
                line += " " + piece
        return [*lines, line]


MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
HOST_MHA = "sglang.srt.mem_cache.pool_host.mha"
HOST_MLA = "sglang.srt.mem_cache.pool_host.mla"
BUFFER_INFO = "device_pool.get_device_pool_infos()[0].buffer_info"  # the host pool's first argument
HOST_CLASSES = {Attention.MHA: "MHATokenToKVPoolHost", Attention.MLA: "MLATokenToKVPoolHost"}


@dataclass(frozen=True)
class PoolConstruction:
    """One PoolSpec as sglang pools: the device pool, then the host pool over the device pool's buffer info."""

    device_pool: Constructor
    host_pool: Constructor
    components: tuple[str, ...]  # the device pool's per-layer buffer attributes, in the spec's component order
    write_back_jit: bool  # False: the host pool's can_use_write_back_jit is switched off after construction


def pool_construction(case: Case, spec: PoolSpec, device_size: int | None = None) -> PoolConstruction:
    """The device pool of exactly ``device_rows`` rows (``size = device_rows - page_size``: sglang adds the padding
    page) and the pinned host pool of ``host_slots`` tokens, layout and page size of the case, every layer of the
    target model (start layer 0); an MHA host pool on page_unified gets the pool's head groups
    (``head_group_num``). The io backend is no constructor argument: every transfer call names it.

    `device_size`: the device pool's token capacity instead (sglang adds the padding page), for a caller whose
    device pool only describes its rows to the host pool's constructor (kernels/sglang_page_unified.py)."""
    ps, layers = case.page_size, case.layers
    size = case.device_rows - ps if device_size is None else device_size
    dtype = _DTYPES[spec.dtype]
    # what both host-pool constructors take alike: (host-to-device ratio, host size, page size, layout) after the
    # buffer info, and the placement keywords
    host_args: tuple[Value, ...] = (2.0, 0, ps, case.layout.value)
    host_kwargs: tuple[tuple[str, Value], ...] = (
        ("pin_memory", True), ("device", "cpu"), ("device_capacity_tokens", size), ("start_layer", 0),
        ("end_layer", layers - 1), ("pool_label", spec.name), ("host_token_capacity", case.host_slots))
    if spec.attention is Attention.MLA:
        rope = 64 if spec.head_dim > 64 else 0
        device = Constructor(MEMORY_POOL, "MLATokenToKVPool",
                             (size, ps, dtype, spec.head_dim - rope, rope, layers, DEVICE_NAME, False), ())
        host = Constructor(HOST_MLA, HOST_CLASSES[Attention.MLA], host_args,
                           (*host_kwargs, ("target_layer_num", layers)))
    else:
        device = Constructor(MEMORY_POOL, "MHATokenToKVPool",
                             (size, ps, dtype, spec.heads, spec.head_dim, layers, DEVICE_NAME, False),
                             (("enable_alt_stream", False),))
        groups: tuple[tuple[str, Value], ...] = (
            (("head_group_num", spec.head_groups),) if case.layout is HostLayout.PAGE_UNIFIED else ())
        host = Constructor(HOST_MHA, HOST_CLASSES[Attention.MHA], host_args, (*host_kwargs, *groups))
    return PoolConstruction(device, host, device_buffers(spec), spec.write_back_jit)


def device_buffers(spec: PoolSpec) -> tuple[str, ...]:
    """The device pool's attributes holding each component's per-layer tensors, in the spec's component order."""
    return ("kv_buffer",) if spec.attention is Attention.MLA else ("k_buffer", "v_buffer")


def io_backend_for(cls: pool_layouts.PoolClass, layout: HostLayout, wanted: str) -> str:
    """The io backend a host pool of class `cls` moves `layout` with when `wanted` is asked for: `wanted` where
    the class moves the layout with it, else the other io backend where only that one does, else `wanted` (a
    value that names no io backend, or a layout neither moves: the case is then unsupported by the class's rule).

    A case's layout is drawn before its knobs and its storages are laid out in it, so the io backend gives way.
    sglang's server resolves the same pairs at start-up (``resolve_layout_io_compatibility``):
    page_first_direct with kernel io runs direct io; page_first with direct io becomes page_first_direct, a
    layout the case does not have, so the case keeps page_first and takes the kernel io backend."""
    if wanted not in pool_layouts.IO_BACKENDS or layout in cls.layouts_for(wanted):
        return wanted
    other = pool_layouts.DIRECT if wanted == pool_layouts.KERNEL else pool_layouts.KERNEL
    return other if layout in cls.layouts_for(other) else wanted


def io_backend(case: Case) -> str:
    """The io backend of an sglang-pool case, the controller's and every pool transfer's: the ``io_backend``
    knob (``kernel`` where the case has none) resolved by :func:`io_backend_for` against the anchor pool's host
    class (the group's layout is the anchor's; the MHA and MLA classes move the same layouts with each io
    backend but page_head, which this backend does not draw)."""
    wanted = str(case.tuning_value("io_backend", pool_layouts.KERNEL))
    name = HOST_CLASSES.get(case.pools[0].attention)
    return wanted if name is None else io_backend_for(pool_layouts.pool_class(name), case.layout, wanted)


class Placement(enum.Enum):
    """Which of the controller's index placements a case goes through (the controller's own methods do it)."""

    MOVE_ALL = "move_all"  # HiCacheController.move_indices, the same pair for every pool
    BASE_WRITE = "base_write"  # HiCacheController._move_write_operation on a write operation, for every pool
    # the HybridCacheController's per-pool routing: with some pool on the staged path (can_use_write_back_jit),
    # each such pool keeps CPU host indices and the others get moved ones; with none, move_indices for all
    HYBRID_SPLIT = "hybrid_split"


def placement(case: Case) -> Placement:
    if case.direction is Direction.LOAD_BACK:
        return Placement.MOVE_ALL
    if case.tuning_value("controller", "hybrid") == "base":
        return Placement.BASE_WRITE
    # the HybridCacheController routes per pool only for a page_first back-up with kernel io
    # (hybrid_cache_controller.py:856); direct io takes move_indices, whose direct branch keeps indices on the CPU
    if case.layout is not HostLayout.PAGE_FIRST or io_backend(case) != pool_layouts.KERNEL:
        return Placement.MOVE_ALL
    return Placement.HYBRID_SPLIT


# A load-back of a layer the host pool does not hold (a draft/MTP layer past the target model's, or another pool's
# layer in a hybrid group) must return without touching anything (docs/semantics.md, 4.1). The controller makes
# such calls in production; the ids just outside the pool's range are the ones an off-by-one guard lets through,
# and Python would take -1 as the last layer. The whole-storage compare then shows any write, and an exception
# is a failure of a valid case.
def foreign_layers(case: Case) -> tuple[int, ...]:
    return (-1, case.layers)


def pool_transfers(case: Case) -> list[tuple[str, int | None]]:
    """Each pool's transfer calls, in order: (host-pool method, layer or None). A write-back backs up all layers
    at once; a load-back loads each moved layer, as the controller does, then the layers just outside the pool."""
    if case.direction is Direction.WRITE_BACK:
        return [("backup_from_device_all_layer", None)]
    return [("load_to_device_per_layer", layer) for layer in (*case.moved_layers, *foreign_layers(case))]
