"""Test-wide settings: Hypothesis profiles, torch threads, and skipping network tests when offline.

Tests marked ``network`` download sglang's wheel and the ISA toolchains (~57 MB, cached afterwards under
``~/.cache/hicache-fuzz``). Offline they are skipped with the reason; whether the machine is online is
decided once per session by one TCP connect to pypi.org with a short timeout. ``HICACHE_FUZZ_OFFLINE=1``
skips them without trying; ``-m "not network"`` deselects them.

Profiles: ``ci`` is derandomized (every run draws the same examples, xdist-safe) and
prints reproduction blobs; ``nightly`` hunts with 10**4 random examples; ``dev`` is the local default.
Choose with HYPOTHESIS_PROFILE; the default is ``ci`` when CI=true, else ``dev``. No profile has a deadline:
first calls compile or warm caches and would be flagged as flaky timing.
"""

from __future__ import annotations

import functools
import os
import socket

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, max_examples=25)
settings.register_profile("dev", deadline=None, print_blob=True, max_examples=25)
settings.register_profile("nightly", deadline=None, print_blob=True, max_examples=10**4)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI", "").lower() == "true" else "dev")
settings.load_profile(PROFILE)

# Test cases are small; on a busy 2-core runner torch's intra-op threads make them ~10x slower, not faster.
torch.set_num_threads(int(os.environ.get("HICACHE_FUZZ_TORCH_THREADS", "1")))
# Tests probe test backends whose answers change within a session: no probe answers kept on disk (the probe
# cache's own tests turn it on, in a folder of their own).
os.environ.setdefault("HICACHE_FUZZ_PROBE_CACHE", "off")
# Nor do their workers come from a standing pool this machine may run (pipeline/standing.py): tests count the
# workers they start. The standing pool's own tests turn it on, with a server of their own in a folder of their own.
os.environ.setdefault("HICACHE_FUZZ_STANDING_WORKERS", "off")


def pytest_report_header(config: pytest.Config) -> str:
    current = settings.get_profile(PROFILE)
    seed = config.getoption("hypothesis_seed", default=None)
    seed_text = (f"--hypothesis-seed={seed}" if seed is not None
                 else "fixed (derandomize)" if current.derandomize else "random per test, printed on failure")
    return (f"hypothesis profile: {PROFILE} (max_examples={current.max_examples}, "
            f"derandomize={current.derandomize}); seed: {seed_text}; torch threads: {torch.get_num_threads()}")


NETWORK_PROBE = ("pypi.org", 443)
NETWORK_PROBE_TIMEOUT_S = 2.0


@functools.lru_cache(maxsize=1)
def offline_reason() -> str:
    """Why network tests cannot run here ("" when they can)."""
    if os.environ.get("HICACHE_FUZZ_OFFLINE", "") not in ("", "0"):
        return "HICACHE_FUZZ_OFFLINE is set"
    try:
        socket.create_connection(NETWORK_PROBE, timeout=NETWORK_PROBE_TIMEOUT_S).close()
    except OSError as error:
        return f"offline: cannot reach {NETWORK_PROBE[0]}:{NETWORK_PROBE[1]} ({error})"
    return ""


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("network") is not None and offline_reason():
        pytest.skip(f"needs the network (downloads sglang's wheel and toolchains, ~57 MB): {offline_reason()}")
