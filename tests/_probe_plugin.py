"""Test-only backends for tests/pipeline/test_probe_cache.py: probes that count themselves, one that imports a
marker module (standing for sglang's import) and one whose answer an environment variable decides."""

from __future__ import annotations

import os

from hicache_fuzz.kernels.base import Availability
from hicache_fuzz.kernels.reference import ReferenceBackend

CALLS: dict[str, int] = {}  # backend name -> probes run in this process


class CountingBackend(ReferenceBackend):
    name = "test-probe-count"

    def probe(self, platform):  # type: ignore[no-untyped-def]
        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        return Availability(True, "counted")


class OtherCountingBackend(CountingBackend):
    name = "test-probe-other"


class GatedBackend(ReferenceBackend):
    """Available unless TEST_PROBE_CLOSED is set; its probe imports _probe_marker, which writes its pid."""

    name = "test-probe-gated"
    needs_isolation = True

    def probe(self, platform):  # type: ignore[no-untyped-def]
        import _probe_marker  # noqa: F401 - the import a real probe pays (sglang's)

        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        if os.environ.get("TEST_PROBE_CLOSED"):
            return Availability(False, "gate closed")
        return Availability(True, "gate open")


def backends():  # type: ignore[no-untyped-def]
    return [CountingBackend(), OtherCountingBackend(), GatedBackend()]
