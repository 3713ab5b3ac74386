"""The case mix: what share of a backend's cases are byte-compared transfers, rejections, empty transfers.

A campaign draws case ``i`` as before (:func:`case_for_index`) when no mix is set. With a :class:`Mix`, case ``i``
first picks a target class from ``(seed, i)`` with the mix's weights, then draws candidates ``(seed, i, 0)``,
``(seed, i, 1)``, ... from the backend's space and keeps the first whose class (from the backend's own
``unsupported_reason`` and the contract's prediction) is the target. Candidate 0 is the unmixed case ``i``.
So case ``i`` still depends only on (seed, i, space, mix): shards, resume and replay by index keep working.

Rejection sampling alone is slow where a backend rejects most of its space (the JIT kernels take device
indices of one dtype only: 4 in 5 default draws are rejections). So transfer candidates come from a narrowed
space: :class:`TransferProfile` draws a fixed calibration sample of the backend's space once (seeded by the
backend's name, not the campaign: a pure function of the space), keeps the knob settings (direction, scope,
index placement and dtype per side, host allocator) of the cases the contract accepts, and a transfer
candidate is drawn with one of those settings, picked by (seed, i). Geometry and indices still vary freely.
If no candidate of the target class turns up within ``attempts``, the first candidate of any class with a
positive weight is kept (else candidate 0): the mix is a target, the report shows what was reached.

Classes: ``transfer`` (the contract accepts it and it moves at least one token: the kernel runs and every byte
is compared), ``reject`` (the contract predicts a rejection: the backend must refuse it, and the storages must
be unchanged), ``empty`` (an accepted zero-length transfer), ``undefined`` (not run) and ``unsupported``
(the backend does not implement it; with each backend's space narrowed to what it implements, these are rare).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hicache_fuzz.harness.engine.defaults import DEFAULT_MIX_TEXT
from hicache_fuzz.harness.generation.generate import RandomChooser, case_for_index, draw_case
from hicache_fuzz.harness.model.case import Case, Direction, HostAllocator, IndexDevice, IndexDtype, Scope
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform, Verdict, predict

CLASSES = ("transfer", "reject", "empty", "undefined", "unsupported")


@dataclass(frozen=True)
class Mix:
    weights: tuple[tuple[str, float], ...]
    attempts: int = 16

    @classmethod
    def parse(cls, text: str) -> Mix:
        """'transfer=0.6,reject=0.4' -> a Mix (weights normalized). ValueError names what is wrong."""
        weights: dict[str, float] = {}
        for part in text.split(","):
            name, sep, value = part.strip().partition("=")
            if not sep or name not in CLASSES:
                raise ValueError(f"--mix {text!r}: expected CLASS=WEIGHT,... with CLASS one of {', '.join(CLASSES)}")
            try:
                weight = float(value)
            except ValueError:
                raise ValueError(f"--mix {text!r}: weight of {name} is not a number: {value!r}") from None
            if not math.isfinite(weight) or weight < 0:  # NaN would make every draw fall through the weights
                raise ValueError(f"--mix {text!r}: weight of {name} must be a finite number >= 0, got {value!r}")
            if name in weights:
                raise ValueError(f"--mix {text!r}: {name} is given twice")
            weights[name] = weight
        total = sum(weights.values())
        if total <= 0:
            raise ValueError(f"--mix {text!r}: the weights sum to 0")
        return cls(tuple((name, weight / total) for name, weight in weights.items() if weight > 0))

    def share(self, name: str) -> float:
        return dict(self.weights).get(name, 0.0)

    def target(self, seed: int, index: int) -> str:
        roll = random.Random(f"hicache-fuzz-mix:{seed}:{index}").random()
        for name, weight in self.weights:
            roll -= weight
            if roll < 0:
                return name
        return self.weights[-1][0]

    def to_dict(self) -> dict[str, float]:
        return {name: round(weight, 4) for name, weight in self.weights}


DEFAULT_MIX = Mix.parse(DEFAULT_MIX_TEXT)


def case_class(case: Case, backend: Backend, platform: Platform) -> str:
    """Which mix class `case` belongs to for `backend` (what the runner will do with it)."""
    if backend.unsupported_reason(case, platform) is not None:
        return "unsupported"
    verdict = predict(case, backend.plan(case, platform).entry, platform).verdict
    if verdict is Verdict.UNDEFINED:
        return "undefined"
    if verdict is Verdict.REJECT:
        return "reject"
    return "transfer" if case.host_indices and case.device_indices else "empty"


def candidate(seed: int, index: int, attempt: int, space: CaseSpace) -> Case:
    if attempt == 0:
        return case_for_index(seed, index, space)
    rng = random.Random(f"hicache-fuzz:{seed}:{index}:{attempt}")
    return draw_case(RandomChooser(rng), space.at_index(index))


Knobs = tuple[Direction, Scope, IndexDevice, IndexDevice, IndexDtype, HostAllocator]


def knobs_of(case: Case) -> Knobs:
    return (case.direction, case.scope, case.host_index.device, case.device_index.device, case.host_index.dtype,
            case.host_allocator)


@dataclass(frozen=True)
class TransferProfile:
    """The knob settings under which `backend` accepts cases of its space (see the module docstring)."""

    accepted: tuple[Knobs, ...]

    @classmethod
    def calibrate(cls, backend: Backend, space: CaseSpace, platform: Platform, samples: int = 96) -> TransferProfile:
        found: set[Knobs] = set()
        for number in range(samples):
            rng = random.Random(f"hicache-fuzz-mix-calibration:{backend.name}:{number}")
            case = draw_case(RandomChooser(rng), space.narrowed(invalid_rate=0.0, empty_rate=0.0))
            if case.host_index.dtype is case.device_index.dtype and case_class(case, backend, platform) == "transfer":
                found.add(knobs_of(case))
        return cls(tuple(sorted(found, key=lambda k: tuple(str(v.value) for v in k))))

    def space_for(self, space: CaseSpace, seed: int, index: int) -> CaseSpace:
        if not self.accepted:
            return space
        pick = self.accepted[random.Random(f"hicache-fuzz-mix-knobs:{seed}:{index}").randrange(len(self.accepted))]
        direction, scope, host_device, device_device, dtype, allocator = pick
        return space.narrowed(directions=(direction,), scopes=(scope,), host_index_devices=(host_device,),
                              device_index_devices=(device_device,), index_dtypes=(dtype,), allocators=(allocator,),
                              invalid_rate=0.0, empty_rate=0.0)


def mixed_case(seed: int, index: int, space: CaseSpace, backend: Backend, platform: Platform, mix: Mix,
               profile: TransferProfile | None = None) -> Case:
    """Case `index` of a campaign with `seed` under `mix` (see the module docstring)."""
    target = mix.target(seed, index)
    draw_space = profile.space_for(space, seed, index) if profile is not None and target == "transfer" else space
    fallback: Case | None = None
    first: Case | None = None
    for attempt in range(mix.attempts):
        case = candidate(seed, index, attempt, draw_space)
        first = first or case
        kind = case_class(case, backend, platform)
        if kind == target:
            return case
        if fallback is None and mix.share(kind) > 0:
            fallback = case
    assert first is not None
    return fallback or first
