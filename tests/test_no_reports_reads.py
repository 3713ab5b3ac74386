"""Nothing in the code or the tests reads the repository's reports/ folder: it holds Markdown written for people,
which may be rewritten or trimmed at any time. Fixtures live in tests/data/, maintained scripts in benchmarks/.

The check reads the source: a string that starts with ``reports/``, or a path built as ``ROOT / "reports"`` or
``Path(...).parents[n] / "reports"`` (an output folder of the same name under a temporary directory is fine)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "reports"
TREES = ("harness", "kernels", "oracles", "tests")


def _is_repository_root(node: ast.expr) -> bool:
    """ROOT / REPO names, or `<path>.parents[n]`."""
    if isinstance(node, ast.Name):
        return node.id in {"ROOT", "REPO", "REPO_ROOT", "REPOSITORY"}
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents"


def reads_of_reports(source: str) -> list[int]:
    """Line numbers where `source` names the repository's reports/ folder in code (not in comments)."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        named = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(FOLDER + "/")
        joined = (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_repository_root(node.left)
                  and isinstance(node.right, ast.Constant) and str(node.right.value).split("/")[0] == FOLDER)
        if named or joined:
            lines.add(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("tree", TREES)
def test_no_code_reads_reports(tree: str) -> None:
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sorted((ROOT / tree).rglob("*.py"))
             for line in reads_of_reports(path.read_text())]
    assert not found, found


def test_the_check_finds_a_read() -> None:
    assert reads_of_reports('x = ROOT / "reports" / "gate.json"\n') == [1]
    assert reads_of_reports('x = Path(__file__).parents[2] / "reports/gate/gate.json"\n') == [1]
    assert reads_of_reports('x = "reports/gpu/report.json"\n') == [1]
    assert reads_of_reports('x = tmp_path / "reports" / worker\n# reports/ in a comment\n') == []
