"""The README's worked backend example runs as a plugin, is clean under the reference contract and, like every
test plugin, imports only the public plugin API (hicache_fuzz.api)."""

from __future__ import annotations

import ast
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


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_example() -> str:
    """The README's backend example: the code block that names docs/examples/torch_index_copy.py."""
    text = README.read_text()
    start = text.index("# docs/examples/torch_index_copy.py")
    return text[start:text.index("```", start)]


def hicache_fuzz_imports(source: str) -> set[str]:
    """Every hicache_fuzz module `source` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "hicache_fuzz"}


def test_readme_example_is_the_example_file_and_imports_only_the_api() -> None:
    example = (EXAMPLES / "torch_index_copy.py").read_text()
    block = _readme_example().split("\n", 1)[1]
    assert block == example[example.index("from __future__"):]  # the file the test above runs
    assert hicache_fuzz_imports(block) == {"hicache_fuzz.api"}


@pytest.mark.parametrize("plugin", ["_cli_plugin.py", "_gate_plugin.py", "_mps_startup_plugin.py",
                                    "_selftest_plugin.py", "_worker_plugin.py", "adversarial/_bad_plugins.py"])
def test_test_plugins_import_only_the_api(plugin: str) -> None:
    source = (Path(__file__).resolve().parents[1] / plugin).read_text()
    assert hicache_fuzz_imports(source) == {"hicache_fuzz.api"}


def test_the_api_exports_what_it_names() -> None:
    import hicache_fuzz.api as api

    assert all(getattr(api, name, None) is not None for name in api.__all__)
    assert {"Backend", "Case", "CaseSpace", "Materialized", "Plan", "Availability", "BackendRejected",
            "EntryPoint", "Platform", "Direction", "Scope", "Attention", "HostLayout"} <= set(api.__all__)


def test_the_import_check_sees_an_internal_import() -> None:
    source = "from hicache_fuzz.api import Case\ndef f():\n    import hicache_fuzz.kernels.base\n"
    assert hicache_fuzz_imports(source) == {"hicache_fuzz.api", "hicache_fuzz.kernels.base"}
