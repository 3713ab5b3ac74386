"""The forward pass's read of a controller load, layer by layer, for ``sglang-hicache``.

A load is consumed as the forward pass consumes it: ``start_loading()`` returns a producer id of the controller's
``LayerDoneCounter``; on a stream of its own (the forward stream's stand-in) that id is made the consumer, as the
model runner makes it, and for each transfer layer in order ``wait_until(layer)`` is followed by a copy of the
load's rows of that device layer. Each copy must equal the layer once the whole load has finished. One load in two
(drawn from the case and the step) is submitted with sglang's test knob ``SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES``
set, which slows every layer of that submission on the H2D stream, so that a wait that does not cover its layer
reads bytes the load has not yet written.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels.buffers import PoolBuffers
from hicache_fuzz.kernels.sglang_hicache_objects import Built, forward_stream, sync
from hicache_fuzz.kernels.sglang_hicache_settings import HYBRID, controller_kind
from hicache_fuzz.kernels.sglang_hicache_settings import case_settings as settings
from hicache_fuzz.kernels.sglang_hicache_tensors import device_layers
from hicache_fuzz.oracles import sequence

# sglang's test knob (mem_cache/l2_transfer.py, submit_host_to_device): read on every submission, it sleeps this
# many GPU cycles on the H2D stream before each layer's copies. ~100 us a layer at H100 clocks: longer than the host
# takes to enqueue a layer, so the H2D stream falls behind the forward stream's reads.
H2D_DELAY_ENV = "SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES"
H2D_DELAY_CYCLES = 200_000
# Every load's submission holds it: the knob is process-wide, and a delayed submission's setting must not leak
# into another thread's submission, nor be restored over another's.
_H2D_DELAY_LOCK = threading.Lock()


def h2d_delayed(case: Case, step: sequence.Step) -> bool:
    """Whether the load of `step` is submitted with the H2D delay: one load in two, a function of the case and the
    step only, so that a replay of the case delays the same loads."""
    return zlib.crc32(f"{case.case_id}:{step.index}".encode()) % 2 == 0


@contextmanager
def h2d_delay(delayed: bool) -> Iterator[None]:
    """sglang's H2D delay knob set for the submissions inside (`delayed`), then as it was: sglang reads it on every
    submission, so only the delayed loads pay for it."""
    with _H2D_DELAY_LOCK:
        if not delayed:
            yield
            return
        before = os.environ.get(H2D_DELAY_ENV)
        os.environ[H2D_DELAY_ENV] = str(H2D_DELAY_CYCLES)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(H2D_DELAY_ENV, None)
            else:
                os.environ[H2D_DELAY_ENV] = before


class LayerRead(NamedTuple):
    """One device layer of a load as the forward stream read it."""

    component: str
    layer: int  # of the case's device storage
    waited_for: int  # the transfer layer id passed to wait_until before the read
    tensor: torch.Tensor  # sglang's tensor of the layer (device_rows x row bytes, uint8)
    read: torch.Tensor  # its rows of the load, copied on the forward stream after the wait


def _layer_done_at(case: Case, built: Built) -> list[int | None]:
    """For each layer of the case's device storage, the transfer layer id whose event marks it loaded: a target
    layer its own (a DSA indexer's layer the device layer owning its index keys), a packed draft layer under the
    hybrid controller the last one (sglang finishes every draft before the final target-layer event), under the
    base controller none (the draft pass loads it after the load)."""
    drafts = settings(case)[3]
    target: range | tuple[int, ...] = range(case.layers - drafts)
    if built.dsa is not None:
        target = built.dsa.layers
    elif built.shard is not None:  # case layer j is the stage's device layer start + j
        target = range(built.shard.start, built.shard.start + built.shard.owned)
    draft_at = built.controller.transfer_layer_id_max - 1 if controller_kind(case) == HYBRID else None
    return [*target, *[draft_at] * drafts]


def layers_by_wait(built: Built, pool: PoolBuffers) -> list[tuple[int, list[tuple[str, int, torch.Tensor]]]]:
    """The layers of the case's device storage that a load brings, grouped by the transfer layer id whose event
    marks them loaded, in the order of the ids: the case's device storage only (an MXFP8 pool's scale blocks and a
    DSA case's MLA anchor, loaded beside it, are judged once the load is done)."""
    done_at = _layer_done_at(pool.case, built)
    by_transfer_layer: dict[int, list[tuple[str, int, torch.Tensor]]] = {}
    for component, layer, tensor in device_layers(pool, built):
        at = done_at[layer]
        if at is not None:
            by_transfer_layer.setdefault(at, []).append((component, layer, tensor))
    return sorted(by_transfer_layer.items())


def read_layer_by_layer(built: Built, layers: list[tuple[int, list[tuple[str, int, torch.Tensor]]]], producer: int,
                        rows: torch.Tensor) -> list[LayerRead]:
    """The load of `producer` consumed as the forward pass consumes it (the model runner's ``set_consumer``, then
    the device pool's ``wait_until(layer)`` before attention reads the layer): the load's rows of each of `layers`
    (``layers_by_wait``), copied after the wait for the transfer layer that marks it loaded."""
    counter = built.controller.layer_done_counter
    reads = []
    with forward_stream(built, rows.device):
        counter.set_consumer(producer)
        for at, loaded in layers:
            counter.wait_until(at)
            reads += [LayerRead(component, layer, at, tensor, tensor.index_select(0, rows))
                      for component, layer, tensor in loaded]
        counter.set_consumer(-1)  # as a batch without a load sets it: later reads wait on nothing
    return reads


def stale_read(reads: list[LayerRead], rows: torch.Tensor) -> str:
    """'' if every layer the forward stream read holds what that layer holds once the whole load has finished,
    else the first that does not. The whole load is the runner's to compare with the oracle (the step's image or
    the final storages): a load that moves wrong bytes is reported there, against the oracle; what only the reads
    can show is a wait that returned before its layer was loaded."""
    if not reads:
        return ""
    sync(rows.device)
    loaded = [r.tensor.index_select(0, rows) for r in reads]
    if torch.equal(torch.cat([r.read.view(-1) for r in reads]), torch.cat([t.view(-1) for t in loaded])):
        return ""
    for r, now in zip(reads, loaded, strict=True):
        differs = (r.read != now).nonzero()
        if len(differs):
            index, byte = (int(v) for v in differs[0])
            return (f"layer-wise read: device layer {r.layer} ({r.component.upper()}) as the forward stream read it "
                    f"after layer_done_counter.wait_until({r.waited_for}) differs from the layer once the load had "
                    f"finished in {len(differs)} bytes, the first at device row {int(rows[index])} byte {byte}")
    return ""
