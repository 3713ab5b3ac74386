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
