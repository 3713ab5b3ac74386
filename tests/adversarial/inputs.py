"""Generated malformed inputs for the adversarial suite: each a (name, writer, expected words) triple.

Every input is derived from one valid case (or reproducer) by a single change, so each exercises one check
of the input boundary; ``expected`` lists words the error message must contain (the field or the problem).
"""

from __future__ import annotations

import copy
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.corpus import REPRODUCER_FORMAT, REPRODUCER_VERSION


def valid_case() -> dict[str, Any]:
    return {
        "schema": 1, "direction": "load_back", "scope": "all_layers", "layout": "layer_first",
        "pools": [{"name": "kv", "attention": "mha", "dtype": "bf16", "heads": 1, "head_dim": 8,
                   "v_head_dim": None, "head_groups": 1, "write_back_jit": True}],
        "layers": 2, "page_size": 1, "device_rows": 8, "host_slots": 8, "layer": 0,
        "host_indices": [1, 2], "device_indices": [3, 4],
        "host_index": {"dtype": "int64", "device": "cpu"}, "device_index": {"dtype": "int64", "device": "device"},
        "host_allocator": "pin_memory", "backend": "reference", "tuning": {}, "seed": 7, "note": "",
    }


def valid_reproducer(case: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"format": REPRODUCER_FORMAT, "version": REPRODUCER_VERSION, "signature": "reference-mismatch-0123456789",
            "case": case or valid_case(), "expect": "pass",
            "observed": {"case_id": "x", "backend": "reference", "outcome": "mismatch", "summary": "s"}}


@dataclass(frozen=True)
class BadInput:
    name: str
    write: Callable[[Path], None]  # writes the input at the given path (which ends in .json)
    expected: tuple[str, ...]  # words the error message must contain (besides the file's path)


def _json(data: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(json.dumps(data))
    return write


def _text(text: str | bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
    return write


def _case_with(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    case = valid_case()
    change(case)
    return case


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(case: dict[str, Any]) -> None:
        target = case
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _symlink_loop(path: Path) -> None:
    os.symlink(path.name, path)  # points at itself


def _dangling(path: Path) -> None:
    os.symlink(path.parent / "nowhere" / "x.json", path)


def _dev_zero(path: Path) -> None:
    os.symlink("/dev/zero", path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def _huge_sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(17 << 20)  # a hole: no disk used, over the 16 MiB limit for a case file


TYPE_CHANGES: list[tuple[str, tuple[Any, ...], Any, str]] = [
    # (name, field path, bad value, word expected in the message)
    ("layer-true", ("layer",), True, "case.layer"),
    ("layers-true", ("layers",), True, "case.layers"),
    ("layers-string", ("layers",), "2", "case.layers"),
    ("layers-float", ("layers",), 2.0, "case.layers"),
    ("layers-zero", ("layers",), 0, "case.layers"),
    ("page-size-null", ("page_size",), None, "case.page_size"),
    ("schema-true", ("schema",), True, "case.schema"),
    ("schema-two", ("schema",), 2, "case.schema"),
    ("seed-true", ("seed",), True, "case.seed"),
    ("seed-huge", ("seed",), 1 << 70, "case.seed"),
    ("backend-int", ("backend",), 5, "case.backend"),
    ("backend-slash", ("backend",), "../ref", "case.backend"),
    ("note-list", ("note",), ["x"], "case.note"),
    ("direction-int", ("direction",), 1, "case.direction"),
    ("layout-unknown", ("layout",), "page_last", "case.layout"),
    ("write-back-jit-string", ("pools", 0, "write_back_jit"), "false", "write_back_jit"),
    ("write-back-jit-int", ("pools", 0, "write_back_jit"), 0, "write_back_jit"),
    ("heads-true", ("pools", 0, "heads"), True, "heads"),
    ("head-dim-string", ("pools", 0, "head_dim"), "8", "head_dim"),
    ("pool-name-slash", ("pools", 0, "name"), "kv/../x", "name"),
    ("pool-name-nul", ("pools", 0, "name"), "kv\x00x", "name"),
    ("pool-name-dotdot", ("pools", 0, "name"), "..", "name"),
    ("pool-name-int", ("pools", 0, "name"), 3, "name"),
    ("pool-not-object", ("pools", 0), "kv", "pools[0]"),
    ("pools-object", ("pools",), {"name": "kv"}, "case.pools"),
    ("host-index-unknown-key", ("host_index", "dtpye"), "int32", "host_index"),
    ("device-index-unknown-key", ("device_index", "extra"), 1, "device_index"),
    ("host-index-dtype-bool", ("host_index", "dtype"), True, "host_index.dtype"),
    ("host-index-list", ("host_index",), [], "host_index"),
    ("pool-unknown-key", ("pools", 0, "colour"), "red", "colour"),
    ("top-unknown-key", ("bogus",), 1, "bogus"),
    ("index-bool", ("host_indices", 0), True, "host_indices[0]"),
    ("index-float", ("device_indices", 1), 1.5, "device_indices[1]"),
    ("index-huge", ("host_indices", 0), 1 << 63, "host_indices[0]"),
    ("indices-string", ("host_indices",), "1,2", "host_indices"),
    ("tuning-nested", ("tuning", "unroll"), {"a": 1}, "tuning.unroll"),
    ("page-size-not-dividing", ("page_size",), 3, "host_slots"),
]


def bad_inputs() -> list[BadInput]:
    inputs = [BadInput(f"type:{name}", _json(_case_with(_set(*keys, value=value))), (word,))
              for name, keys, value, word in TYPE_CHANGES]
    too_big = valid_case()
    too_big.update(layers=1 << 10, device_rows=1 << 20, host_slots=1 << 20)
    too_big["pools"][0].update(heads=8, head_dim=128)
    inputs += [
        BadInput("size:case-over-8GiB", _json(too_big), ("limit",)),
        BadInput("missing:pools", _json({k: v for k, v in valid_case().items() if k != "pools"}), ("pools", "missing")),
        BadInput("json:top-level-list", _json([valid_case()]), ("object",)),
        BadInput("json:top-level-number", _text("3"), ("object",)),
        BadInput("json:empty-file", _text(""), ("JSON",)),
        BadInput("json:truncated", _text(json.dumps(valid_case())[:-5]), ("JSON",)),
        BadInput("json:nan", _text(json.dumps(valid_case()).replace('"seed": 7', '"seed": NaN')), ("NaN",)),
        BadInput("json:infinity", _text(json.dumps(valid_case()).replace('"seed": 7', '"seed": -Infinity')),
                 ("Infinity",)),
        BadInput("json:duplicate-key", _text(json.dumps(valid_case())[:-1] + ', "seed": 8}'), ("twice",)),
        BadInput("nesting:10000-lists", _text("[" * 10000 + "]" * 10000), ("nested",)),
        BadInput("nesting:200-objects", _text('{"a": ' * 200 + "1" + "}" * 200), ("nested",)),
        BadInput("nesting:deep-note", _json(_case_with(_set("tuning", value=_deep(100)))), ("nested",)),
        BadInput("number:5000-digit-layers", _text(json.dumps(valid_case()).replace('"layers": 2', '"layers": '
                                                                                   + "9" * 5000)), ("number",)),
        BadInput("number:5000-digit-index",
                 _text(json.dumps(valid_case()).replace("[1, 2]", "[1" + "0" * 5000 + ", 2]")), ("number",)),
        BadInput("number:long-float", _text(json.dumps(valid_case()).replace('"seed": 7', '"seed": 0.' + "1" * 100)),
                 ("number",)),
        BadInput("encoding:latin-1", _text(json.dumps(valid_case()).replace('"note": ""', '"note": "\xe9"')
                                           .encode("latin-1")), ("UTF-8",)),
        BadInput("encoding:utf-16", _text(json.dumps(valid_case()).encode("utf-16")), ("UTF-8",)),
        BadInput("encoding:invalid-bytes", _text(b'{"schema": 1, "note": "\xff\xfe"}'), ("UTF-8",)),
        BadInput("encoding:nul-bytes", _text(b"\x00" * 64), ("JSON",)),
        BadInput("kind:fifo", _fifo, ("FIFO",)),
        BadInput("kind:directory-named-json", _directory, ("directory",)),
        BadInput("kind:symlink-loop", _symlink_loop, ("symbolic links",)),
        BadInput("kind:dangling-symlink", _dangling, ("no such",)),
        BadInput("kind:dev-zero", _dev_zero, ("character device",)),
        BadInput("kind:socket", _socket, ("socket",)),
        BadInput("size:17MiB-file", _huge_sparse, ("limit",)),
    ]
    inputs += _reproducer_inputs()
    return inputs


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def _reproducer_with(**changes: Any) -> dict[str, Any]:
    data = valid_reproducer()
    for key, value in changes.items():
        if value is _DELETE:
            del data[key]
        else:
            data[key] = value
    return data


_DELETE = object()


def _reproducer_inputs() -> list[BadInput]:
    bad_case = copy.deepcopy(valid_case())
    bad_case["layer"] = True
    multi = copy.deepcopy(valid_case())
    del multi["backend"]
    return [
        BadInput("reproducer:signature-absolute", _json(_reproducer_with(signature="/tmp/x/ESCAPED")), ("signature",)),
        BadInput("reproducer:signature-dotdot", _json(_reproducer_with(signature="../../X")), ("signature",)),
        BadInput("reproducer:signature-nul", _json(_reproducer_with(signature="a\x00b")), ("signature",)),
        BadInput("reproducer:signature-int", _json(_reproducer_with(signature=5)), ("signature",)),
        BadInput("reproducer:version-true", _json(_reproducer_with(version=True)), ("version",)),
        BadInput("reproducer:version-2", _json(_reproducer_with(version=2)), ("version",)),
        BadInput("reproducer:expect-maybe", _json(_reproducer_with(expect="maybe")), ("expect",)),
        BadInput("reproducer:expect-bool", _json(_reproducer_with(expect=True)), ("expect",)),
        BadInput("reproducer:no-case", _json(_reproducer_with(case=_DELETE)), ("case",)),
        BadInput("reproducer:case-list", _json(_reproducer_with(case=[])), ("case",)),
        BadInput("reproducer:case-layer-true", _json(_reproducer_with(case=bad_case)), ("case.layer",)),
        BadInput("reproducer:unknown-key", _json(_reproducer_with(extra=1)), ("extra",)),
        BadInput("reproducer:observed-outcome", _json(_reproducer_with(observed={"outcome": "meh"})), ("outcome",)),
        BadInput("reproducer:observed-unknown-key", _json(_reproducer_with(observed={"outcome": "pass", "x": 1})),
                 ("observed",)),
        BadInput("reproducer:observed-list", _json(_reproducer_with(observed=[])), ("observed",)),
        BadInput("backends:empty", _json({**multi, "backends": []}), ("backends",)),
        BadInput("backends:not-strings", _json({**multi, "backends": ["reference", 3]}), ("backends[1]",)),
        BadInput("backends:duplicate", _json({**multi, "backends": ["reference", "reference"]}), ("twice",)),
        BadInput("backends:and-backend", _json({**valid_case(), "backends": ["reference"]}), ("not both",)),
        BadInput("backends:unsafe-name", _json({**multi, "backends": ["../x"]}), ("backends[0]",)),
    ]
