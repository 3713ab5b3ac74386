"""A host-pool construction that raises after sglang pinned its buffers must not leave them pinned
(kernels/sglang_common.py, registrations_released_on_failure): the next case's buffers at those addresses could
not be pinned, and every later case in the worker would fail for a reason that is not its own."""

from __future__ import annotations

import types
from typing import Any

import pytest

from hicache_fuzz.kernels.sglang_common import registrations_released_on_failure


def fake_common() -> tuple[types.SimpleNamespace, set[int]]:
    """A stand-in for sglang's pool_host/common.py: pinning records the buffer's id in `pinned`."""
    pinned: set[int] = set()

    def register(buffer: Any, granularity: int | None = None) -> None:
        assert id(buffer) not in pinned, "already registered"
        pinned.add(id(buffer))

    def unregister(buffer: Any) -> None:
        pinned.discard(id(buffer))

    return types.SimpleNamespace(_cuda_host_register=register, _cuda_host_unregister=unregister), pinned


def test_a_failed_construction_unpins_what_it_pinned() -> None:
    common, pinned = fake_common()
    first, second = object(), object()
    with pytest.raises(RuntimeError, match="pointer table"), registrations_released_on_failure(common):
        common._cuda_host_register(first)
        common._cuda_host_register(second, 4096)
        assert pinned == {id(first), id(second)}
        raise RuntimeError("pointer table")
    assert pinned == set()
    common._cuda_host_register(first)  # the address can be pinned again
    assert pinned == {id(first)}


def test_a_construction_that_returns_keeps_its_buffers_pinned_and_restores_the_function() -> None:
    common, pinned = fake_common()
    original = common._cuda_host_register
    buffer = object()
    with registrations_released_on_failure(common):
        common._cuda_host_register(buffer)
    assert pinned == {id(buffer)}
    assert common._cuda_host_register is original


def test_without_sglangs_module_it_does_nothing() -> None:
    with pytest.raises(ValueError), registrations_released_on_failure(types.SimpleNamespace()):
        raise ValueError("no module")


def test_nested_blocks_release_only_their_own_pins_and_restore_the_function_they_found() -> None:
    common, pinned = fake_common()
    original = common._cuda_host_register
    outer, inner = object(), object()
    with registrations_released_on_failure(common):
        common._cuda_host_register(outer)
        with pytest.raises(RuntimeError), registrations_released_on_failure(common):
            common._cuda_host_register(inner)
            raise RuntimeError("inner construction")
        assert pinned == {id(outer)}
    assert pinned == {id(outer)} and common._cuda_host_register is original


def test_overlapping_blocks_in_two_threads_leave_the_original_function() -> None:
    """A block that starts while another thread's is open and ends after it: without the lock it would save the
    first block's wrapper as 'the original' and put that back."""
    import threading

    common, pinned = fake_common()
    original = common._cuda_host_register
    first_inside, first_done, second_inside, release = (threading.Event() for _ in range(4))
    buffer = object()

    def first() -> None:
        with registrations_released_on_failure(common):
            first_inside.set()
            release.wait(5)
        first_done.set()

    def second() -> None:
        with pytest.raises(RuntimeError), registrations_released_on_failure(common):
            second_inside.set()
            first_done.wait(5)
            common._cuda_host_register(buffer)
            raise RuntimeError("second construction")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_inside.wait(5)
    threads[1].start()
    assert not second_inside.wait(0.3)  # it waits for the first block to end
    release.set()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()
    assert common._cuda_host_register is original and pinned == set()
