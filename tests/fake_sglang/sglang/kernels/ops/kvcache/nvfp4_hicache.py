"""Fake: sglang's warm-up of the page_row JIT modules (counts its calls)."""

from __future__ import annotations

BUILDS: list[str] = []


def warmup_page_row_transfer() -> None:
    BUILDS.append("page_row")
