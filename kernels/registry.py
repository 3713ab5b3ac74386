"""Finding backends by name: built-ins, the bug zoo, entry-point plugins and ``--backend-plugin``.

Built-in backends are named here as ``module:attribute`` strings and imported only when asked for, so a
backend whose optional dependency (sglang, a GPU torch) is missing never breaks the others; its import error
becomes the reason it is unavailable.

Third parties add backends without touching this file, in either of two ways:

* an entry point in the group ``hicache_fuzz.backends`` whose object is a Backend subclass, an instance, or a
  callable returning one backend or an iterable of them;
* on the command line, ``--backend-plugin module:callable`` with the same contract.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from hicache_fuzz.kernels.base import Availability, Backend, Plan
from hicache_fuzz.oracles.contract import Platform

ENTRY_POINT_GROUP = "hicache_fuzz.backends"

# name -> "module:attribute" (a Backend subclass). Real-kernel backends are listed in sglang_backends.
BUILTIN: dict[str, str] = {
    "reference": "hicache_fuzz.kernels.reference:ReferenceBackend",
    "sglang-hicache": "hicache_fuzz.kernels.sglang_hicache:SglangHicacheBackend",
}
# Modules that each export BACKENDS: a tuple of Backend subclasses.
BUILTIN_FAMILIES: tuple[str, ...] = (
    "hicache_fuzz.kernels.zoo",
    "hicache_fuzz.kernels.sglang_backends",
)


class UnknownBackend(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class BrokenBackend(Backend):
    """Stands in for a backend whose module failed to import, so `backends` can say why."""

    description = "failed to import"

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def probe(self, platform: Platform) -> Availability:
        return Availability(False, self.reason)

    def plan(self, case: Any, platform: Platform) -> Plan:
        raise RuntimeError(self.reason)

    def run(self, buffers: Any) -> str:
        raise RuntimeError(self.reason)


@dataclass
class Registry:
    backends: dict[str, Backend]

    def get(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends))
            raise UnknownBackend(f"unknown backend {name!r}; known backends: {known}") from None

    def names(self) -> list[str]:
        return sorted(self.backends)

    def unavailable_reason(self, name: str, platform: Platform) -> str:
        """Why backend `name` cannot run on `platform` ("" if it can): what replay and the gate skip on."""
        if name not in self.backends:
            return f"backend {name!r} is not installed here"
        try:
            availability = self.backends[name].probe(platform)
        except Exception as exc:  # a plugin's probe that raises says the backend cannot run here
            return f"backend {name} unavailable: its probe raised {type(exc).__name__}: {exc}"
        return "" if availability.available else f"backend {name} unavailable: {availability.reason}"

    def zoo(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.models_bug]


def _import(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"plugin {spec!r}: expected module:callable")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"plugin {spec!r}: module {module_name} has no attribute {attribute}") from None


def _instances(obj: Any, origin: str) -> list[Backend]:
    if isinstance(obj, type) and issubclass(obj, Backend):
        return [obj()]
    if isinstance(obj, Backend):
        return [obj]
    if callable(obj):
        produced = obj()
        items: Iterable[Any] = produced if isinstance(produced, Iterable) else [produced]
        out = []
        for item in items:
            out.extend(_instances(item, origin) if isinstance(item, type) else [item])
        for item in out:
            if not isinstance(item, Backend):
                raise TypeError(f"{origin}: produced {item!r}, which is not a hicache_fuzz Backend")
        return out
    raise TypeError(f"{origin}: {obj!r} is neither a Backend nor a callable producing backends")


def load_registry(plugins: Iterable[str] = ()) -> Registry:
    """All backends: built-ins, families, installed entry points, then `plugins` (module:callable)."""
    backends: dict[str, Backend] = {}

    def add(items: Iterable[Backend]) -> None:
        for backend in items:
            backends[backend.name] = backend

    for name, spec in BUILTIN.items():
        try:
            add(_instances(_import(spec), spec))
        except Exception as exc:  # an optional dependency is missing: report, don't break
            add([BrokenBackend(name, f"import failed: {exc}")])
    for family in BUILTIN_FAMILIES:
        try:
            module = importlib.import_module(family)
        except ModuleNotFoundError as exc:
            if exc.name == family:
                continue  # family not present in this build
            add([BrokenBackend(family.rsplit(".", 1)[-1], f"import failed: {exc}")])
            continue
        add(cls() for cls in module.BACKENDS)
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            add(_instances(entry_point.load(), f"entry point {entry_point.name}"))
        except Exception as exc:
            add([BrokenBackend(entry_point.name, f"entry point {entry_point.value} failed: {exc}")])
        except (SystemExit, KeyboardInterrupt) as exc:  # an installed plugin must not end the command either
            add([BrokenBackend(entry_point.name, f"entry point {entry_point.value} raised {type(exc).__name__} "
                                                 "while loading")])
    for spec in plugins:
        add(_run_plugin(spec))
    return Registry(backends)


class PluginAborted(RuntimeError):
    """A plugin's import or factory raised SystemExit or KeyboardInterrupt: reported as the plugin's failure
    (exit 3, naming it), never as the command's own exit (a plugin calling sys.exit(0) must not make a run of
    nothing exit 0)."""


def _run_plugin(spec: str) -> list[Backend]:
    """The backends of ``--backend-plugin spec``. Its ordinary exceptions propagate (the caller maps them);
    SystemExit and KeyboardInterrupt at import or factory time become PluginAborted."""
    try:
        return _instances(_import(spec), f"--backend-plugin {spec}")
    except SystemExit as exc:
        raise PluginAborted(f"plugin {spec} called sys.exit({exc.code!r}) while loading") from None
    except KeyboardInterrupt:
        raise PluginAborted(f"plugin {spec} raised KeyboardInterrupt while loading") from None
