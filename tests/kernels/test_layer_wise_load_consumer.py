"""sglang-hicache: every load consumed as the forward pass consumes it (the producer id ``start_loading`` returns
made the consumer, then ``wait_until(layer)`` before each device layer is read), each read compared with the layer
once the load has finished; the H2D delay knob set for the drawn loads only. Fake sglang on the CPU, whose H2D
stream lags while the knob is set, with planted bugs of the consumer contract."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.kernels import sglang_hicache_hisparse as hisparse
from hicache_fuzz.kernels import sglang_hicache_layer_read as layer_read
from hicache_fuzz.kernels.sglang_hicache_settings import BASE, HYBRID, case_settings, controller_kind, skip_topk_layers
from hicache_fuzz.oracles import pool_layouts, sequence
from tests.kernels._hicache_helpers import fake_sglang, hicache_case, run_on_cpu
from tests.kernels.test_sglang_pool_classes import KIND

__all__ = ["fake_sglang"]  # the fixture, used by name

DRIVEN_BY_CONTROLLER = [name for name in pool_layouts.MODELLED if name not in hisparse.COORDINATOR_LOADED]
CONTROLLER_CLASS = {HYBRID: "HybridCacheController", BASE: "HiCacheController"}


def class_case(name: str, controller: str, ops: str = "backup,load,evict,backup,load") -> Case:
    """A sequence case of class `name` (its first layout with the kernel io backend, else the direct one), with
    packed draft layers where the class has them."""
    cls = pool_layouts.pool_class(name)
    assert cls.attention is not None
    io = "kernel" if cls.layouts_for("kernel") else "direct"
    layout = sorted(cls.layouts_for(io), key=lambda x: x.value)[0]
    # as test_sglang_pool_classes: one-slot pages, 128-byte page rows, the DSA indexer's compiled 576-byte row
    page_size = cls.only_page_size or (1 if cls.slot_pages else 12 if name == "DSAIndexerPoolHost" else (
        8 if cls.kernel_page_row_align > 1 else 3))
    case = hicache_case(cls.attention, layout, page_size=page_size, layers=4, ops=ops, pool_kind=KIND[name],
                        io_backend=io, start_layer=2, draft_layers=2 if cls.drafts else 0, controller=controller)
    if cls.row_align > 1:  # the MXFP8 pool: rows of whole 32-element scale blocks, of a compiled width
        case = case.replace(pools=(PoolSpec("kv", cls.attention, KVDtype.BF16, 2, 32),))
    assert case_settings(case)[0] == name
    return case


@pytest.fixture
def every_load_delayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layer_read, "h2d_delayed", lambda case, step: True)


class ConsumerLog:
    """The counter calls of a run, in order: ("producer", id) from start_loading, ("consumer", id), ("wait", layer)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def loads(self) -> list[list[tuple[str, int]]]:
        """The calls of each load, from its producer id on."""
        out: list[list[tuple[str, int]]] = []
        for call in self.calls:
            if call[0] == "producer":
                out.append([])
            out[-1].append(call)
        return out


@pytest.fixture
def consumer_log(fake_sglang: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConsumerLog]:
    from sglang.srt.managers.cache_controller import LayerDoneCounter

    log = ConsumerLog()
    update_producer, set_consumer, wait_until = (LayerDoneCounter.update_producer, LayerDoneCounter.set_consumer,
                                                 LayerDoneCounter.wait_until)

    def logged_update_producer(self: Any) -> int:
        producer: int = update_producer(self)
        log.calls.append(("producer", producer))
        return producer

    def logged_set_consumer(self: Any, index: int) -> None:
        log.calls.append(("consumer", index))
        set_consumer(self, index)

    def logged_wait_until(self: Any, threshold: int) -> None:
        log.calls.append(("wait", threshold))
        wait_until(self, threshold)

    monkeypatch.setattr(LayerDoneCounter, "update_producer", logged_update_producer)
    monkeypatch.setattr(LayerDoneCounter, "set_consumer", logged_set_consumer)
    monkeypatch.setattr(LayerDoneCounter, "wait_until", logged_wait_until)
    yield log


# ---- the reads --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize("name", DRIVEN_BY_CONTROLLER)
def test_every_load_is_read_layer_by_layer_after_waiting_on_its_own_producer(consumer_log: ConsumerLog,
                                                                             every_load_delayed: None, name: str,
                                                                             controller: str) -> None:
    case = class_case(name, controller)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
    loads = [s for s in sequence.plan_steps(case) if s.op == sequence.LOAD]
    # the transfer layers the forward pass waits for: each layer of the target model holding the case's bytes (a
    # DSA indexer's: those owning index keys), in order
    target = case.layers - case_settings(case)[3]
    waits = list(pool_layouts.owned_device_layers(skip_topk_layers(case))) if name == "DSAIndexerPoolHost" else list(
        range(target))
    assert len(consumer_log.loads()) == len(loads)
    for calls in consumer_log.loads():
        producer = calls[0][1]
        assert calls == [("producer", producer), ("consumer", producer), *[("wait", t) for t in waits],
                         ("consumer", -1)]


@pytest.mark.parametrize("controller", ["hybrid", "base"])
def test_packed_draft_layers_are_read_after_the_last_wait_under_the_hybrid_controller_only(
        fake_sglang: None, monkeypatch: pytest.MonkeyPatch, controller: str) -> None:
    """The hybrid controller loads every draft before the final target-layer event; under the base controller
    the draft pass loads them after the load, so the forward stream's reads leave them out."""
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, layers=5, draft_layers=2, ops="load",
                        controller=controller)
    reads: list[layer_read.LayerRead] = []
    read_layer_by_layer = layer_read.read_layer_by_layer

    def kept(*args: Any) -> list[layer_read.LayerRead]:
        out = read_layer_by_layer(*args)
        reads.extend(out)
        return out

    monkeypatch.setattr(layer_read, "read_layer_by_layer", kept)
    assert run_on_cpu(case).outcome is Outcome.PASS
    target = [(c, layer, layer) for c in ("k", "v") for layer in range(3)]
    drafts = [(c, layer, 2) for c in ("k", "v") for layer in (3, 4)] if controller_kind(case) == HYBRID else []
    assert sorted((r.waited_for, r.component, r.layer) for r in reads) == sorted(
        (at, c, layer) for c, layer, at in target + drafts)  # one load: step 1


# ---- planted bugs of the consumer contract ----------------------------------------------------------------------

@pytest.mark.parametrize("bug", ["wrong_producer", "early_layer_event"])
@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize("name", DRIVEN_BY_CONTROLLER)
def test_a_wait_that_does_not_cover_its_layer_is_caught_on_the_layer_wise_read(fake_sglang: None,
                                                                               every_load_delayed: None,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               name: str, controller: str,
                                                                               bug: str) -> None:
    """wrong_producer: the load's events go to another producer slot (sglang's cache_controller.py
    ``events[producer_id - 1]``), so the consumer waits on events never recorded; early_layer_event: each layer's
    event is recorded before its copies. Either way the forward stream reads layer 0 before it is loaded."""
    case = class_case(name, controller, ops="backup,load")
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", bug)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    first_wait = pool_layouts.owned_device_layers(skip_topk_layers(case))[0] if name == "DSAIndexerPoolHost" else 0
    assert (f"step 2 (load) [{CONTROLLER_CLASS[controller_kind(case)]}.load + start_loading]: layer-wise read: device "
            f"layer 0 (") in result.summary, result.summary
    assert f"after layer_done_counter.wait_until({first_wait}) differs from the layer once the load had finished" in (
        result.summary)


def test_a_load_back_case_names_its_first_load(fake_sglang: None, every_load_delayed: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    case = hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, direction=Direction.LOAD_BACK, layers=3)
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "wrong_producer")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED
    assert result.summary.startswith("valid input rejected: AssertionError: step 0 (load) [HybridCacheController.load "
                                     "+ start_loading]: layer-wise read: device layer 0 (KV)"), result.summary


# ---- the delay knob ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("outside", [None, "7"])
def test_the_delay_knob_is_set_for_the_drawn_loads_only_and_restored(fake_sglang: None,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     outside: str | None) -> None:
    """sglang reads the knob on every submission: each load sees the drive's delay where drawn, else what the
    process had (unset, or a value of its own), and the process has that again afterwards."""
    import sglang.srt.managers.cache_controller as fake_controller

    if outside is None:
        monkeypatch.delenv(layer_read.H2D_DELAY_ENV, raising=False)
    else:
        monkeypatch.setenv(layer_read.H2D_DELAY_ENV, outside)
    seen: list[str | None] = []
    submit = fake_controller.submit_host_to_device

    def seeing(*args: Any) -> Any:
        seen.append(os.environ.get(layer_read.H2D_DELAY_ENV))
        return submit(*args)

    monkeypatch.setattr(fake_controller, "submit_host_to_device", seeing)
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, direction=Direction.LOAD_BACK,
                        ops="load,backup,load,load,load,load,load,load")
    assert run_on_cpu(case).outcome is Outcome.PASS
    drawn = [layer_read.h2d_delayed(case, s) for s in sequence.plan_steps(case) if s.op == sequence.LOAD]
    assert True in drawn and False in drawn  # this case draws both
    assert seen == [str(layer_read.H2D_DELAY_CYCLES) if delayed else outside for delayed in drawn]
    assert os.environ.get(layer_read.H2D_DELAY_ENV) == outside


def test_about_half_the_loads_are_drawn_for_the_delay_and_a_replay_draws_the_same() -> None:
    cases = [hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, ops="load,load,load", layers=layers)
             for layers in range(1, 41)]
    draws = [layer_read.h2d_delayed(c, s) for c in cases for s in sequence.plan_steps(c) if s.op == sequence.LOAD]
    assert 0.35 < sum(draws) / len(draws) < 0.65
    again = [layer_read.h2d_delayed(Case.from_json(c.to_json()), s) for c in cases for s in sequence.plan_steps(c)
             if s.op == sequence.LOAD]
    assert again == draws


def test_an_undelayed_load_is_read_after_the_fake_ran_it_whole(consumer_log: ConsumerLog,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the delay the fake's H2D stream runs a load at submission (a stream that is not behind): the same
    wrong wait reads the loaded bytes, which is why the drive delays its share of loads."""
    monkeypatch.setattr(layer_read, "h2d_delayed", lambda case, step: False)
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "wrong_producer")
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, ops="backup,load")
    assert run_on_cpu(case).outcome is Outcome.PASS
    assert ("wait", 0) in consumer_log.calls  # read layer by layer all the same
