"""benchmarks/mutate/sglang_tests_conftest.py: the adapter that lets sglang's staged HiCache tests (written for the
host-pool constructor before 0.5.23) build 0.5.23's host pools. Checked against stand-in pool classes with
0.5.23's signatures (sglang itself is not importable on the CPU test machine)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ADAPTER = Path(__file__).resolve().parents[2] / "benchmarks" / "mutate" / "sglang_tests_conftest.py"


class _HostPool:
    """0.5.23's leading parameters, then keyword-only geometry (pool_host/mha.py, mla.py)."""

    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu", *, device_capacity_tokens: int, start_layer: int,
                 end_layer: int, **rest: Any) -> None:
        self.seen = dict(buffer_info=buffer_info, ratio=host_to_device_ratio, host_size=host_size,
                         page_size=page_size, layout=layout, pin_memory=pin_memory, device=device,
                         device_capacity_tokens=device_capacity_tokens, start_layer=start_layer,
                         end_layer=end_layer, **rest)


class MHAHost(_HostPool):
    pass


class MLAHost(_HostPool):
    pass


class _DevicePool:
    size, start_layer, end_layer, layer_num, host_capacity_tokens = 128, 0, 1, 2, None
    hicache_write_back_staging = None

    def get_device_pool_infos(self) -> tuple[Any, ...]:
        return (types.SimpleNamespace(buffer_info="INFO"),)


@pytest.fixture
def adapted(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.pool_host"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    mha, mla = (types.ModuleType(f"sglang.srt.mem_cache.pool_host.{n}") for n in ("mha", "mla"))
    mha.MHATokenToKVPoolHost, mla.MLATokenToKVPoolHost = MHAHost, MLAHost  # type: ignore[attr-defined]
    pool_host = sys.modules["sglang.srt.mem_cache.pool_host"]
    pool_host.mha, pool_host.mla = mha, mla  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.pool_host.mha", mha)
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.pool_host.mla", mla)
    originals = MHAHost.__init__, MLAHost.__init__
    spec = importlib.util.spec_from_file_location("hicache_fuzz_sglang_tests_conftest", ADAPTER)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    yield
    MHAHost.__init__, MLAHost.__init__ = originals  # type: ignore[method-assign]


def test_the_old_keyword_builds_a_0523_pool(adapted: None) -> None:
    old_style = dict(host_to_device_ratio=2.0, host_size=0, page_size=16, pin_memory=True, device="cpu")
    mha = MHAHost(device_pool=_DevicePool(), layout="page_first", **old_style)  # type: ignore[call-arg]
    assert mha.seen == dict(buffer_info="INFO", ratio=2.0, host_size=0, page_size=16, layout="page_first",
                            pin_memory=True, device="cpu", device_capacity_tokens=128, start_layer=0, end_layer=1)
    mla = MLAHost(device_pool=_DevicePool(), layout="layer_first", **old_style)  # type: ignore[call-arg]
    assert mla.seen["target_layer_num"] == 2 and mla.seen["buffer_info"] == "INFO"
    # the new form passes through untouched
    new = MHAHost("I", 1.0, 0, 1, "layer_first", device_capacity_tokens=8, start_layer=0, end_layer=0)
    assert new.seen["buffer_info"] == "I" and new.seen["device_capacity_tokens"] == 8
