"""Fake HiCacheController: sglang's constructor signature and the methods the harness drives (write, load,
start_writing, start_loading, evict_host, and the index placement the standalone pool scripts call unbound).
Transfers run on the CPU as L2 transfers (pool, device pool, indices, layer mapper, draft flag) through the host
pool's prepare_transfer_indices and *_physical methods, as sglang's L2 transfer engine calls them.

A load is consumed as sglang's forward pass consumes it: ``start_loading`` returns a producer id of the
controller's ``LayerDoneCounter`` (three ``LayerLoadingEvent`` slots used in turn), the H2D submission records the
producer's event of each layer after that layer's copies, and the consumer (``set_consumer(producer id)``, then
``wait_until(layer)``) waits on those events. The controller's H2D stream is a ``_Stream``: with
``SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES`` set at submission (sglang's test knob, read on every submission) the
load's copies lag, running only when something waits for them (a layer's event, or the ack's finish event): the
most a delayed stream can lag. Without it they run at submission, so every read after ``start_loading`` sees the
whole load. Back-ups run at once (their ack's event was never recorded, so it is complete).

``FAKE_SGLANG_POOL_BUG`` plants one bug of the consumer contract:

* ``wrong_producer``: ``start_loading`` records the load's events in the slot before its producer id's (as sglang
  would with ``events[producer_id - 1]``), so the consumer of that producer id waits on another slot's events;
* ``early_layer_event``: the H2D submission records each layer's event before that layer's copies, so
  ``wait_until(layer)`` returns before the layer is loaded.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from sglang.srt.mem_cache.pool_host.base import planted_bug

H2D_DELAY_ENV = "SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES"


class _Stream:
    """A device stream: work runs in the order it was enqueued, at once unless the stream lags; a lagging
    stream runs it only when something waits for it."""

    def __init__(self) -> None:
        self.pending: deque[Callable[[], None]] = deque()
        self.enqueued = 0
        self.ran = 0
        self.lagging = False

    def enqueue(self, work: Callable[[], None]) -> None:
        self.pending.append(work)
        self.enqueued += 1
        if not self.lagging:
            self.run_until(self.enqueued)

    def run_until(self, position: int) -> None:
        while self.ran < position:
            self.pending.popleft()()
            self.ran += 1


_current = threading.local()  # the stream work is enqueued on (none: the caller's, i.e. the CPU at once)


def current_stream() -> _Stream | None:
    return getattr(_current, "stream", None)


@contextmanager
def stream_context(stream: _Stream) -> Iterator[None]:
    """``device_module.stream(stream)``: events recorded inside are recorded on `stream`."""
    outer, _current.stream = current_stream(), stream
    try:
        yield
    finally:
        _current.stream = outer


class Event:
    """A device event: recorded on the current stream after the work enqueued on it so far; one never recorded
    is complete (a CUDA event that was never recorded: waits on it return at once, its query is True)."""

    def __init__(self) -> None:
        self.stream: _Stream | None = None
        self.position = 0

    def record(self) -> None:
        stream = current_stream()
        self.stream, self.position = stream, stream.enqueued if stream is not None else 0

    def query(self) -> bool:
        return self.stream is None or self.stream.ran >= self.position

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run_until(self.position)


class LayerLoadingEvent:
    """sglang's: one event per transfer layer, recorded on the H2D stream as each layer's copies are enqueued;
    a consumer's wait is the caller's stream waiting on that event (here the CPU, so the work before it runs)."""

    def __init__(self, num_layers: int) -> None:
        self._num_layers = num_layers
        self.load_events = [Event() for _ in range(num_layers)]
        self.start_event = Event()

    def complete(self, layer_index: int) -> None:
        assert 0 <= layer_index < self._num_layers
        self.load_events[layer_index].record()

    def wait(self, layer_index: int) -> None:
        self.load_events[layer_index].synchronize()

    @property
    def finish_event(self) -> Event:
        return self.load_events[-1]


class LayerDoneCounter:
    """sglang's: three producer slots used in turn (a slot is reused only once its load has finished), and the
    consumer the forward pass waits on (none: -1, waits return at once)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.num_counters = 3
        self.events = [LayerLoadingEvent(num_layers) for _ in range(self.num_counters)]
        self.producer_index = -1
        self.consumer_index = -1

    def update_producer(self) -> int:
        self.producer_index = (self.producer_index + 1) % self.num_counters
        assert self.events[self.producer_index].finish_event.query(), (
            "Producer finish event should be ready before being reused.")
        return self.producer_index

    def set_consumer(self, index: int) -> None:
        self.consumer_index = index

    def wait_until(self, threshold: int) -> None:
        if self.consumer_index < 0:
            return
        self.events[self.consumer_index].wait(threshold)

    def reset(self) -> None:
        self.producer_index = -1
        self.consumer_index = -1


class L2Transfer(NamedTuple):
    host_pool: Any
    device_pool: Any
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    layer_mapper: Callable[[int], int | None] | None = None
    is_draft: bool = False


def _prepared(transfers: list[L2Transfer], io_backend: str) -> list[L2Transfer]:
    out = []
    for t in transfers:
        host, device = t.host_pool.prepare_transfer_indices(t.host_indices, t.device_indices, io_backend)
        out.append(t._replace(host_indices=host, device_indices=device))
    return out


def submit_device_to_host(transfers: list[L2Transfer], io_backend: str) -> None:
    for t in _prepared(transfers, io_backend):
        t.host_pool.backup_from_device_all_layer_physical(t.device_pool, t.host_indices, t.device_indices,
                                                          io_backend)


def _h2d_delay_cycles() -> int:
    """sglang's ``envs.SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES.get()``: read at every submission, 0 when unset or
    not an integer."""
    try:
        return int(os.environ.get(H2D_DELAY_ENV, "0"))
    except ValueError:
        return 0


def submit_host_to_device(transfers: list[L2Transfer], io_backend: str, transfer_layer_id_max: int,
                          stream: _Stream, on_layer_done: Callable[[int], None] | None = None) -> Event:
    """Each layer's copies enqueued on `stream`, then `on_layer_done(layer)` there; the finish event after them.
    The stream lags while the delay knob is set (sglang sleeps on the stream before each layer's copies)."""
    prepared = _prepared(transfers, io_backend)
    stream.lagging = _h2d_delay_cycles() > 0
    early = planted_bug() == "early_layer_event"  # the bug: the event before the layer's copies
    with stream_context(stream):
        for layer_id in range(transfer_layer_id_max):
            if early and on_layer_done is not None:
                on_layer_done(layer_id)
            for t in prepared:
                local = t.layer_mapper(layer_id) if t.layer_mapper is not None else layer_id
                if local is None:
                    continue
                stream.enqueue(lambda t=t, local=local: t.host_pool.load_to_device_per_layer_physical(
                    t.device_pool, t.host_indices, t.device_indices, local, io_backend, is_draft=t.is_draft))
            if not early and on_layer_done is not None:
                on_layer_done(layer_id)
        finish = Event()
        finish.record()
    return finish


def _pool_transfers(ops: list[SimpleNamespace]) -> list[Any] | None:
    """The queued operations' side-pool transfers, one after another (sglang merges those of one pool)."""
    return [t for op in ops for t in (op.pool_transfers or [])] or None


class HiCacheController:
    io_backend: str
    device: Any
    mem_pool_host: Any

    def __init__(self, token_to_kv_pool_allocator: Any, mem_pool_host: Any, page_size: int, tp_group: Any,
                 load_cache_event: threading.Event, attn_cp_group: Any = None, attn_tp_group: Any = None,
                 pp_group: Any = None, write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: str | None = None, prefetch_threshold: int = 256, model_name: str | None = None,
                 storage_backend_extra_config: dict[str, Any] | None = None, enable_storage_metrics: bool = False,
                 host_memory_mode: str = "cache") -> None:
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        self.mem_pool_host, self.page_size, self.io_backend = mem_pool_host, page_size, io_backend
        self.device = self.mem_pool_device.device
        self.transfer_layer_id_max = self.mem_pool_device.layer_num
        self.layer_done_counter = LayerDoneCounter(self.transfer_layer_id_max)
        self.mem_pool_device.register_layer_transfer_counter(self.layer_done_counter)
        self.host_to_device_stream = _Stream()
        if write_policy not in ("write_through", "write_through_selective", "write_back"):
            raise ValueError(f"Invalid write policy: {write_policy}")
        self.write_queue: list[SimpleNamespace] = []
        self.load_queue: list[SimpleNamespace] = []
        self.ack_write_queue: list[SimpleNamespace] = []
        self.ack_load_queue: list[SimpleNamespace] = []

    def write(self, device_indices: torch.Tensor, priority: int | None = None, node_id: int = -1,
              extra_pools: Any = None) -> torch.Tensor | None:
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.write_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=device_indices,
                                                pool_transfers=None))
        self.start_writing()
        return host_indices

    def start_writing(self) -> None:
        if not self.write_queue:
            return
        op = SimpleNamespace(host_indices=torch.cat([o.host_indices for o in self.write_queue]),
                             device_indices=torch.cat([o.device_indices for o in self.write_queue]),
                             pool_transfers=_pool_transfers(self.write_queue))
        host_indices, device_indices, transfers = self._move_write_operation(op)
        self.write_queue.clear()
        submit_device_to_host(self._l2_transfers(host_indices, device_indices, transfers), self.io_backend)
        finish = Event()  # the copies have run
        # the allocator must not hand out rows a pending transfer still reads (cache_controller.py, start_writing)
        self.mem_pool_device_allocator.set_hicache_transfer_done_event((id(self), "write"), finish)
        self.ack_write_queue.append(SimpleNamespace(finish_event=finish))

    def _l2_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                      pool_transfers: Any = None) -> list[L2Transfer]:
        return [L2Transfer(self.mem_pool_host, self.mem_pool_device, host_indices, device_indices)]

    def _l2_load_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                           pool_transfers: Any = None) -> list[L2Transfer]:
        return self._l2_transfers(host_indices, device_indices, pool_transfers)

    def load(self, host_indices: torch.Tensor, priority: int | None = None, node_id: int = -1) -> torch.Tensor | None:
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.load_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=device_indices,
                                               pool_transfers=None))
        return device_indices

    def start_loading(self) -> int:
        if not self.load_queue:
            return -1
        producer_id = self.layer_done_counter.update_producer()
        op = SimpleNamespace(host_indices=torch.cat([o.host_indices for o in self.load_queue]),
                             device_indices=torch.cat([o.device_indices for o in self.load_queue]),
                             pool_transfers=_pool_transfers(self.load_queue))
        host_indices, device_indices, transfers = self._move_op_indices(op)
        self.load_queue.clear()
        slot = producer_id - 1 if planted_bug() == "wrong_producer" else producer_id  # the bug: another slot
        producer_event = self.layer_done_counter.events[slot]
        producer_event.start_event.record()
        finish = submit_host_to_device(self._l2_load_transfers(host_indices, device_indices, transfers),
                                       self.io_backend, self.transfer_layer_id_max, self.host_to_device_stream,
                                       producer_event.complete)
        # the allocator must not reuse rows a pending load still writes (cache_controller.py, start_loading)
        if planted_bug() != "no_load_done_event":  # the bug: the load's event is never handed over
            self.mem_pool_device_allocator.set_hicache_transfer_done_event((id(self), "load"), finish)
        self.ack_load_queue.append(SimpleNamespace(finish_event=finish))
        return producer_id

    def evict_host(self, host_indices: torch.Tensor, backup_only: bool = True) -> int:
        if not backup_only:
            raise ValueError("Other eviction policies are not supported yet.")
        self.mem_pool_host.free(host_indices)
        return len(host_indices)

    def move_indices(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.io_backend == "direct":
            layout = self.mem_pool_host.layout
            if layout == "layer_first":
                host_indices, order = host_indices.sort()
                return host_indices, device_indices.cpu().index_select(0, order)
            if layout == "page_first_direct":
                return host_indices, device_indices.cpu()
            raise ValueError(f"Unsupported layout {layout!r} for io backend 'direct'")
        return host_indices.to(self.device), device_indices

    def _move_op_indices(self, op: Any) -> tuple[Any, ...]:
        return (*self.move_indices(op.host_indices, op.device_indices), None)

    def _move_write_operation(self, op: Any) -> tuple[Any, ...]:
        if (self.io_backend == "kernel" and self.mem_pool_host.layout == "page_first"
                and getattr(self.mem_pool_host, "can_use_write_back_jit", False)):
            return op.host_indices, op.device_indices.to(self.device), op
        return self._move_op_indices(op)
