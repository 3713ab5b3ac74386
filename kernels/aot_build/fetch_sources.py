"""Download the pinned sglang sources of the AOT kvcacheio ops into an ignored folder (default ``.aot-src/``).

The list, with the sha256 and git blob id of every file, is ``sources.json`` beside this module. Every file is
checked against both before it is written; a mismatch is an error that names the file (exit 1), so a moved
commit, a proxy rewriting line ends or a truncated download never reaches the compiler.

Where the files come from (first match wins):

* ``--from-dir DIR``: a folder laid out like the destination (e.g. a copy carried to an offline machine);
* ``--from-git CHECKOUT``: any local clone of sglang that contains the pinned blobs (``git cat-file``);
* ``--from-wheel WHEEL``: a downloaded sglang-kernel 0.4.10 wheel, for the files it ships (``wheel_member``);
* otherwise GitHub: the file at the pinned commit, or for a file pinned by content only, the blob by its id.

    python -m hicache_fuzz.kernels.aot_build.fetch_sources --dest .aot-src
    python -m hicache_fuzz.kernels.aot_build.fetch_sources --dest .aot-src --check   # verify, download nothing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = Path(__file__).with_name("sources.json")
DEFAULT_DEST = Path(".aot-src")
_HEX = frozenset("0123456789abcdef")


class SourceError(RuntimeError):
    """A pinned file is missing, unreadable or not the pinned content; the message names it."""


@dataclass(frozen=True)
class PinnedFile:
    path: str  # path inside the sglang repository, also the path under the destination folder
    role: str  # "build" (compiled) or "reference" (read by tests only)
    sha256: str
    git_blob: str
    size: int
    commit: str | None
    wheel_member: str | None


def _is_hex(text: Any, length: int) -> bool:
    return isinstance(text, str) and len(text) == length and set(text) <= _HEX


def load_manifest(path: Path = MANIFEST) -> tuple[str, str, list[PinnedFile]]:
    """(repository, commit, files) from the manifest; raises SourceError naming the first malformed entry."""
    data = json.loads(path.read_text(encoding="utf-8"))
    repository, commit = data.get("repository"), data.get("commit")
    if not isinstance(repository, str) or repository.count("/") != 1:
        raise SourceError(f"{path}: 'repository' must be owner/name, got {repository!r}")
    if not _is_hex(commit, 40):
        raise SourceError(f"{path}: 'commit' must be 40 hex digits, got {commit!r}")
    files: list[PinnedFile] = []
    for entry in data.get("files", []):
        name = entry.get("path")
        if not isinstance(name, str) or not name or name.startswith("/") or ".." in Path(name).parts:
            raise SourceError(f"{path}: bad file path {name!r} (must be relative, without '..')")
        if not _is_hex(entry.get("sha256"), 64) or not _is_hex(entry.get("git_blob"), 40):
            raise SourceError(f"{path}: {name}: sha256 must be 64 and git_blob 40 hex digits")
        if entry.get("role") not in ("build", "reference"):
            raise SourceError(f"{path}: {name}: role must be 'build' or 'reference'")
        file_commit = entry.get("commit")
        if file_commit is not None and not _is_hex(file_commit, 40):
            raise SourceError(f"{path}: {name}: commit must be null or 40 hex digits")
        if not isinstance(entry.get("bytes"), int) or entry["bytes"] <= 0:
            raise SourceError(f"{path}: {name}: bytes must be a positive integer")
        files.append(
            PinnedFile(name, entry["role"], entry["sha256"], entry["git_blob"], entry["bytes"], file_commit,
                       entry.get("wheel_member"))
        )
    if not any(f.role == "build" for f in files):
        raise SourceError(f"{path}: no file with role 'build'")
    return repository, commit, files


def git_blob_id(content: bytes) -> str:
    """The id git gives a file with this content (sha1 of 'blob <size>\\0' + content)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content, usedforsecurity=False).hexdigest()


def verify(pinned: PinnedFile, content: bytes) -> None:
    """Raise SourceError unless the content is exactly the pinned file."""
    sha = hashlib.sha256(content).hexdigest()
    blob = git_blob_id(content)
    if sha != pinned.sha256 or blob != pinned.git_blob or len(content) != pinned.size:
        raise SourceError(
            f"{pinned.path}: content differs from the pin (sha256 {sha[:16]}… vs {pinned.sha256[:16]}…, "
            f"git blob {blob[:12]} vs {pinned.git_blob[:12]}, {len(content)} vs {pinned.size} bytes)"
        )


def _from_github(repository: str, pinned: PinnedFile) -> bytes:
    if pinned.commit is not None:
        url = f"https://raw.githubusercontent.com/{repository}/{pinned.commit}/{pinned.path}"
        request = urllib.request.Request(url)
    else:  # pinned by content only: ask for the blob itself
        url = f"https://api.github.com/repos/{repository}/git/blobs/{pinned.git_blob}"
        request = urllib.request.Request(url, headers={"Accept": "application/vnd.github.raw+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return bytes(response.read())
    except OSError as exc:
        raise SourceError(f"{pinned.path}: download from {url} failed: {exc}") from exc


def _from_git(checkout: Path, pinned: PinnedFile) -> bytes:
    result = subprocess.run(
        ["git", "-C", str(checkout), "cat-file", "blob", pinned.git_blob], capture_output=True, check=False
    )
    if result.returncode != 0:
        raise SourceError(f"{pinned.path}: blob {pinned.git_blob} not in {checkout}: {result.stderr.decode()[:200]}")
    return result.stdout


def _from_wheel(wheel: Path, pinned: PinnedFile) -> bytes | None:
    if pinned.wheel_member is None:
        return None
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(pinned.wheel_member)


def fetch(
    dest: Path,
    *,
    from_dir: Path | None = None,
    from_git: Path | None = None,
    from_wheel: Path | None = None,
    check_only: bool = False,
    manifest: Path = MANIFEST,
) -> list[Path]:
    """Bring every pinned file to ``dest/<path>`` (verified); the written (or checked) paths."""
    repository, _, files = load_manifest(manifest)
    written: list[Path] = []
    for pinned in files:
        target = dest / pinned.path
        if target.is_file():
            verify(pinned, target.read_bytes())  # already there: must still be the pinned content
            written.append(target)
            continue
        if check_only:
            raise SourceError(f"{pinned.path}: missing under {dest} (run without --check to fetch it)")
        content: bytes | None = None
        if from_dir is not None and (from_dir / pinned.path).is_file():
            content = (from_dir / pinned.path).read_bytes()
        elif from_git is not None:
            content = _from_git(from_git, pinned)
        elif from_wheel is not None:
            content = _from_wheel(from_wheel, pinned)
        if content is None:
            content = _from_github(repository, pinned)
        verify(pinned, content)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="ignored folder to fill (default .aot-src)")
    parser.add_argument("--from-dir", type=Path, help="copy from a folder laid out like --dest")
    parser.add_argument("--from-git", type=Path, help="read the pinned blobs from a local sglang clone")
    parser.add_argument("--from-wheel", type=Path, help="read the files it ships from a sglang-kernel 0.4.10 wheel")
    parser.add_argument("--check", action="store_true", help="only verify what is already under --dest")
    args = parser.parse_args(argv)
    try:
        paths = fetch(args.dest, from_dir=args.from_dir, from_git=args.from_git, from_wheel=args.from_wheel,
                      check_only=args.check)
    except SourceError as exc:
        print(f"fetch_sources: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"ok {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
