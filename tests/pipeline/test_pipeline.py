"""materialize -> backend -> compare -> classify, end to end on the CPU, with backends that misbehave on purpose."""

from __future__ import annotations

import torch

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline import runner
from hicache_fuzz.harness.pipeline.materialize import materialize
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels.base import BackendRejected, Plan
from hicache_fuzz.kernels.buffers import GUARD_BYTES
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.oracles.contract import EntryPoint, Platform

CPU = torch.device("cpu")


def mha_case(**changes: object) -> Case:
    base = Case(
        direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
        pools=(PoolSpec(heads=2, head_dim=8, dtype=KVDtype.BF16),), layers=2, page_size=4, device_rows=24,
        host_slots=16, host_indices=(8, 9, 10, 11), device_indices=(4, 5, 6, 7),
    )
    return base.replace(**changes)


class WritesGuard(ReferenceBackend):
    name = "test-writes-guard"

    def run(self, buffers):  # type: ignore[no-untyped-def]
        path = super().run(buffers)
        buffers.pools[0].host.raw[-1] ^= 0xFF  # one byte past the payload
        return path


class FlipsOneByte(ReferenceBackend):
    name = "test-flips-byte"

    def run(self, buffers):  # type: ignore[no-untyped-def]
        path = super().run(buffers)
        pool = buffers.pools[0]
        offset = GUARD_BYTES + (8 * 2 + 1) * 32 + 5  # page_first: token 8, layer 1, byte 5 of K
        pool.host.raw[offset] ^= 0x01
        return path


class AcceptsEverything(ReferenceBackend):
    name = "test-accepts-everything"

    def validate(self, case, host, device):  # type: ignore[no-untyped-def]
        pass

    def expand(self, case, host, device):  # type: ignore[no-untyped-def]
        return host, device


class RejectsEverything(ReferenceBackend):
    name = "test-rejects"

    def run(self, buffers):  # type: ignore[no-untyped-def]
        raise RuntimeError("Destination indices must be a CUDA tensor")


class ReportsOtherPath(ReferenceBackend):
    name = "test-other-path"

    def plan(self, case, platform):  # type: ignore[no-untyped-def]
        return Plan(EntryPoint.REFERENCE, "fast-path")


def test_reference_is_clean_on_generated_cases() -> None:
    outcomes = set()
    for index in range(120):
        case = case_for_index(5, index, CaseSpace(byte_budget=256 << 10))
        result = run_case(case, ReferenceBackend(), Platform(), CPU)
        assert not result.outcome.is_failure, (result.summary, case.to_json())
        outcomes.add(result.outcome)
    assert outcomes == {Outcome.PASS, Outcome.REJECTED_AS_PREDICTED}


def test_materialize_fills_every_byte_with_an_address_tagged_pattern() -> None:
    case = mha_case()
    buffers = materialize(case, CPU)
    host, device = buffers.pools[0].host.raw, buffers.pools[0].device.raw
    # source and destination patterns differ, and rows are distinguishable
    assert not torch.equal(host[:256], device[:256])
    rows = device[GUARD_BYTES:GUARD_BYTES + 32 * 8].view(8, 32)
    assert len({bytes(r.tolist()) for r in rows}) == 8
    again = materialize(case, CPU)
    assert torch.equal(again.pools[0].host.raw, host)


def test_byte_in_guard_is_a_mismatch_outside_the_addressed_rows() -> None:
    result = run_case(mha_case(), WritesGuard(), Platform(), CPU)
    assert result.outcome is Outcome.MISMATCH
    diff = result.diff["storages"][0]
    assert diff["region"] == "guard_after"
    assert diff["outside_addressed"] is True


def test_single_flipped_byte_is_located() -> None:
    result = run_case(mha_case(), FlipsOneByte(), Platform(), CPU)
    assert result.outcome is Outcome.MISMATCH
    diff = result.diff["storages"][0]
    assert diff["differing_bytes"] == 1
    assert diff["location"] == {"component": "k", "layer": 1, "page": 2, "token": 8, "byte": 5}
    assert diff["rows_per_layer"] == {"k/1": 1}
    assert diff["outside_addressed"] is False


def test_contract_violations_classified() -> None:
    bad = mha_case(host_indices=(8, 9, 10, 16))  # host index out of range
    assert run_case(bad, ReferenceBackend(), Platform(), CPU).outcome is Outcome.REJECTED_AS_PREDICTED
    dup = mha_case(host_indices=(8, 9, 10, 8))
    assert run_case(dup, AcceptsEverything(), Platform(), CPU).outcome is Outcome.WRONGLY_ACCEPTED
    result = run_case(mha_case(), RejectsEverything(), Platform(), CPU)
    assert result.outcome is Outcome.WRONGLY_REJECTED
    assert "CUDA tensor" in result.error


def _raised_in(path: str, source: str) -> Exception:
    """The exception `source` raises, with its innermost frame in the file `path`."""
    try:
        exec(compile(source, path, "exec"), {})
    except Exception as exc:
        return exc
    raise AssertionError(f"{source!r} did not raise")


class RaisesFromHarness(ReferenceBackend):
    """Refuses with an exception whose innermost frame is in the harness's own code."""
    name = "test-raises-from-harness"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def run(self, buffers):  # type: ignore[no-untyped-def]
        raise self.exc


def test_a_predicted_rejection_counts_only_when_the_backend_refuses() -> None:
    bad = mha_case(host_indices=(8, 9, 10, 16))
    inside = f"{runner._PACKAGE_ROOTS[1]}/check.py"  # a file in the package's kernels folder
    failed_check = _raised_in(inside, "raise AssertionError('the side pool kept its slots')")
    harness_bug = _raised_in(inside, "None.pool")
    for exc in (failed_check, harness_bug, RuntimeError("harness: the host pool holds 8 bytes")):
        result = run_case(bad, RaisesFromHarness(exc), Platform(), CPU)
        assert result.outcome is Outcome.WRONGLY_REJECTED, exc
        assert "predicted rejection, but" in result.summary
    # the backend's refusals: its own exception type, or anything raised outside the harness (sglang, torch)
    outside = _raised_in("/elsewhere/sglang/check.py", "raise AssertionError('index out of range')")
    for exc in (BackendRejected("host index out of range"), outside, failed_check.__class__("no traceback")):
        result = run_case(bad, RaisesFromHarness(exc), Platform(), CPU)
        assert result.outcome is Outcome.REJECTED_AS_PREDICTED, exc


def test_silent_fallback_is_flagged() -> None:
    result = run_case(mha_case(), ReportsOtherPath(), Platform(), CPU)
    assert result.outcome is Outcome.UNEXPECTED_PATH
    assert "fast-path" in result.summary


def test_every_layout_and_attention_passes_on_the_reference() -> None:
    for layout in HostLayout:
        for attention in Attention:
            heads = 1 if attention is Attention.MLA else 4
            pool = PoolSpec(attention=attention, heads=heads, head_dim=8,
                            v_head_dim=4 if attention is Attention.MHA_ASYM else None,
                            head_groups=2 if layout is HostLayout.PAGE_UNIFIED and heads == 4 else 1)
            try:
                case = mha_case(layout=layout, pools=(pool,))
            except ValueError:
                continue
            for direction in Direction:
                result = run_case(case.replace(direction=direction), ReferenceBackend(), Platform(), CPU)
                assert result.outcome is Outcome.PASS, (layout, attention, direction, result.summary)
