"""Classify: the closed set of outcomes and the result record every run produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Outcome(str, Enum):
    PASS = "pass"  # predicted valid, returned, every byte as the oracle says
    REJECTED_AS_PREDICTED = "rejected_as_predicted"  # predicted invalid and refused ("clean rejection")
    MISMATCH = "mismatch"  # predicted valid, returned, bytes differ
    WRONGLY_ACCEPTED = "wrongly_accepted"  # predicted invalid, returned anyway
    WRONGLY_REJECTED = "wrongly_rejected"  # predicted valid, raised
    UNEXPECTED_PATH = "unexpected_path"  # right bytes, but a different implementation ran (silent fallback)
    CRASH = "crash"  # the worker process died (signal, abort, illegal address)
    HANG = "hang"  # the worker did not finish within the timeout
    UNSUPPORTED = "unsupported"  # the backend does not implement this kind of case (not a finding)
    UNDEFINED = "undefined"  # the contract leaves the behaviour undefined; not run (not a finding)

    @property
    def is_failure(self) -> bool:
        return self in FAILURES


FAILURES = frozenset({
    Outcome.MISMATCH, Outcome.WRONGLY_ACCEPTED, Outcome.WRONGLY_REJECTED, Outcome.UNEXPECTED_PATH,
    Outcome.CRASH, Outcome.HANG,
})

# A lost case's diff keys (pipeline/worker.py): what the case did when run once more in a fresh worker, and
# the cases (dicts, oldest first) its worker had run just before it.
FRESH_WORKER_KEY = "fresh_worker_outcome"
HISTORY_KEY = "worker_history"


@dataclass
class Result:
    case_id: str
    backend: str
    outcome: Outcome
    expected_path: str = ""
    path: str = ""  # the implementation that actually ran ("" if it did not return)
    prediction: str = ""  # the contract's verdict and reasons
    error: str = ""  # exception type and message, or how the worker died
    diff: dict[str, Any] = field(default_factory=dict)
    summary: str = ""  # one human line: what went wrong where
    seconds: float = 0.0
    raised_at: str = ""  # innermost frames of what the backend raised (file:line function), for triage only

    @property
    def flaky(self) -> bool:
        """A crash or hang of a worker that did not come back when the case ran again in a fresh worker: order-
        or state-dependent (an earlier case of that worker corrupted it), so not a finding against the case."""
        again = self.diff.get(FRESH_WORKER_KEY)
        if self.outcome not in (Outcome.CRASH, Outcome.HANG) or not isinstance(again, str):
            return False
        try:
            return not Outcome(again).is_failure
        except ValueError:  # a value this version does not know: not shown to be clean
            return False

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "backend": self.backend,
            "outcome": self.outcome.value,
            "expected_path": self.expected_path,
            "path": self.path,
            "prediction": self.prediction,
            "error": self.error,
            "diff": self.diff,
            "summary": self.summary,
            "seconds": round(self.seconds, 6),
            "raised_at": self.raised_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        return cls(
            case_id=data["case_id"], backend=data["backend"], outcome=Outcome(data["outcome"]),
            expected_path=data.get("expected_path", ""), path=data.get("path", ""),
            prediction=data.get("prediction", ""), error=data.get("error", ""), diff=data.get("diff", {}),
            summary=data.get("summary", ""), seconds=float(data.get("seconds", 0.0)),
            raised_at=data.get("raised_at", ""),
        )
