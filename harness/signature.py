"""Failure signatures: what makes two failures "the same bug", for dedup and corpus folders.

A signature is (backend, path, outcome kind, role): the role is the normalized error for rejections and
crashes (numbers and addresses stripped) or the first differing (storage, K/V, layer-relation, region) for
mismatches. The Python stack is deliberately not part of it (ClusterFuzz's lesson: frames of the harness
would merge distinct bugs or split one).
"""

from __future__ import annotations

import hashlib
import re

from hicache_fuzz.harness.outcome import Outcome, Result

_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def normalize_error(error: str) -> str:
    first_line = error.strip().splitlines()[0] if error.strip() else ""
    return _NUMBERS.sub("N", first_line)[:160]


def failure_role(result: Result) -> str:
    if result.outcome is Outcome.MISMATCH:
        storages = result.diff.get("storages", [])
        if not storages:
            return "mismatch"
        first = storages[0]
        location = first.get("location", {})
        component = location.get("component", "?")
        where = "outside" if first.get("outside_addressed") else "inside"
        return f"{first['storage'].split('/')[-1]}:{component}:{first.get('region', '?')}:{where}"
    if result.outcome in (Outcome.WRONGLY_REJECTED, Outcome.CRASH, Outcome.HANG):
        return normalize_error(result.error)
    if result.outcome is Outcome.WRONGLY_ACCEPTED:
        return normalize_error(result.prediction)
    return ""


def signature(result: Result) -> str:
    """A short, filesystem-safe, stable name for the failure's class."""
    key = "|".join((result.backend, result.path or result.expected_path, result.outcome.value, failure_role(result)))
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    safe_backend = re.sub(r"[^A-Za-z0-9_.-]", "_", result.backend)
    return f"{safe_backend}-{result.outcome.value}-{digest}"
