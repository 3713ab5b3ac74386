"""Run one case through one backend: materialize -> (oracle || backend) -> compare -> classify.

This is the whole per-case data flow; everything else (campaigns, selftest, replay, workers) calls
:func:`run_case`. It runs in the current process; crash isolation wraps it in a worker process
(:mod:`hicache_fuzz.harness.pipeline.worker`).
"""

from __future__ import annotations

import inspect
import re
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.pipeline.compare import DiffReport, compare_storages, storages_equal
from hicache_fuzz.harness.pipeline.materialize import materialize
from hicache_fuzz.harness.pipeline.reuse import StorageReuse
from hicache_fuzz.kernels.base import Backend, BackendRejected, Plan
from hicache_fuzz.kernels.buffers import GUARD_BYTES, HostMemory, Materialized
from hicache_fuzz.oracles.contract import Platform, Prediction, Verdict, predict
from hicache_fuzz.oracles.sequence import Step, apply_sequence, step_case
from hicache_fuzz.oracles.transfer import Semantics, addressed_destination_bytes


def run_case(case: Case, backend: Backend, platform: Platform, device: torch.device,
             memory: HostMemory | None = None, stage_seconds: dict[str, float] | None = None,
             reuse: StorageReuse | None = None) -> Result:
    """Run `case` on `backend`. With `stage_seconds`, add each stage's wall time to it (keys: predict,
    materialize, backend, oracle, compare, classify) so benchmarks see where a case's time goes. With `reuse`,
    the case may run on the storages of the previous case of its geometry (pipeline/reuse.py); a failure seen
    there is run again on fresh storages, and that run's result is the one reported."""
    started = time.perf_counter()
    clock = _StageClock(stage_seconds, started)
    result, reused = _run(case, backend, platform, device, memory, clock, reuse)
    if reused and result.outcome in RERUN_FRESH:
        assert reuse is not None
        reuse.drop()
        fresh, _ = _run(case, backend, platform, device, memory, clock, None)
        if fresh.outcome in RERUN_FRESH or fresh.outcome is Outcome.CRASH:
            result = fresh
        else:  # only on the reused storages: report it (nothing found is lost), saying what differed
            result.summary = (f"{result.summary} [on storages reused from the previous case of this geometry only; "
                              f"on fresh storages the case was {fresh.outcome.value}]")
    result.seconds = time.perf_counter() - started
    return result


# Outcomes of a case on reused storages that are checked again on fresh ones before they are reported.
RERUN_FRESH = frozenset({Outcome.MISMATCH, Outcome.WRONGLY_ACCEPTED, Outcome.WRONGLY_REJECTED,
                         Outcome.UNEXPECTED_PATH})


class _StageClock:
    def __init__(self, totals: dict[str, float] | None, started: float) -> None:
        self.totals = totals
        self.last = started

    def lap(self, stage: str) -> None:
        if self.totals is None:
            return
        now = time.perf_counter()
        self.totals[stage] = self.totals.get(stage, 0.0) + now - self.last
        self.last = now


def _run(case: Case, backend: Backend, platform: Platform, device: torch.device,
         memory: HostMemory | None, clock: _StageClock, reuse: StorageReuse | None) -> tuple[Result, bool]:
    """The result, and whether the case ran on reused storages."""
    base = Result(case.case_id, backend.name, Outcome.UNSUPPORTED)
    planned = _plan(case, backend, platform, base, clock)
    if planned is None:  # unsupported here, or undefined by the contract: `base` says which, nothing ran
        return base, False
    plan, prediction = planned
    # Everything is compared where the device storages live (the CPU when simulated): "before" is a copy,
    # "after" is the storage itself where it lives there, so only host storages cross to a GPU.
    try:
        buffers, reused = reuse.take(case, device, memory) if reuse is not None else (
            materialize(case, device, memory), False)
    except (MemoryError, RuntimeError) as exc:
        return _not_allocated(base, exc, clock), False
    keep = False  # storages go back to `reuse` only after a case that left the device healthy
    # The "before" copies live for this case only, also when the storages live on for the next one.
    scratch = HostMemory(simulate=buffers.simulated, arena=buffers.memory.arena) if reuse is not None else None
    try:
        try:
            before = buffers.snapshot_on(device, scratch)
        except (MemoryError, RuntimeError) as exc:
            return _not_allocated(base, exc, clock), reused
        clock.lap("materialize")
        raised = _call_backend(backend, buffers, base)
        # A device error raised by the backend, or left pending by it (a launch sglang made with a zero-size
        # grid fails the *next* launch check), is a crash of this case. Non-sticky ones are cleared here and
        # the process goes on; a sticky one raises DeviceContextLost (the worker then exits).
        # (On the CPU platform nothing is a device error: simulated backends raise to reject.)
        pending = device_error_of(raised) if raised is not None and device.type != "cpu" else None
        pending = check_device(device, pending)
        if pending is not None:
            clock.lap("backend")
            return device_crash(case, backend.name, pending), reused
        after = buffers.current_on(device)
        keep = reuse is not None
        clock.lap("backend")
        if raised is not None or prediction.verdict is Verdict.REJECT:
            _judge_rejection(base, raised, prediction, before, after, clock)
            return base, reused
        expected_steps: list[tuple[Step, dict[str, torch.Tensor]]] | None = [] if buffers.step_images else None
        expected = _expected_raw(case, before, prediction.semantics, expected_steps)
        clock.lap("oracle")
        if expected_steps is not None:
            step_failure = _first_step_mismatch(case, expected_steps, buffers.step_images, prediction.semantics)
            if step_failure is not None:
                base.outcome, base.summary, base.diff = step_failure
                clock.lap("compare")
                return base, reused
        report = _whole_storage_diff(case, expected, after, prediction.semantics)
        clock.lap("compare")
    finally:
        if scratch is not None:
            scratch.release()
        if keep and reuse is not None:
            reuse.keep(buffers)
        else:
            buffers.release()
    _classify(base, plan.path, report, clock)
    return base, reused


def _plan(case: Case, backend: Backend, platform: Platform, base: Result,
          clock: _StageClock) -> tuple[Plan, Prediction] | None:
    """The backend's plan for `case` and the contract's prediction, both recorded in `base`; None when the case
    does not run: the backend does not support it here, or the contract leaves it undefined (`base` says which)."""
    reason = backend.unsupported_reason(case, platform)
    if reason is not None:
        base.summary = reason
        clock.lap("classify")
        return None
    plan = backend.plan(case, platform)
    prediction = predict(case, plan.entry, platform)
    base.expected_path, base.prediction = plan.path, prediction.describe()
    clock.lap("predict")
    if prediction.verdict is Verdict.UNDEFINED:
        base.outcome, base.summary = Outcome.UNDEFINED, prediction.describe()
        clock.lap("classify")
        return None
    return plan, prediction


def _call_backend(backend: Backend, buffers: Materialized, base: Result) -> Exception | None:
    """Run `backend` on `buffers`, recording the path it took in `base`. What it raises is its refusal (or its
    failure): data, not a harness error; it is recorded as `base.error` and returned."""
    try:
        base.path = backend.run(buffers)
    except Exception as exc:
        base.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
        base.raised_at = raised_at(exc)
        return exc
    return None


def raised_at(exc: BaseException, frames: int = 4) -> str:
    """The innermost `frames` frames of `exc`'s traceback (file as its folder/name:line function), innermost first:
    whether a refusal came from sglang, from the kernel's Python wrapper or from this harness is the first question
    of its triage. Kept out of the error text, so failure signatures do not depend on line numbers."""
    summary = traceback.extract_tb(exc.__traceback__)[-frames:]
    return " <- ".join(f"{'/'.join(Path(f.filename).parts[-2:])}:{f.lineno} {f.name}" for f in reversed(summary))


def _judge_rejection(base: Result, raised: Exception | None, prediction: Prediction,
                     before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], clock: _StageClock) -> None:
    """Classify a case the backend refused (`raised`: rejected as predicted, or a valid input wrongly rejected;
    either way whether it changed bytes before refusing) or one the contract rejects that ran (wrongly
    accepted). A predicted rejection counts only when the refusal is the backend's: one raised by the harness's
    own checks or code is that check failing (or a harness bug), reported like a valid case that raised."""
    if raised is not None:
        changed = not storages_equal(before, after)
        clock.lap("compare")
        base.diff = {"bytes_changed_before_rejection": changed}
        fault = harness_fault(raised)
        if prediction.verdict is Verdict.REJECT and fault is None:
            base.outcome = Outcome.REJECTED_AS_PREDICTED
            base.summary = f"rejected as predicted ({prediction.describe()})"
        elif prediction.verdict is Verdict.REJECT:
            base.outcome = Outcome.WRONGLY_REJECTED
            base.summary = f"predicted rejection, but {fault}: {base.error}"
        else:
            base.outcome = Outcome.WRONGLY_REJECTED
            base.summary = f"valid input rejected: {base.error}"
    else:
        base.outcome = Outcome.WRONGLY_ACCEPTED
        base.summary = f"accepted input the contract rejects: {'; '.join(prediction.reasons)}"
    clock.lap("classify")


# The folders of the harness's own code: an exception raised there is not the backend refusing. (This file is
# harness/pipeline/runner.py; kernels/base.py and oracles/contract.py sit at their folders' tops.)
_PACKAGE_ROOTS = tuple(str(Path(path).resolve().parent) for path in (
    Path(__file__).parent, inspect.getfile(Backend), inspect.getfile(predict)))
_PROGRAMMING_ERRORS = (AttributeError, NameError, ImportError, KeyError, IndexError, TypeError, ZeroDivisionError)


def harness_fault(exc: BaseException) -> str | None:
    """Why `exc` is not the backend's refusal, or None when it is. The harness's own consistency checks say
    "harness: ..."; its checks of what sglang did raise AssertionError from harness code; a programming error
    raised in harness code is a harness bug. A backend's deliberate refusal (`BackendRejected`) and anything
    raised inside sglang, torch or a plugin is the backend's."""
    if isinstance(exc, BackendRejected):
        return None
    if str(exc).startswith("harness:"):
        return "the harness's own consistency check raised"
    if not isinstance(exc, (AssertionError, *_PROGRAMMING_ERRORS)):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or not _in_harness(frames[-1].filename):
        return None
    if isinstance(exc, AssertionError):
        return "the refusal is a failed check of the harness, not the backend's"
    return "the refusal is an error in the harness's code, not the backend's"


def _in_harness(filename: str) -> bool:
    path = str(Path(filename).resolve())
    return any(path.startswith(root + "/") for root in _PACKAGE_ROOTS)


def _whole_storage_diff(case: Case, expected: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                        semantics: Semantics) -> DiffReport | None:
    """None when every storage equals the oracle's byte for byte, else where they differ. Only a mismatch pays
    for the addressed-byte map and the locator (on CPU copies)."""
    if storages_equal(expected, after):
        return None
    addressed = addressed_destination_bytes(case, semantics)
    return compare_storages(case, _on_cpu(expected), _on_cpu(after), addressed)


def _classify(base: Result, planned_path: str, report: DiffReport | None, clock: _StageClock) -> None:
    """The outcome of a transfer that ran to the end: a mismatch, the planned path not taken, or a pass."""
    if report is not None and not report.equal:
        base.outcome, base.diff, base.summary = Outcome.MISMATCH, report.to_dict(), report.summary()
    elif base.path != planned_path:
        base.outcome = Outcome.UNEXPECTED_PATH
        base.summary = f"expected path {planned_path!r} but {base.path!r} ran (bytes correct)"
    else:
        base.outcome, base.summary = Outcome.PASS, "all storages byte-identical"
    clock.lap("classify")


NOT_RUN = "not run:"  # summary prefix of a case this machine could not run at all (replay counts it skipped)
_ALLOCATION_FAILED = re.compile(r"out of memory|can't allocate|cannot allocate|failed to allocate|cudaHostRegister|"
                                r"hipHostRegister", re.IGNORECASE)


def _not_allocated(base: Result, exc: BaseException, clock: _StageClock) -> Result:
    """The case's storages could not be allocated on this machine: not a finding about the backend (it never
    ran), so the case is UNSUPPORTED here, with the allocator's words; anything else escapes as a harness bug."""
    if not isinstance(exc, MemoryError) and not _ALLOCATION_FAILED.search(str(exc)):
        raise exc
    base.outcome = Outcome.UNSUPPORTED
    base.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
    base.summary = f"{NOT_RUN} this machine could not allocate the case's storages ({base.error[:200]})"
    clock.lap("classify")
    return base


def _expected_raw(case: Case, before: dict[str, torch.Tensor], semantics: Semantics,
                  steps: list[tuple[Step, dict[str, torch.Tensor]]] | None = None) -> dict[str, torch.Tensor]:
    """The oracle applied in place to `before` (raw storages, guards included), which it returns: the
    guards and the source storages stay as they were, so whole raw storages can be compared. A sequence case
    (oracles/sequence.py) applies every transfer of its sequence; with `steps`, a copy of the raw storages
    after each transfer is appended to it."""
    payloads = {k: v[GUARD_BYTES : v.numel() - GUARD_BYTES] for k, v in before.items()}

    def record(step: Step) -> None:
        assert steps is not None
        steps.append((step, {k: v.clone() for k, v in before.items()}))

    apply_sequence(case, payloads, semantics, record if steps is not None else None)
    return before


def _first_step_mismatch(case: Case, expected: list[tuple[Step, dict[str, torch.Tensor]]],
                         recorded: list[tuple[str, dict[str, torch.Tensor]]],
                         semantics: Semantics) -> tuple[Outcome, str, dict[str, object]] | None:
    """The first transfer of a sequence after which the backend's storages differ from the oracle's, as
    (outcome, summary naming the step, diff), or None if every recorded step matches."""
    if len(recorded) != len(expected):
        return (Outcome.MISMATCH, f"the backend recorded {len(recorded)} step images for a sequence of "
                f"{len(expected)} transfers ({', '.join(s.label() for s, _ in expected)})", {})
    for (step, want), (label, got) in zip(expected, recorded, strict=True):
        if storages_equal(want, got):
            continue
        sub = step_case(case, step)
        report = compare_storages(sub, _on_cpu(want), _on_cpu(got), addressed_destination_bytes(sub, semantics))
        if report.equal:
            continue
        diff = report.to_dict()
        diff["failing_step"] = step.label()
        return Outcome.MISMATCH, f"{step.label()} [{label}]: {report.summary()}", diff
    return None


class DeviceContextLost(RuntimeError):
    """A sticky device error: the CUDA/HIP context of this process is unusable (cases must stop here)."""


DEVICE_CRASH_PREFIX = "device error escaped the case: "  # the worker's wording, so signatures stay the same


def device_crash(case: Case, backend_name: str, message: str) -> Result:
    """The CRASH result of a case whose backend raised or left a (non-sticky) device error. Shaped like the
    result of a worker that died of it (no paths, same error text), so its failure signature is the same and
    known-failure entries recorded from worker deaths still match it."""
    result = Result(case.case_id, backend_name, Outcome.CRASH)
    result.error = DEVICE_CRASH_PREFIX + message
    result.summary = f"device error (context recovered, process kept): {message.splitlines()[0]}"
    return result


def is_device_error(exc: BaseException) -> bool:
    """A CUDA/HIP runtime error (torch.AcceleratorError, or a RuntimeError naming one)."""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ == "AcceleratorError" or "CUDA error" in text or "HIP error" in text


def device_error_of(exc: BaseException) -> str | None:
    return f"{type(exc).__name__}: {exc}" if is_device_error(exc) else None


_PROBES: dict[str, torch.Tensor] = {}


def _probe(device: torch.device) -> None:
    """Launch one tiny kernel, then synchronize. torch checks the runtime's last error after every launch
    (cudaGetLastError, which also clears it), so an error a previous launch left pending surfaces and is cleared
    here; a synchronize alone returns such an error without clearing it, so it comes second."""
    probe = _PROBES.get(str(device))
    if probe is None:
        probe = _PROBES[str(device)] = torch.zeros(1, dtype=torch.int32, device=device)
    probe.add_(1)
    torch.cuda.synchronize(device)


def check_device(device: torch.device, pending: str | None = None,
                 probe: Callable[[torch.device], None] | None = None) -> str | None:
    """None if the device is healthy and nothing was pending; the error text if an error was raised or
    pending and the context recovered; raises DeviceContextLost if the context stays broken (sticky error).

    `probe` is injectable so the logic is tested on the CPU platform."""
    if device.type == "cpu" and probe is None:
        return pending
    probe = probe or _probe
    try:
        probe(device)
    except Exception as exc:
        if not is_device_error(exc):
            raise
        pending = pending or f"{type(exc).__name__}: {exc}"
        for attempt in range(PROBE_RETRIES):  # each failed probe clears one pending error; sticky ones stay
            try:
                probe(device)
                break
            except Exception as again:
                if not is_device_error(again):
                    raise
                if attempt == PROBE_RETRIES - 1:
                    raise DeviceContextLost(pending) from again
    return pending


PROBE_RETRIES = 3


def _on_cpu(storages: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in storages.items()}


def explain_crash(result: Result, backend: Backend, case: Case, platform: Platform) -> Result:
    """A worker that died could not report what the case was planned to do: add the planned path and the
    contract's prediction to a crash or hang (what its bug identity is built from). Harmless elsewhere."""
    if result.outcome not in (Outcome.CRASH, Outcome.HANG) or result.prediction:
        return result
    try:
        plan = backend.plan(case, platform)
    except Exception:  # a backend that cannot even plan the case: the crash stays as it was
        return result
    result.expected_path = result.expected_path or plan.path
    result.prediction = predict(case, plan.entry, platform).describe()
    return result
