"""Where a known failure applies: platforms, GPU architectures, sglang versions, backends.

A corpus entry marked ``"expect": "fail"`` may carry a ``"scope"`` object; every field is optional and an
absent field means "everywhere". Outside its scope an entry is an ordinary regression case: it is expected to
pass there, and a campaign failure with its identity is a new finding there. docs/identity.md has examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PLATFORMS = ("cpu", "cuda", "rocm")
_SCOPE_KEYS = {"platforms", "archs", "sglang", "backends"}
_VERSION = re.compile(r"^\d+(\.\d+)*")
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")


class ScopeError(ValueError):
    """A scope object that does not follow the format; the message names the field."""


@dataclass(frozen=True)
class Environment:
    """What a scope is matched against: the platform kind, the GPU architecture ("sm90", "gfx942"; "" on the
    CPU) and the installed sglang version ("" when sglang is absent)."""

    platform: str
    arch: str = ""
    sglang_version: str = ""


@dataclass(frozen=True)
class KnownScope:
    platforms: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    sglang: str = ""  # a version range: comma-separated clauses such as ">=0.5.23,<0.6"
    backends: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Any, where: str) -> KnownScope:
        if not isinstance(data, dict):
            raise ScopeError(f"{where}: scope must be an object")
        unknown = sorted(set(data) - _SCOPE_KEYS)
        if unknown:
            raise ScopeError(f"{where}: unknown scope keys {unknown} (allowed: {sorted(_SCOPE_KEYS)})")
        platforms = _strings(data.get("platforms", []), f"{where}.platforms")
        bad = [p for p in platforms if p not in PLATFORMS]
        if bad:
            raise ScopeError(f"{where}.platforms: {bad} not in {list(PLATFORMS)}")
        sglang = data.get("sglang", "")
        if not isinstance(sglang, str):
            raise ScopeError(f"{where}.sglang: must be a string such as \">=0.5.23,<0.6\"")
        if sglang:
            for clause in sglang.split(","):
                if not _CLAUSE.match(clause):
                    raise ScopeError(f"{where}.sglang: clause {clause.strip()!r} is not <op><version>")
        return cls(platforms, _strings(data.get("archs", []), f"{where}.archs"), sglang,
                   _strings(data.get("backends", []), f"{where}.backends"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.platforms:
            out["platforms"] = list(self.platforms)
        if self.archs:
            out["archs"] = list(self.archs)
        if self.sglang:
            out["sglang"] = self.sglang
        if self.backends:
            out["backends"] = list(self.backends)
        return out

    def applies(self, environment: Environment, backend: str) -> bool:
        if self.platforms and environment.platform not in self.platforms:
            return False
        if self.archs and environment.arch not in self.archs:
            return False
        if self.backends and backend not in self.backends:
            return False
        return not self.sglang or version_in_range(environment.sglang_version, self.sglang)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.to_dict().items()]
        return ", ".join(parts) if parts else "everywhere"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ScopeError(f"{where}: must be a list of non-empty strings")
    return tuple(value)


def _version_tuple(version: str) -> tuple[int, ...]:
    match = _VERSION.match(version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def version_in_range(version: str, spec: str) -> bool:
    """True if `version` ("0.5.23", "0.5.23.post1", "0.6.0rc1": the leading numbers count) meets every clause
    of `spec`. An absent version (sglang not installed) is in no range."""
    have = _version_tuple(version)
    if not have:
        return False
    for clause in spec.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            raise ScopeError(f"sglang range clause {clause.strip()!r} is not <op><version>")
        op, bound = match.group(1), _version_tuple(match.group(2))
        width = max(len(have), len(bound))
        a, b = have + (0,) * (width - len(have)), bound + (0,) * (width - len(bound))
        holds = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b}[op]
        if not holds:
            return False
    return True
