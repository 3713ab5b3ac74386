"""sglang-hicache: the controller hands the device allocator each transfer's done event (the contract that lets an
allocator which recycles rows wait for the transfer still touching them). The drive's allocator stand-in records
what it is handed; after each write and each load the event under the controller's key for that operation must be
that operation's ack's finish event. A controller that drops the load's event is caught."""

from __future__ import annotations

import pytest

from hicache_fuzz.harness.model.case import Attention, HostLayout
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.kernels import sglang_hicache_objects as objects
from hicache_fuzz.oracles import sequence
from tests.kernels._hicache_helpers import fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

CONTROLLER_CLASS = {"hybrid": "HybridCacheController", "base": "HiCacheController"}


@pytest.mark.parametrize("controller", ["hybrid", "base"])
def test_each_transfer_hands_the_allocator_its_finish_event(fake_sglang: None, monkeypatch: pytest.MonkeyPatch,
                                                            controller: str) -> None:
    handed: list[str] = []
    record = objects.DeviceAllocatorStandIn.set_hicache_transfer_done_event

    def recording(self: objects.DeviceAllocatorStandIn, key: tuple[int, str], event: object) -> None:
        handed.append(key[1])
        record(self, key, event)

    monkeypatch.setattr(objects.DeviceAllocatorStandIn, "set_hicache_transfer_done_event", recording)
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, ops="backup,load,evict,backup,load",
                        controller=controller)
    assert run_on_cpu(case).outcome is Outcome.PASS
    ops = {sequence.BACKUP: "write", sequence.LOAD: "load"}
    assert handed == [ops[s.op] for s in sequence.plan_steps(case) if s.op in ops]


@pytest.mark.parametrize("controller", ["hybrid", "base"])
def test_a_load_whose_event_the_allocator_never_gets_is_caught(fake_sglang: None, monkeypatch: pytest.MonkeyPatch,
                                                               controller: str) -> None:
    """sglang's ``start_loading`` without its ``set_hicache_transfer_done_event`` call (cache_controller.py)."""
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, ops="backup,load", controller=controller)
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "no_load_done_event")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert (f"step 2 (load) [{CONTROLLER_CLASS[controller]}.load + start_loading]: the controller handed the device "
            f"allocator no event under ({CONTROLLER_CLASS[controller]}, 'load') for this load") in result.summary, (
        result.summary)


def test_the_stand_in_tells_a_missing_or_foreign_event_from_the_finish_event() -> None:
    allocator = objects.DeviceAllocatorStandIn(device_pool=None)
    controller, finish, other = object(), object(), object()
    assert "no event under (object, 'write')" in allocator.done_event_differs(controller, "write", finish)
    allocator.set_hicache_transfer_done_event((id(controller), "write"), finish)
    assert allocator.done_event_differs(controller, "write", finish) == ""
    assert "no event" in allocator.done_event_differs(controller, "load", finish)
    allocator.set_hicache_transfer_done_event((id(controller), "load"), other)
    assert "another event than the ack's finish event" in allocator.done_event_differs(controller, "load", finish)
