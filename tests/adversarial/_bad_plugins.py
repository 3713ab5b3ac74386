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


def factory_exits() -> list[Backend]:
    """A factory that ends the process (exit 0): the command must not exit 0 having run nothing."""
    import sys

    sys.exit(0)


def factory_interrupts() -> list[Backend]:
    raise KeyboardInterrupt
