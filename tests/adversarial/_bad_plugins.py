"""Backend plugins that fail in each way a third-party plugin can: the factory raises, the probe raises."""

from __future__ import annotations

from hicache_fuzz.api import Availability, Backend, Platform, ReferenceBackend


def factory_raises() -> list[Backend]:
    raise RuntimeError("plugin factory exploded")


class ProbeRaises(ReferenceBackend):
    name = "test-probe-raises"

    def probe(self, platform: Platform) -> Availability:
        raise OSError("probe could not open /dev/kfd")


def probe_raises() -> list[Backend]:
    return [ProbeRaises()]
