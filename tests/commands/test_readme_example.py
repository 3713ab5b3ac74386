"""The README's worked backend example runs as a plugin and is clean under the reference contract."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hicache_fuzz.harness.commands.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_readme_backend_example_is_a_working_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    report = tmp_path / "r.json"
    code = main(["fuzz", "--platform", "cpu", "--backend-plugin", "torch_index_copy:backends",
                 "--backend", "torch-index-copy", "--seed", "3", "--runs", "150", "--byte-budget", "131072",
                 "--corpus", str(tmp_path / "c"), "--json", str(report), "--no-progress"])
    data = json.loads(report.read_text())
    assert code == 0, data["unique_failures"]
    counts = data["outcomes"]["torch-index-copy"]
    assert counts.get("pass", 0) > 50  # it really moved data, not just rejected
    sys.modules.pop("torch_index_copy", None)
