"""The case space from the command line and from a file: ``--space space.toml`` (or .json) and ``--set KEY=VALUE``.

A space file lists :class:`~hicache_fuzz.harness.model.space.CaseSpace` fields to change, at the top level or
under a ``[space]`` table; ``--set`` changes one field (lists comma-separated) and wins over the file. Narrowing
a menu narrows its range too unless the range is given (``CaseSpace.narrowed``). Every key and value is
checked: an unknown key or a bad value is a usage error naming the key (exit 2).

The overrides travel as plain JSON (strings for enum members, lists for menus), so parallel shards and
reports carry them unchanged; :func:`apply_space` turns them into a ``CaseSpace``::

    # space.toml: long contexts on a 61-layer MLA model, page sizes a server accepts
    attentions = ["mla"]
    layer_counts = [61]
    page_sizes = [1, 12, 64, 100]
    byte_budget = 33554432
"""

from __future__ import annotations

import argparse
from enum import Enum
from pathlib import Path
from typing import Any

import tomllib

from hicache_fuzz.harness.model.case import (
    Attention,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    KVDtype,
    Scope,
)
from hicache_fuzz.harness.model.exit_codes import UsageError
from hicache_fuzz.harness.model.space import CaseSpace

ENUM_MENUS: dict[str, type[Enum]] = {
    "directions": Direction, "scopes": Scope, "layouts": HostLayout, "attentions": Attention, "dtypes": KVDtype,
    "index_dtypes": IndexDtype, "index_devices": IndexDevice, "host_index_devices": IndexDevice,
    "device_index_devices": IndexDevice, "allocators": HostAllocator,
}
INT_MENUS = {"row_bytes": 1, "heads": 1, "head_dims": 1, "page_sizes": 1, "layer_counts": 1, "page_counts": 0}
INTS = {"max_page_size": 0, "max_layers": 0, "max_pages": 0, "max_tokens": 1, "max_pools": 1, "byte_budget": 1,
        "small_budget": 1, "tail_factor": 1}
RATES = ("invalid_rate", "irregular_rate", "empty_rate", "partial_rate", "big_pool_rate", "small_rate",
         "tail_rate", "honour_rate", "long_rate")
FLAGS = ("schedule",)
SETTABLE = (*ENUM_MENUS, *INT_MENUS, *INTS, *RATES, *FLAGS)
MAX_SPACE_INT = (1 << 63) - 1  # sizes and counts become int64 tensor indices; anything larger is a typo
MAX_SPACE_FILE_BYTES = 1 << 20  # a space file lists a few dozen fields


def _as_list(value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    raise UsageError(f"space key {key!r}: expected a list, got {value!r}")


def _integer(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value, 0)
        except ValueError:
            raise UsageError(f"space key {key!r}: {value!r} is not an integer") from None
    if type(value) is not int or not minimum <= value <= MAX_SPACE_INT:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}... ({len(repr(value))} characters)"
        raise UsageError(f"space key {key!r}: expected an integer from {minimum} to {MAX_SPACE_INT} (int64), "
                         f"got {shown}")
    return value


def normalize(key: str, value: Any) -> Any:
    """One override checked and turned into its plain JSON form; UsageError names the key."""
    if key not in SETTABLE:
        raise UsageError(f"space key {key!r} is unknown; known keys: {', '.join(sorted(SETTABLE))}")
    if key in ENUM_MENUS:
        kind = ENUM_MENUS[key]
        members = [str(m.value) for m in kind]
        items = [str(v) for v in _as_list(value, key)]
        bad = [v for v in items if v not in members]
        if bad or not items:
            raise UsageError(f"space key {key!r}: {bad or 'an empty list'} not among {', '.join(members)}")
        return items
    if key in INT_MENUS:
        numbers = [_integer(v, key, INT_MENUS[key]) for v in _as_list(value, key)]
        if not numbers:
            raise UsageError(f"space key {key!r}: the menu is empty")
        return numbers
    if key in INTS:
        return _integer(value, key, INTS[key])
    if key in RATES:
        try:
            rate = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"space key {key!r}: {value!r} is not a number") from None
        if isinstance(value, bool) or not 0.0 <= rate <= 1.0:
            raise UsageError(f"space key {key!r}: expected a share in [0, 1], got {value!r}")
        return rate
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise UsageError(f"space key {key!r}: expected true or false, got {value!r}")


def normalize_all(overrides: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(overrides, dict):
        raise UsageError(f"{where}: expected a table of CaseSpace fields")
    return {key: normalize(key, value) for key, value in overrides.items()}


def load_space_file(path: Path) -> dict[str, Any]:
    """A space file (TOML, or JSON by its .json suffix) -> plain overrides. Read through the strict input loader
    (harness/model/json_input.py): regular files only (a FIFO is refused, never waited on), bounded size, and
    for JSON no duplicate keys, NaN or over-long numbers (TOML refuses duplicate keys itself)."""
    from hicache_fuzz.harness.model.json_input import InputError, parse_json, read_text_file

    try:
        text = read_text_file(path, MAX_SPACE_FILE_BYTES)
        data = parse_json(text, str(path)) if path.suffix == ".json" else tomllib.loads(text)
    except InputError as exc:
        raise UsageError(f"--space {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--space {path}: not valid TOML ({exc})") from None
    if isinstance(data, dict) and set(data) == {"space"}:
        data = data["space"]
    return normalize_all(data, f"--space {path}")


def apply_space(base: CaseSpace, overrides: dict[str, Any]) -> CaseSpace:
    """`base` with the plain overrides applied (menus narrow their ranges, see CaseSpace.narrowed)."""
    typed: dict[str, object] = {}
    for key, value in normalize_all(overrides, "space").items():
        if key in ENUM_MENUS:
            typed[key] = tuple(ENUM_MENUS[key](v) for v in value)
        elif key in INT_MENUS:
            typed[key] = tuple(value)
        else:
            typed[key] = value
    return base.narrowed(**typed) if typed else base


def add_space_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--space", type=Path, metavar="FILE",
                        help="widen or narrow the case space from a TOML (or .json) file of CaseSpace fields "
                             "(see docs/generation.md)")
    parser.add_argument("--set", dest="space_set", action="append", default=[], metavar="KEY=VALUE",
                        help="change one case-space field, lists comma-separated (repeatable; wins over --space), "
                             "e.g. --set page_sizes=1,12,100 --set max_layers=126")


def space_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The plain overrides --space and --set ask for ({} when neither is given)."""
    overrides: dict[str, Any] = {}
    if getattr(args, "space", None) is not None:
        overrides.update(load_space_file(args.space))
    for item in getattr(args, "space_set", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = normalize(key.strip(), value.strip())
    return overrides
