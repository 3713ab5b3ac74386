"""sglang's objects of one ``sglang-hicache`` case as the drive holds them (``Built``: the device and host pools,
the controller, the pools beside them), the device allocator stand-in the controller is handed, and the small
helpers every part of the drive shares (index tensors, the forward stream's stand-in).

``DeviceAllocatorStandIn`` stands for the scheduler's ``token_to_kv_pool_allocator``: it returns the device pool,
grants the device rows the sequence names for a load (which rows the device allocator picks is the radix tree's
business, not HiCache's, and the oracle must know them), and records the transfer-done event the controller hands
it. After each ``write`` and ``start_loading`` the event recorded under the controller's key for that operation
(``(id(controller), "write")`` / ``"load"``) must be that operation's ack's finish event: sglang's allocators that
recycle rows (the unified sub-pool allocator) wait on it before reusing rows a transfer still touches. The harness
itself waits on the ack's finish event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels import sglang_hicache_dsa as dsa
from hicache_fuzz.kernels import sglang_hicache_mxfp8 as mxfp8
from hicache_fuzz.kernels import sglang_hicache_side as side_pools
from hicache_fuzz.kernels.sglang_hicache_settings import LayerShard

K_ONLY = "MHATokenToKOnlyPoolHost"


class DeviceAllocatorStandIn:
    """The scheduler's device token allocator, as far as the controllers use it (see the module doc)."""

    def __init__(self, device_pool: Any) -> None:
        self.device_pool = device_pool
        self.grants: deque[torch.Tensor] = deque()
        # the transfer-done events the controller handed over, by its key ((id(controller), "write" or "load"))
        self.done_events: dict[Any, Any] = {}

    def get_kvcache(self) -> Any:
        return self.device_pool

    def alloc(self, need_size: int) -> torch.Tensor:
        rows = self.grants.popleft()
        if len(rows) != need_size:
            raise AssertionError(f"the controller asked the device allocator for {need_size} rows, the load has "
                                 f"{len(rows)}")
        return rows

    def set_hicache_transfer_done_event(self, key: Any, event: Any) -> None:
        self.done_events[key] = event

    def done_event_differs(self, controller: Any, operation: str, finish_event: Any) -> str:
        """'' if the controller handed over `finish_event` for its `operation` ("write" or "load") since the
        record was last cleared, else what it handed over."""
        key = (id(controller), operation)
        got = self.done_events.get(key)
        if got is finish_event:
            return ""
        what = "no event" if got is None else "another event than the ack's finish event"
        return (f"the controller handed the device allocator {what} under ({type(controller).__name__}, "
                f"{operation!r}) for this {operation}: set_hicache_transfer_done_event must receive the "
                f"{operation}'s finish event, which allocators that recycle rows wait on")


class Built:
    """sglang's objects for one pool of a case: the target device pool, one one-layer device pool per packed draft
    layer, the host pool (an instance of the case's class), and the controller over them with its device
    allocator stand-in."""

    def __init__(self, device_pool: Any, drafts: list[Any], host_pool: Any) -> None:
        self.device_pool, self.drafts, self.host_pool = device_pool, drafts, host_pool
        self.allocator = DeviceAllocatorStandIn(device_pool)
        self.controller: Any = None
        self.sides: list[side_pools.SidePool] = []  # the group's side pools, in the group's name order
        self.dsa: dsa.DsaGroup | None = None  # a DSA indexer's anchor and config, if the case's pool is one
        self.mxfp8: mxfp8.ScaleStorages | None = None  # the MXFP8 pool's scale blocks, if the case's pool is one
        self.shard: LayerShard | None = None  # the rank's share of the stage, if the MLA pool is layer-sharded
        # bytes of sglang's tensors no case storage holds, which must keep their values (kernels/sglang_hicache_device)
        self.outside = devices.OutsideBytes()
        self.forward_stream: Any = None  # the stream standing for the forward stream (CUDA), made at first use

    @property
    def allocating_pool(self) -> Any:
        """The host pool whose allocator grants the controller's host slots: the group's anchor (the DSA indexer
        rides on its MLA anchor's slots), else the case's pool."""
        return self.dsa.anchor_host if self.dsa is not None else self.host_pool


@contextmanager
def forward_stream(built: Built, device: torch.device) -> Iterator[None]:
    """Work inside runs on the stand-in for the forward stream, after the current stream's work (the load's row
    indices are made there). On the CPU (the fake sglang) there are no streams: work runs in order."""
    if device.type != "cuda":
        yield
        return
    if built.forward_stream is None:
        built.forward_stream = torch.cuda.Stream(device)
    stream = built.forward_stream
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield


def sync(device: torch.device) -> None:
    """Wait for the device's work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def indices(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Slots or rows as sglang's calls take them: int64 on `device`."""
    return torch.tensor(values, dtype=torch.int64, device=device)


def head(granted: torch.Tensor) -> str:
    """A grant as a step's label names it: its first eight slots, and its length where it has more."""
    values = granted.tolist()
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, ...] ({len(values)})"

