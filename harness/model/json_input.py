"""The one door every input file comes through: case files, reproducers, corpus folders, seeds, known-failure
corpora and reports (replay, minimize, fuzz --known, merge, gate).

A fuzzing harness runs unattended, so a stray or hostile file must end in a clear "bad input" (exit 2) that
names the file and the field, never in a traceback, a hang or a write outside the tool's folders:

* only regular files are opened (a FIFO, a device such as /dev/zero or a directory named ``x.json`` is refused
  from ``os.stat`` before any ``open``, and the open itself is non-blocking and re-checked on the descriptor);
* size, nesting depth and number length are bounded *before* ``json.loads`` runs, so it cannot raise
  RecursionError or the interpreter's int-digit ValueError; NaN/Infinity and duplicate keys are refused;
* the bytes must be UTF-8 (the error gives the offset of the first bad byte);
* field helpers are strict: ``True`` is not an integer, ``"false"`` is not a boolean;
* names that become paths (signatures, case ids, pool names) must match :data:`SAFE_NAME` and, joined to
  their root, must resolve inside it (:func:`child_path`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MAX_CASE_FILE_BYTES = 16 << 20  # cases and reproducers: ~1M indices is far beyond any real case
MAX_REPORT_FILE_BYTES = 256 << 20  # campaign reports can list every case id of a long campaign
MAX_DEPTH = 32  # the deepest real file (a report's coverage table) nests 5 levels
MAX_NUMBER_CHARS = 40  # an int64 has 19 digits; floats written by the tool fit in 25 characters

# Names that become one path component: no separator, no NUL, no leading dot (so never "." or ".."), short.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")

_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_NUMBER_RUNS = re.compile(r"[-+0-9.eE]{" + str(MAX_NUMBER_CHARS + 1) + ",}")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class InputError(ValueError):
    """A file or value given to the tool is unusable; the message names the file and the field (exit 2)."""


# ---- files -------------------------------------------------------------------------------------------------

def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file_size(path: Path) -> int:
    """The size of `path` if it is a regular file (symlinks followed); InputError otherwise. Never opens it."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path}: {_kind(info.st_mode)}, not a regular file")
    return info.st_size


def read_text_file(path: Path, max_bytes: int = MAX_CASE_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`, read without ever blocking."""
    size = regular_file_size(path)
    if size > max_bytes:
        raise InputError(f"{path}: {size} bytes, over the {max_bytes}-byte limit for this kind of file")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open still returns at once, and the
        # fstat below refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: {_kind(info.st_mode)}, not a regular file")
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise InputError(f"{path}: over the {max_bytes}-byte limit for this kind of file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None


def read_json_file(path: Path, max_bytes: int = MAX_CASE_FILE_BYTES) -> Any:
    """A regular file's JSON value, with every limit of this module applied."""
    return parse_json(read_text_file(path, max_bytes), str(path))


# ---- JSON text ---------------------------------------------------------------------------------------------

def _refuse_constant(name: str) -> Any:
    raise InputError(f"{name} is not a JSON number")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise InputError(f"key {key!r} appears twice in one object")
        data[key] = value
    return data


def parse_json(text: str, source: str) -> Any:
    """Parse `text` (from `source`, named in errors) after checking depth and number length cheaply."""
    skeleton = _STRINGS.sub('""', text)  # string contents cannot open brackets or hold numbers
    depth = max(itertools.accumulate(_DEPTH_STEP[b] for b in _BRACKETS.findall(skeleton)), default=0)
    if depth > MAX_DEPTH:
        raise InputError(f"{source}: nested {depth} levels deep, over the limit of {MAX_DEPTH}")
    long_number = _NUMBER_RUNS.search(skeleton)
    if long_number:
        raise InputError(f"{source}: a number of {len(long_number.group())} characters, over the limit of "
                         f"{MAX_NUMBER_CHARS}")
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicate_keys)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:  # belt and braces: the checks above should make these impossible
        raise InputError(f"{source}: unparsable JSON ({type(exc).__name__})") from None


# ---- strict fields -----------------------------------------------------------------------------------------

def expect_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected an object, got {_type_name(value)}")
    return value


def expect_keys(data: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise InputError(f"{where}: unknown field(s) {unknown}")


def expect_int(value: Any, where: str) -> int:
    """An integer that is not a bool (``True`` is an int to Python, never to a case file)."""
    if type(value) is not int:
        raise InputError(f"{where}: expected an integer, got {_describe(value)}")
    return value


def expect_bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise InputError(f"{where}: expected true or false, got {_describe(value)}")
    return value


def expect_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: expected a string, got {_describe(value)}")
    return value


def expect_number(value: Any, where: str) -> float:
    if type(value) not in (int, float):
        raise InputError(f"{where}: expected a number, got {_describe(value)}")
    return float(value)


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{_type_name(value)} {text[:60]}{'...' if len(text) > 60 else ''}"


# ---- names that become paths -------------------------------------------------------------------------------

def safe_name(value: Any, where: str) -> str:
    """`value` if it can be one path component everywhere (see SAFE_NAME); InputError otherwise."""
    name = expect_str(value, where)
    if not SAFE_NAME.fullmatch(name):
        raise InputError(f"{where}: {name[:80]!r} is not a safe name (letters, digits, _ . + -, not starting "
                         f"with a dot, at most 128 characters)")
    return name


def child_path(root: Path, *names: str, where: str = "path") -> Path:
    """``root / names...`` after checking each name with safe_name and that the result resolves inside root
    (so neither a name nor a symlink already in the tree can lead a write outside it)."""
    target = root
    for name in names:
        target = target / safe_name(name, where)
    resolved_root = root.resolve()
    resolved = target.resolve()
    if resolved != resolved_root and resolved_root not in resolved.parents:
        raise InputError(f"{where}: {target} resolves to {resolved}, outside {resolved_root}")
    return target
