"""A backend plugin for the known-scope and baseline tests: the CPU reference refusing valid inputs under two
triggers that share one bug identity (``test-scoped-refusal|wrongly_rejected|valid``):

* pageable host memory: always (the "known" bug);
* int32 device indices: only where the importable ``sglang`` module says ``HICACHE_FUZZ_TEST_PLANTED_BUG =
  True`` (a regression planted in a copy of tests/fake_sglang), so that which sglang a process imports
  decides whether the second bug is there, as it does for the real kernels.
"""

from __future__ import annotations

import importlib

from hicache_fuzz.harness.model.case import Case, HostAllocator, IndexDtype
from hicache_fuzz.kernels.base import Backend, BackendRejected
from hicache_fuzz.kernels.reference import ReferenceBackend

PLANTED_FLAG = "HICACHE_FUZZ_TEST_PLANTED_BUG"


def planted() -> bool:
    try:
        return bool(getattr(importlib.import_module("sglang"), PLANTED_FLAG, False))
    except ImportError:
        return False


class ScopedRefusal(ReferenceBackend):
    name = "test-scoped-refusal"
    description = "test plugin: refuses pageable host memory; with the planted sglang also int32 device indices"

    def validate(self, case: Case, host: list[int], device: list[int]) -> None:
        if case.host_allocator is HostAllocator.PAGEABLE:
            raise BackendRejected("host memory is pageable")
        if case.device_index.dtype is IndexDtype.INT32 and planted():
            raise BackendRejected("device indices are int32")
        super().validate(case, host, device)


def backends() -> list[Backend]:
    return [ScopedRefusal()]
