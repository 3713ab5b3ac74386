"""The sglang backends' calls (kernels/sglang_call.py, kernels/sglang_pool_calls.py) are one definition that both
runs and prints.

Run: every such backend's own ``run`` (the calls evaluated on the case's storages) on the CPU, with
the fake sglang (tests/fake_sglang, the contract's semantics in torch) as the module it calls, moves exactly the
bytes the oracle expects. Printed: the standalone scripts of the same cases, which print those calls, pass
against the same fake (tests/campaign/test_standalone.py). So a change to an argument shows in both.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels import sglang_aot, sglang_pool
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Backend, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_call import HOST_INDICES, DeviceLayer, HostLayer, HostTensor, LayerTable, SglangCall
from hicache_fuzz.kernels.sglang_pool_calls import pool_construction
from hicache_fuzz.oracles.contract import Platform
from tests.campaign.test_standalone import SYNTHETIC
from tests.kernels._hicache_helpers import fake_sglang  # noqa: F401  (a fixture)

CUDA = Platform("cuda", (9, 0))
KERNEL_CASES = dict(SYNTHETIC)  # every backend with a standalone script, sglang-pool's pool objects included


class OnTheCpu(Backend):
    """A kernel backend's own run() on CPU storages, the fake sglang the module it calls. The fake has no JIT
    factories to spy on, so no path is recorded: the plan's path is "none" here (the path rules have tests of
    their own); what is checked is the bytes."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name

    def probe(self, platform: Platform) -> Availability:
        return Availability(True, "the fake sglang on the CPU")

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        return None

    def plan(self, case: Case, platform: Platform) -> Plan:
        return Plan(self.inner.plan(case, platform).entry, "none")

    def run(self, buffers: Materialized) -> str:
        self.inner.run(buffers)
        return "none"


@pytest.fixture
def fake_modules(fake_sglang: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # noqa: F811
    fake = importlib.import_module(common.HICACHE_MODULE)
    monkeypatch.setattr(common, "hicache", lambda: fake)
    monkeypatch.setattr(sglang_aot, "aot_status", lambda: (True, "the fake sgl_kernel"))
    monkeypatch.setattr(sglang_pool, "_MODS", None)  # the pool modules are loaded from the fake, and dropped after
    yield


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_each_kernel_backends_own_run_moves_what_the_oracle_expects(name: str, fake_modules: None) -> None:
    case = Case.from_dict(KERNEL_CASES[name])
    backend = OnTheCpu(load_registry().get(case.backend))
    result = run_case(case, backend, CUDA, torch.device("cpu"))
    assert result.outcome in (Outcome.PASS, Outcome.REJECTED_AS_PREDICTED), f"{name}: {result.summary}"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def transfer(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))


def test_a_call_prints_and_runs_the_same_arguments() -> None:
    case = Case.from_dict(KERNEL_CASES["jit-mha-lf-one-load"])
    from hicache_fuzz.harness.pipeline.materialize import materialize

    buffers = materialize(case, torch.device("cpu"))
    spec = case.pools[0]
    host = HostTensor(spec.name, "k", 0)
    call = SglangCall("hicache", "transfer", (DeviceLayer(spec.name, "v", 1, 2), HostLayer(host, 2, True),
                                              HOST_INDICES, None),
                      (("table", LayerTable((DeviceLayer(spec.name, "k", 0, 0), DeviceLayer(spec.name, "k", 0, 1)))),
                       ("size", 7)))
    assert call.source() == "\n".join([
        "hicache.transfer(",
        '    typed(raw, "kv", "device")[1, 2],',
        '    typed(raw, "kv", "host")[0][2],',
        "    host_idx,",
        "    None,",
        '    table=ptrs(typed(raw, "kv", "device")[0, layer] for layer in range(2)),',
        "    size=7,",
        ")",
    ])
    recorder = Recorder()
    call.run(recorder, buffers)
    (args, kwargs), = recorder.calls
    pool = buffers.pools[0]
    assert args[0].data_ptr() == pool.device_layer_typed("v", 2).data_ptr()
    assert args[1].data_ptr() == pool.host_component_typed("k")[2].data_ptr()
    assert args[2] is buffers.host_indices and args[3] is None
    assert kwargs["table"].tolist() == [pool.device_layer("k", 0).data_ptr(), pool.device_layer("k", 1).data_ptr()]
    assert kwargs["size"] == 7


def test_a_pool_constructor_calls_and_prints_the_same_arguments() -> None:
    case = Case.from_dict(KERNEL_CASES["pool-mla-lf-load"])
    made = pool_construction(case, case.pools[0])
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def cls(*args: Any, **kwargs: Any) -> None:
        seen.append((args, kwargs))

    made.host_pool.call(cls, torch.device("cpu"), "INFO")
    made.device_pool.call(cls, torch.device("cpu"))
    (host_args, host_kwargs), (device_args, _) = seen
    assert host_args[0] == "INFO" and device_args[2] is torch.bfloat16 and "cpu" in device_args
    source = "\n".join(made.host_pool.source("host_pool", "INFO", width=60))
    assert all(len(line) <= 60 for line in source.splitlines()[:-1])
    # the printed call, evaluated, passes what the backend passes
    printed: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    namespace = {made.host_pool.cls: lambda *a, **k: printed.append((a, k)), "INFO": "INFO"}
    exec(source, namespace)
    assert printed == [(host_args, host_kwargs)]
