"""The on-disk record of JIT builds sglang refuses (kernels/refused_builds.py): what is kept, how it is keyed,
and that a second process's memo replays the recorded error instead of compiling again."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from hicache_fuzz.kernels import refused_builds
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.refused_builds import RefusedBuilds, is_compile_refusal

REFUSAL = ("Failed to build JIT module hicache in /tmp/x/staging-1\nstdout:\n"
           "hicache.cuh(169): error: static assertion failed with \"no 4/8/16 B package tiles kBytes\"\nstderr:\n")


def fake_sglang(root: Path, kernel_text: str = "template <int N> struct K {};") -> Path:
    """A tree shaped like sglang's: the ops module file (what RefusedBuilds is given) and the kernel sources."""
    ops = root / "sglang" / "kernels" / "ops" / "kvcache"
    ops.mkdir(parents=True)
    (ops / "hicache.py").write_text("# ops\n")
    csrc = root / "sglang" / "kernels" / "jit" / "csrc" / "kvcacheio"
    csrc.mkdir(parents=True)
    (csrc / "hicache.cuh").write_text(kernel_text)
    return ops / "hicache.py"


def records(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def test_only_static_assertion_build_failures_are_refusals() -> None:
    assert is_compile_refusal(RuntimeError(REFUSAL))
    assert is_compile_refusal(RuntimeError("Failed to build JIT module x\nerror: static assertion failed due to "
                                           "requirement 'kBytes % 16 == 0'"))
    assert not is_compile_refusal(RuntimeError("Failed to build JIT module x\n/bin/sh: nvcc: not found"))
    assert not is_compile_refusal(RuntimeError("static assertion failed"))  # not a build failure
    assert not is_compile_refusal(ValueError(REFUSAL))  # not what sglang's build raises


def test_a_refusal_is_recorded_and_replayed_with_its_text(tmp_path: Path) -> None:
    module_file = fake_sglang(tmp_path)
    folder = tmp_path / "cache"
    writer = RefusedBuilds(str(module_file), folder, toolchain=lambda: ["t1"])
    key = ((), (("element_size", 96),))
    assert writer.lookup("_jit_hicache_module", key) is None
    assert writer.record("_jit_hicache_module", key, RuntimeError(REFUSAL))
    reader = RefusedBuilds(str(module_file), folder, toolchain=lambda: ["t1"])  # another process
    replayed = reader.lookup("_jit_hicache_module", key)
    assert type(replayed) is RuntimeError and str(replayed) == REFUSAL
    assert reader.replayed == 1
    assert refused_builds.replayed_here() >= 1  # the process-wide count the worker's greeting reports
    assert reader.lookup("_jit_hicache_module", ((), (("element_size", 128),))) is None  # other arguments
    assert reader.lookup("_jit_hicache_staged_module", key) is None  # another factory


def test_other_failures_are_never_recorded(tmp_path: Path) -> None:
    builds = RefusedBuilds(str(fake_sglang(tmp_path)), tmp_path / "cache", toolchain=lambda: ["t"])
    assert not builds.record("f", (), RuntimeError("Failed to build JIT module x\nninja: timeout"))
    assert not builds.record("f", (), OSError("No space left on device"))
    assert records(tmp_path / "cache") == []


def test_other_sources_or_toolchain_never_meet_the_record(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    original = fake_sglang(tmp_path / "a")
    mutated = fake_sglang(tmp_path / "b", kernel_text="template <int N> struct K { static_assert(N > 1); };")
    RefusedBuilds(str(original), folder, toolchain=lambda: ["t1"]).record("f", (), RuntimeError(REFUSAL))
    assert RefusedBuilds(str(original), folder, toolchain=lambda: ["t1"]).lookup("f", ()) is not None
    assert RefusedBuilds(str(mutated), folder, toolchain=lambda: ["t1"]).lookup("f", ()) is None
    assert RefusedBuilds(str(original), folder, toolchain=lambda: ["t2"]).lookup("f", ()) is None


def test_switched_off_or_unreadable_records_mean_a_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_file = fake_sglang(tmp_path)
    folder = tmp_path / "cache"
    RefusedBuilds(str(module_file), folder, toolchain=lambda: ["t"]).record("f", (), RuntimeError(REFUSAL))
    (record,) = records(folder)
    monkeypatch.setenv(refused_builds.SWITCH_ENV, "off")
    assert RefusedBuilds(str(module_file), folder, toolchain=lambda: ["t"]).lookup("f", ()) is None
    monkeypatch.delenv(refused_builds.SWITCH_ENV)
    record.write_text("{not json")
    assert RefusedBuilds(str(module_file), folder, toolchain=lambda: ["t"]).lookup("f", ()) is None
    record.write_text('{"version": 1, "label": "f", "key": "()", "fingerprint": "other", "message": "x"}')
    assert RefusedBuilds(str(module_file), folder, toolchain=lambda: ["t"]).lookup("f", ()) is None
    assert RefusedBuilds(None, folder).lookup("f", ()) is None  # no sources to key on: off


def test_a_new_process_memo_replays_the_refusal_without_compiling(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(tmp_path / "jit"))
    module_file = fake_sglang(tmp_path)
    builds = {"count": 0}

    class Module:
        def launch_one(self) -> str:
            return "ran"

    def _jit_hicache_module(**kw: object) -> Module:
        builds["count"] += 1
        if kw["element_size"] == 96:
            raise RuntimeError(REFUSAL)
        return Module()

    def fresh_module() -> types.ModuleType:  # what each worker process's import of sglang gives
        module = types.ModuleType("fake_hicache_refused")
        module.__file__ = str(module_file)
        module._jit_hicache_module = _jit_hicache_module  # type: ignore[attr-defined]
        module.use_hicache_tma_kernel = lambda **kw: False  # type: ignore[attr-defined]
        common._install_jit_spies(module)
        return module

    first = fresh_module()
    with pytest.raises(RuntimeError, match="static assertion failed"):
        first._jit_hicache_module(element_size=96, unroll=1, block_quota=2)
    assert builds["count"] == 1
    assert len(records(tmp_path / "jit" / refused_builds.FOLDER)) == 1
    second = fresh_module()
    with pytest.raises(RuntimeError) as raised:
        second._jit_hicache_module(element_size=96, unroll=1, block_quota=2)
    assert str(raised.value) == REFUSAL and builds["count"] == 1  # the record answered: no second build
    second._jit_hicache_module(element_size=128, unroll=1, block_quota=2).launch_one()
    assert builds["count"] == 2  # modules that build still build (and load from sglang's own cache)
