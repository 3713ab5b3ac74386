"""The import layering of hicache_fuzz (ARCHITECTURE.md): imports only point down, no circles, only the
console entry imports the CLI wiring.

Layers, lowest first: model (vocabulary) <- oracles <- kernels <- pipeline <- generation <- findings <- engine
<- reporting <- campaign <- commands; the plugin
API (hicache_fuzz.api) sits on the kernels layer and nothing in the package imports it. The ISA
check and the mutation tester stand apart: they import nothing of the layers but the exit codes and copy rules, and only
commands import them.
Every import counts, also one inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> dotted package, as pyproject.toml maps them
PACKAGE_DIRS = {"harness/_root": "hicache_fuzz", "harness": "hicache_fuzz.harness", "oracles": "hicache_fuzz.oracles",
                "kernels": "hicache_fuzz.kernels"}
# dotted prefix -> layer rank; the longest matching prefix wins
LAYERS = {
    "hicache_fuzz.harness.model": 0,
    "hicache_fuzz.oracles": 1,
    "hicache_fuzz.kernels": 2,
    "hicache_fuzz.harness.pipeline": 3,
    "hicache_fuzz.harness.generation": 4,
    "hicache_fuzz.harness.findings": 5,
    "hicache_fuzz.harness.engine": 6,
    "hicache_fuzz.harness.reporting": 7,
    "hicache_fuzz.harness.campaign": 8,
    "hicache_fuzz.harness.commands": 9,
    "hicache_fuzz": 9,  # the package root (__main__) sits with the commands
    "hicache_fuzz.api": 2,  # the plugin surface: re-exports of the model, oracles and kernels, nothing above
}
API = "hicache_fuzz.api"
APART = ("hicache_fuzz.harness.isa", "hicache_fuzz.harness.mutate")  # stand-alone tools
# Modules of the lowest layer that the stand-alone tools may import too (standard library only): the exit
# codes, so that every command and tool exits with the same codes, sglang's copy-round rules, so that the
# contract, the sglang backends and the ISA check apply one row-tiling rule, the one progress line, and the one
# atomic write of a JSON file.
SHARED_WITH_TOOLS = {"hicache_fuzz.harness.model.exit_codes", "hicache_fuzz.harness.model.copy_rules",
                     "hicache_fuzz.harness.model.progress", "hicache_fuzz.harness.model.output_paths"}
CLI = "hicache_fuzz.harness.commands.cli"
CLI_IMPORTERS = {"hicache_fuzz.__main__"}


def module_files() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    modules: dict[str, Path] = {}
    for folder, package in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            relative = path.relative_to(base)
            if folder == "harness" and relative.parts[0] == "_root":
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The hicache_fuzz modules `name` imports (resolved to known modules; `from p import m` names m)."""
    known = set(known)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from p import m` depends on module p.m where that is a module, else on p itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("hicache_fuzz"):
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")),
               key=len, default=None)
    return None if best is None else LAYERS[best]


def is_apart(module: str) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in APART)


def layering_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Upward imports, imports into or out of a stand-alone tool, and imports of the CLI wiring."""
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target == CLI and module not in CLI_IMPORTERS:
                problems.append(f"{module} imports the CLI wiring {CLI}")
                continue
            if is_apart(module) and target in SHARED_WITH_TOOLS:
                continue
            if is_apart(module) or is_apart(target):
                same_tool = any(module.startswith(p) and target.startswith(p) for p in APART)
                commands_use_tool = is_apart(target) and layer_of(module) == LAYERS["hicache_fuzz.harness.commands"]
                if not (same_tool or commands_use_tool or module in ("hicache_fuzz.harness",)):
                    problems.append(f"{module} -> {target}: the stand-alone tools and the layers do not mix")
                continue
            source_layer, target_layer = layer_of(module), layer_of(target)
            if source_layer is None or target_layer is None:
                continue  # package __init__ files of the harness folder itself
            if target_layer > source_layer:
                problems.append(f"{module} (layer {source_layer}) imports {target} (layer {target_layer})")
    return problems


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_upward_imports_and_no_cli_imports() -> None:
    assert layering_violations(import_graph()) == []


def test_no_import_cycles() -> None:
    assert import_cycles(import_graph()) == []


def test_the_plugin_api_is_imported_by_no_module_of_the_package() -> None:
    """hicache_fuzz.api is the surface for code outside the package; inside, modules import what they use from
    where it is defined, so the surface can be extended without creating import circles."""
    graph = import_graph()
    assert API in graph and [module for module, targets in graph.items() if API in targets] == []


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in import_graph() if layer_of(m) is None and not is_apart(m)
                and m not in ("hicache_fuzz.harness",)]
    assert unplaced == []


@pytest.mark.parametrize(("graph", "expected"), [
    ({"hicache_fuzz.oracles.contract": {"hicache_fuzz.harness.pipeline.runner"}}, "(layer 3)"),
    ({"hicache_fuzz.harness.campaign.minimize": {CLI}}, "imports the CLI wiring"),
    ({API: {"hicache_fuzz.harness.pipeline.runner"}}, "(layer 3)"),
    ({"hicache_fuzz.harness.engine.feed": {"hicache_fuzz.harness.campaign.loop"}}, "(layer 8)"),
    ({"hicache_fuzz.harness.findings.corpus": {"hicache_fuzz.harness.reporting.merge"}}, "(layer 7)"),
    ({"hicache_fuzz.harness.isa.check": {"hicache_fuzz.harness.model.case"}}, "do not mix"),
    ({"hicache_fuzz.harness.pipeline.runner": {"hicache_fuzz.harness.isa.check"}}, "do not mix"),
    ({"hicache_fuzz.harness.isa.check": {"hicache_fuzz.harness.model.exit_codes",
                                         "hicache_fuzz.harness.model.outcome"}}, "do not mix"),
])
def test_checker_reports_a_violation(graph: dict[str, set[str]], expected: str) -> None:
    problems = layering_violations(graph)
    assert len(problems) == 1 and expected in problems[0]


def test_checker_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_checker_reads_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from hicache_fuzz.harness.commands import cli\n", encoding="utf-8")
    assert imports_of("hicache_fuzz.oracles.m", module, {CLI, "hicache_fuzz.harness.commands"}) == {CLI}
