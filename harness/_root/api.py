"""The stable surface for backend plugins: import from here, never from the modules behind it.

A third-party backend (README, "Adding a backend"; docs/api.md) needs the backend interface, the case
vocabulary, the generator's space and the materialized storages. Everything here keeps its name and meaning
across releases; the modules it comes from (``hicache_fuzz.harness.*``, ``hicache_fuzz.kernels.*``,
``hicache_fuzz.oracles.*``) are internal and may move, as they have before. A name leaves this module only with a
deprecation period; one that a plugin needs and that is missing here belongs here, not in the plugin's imports.

What each name is:

* :class:`Backend`: the interface (``probe``, ``case_space``, ``unsupported_reason``, ``plan``, ``run``).
  :class:`ReferenceBackend` is the CPU reference, to subclass for a backend that only changes how it runs.
* :class:`Availability` (``probe``'s answer), :class:`Plan` (``plan``'s answer: an :class:`EntryPoint`, whose
  contract and semantics apply, and the path that should run), :class:`BackendRejected` (``run`` refusing its
  input, like a kernel's ``TORCH_CHECK``).
* :class:`Case` and its parts: the enums :class:`Direction`, :class:`Scope`, :class:`Attention`,
  :class:`HostLayout`, :class:`KVDtype`, :class:`IndexDtype`, :class:`IndexDevice`, :class:`HostAllocator` and
  the records :class:`PoolSpec`, :class:`IndexSpec`.
* :class:`CaseSpace`: the generator's space; ``case_space`` narrows it (``space.narrowed(...)``).
* :class:`Materialized`: the storages ``run`` transfers on, in place (:class:`PoolBuffers` per pool).
* :class:`Platform`: the machine a case runs on (kind, device, capability).
* :class:`CompileBooks`: where a backend with compiled kernels records its compile time.
"""

from __future__ import annotations

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Availability, Backend, BackendRejected, Plan
from hicache_fuzz.kernels.buffers import Materialized, PoolBuffers
from hicache_fuzz.kernels.compile_books import CompileBooks
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.oracles.contract import EntryPoint

__all__ = [
    "Attention",
    "Availability",
    "Backend",
    "BackendRejected",
    "Case",
    "CaseSpace",
    "CompileBooks",
    "Direction",
    "EntryPoint",
    "HostAllocator",
    "HostLayout",
    "IndexDevice",
    "IndexDtype",
    "IndexSpec",
    "KVDtype",
    "Materialized",
    "Plan",
    "Platform",
    "PoolBuffers",
    "PoolSpec",
    "ReferenceBackend",
    "Scope",
]
