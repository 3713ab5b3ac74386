"""Fixtures shared by the mutate tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .synthetic import CONTROLLER_TEXT, CUH, CUH_TEXT, PY, PY_TEXT


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A synthetic sglang tree (one .cuh kernel, the dispatch, the controller) for mutant generation and runs."""
    root = tmp_path / "site"
    for rel, text in ((CUH, CUH_TEXT), (PY, PY_TEXT), ("sglang/srt/managers/cache_controller.py", CONTROLLER_TEXT),
                      ("sglang/__init__.py", "")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
