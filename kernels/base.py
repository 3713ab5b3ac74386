"""The backend interface: one small class per implementation under test.

A backend answers four questions and does one thing:

* ``probe(platform)``: can it run on this machine at all? (and if not, why: shown by ``hicache-fuzz backends``)
* ``unsupported_reason(case, platform)``: is this case outside what it implements? (None if supported)
* ``case_space(space, platform)``: the part of the generator's space worth drawing for this backend.
* ``plan(case, platform)``: which entry point does the case go to, and which implementation path should run?
  The entry point selects the contract (:mod:`hicache_fuzz.oracles.contract`) and thereby the semantics the
  result is checked against; the path is compared with the path reported by ``run`` to flag silent fallbacks.
* ``run(buffers)``: perform the transfer in place on the materialized storages, raise on rejection, and return
  the name of the path that actually ran.

Backends never compare anything; the harness does. See README "Adding a backend" for a worked example.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.compile_books import CompileBooks
from hicache_fuzz.oracles.contract import EntryPoint, Platform


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str  # why not, or what it found (versions, device)


@dataclass(frozen=True)
class Plan:
    entry: EntryPoint  # whose contract and semantics apply
    path: str  # the implementation that should run, e.g. "jit-register", "staged", "reference"


class BackendRejected(Exception):
    """Raised by a backend that refuses its input (the equivalent of a kernel's TORCH_CHECK)."""


class Backend(ABC):
    #: unique name used on the command line and in case files
    name: ClassVar[str]
    #: one line for `hicache-fuzz backends`
    description: ClassVar[str] = ""
    #: for bug-zoo mutants: the bug class it models (empty for real implementations)
    models_bug: ClassVar[str] = ""
    #: true if crashes in this backend can take the process down (run it in a worker process)
    needs_isolation: ClassVar[bool] = False
    #: required coverage buckets ("dimension=bucket", see harness/reporting/coverage.py) this backend cannot reach by
    #: design, with the reason; campaign reports list them instead of a coverage gap
    coverage_exemptions: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: index variants per generated case this backend needs at least where a campaign runs variants
    #: (harness/engine/feed.py): a backend that pays a set-up per geometry (pool objects, pinned buffers)
    #: amortizes it over the variants, which keep the geometry. 0: the campaign's default is enough
    geometry_setup_variants: ClassVar[int] = 0
    #: worker time of one case of this backend, relative to a JIT kernel case (measured, rounded). A GPU campaign
    #: gives such a backend every k-th campaign index instead of every index (harness/engine/feed.py,
    #: ``EngineOptions.backend_every``), so each backend gets a similar share of the workers' time
    relative_case_cost: ClassVar[int] = 1

    @abstractmethod
    def probe(self, platform: Platform) -> Availability: ...

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        """Narrow the generator's menus to what this backend implements (and what is cheap to compile)."""
        return space

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        return None

    def prefetch(self, space: CaseSpace, platform: Platform) -> None:
        """Get ready, in the background, for cases drawn from `space`, whose row_bytes are rows about to join
        this backend's menu (CaseSpace.row_bytes_growth): e.g. start their JIT compiles. Called by the
        campaign one growth stage ahead; must return at once. Default: nothing to prepare."""
        return None

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list[Callable[[], object]]:
        """The module builds cases from `space` need (JIT backends): run up front, in parallel, by the worker's
        warm-up. Default: none."""
        return []

    def compile_books(self) -> CompileBooks | None:
        """The bookkeeping of this backend's JIT builds (kernels/compile_books.py), or None if it builds none."""
        return None

    def coverage_labels(self, case: Case) -> Mapping[str, str | int | bool]:
        """What this case exercises beyond the Case fields, by dimension name, for coverage reports and the dry
        run (``coverage_values[backend][dimension]``): e.g. a pool backend's ``pool_class``, ``io_backend``,
        ``start_layer_nonzero``, ``draft_layer`` and ``operation``. Pure: no GPU, no sglang import. Default:
        nothing beyond the Case fields."""
        return MappingProxyType({})

    def prediction_assumptions(self, platform: Platform) -> tuple[str, ...]:
        """What a prediction for `platform` made on another machine (``fuzz --dry-run``) assumes about this backend
        beyond "available", one sentence each, for the dry run's report. Default: nothing."""
        return ()

    @abstractmethod
    def plan(self, case: Case, platform: Platform) -> Plan: ...

    @abstractmethod
    def run(self, buffers: Materialized) -> str:
        """Perform the transfer described by ``buffers.case``; return the path that ran."""
