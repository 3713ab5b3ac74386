"""Any sglang, not only 0.5.23: the probe names the sglang under test and refuses one that lacks a hook.

A small fake ``sglang`` package is written to a temporary folder (no real sglang, no GPU): a complete one is
available and reported with its version (and git commit when imported from a checkout); one whose HiCache
module lacks a factory the harness spies on, or a rule constant it reads, makes the sglang backends
unavailable with the missing name in the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.sglang_jit import SglangJitBackend
from hicache_fuzz.oracles.contract import Platform

CUDA = Platform("cuda", (9, 0))

HICACHE_SOURCE = '''
_is_hip = False
GROUP_BYTES = (16, 8, 4)
DEFAULT_BLOCK_QUOTA = 2
TMA_BLOCK_QUOTA = 4
TMA_STAGE_BYTES = 32 * 1024


def _factory(**kwargs):
    raise RuntimeError("fake sglang: no kernels")


_jit_hicache_module = _jit_hicache_tma_module = _jit_hicache_staged_module = _factory
_jit_hicache_page_unified_module = _jit_page_unified_write_back = _factory


def use_hicache_tma_kernel(**kwargs):
    return False
'''


def _write_fake_sglang(root: Path, drop: str | None = None, version: str | None = "0.6.0") -> Path:
    """A fake sglang package under `root` (its HiCache module without the line defining `drop`)."""
    package = root / "sglang"
    hicache = package / "kernels" / "ops" / "kvcache"
    hicache.mkdir(parents=True)
    for folder in (package, package / "kernels", package / "kernels" / "ops", hicache):
        (folder / "__init__.py").write_text("")
    source = HICACHE_SOURCE
    if drop is not None:
        source = source.replace(f"{drop} = ", f"renamed{drop} = ").replace(f"def {drop}(", f"def renamed{drop}(")
        source = source.replace(f"= {drop} =", f"= renamed{drop} =").replace(f" = {drop}\n", f" = renamed{drop}\n")
    (hicache / "hicache.py").write_text(source)
    if version is not None:
        info = root / f"sglang-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return package


def _sglang_modules() -> list[str]:
    return [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]


@pytest.fixture
def fake_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A pretended GPU, a fresh import state; the fake sglang modules are dropped again afterwards."""
    monkeypatch.setattr(common, "gpu_reason", lambda platform: None)
    monkeypatch.setattr(common, "_hicache", None)
    monkeypatch.setattr(common, "_import_error", None)
    for name in _sglang_modules():
        monkeypatch.delitem(sys.modules, name)
    yield monkeypatch
    for name in _sglang_modules():
        del sys.modules[name]


def _use(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.syspath_prepend(str(root))


def test_a_complete_fake_sglang_is_available_and_named_with_its_version(
        fake_machine: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_fake_sglang(tmp_path)
    _use(fake_machine, tmp_path)
    availability = SglangJitBackend().probe(CUDA)
    assert availability.available, availability.reason
    assert f"sglang 0.6.0 at {tmp_path / 'sglang'}" in availability.reason
    assert "WARNING: harness models 0.5.23" in availability.reason  # another version is allowed, but said


@pytest.mark.parametrize("hook", [*common.REQUIRED_HOOKS])
def test_a_missing_hook_makes_the_backend_unavailable_with_its_name(
        fake_machine: pytest.MonkeyPatch, tmp_path: Path, hook: str) -> None:
    _write_fake_sglang(tmp_path, drop=hook)
    _use(fake_machine, tmp_path)
    availability = SglangJitBackend().probe(CUDA)
    assert not availability.available
    assert f"{common.HICACHE_MODULE}.{hook}" in availability.reason
    assert "sglang 0.6.0" in availability.reason
    missing_others = [h for h in common.REQUIRED_HOOKS if h != hook and f".{h}," in availability.reason + ","]
    assert missing_others == []


def test_the_refusal_sticks_for_the_process(fake_machine: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_fake_sglang(tmp_path, drop="_jit_hicache_staged_module")
    _use(fake_machine, tmp_path)
    with pytest.raises(common.SglangUnavailable, match="_jit_hicache_staged_module"):
        common.hicache()
    with pytest.raises(common.SglangUnavailable, match="_jit_hicache_staged_module"):
        common.hicache()  # no second import that might half-install the spies


def test_a_missing_pool_base_hook_is_refused(fake_machine: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = _write_fake_sglang(tmp_path)
    base = package / "srt" / "mem_cache" / "pool_host"
    base.mkdir(parents=True)
    for folder in (package / "srt", package / "srt" / "mem_cache", base):
        (folder / "__init__.py").write_text("")
    (base / "base.py").write_text("WRITE_BACK_STAGING_PAGE_CHUNK = 64  # renamed\n")
    _use(fake_machine, tmp_path)
    availability = SglangJitBackend().probe(CUDA)
    assert not availability.available
    assert "sglang.srt.mem_cache.pool_host.base._WRITE_BACK_STAGING_PAGE_CHUNK" in availability.reason


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_source_checkout_is_reported_with_its_commit(fake_machine: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checkout = tmp_path / "sglang-checkout"
    python_folder = checkout / "python"
    python_folder.mkdir(parents=True)
    _write_fake_sglang(python_folder, version=None)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fake"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    _use(fake_machine, python_folder)
    availability = SglangJitBackend().probe(CUDA)
    assert availability.available, availability.reason
    assert f"git commit {head[:12]}" in availability.reason
    assert "version unknown" in availability.reason
