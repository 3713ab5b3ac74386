"""The one door every output goes through, as json_input.py is the one door for inputs.

Two rules, each here only:

* **Checked before any work starts** (:func:`check_output_file`, :func:`check_output_dir`): a path the tool
  will write (``--json``, ``--markdown``, ``--junit``, ``report --html``, ``--corpus``, ``--out``, ...) that is
  empty, lies under a regular file (or any non-directory), is a device node, a FIFO or a socket, is a directory
  where a file is expected (or a file where a folder is expected), or cannot be written, is bad usage: exit 2
  at once, naming the option. An hour-long campaign never finds out at its end that its report has nowhere to go.
* **A write replaces only a regular file** (:func:`replace_target`, :func:`write_bytes_atomic`): the atomic
  write (temporary file in the same folder, fsync, ``os.replace``) resolves symlinks first and refuses a target
  that exists and is not a regular file, so ``--json /dev/null`` run as root can never replace ``/dev/null``
  (``os.replace`` replaces whatever the path names). A refusal at write time is an OSError, which the callers
  already turn into "written elsewhere" (exit 3), because the path changed after the check.

Only the standard library: every layer (the campaign's corpus writer, JUnit, HTML, the commands) uses it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.json_input import InputError


class OutputPathError(InputError):
    """An output path that cannot take what the command will write: exit 2, naming the option."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _text(value: str | os.PathLike[str] | None, option: str) -> str | None:
    if value is None:
        return None
    text = os.fspath(value)
    if text == "" or text.isspace():
        raise OutputPathError(f"{option}: an empty path (give a file or folder name)")
    if "\0" in text:
        raise OutputPathError(f"{option}: the path contains a NUL byte")
    return text


def _stat(path: str) -> os.stat_result | None:
    """os.stat of `path`, None when nothing is there (or a component on the way is missing or not a folder)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _check_parent(path: str, option: str, shown: str) -> None:
    """The nearest existing ancestor of `path` must be a folder this process can create entries in."""
    parent = os.path.dirname(path) or "."
    while True:
        try:
            info = os.stat(parent)
        except (FileNotFoundError, NotADirectoryError):
            up = os.path.dirname(parent)
            if up == parent:
                raise OutputPathError(f"{option} {shown}: no existing folder above it") from None
            parent = up
            continue
        except OSError as exc:
            raise OutputPathError(f"{option} {shown}: {exc.strerror or exc} ({parent})") from None
        if not stat.S_ISDIR(info.st_mode):
            raise OutputPathError(f"{option} {shown}: lies under {parent}, which is {_kind(info.st_mode)}, "
                                  "not a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputPathError(f"{option} {shown}: the folder {parent} is not writable")
        return


def check_output_file(value: str | os.PathLike[str] | None, option: str) -> Path | None:
    """`value` as a Path if a file can be written there (None stays None); OutputPathError naming `option`
    otherwise. Symlinks are followed: what counts is the file a write would replace."""
    text = _text(value, option)
    if text is None:
        return None
    try:
        real = os.path.realpath(text)
    except OSError as exc:  # a symlink loop
        raise OutputPathError(f"{option} {text}: {exc.strerror or exc}") from None
    try:
        info = _stat(real)
    except OSError as exc:
        raise OutputPathError(f"{option} {text}: {exc.strerror or exc}") from None
    if info is None:
        _check_parent(real, option, text)
        return Path(text)
    if stat.S_ISDIR(info.st_mode):
        raise OutputPathError(f"{option} {text}: a directory, where a file is expected")
    if not stat.S_ISREG(info.st_mode):
        raise OutputPathError(f"{option} {text}: {_kind(info.st_mode)}; only a regular file (or a new path) is "
                              "ever written")
    if not os.access(real, os.W_OK):
        raise OutputPathError(f"{option} {text}: not writable")
    _check_parent(real, option, text)  # the atomic write puts its temporary file beside it
    return Path(text)


def check_output_dir(value: str | os.PathLike[str] | None, option: str) -> Path | None:
    """`value` as a Path if a folder is there (writable) or can be created; OutputPathError naming `option`."""
    text = _text(value, option)
    if text is None:
        return None
    try:
        real = os.path.realpath(text)
        info = _stat(real)
    except OSError as exc:
        raise OutputPathError(f"{option} {text}: {exc.strerror or exc}") from None
    if info is None:
        _check_parent(real, option, text)
        return Path(text)
    if not stat.S_ISDIR(info.st_mode):
        raise OutputPathError(f"{option} {text}: {_kind(info.st_mode)}, where a folder is expected")
    if not os.access(real, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {text}: the folder is not writable")
    return Path(text)


def replace_target(path: Path) -> Path:
    """The path an atomic write may replace for `path`: symlinks resolved, and only a regular file or nothing
    there. OSError (EEXIST) for anything else, so a device node, FIFO or socket is never replaced."""
    real = Path(os.path.realpath(path))
    try:
        info = os.lstat(real)
    except FileNotFoundError:
        return real
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EEXIST, f"{_kind(info.st_mode)} is there; only a regular file is ever replaced",
                      str(path))
    return real


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` (mode 0644) so that a reader or a crash never sees half a file: a temporary file in
    the same folder, fsync, then ``os.replace`` onto a regular file or a new path only (:func:`replace_target`)."""
    target = replace_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=target.suffix or ".out")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; reports and reproducers are for everyone to read
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        replace_target(target)  # again: the path may have changed while the data was written
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as indented, key-sorted JSON, written as :func:`write_bytes_atomic` writes (every report, corpus
    entry and mutant record of this tool goes through here)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
