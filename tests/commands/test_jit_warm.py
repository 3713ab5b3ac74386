"""`hicache-fuzz jit-warm`: the menus plus every growth stage are built; a machine with no JIT backend exits 3
with the reason."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from hicache_fuzz.harness.commands.jit_warm import grown_menus
from hicache_fuzz.harness.engine.campaign_case import backend_space
from hicache_fuzz.harness.model.exit_codes import EXIT_UNAVAILABLE
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.registry import load_registry

H200 = Platform("cuda", (9, 0))


def test_the_grown_menus_hold_every_growth_row_and_keep_the_rest() -> None:
    for name in ("sglang-jit", "sglang-pool", "sglang-staged", "sglang-page-unified"):
        space = backend_space(load_registry().get(name), CaseSpace(), H200)
        assert space.row_bytes_growth, name
        grown = grown_menus(space)
        assert set(grown.row_bytes) == set(space.row_bytes) | set(space.row_bytes_growth)
        assert grown.row_bytes_growth == () and grown.grow_every == 0
        assert grown.head_dims == space.head_dims and grown.page_sizes == space.page_sizes
        # what a campaign can draw at its last growth stage is on the grown menu
        last = space.at_index(10**9)
        assert set(last.row_bytes) <= set(grown.row_bytes)


def test_jit_warm_builds_the_jobs_of_the_grown_menus(monkeypatch: Any) -> None:
    """The command hands each backend its grown space (a stand-in backend records what it was asked)."""
    from hicache_fuzz.harness.commands import jit_warm
    from hicache_fuzz.kernels import compile_books

    registry = load_registry()
    backend = registry.get("sglang-jit")
    asked: list[CaseSpace] = []
    ran: list[int] = []
    monkeypatch.setattr(type(backend), "compile_jobs", lambda self, space, platform: asked.append(space) or [
        lambda: None, lambda: None])
    monkeypatch.setattr(compile_books, "run_jobs", lambda jobs, workers=None: ran.append(len(jobs)) or 0.5)
    monkeypatch.setattr("hicache_fuzz.harness.pipeline.setup.available_backend", lambda reg, name, machine: backend)
    import argparse

    args = argparse.Namespace(platform="cpu", backend_plugin=[], backend=["sglang-jit"], jobs=None, seed=None)
    assert jit_warm.run(args) == 0
    assert ran == [2] and len(asked) == 1 and asked[0].row_bytes_growth == ()
    assert set(backend_space(backend, CaseSpace(), Platform("cpu")).row_bytes_growth) <= set(asked[0].row_bytes)


def test_jit_warm_without_a_gpu_exits_3_naming_why() -> None:
    done = subprocess.run([sys.executable, "-m", "hicache_fuzz", "jit-warm", "--platform", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_UNAVAILABLE
    assert "nothing to build" in done.stderr + done.stdout
