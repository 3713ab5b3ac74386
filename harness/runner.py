"""Run one case through one backend: materialize -> (oracle || backend) -> compare -> classify.

This is the whole per-case data flow; everything else (campaigns, selftest, replay, workers) calls
:func:`run_case`. It runs in the current process; crash isolation wraps it in a worker process
(:mod:`hicache_fuzz.harness.worker`).
"""

from __future__ import annotations

import time

import torch

from hicache_fuzz.harness.case import Case
from hicache_fuzz.harness.compare import compare_storages
from hicache_fuzz.harness.materialize import GUARD_BYTES, HostMemory, materialize
from hicache_fuzz.harness.outcome import Outcome, Result
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform, Verdict, predict
from hicache_fuzz.oracles.transfer import addressed_destination_bytes, expected_storages


def run_case(case: Case, backend: Backend, platform: Platform, device: torch.device,
             memory: HostMemory | None = None) -> Result:
    started = time.perf_counter()
    result = _run(case, backend, platform, device, memory)
    result.seconds = time.perf_counter() - started
    return result


def _run(case: Case, backend: Backend, platform: Platform, device: torch.device,
         memory: HostMemory | None) -> Result:
    base = Result(case.case_id, backend.name, Outcome.UNSUPPORTED)
    reason = backend.unsupported_reason(case, platform)
    if reason is not None:
        base.summary = reason
        return base
    plan = backend.plan(case, platform)
    prediction = predict(case, plan.entry, platform)
    base.expected_path, base.prediction = plan.path, prediction.describe()
    if prediction.verdict is Verdict.UNDEFINED:
        base.outcome, base.summary = Outcome.UNDEFINED, prediction.describe()
        return base

    buffers = materialize(case, device, memory)
    try:
        before = buffers.snapshot()
        try:
            base.path = backend.run(buffers)
            if device.type != "cpu":
                torch.cuda.synchronize(device)
            raised = None
        except Exception as exc:  # the backend's refusal (or failure) is data, not a harness error
            raised = exc
            base.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
            if device.type != "cpu":
                torch.cuda.synchronize(device)  # a sticky device error surfaces here and escapes: a crash
        after = buffers.snapshot()
    finally:
        buffers.release()

    if raised is not None:
        changed = any(not torch.equal(before[k], after[k]) for k in before)
        base.diff = {"bytes_changed_before_rejection": changed}
        if prediction.verdict is Verdict.REJECT:
            base.outcome = Outcome.REJECTED_AS_PREDICTED
            base.summary = f"rejected as predicted ({prediction.describe()})"
        else:
            base.outcome = Outcome.WRONGLY_REJECTED
            base.summary = f"valid input rejected: {base.error}"
        return base
    if prediction.verdict is Verdict.REJECT:
        base.outcome = Outcome.WRONGLY_ACCEPTED
        base.summary = f"accepted input the contract rejects: {'; '.join(prediction.reasons)}"
        return base

    expected = _expected_raw(case, before, prediction.semantics)
    addressed = addressed_destination_bytes(case, prediction.semantics)
    report = compare_storages(case, expected, after, addressed)
    if not report.equal:
        base.outcome, base.diff, base.summary = Outcome.MISMATCH, report.to_dict(), report.summary()
    elif base.path != plan.path:
        base.outcome = Outcome.UNEXPECTED_PATH
        base.summary = f"expected path {plan.path!r} but {base.path!r} ran (bytes correct)"
    else:
        base.outcome, base.summary = Outcome.PASS, report.summary()
    return base


def _expected_raw(case: Case, before: dict[str, torch.Tensor], semantics: object) -> dict[str, torch.Tensor]:
    """Oracle over payloads, re-framed with the unchanged guards so whole raw storages can be compared."""
    payloads = {k: v[GUARD_BYTES : v.numel() - GUARD_BYTES] for k, v in before.items()}
    expected_payloads = expected_storages(case, payloads, semantics)  # type: ignore[arg-type]
    out = {}
    for key, raw in before.items():
        framed = raw.clone()
        framed[GUARD_BYTES : raw.numel() - GUARD_BYTES] = expected_payloads[key]
        out[key] = framed
    return out
