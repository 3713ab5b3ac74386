"""The pytest11 plugin (harness/commands/pytest_plugin.py), loaded with ``-p hicache_fuzz`` into a separate pytest run
(pytester): its options in --help, fixtures and markers in a tiny test file, the corpus replay items
(expect:fail as strict xfail) and the campaign item."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["pytester"]

CASE: dict[str, Any] = {
    "schema": 1, "direction": "load_back", "scope": "all_layers", "layout": "layer_first",
    "pools": [{"name": "kv", "attention": "mha", "dtype": "bf16", "heads": 2, "head_dim": 64}],
    "layers": 2, "page_size": 2, "device_rows": 8, "host_slots": 8,
    "host_indices": [4, 5, 0, 1], "device_indices": [2, 3, 6, 7],
    "host_index": {"dtype": "int64", "device": "device"}, "device_index": {"dtype": "int64", "device": "device"},
    "backend": "reference", "seed": 3,
}
OPTIONS = ("--hicache-fuzz-seconds", "--hicache-fuzz-corpus", "--hicache-fuzz-backend", "--hicache-fuzz-platform",
           "--hicache-fuzz-seed")


def test_help_lists_the_options_without_importing_torch(tmp_path: Path) -> None:
    # A fresh interpreter outside this repository (its conftest imports torch): the plugin must not.
    code = ("import sys, pytest; rc = pytest.main(['-p', 'hicache_fuzz', '--help']); "
            "print('TORCH_IMPORTED' if 'torch' in sys.modules else 'NO_TORCH'); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for option in OPTIONS:
        assert option in done.stdout
    assert "NO_TORCH" in done.stdout


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "hicache_fuzz", "--markers")
    result.stdout.fnmatch_lines(["*hicache_fuzz_gpu:*", "*hicache_fuzz_sglang:*", "*hicache_fuzz_backend(name)*"])


def test_fixtures_and_markers_in_a_test_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=f"""
        import pytest

        CASE = {CASE!r}

        def test_reference_is_byte_exact(hicache_case_runner):
            assert hicache_case_runner(CASE).outcome.value == "pass"

        @pytest.mark.hicache_fuzz_backend("zoo-last-page-dropped")
        def test_mutant_is_caught(hicache_case_runner):
            hicache_case_runner(CASE)

        @pytest.mark.hicache_fuzz_gpu
        def test_needs_a_gpu():
            raise AssertionError("must not run on the CPU")

        def test_backend_fixture(hicache_backend, hicache_platform):
            assert hicache_backend("reference").name == "reference"
            assert hicache_platform.platform.kind == "cpu"

        def test_unavailable_backend_skips(hicache_backend):
            hicache_backend("sglang-jit")
            raise AssertionError("must be skipped on the CPU")
    """)
    result = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-platform", "cpu", "-rs")
    result.assert_outcomes(passed=2, failed=1, skipped=2)
    result.stdout.fnmatch_lines(["*zoo-last-page-dropped mismatch on case*", "*reproducer: *.json*"])
    result.stdout.fnmatch_lines(["*needs a CUDA or ROCm GPU*", "*backend sglang-jit unavailable*"])


def _zoo_reproducer(folder: Path) -> Path:
    from hicache_fuzz.harness.findings.reproducer import save_reproducer
    from hicache_fuzz.harness.model.case import Case
    from hicache_fuzz.harness.model.platform import require
    from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
    from hicache_fuzz.kernels.registry import load_registry

    case = Case.from_dict({**CASE, "backend": "zoo-last-page-dropped"})
    result = InProcessExecutor(load_registry(), require("cpu")).run(case)
    assert result.outcome.is_failure
    return save_reproducer(folder, case, result, extra={"expect": "fail"})


def test_corpus_replay_items(pytester: pytest.Pytester) -> None:
    corpus = pytester.mkdir("corpus")
    (corpus / "passes.json").write_text(json.dumps(CASE))
    _zoo_reproducer(corpus / "known")  # a known bug that still reproduces: xfailed
    fixed = {"format": "hicache-fuzz-reproducer", "version": 1, "case": CASE, "expect": "fail",
             "signature": "reference-mismatch-0000000000"}
    (corpus / "fixed.json").write_text(json.dumps(fixed))  # marked known but passes: XPASS(strict) fails
    result = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-corpus", str(corpus),
                                "--hicache-fuzz-platform", "cpu", "-rxXf")
    result.assert_outcomes(passed=1, xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*hicache_fuzz_replay?known/*", "*hicache_fuzz_replay?fixed.json*XPASS(strict)*"])


def test_corpus_replay_different_failure_is_not_xfailed(pytester: pytest.Pytester) -> None:
    corpus = pytester.mkdir("corpus")
    path = _zoo_reproducer(corpus)
    data = json.loads(path.read_text())
    # Recorded: another bug (a crash). The identity is recomputed from what was observed, so that is what changes.
    data["observed"].update(outcome="crash", error="worker died with signal 11", diff={})
    path.write_text(json.dumps(data))
    result = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-corpus", str(corpus),
                                "--hicache-fuzz-platform", "cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*FAIL-OTHER: expected failure zoo-last-page-dropped-crash-*"])


def test_campaign_item(pytester: pytest.Pytester) -> None:
    clean = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-seconds", "1", "--hicache-fuzz-backend",
                               "reference", "--hicache-fuzz-platform", "cpu")
    clean.assert_outcomes(passed=1)
    broken = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-seconds", "1", "--hicache-fuzz-backend",
                                "zoo-last-page-dropped", "--hicache-fuzz-platform", "cpu")
    broken.assert_outcomes(failed=1)
    broken.stdout.fnmatch_lines(["*new failure signature(s)*", "*zoo-last-page-dropped-mismatch-*",
                                 "*reproducer *.json*"])


def test_bad_corpus_path_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-corpus", "no-such-dir")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hicache-fuzz-corpus: no-such-dir: no such file or directory*"])


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "sglang_test_hicache_fuzz.py"


def test_sglang_example_registers_like_sglang_ci_expects() -> None:
    # sglang's run_suite collects registrations by AST (python/sglang/test/ci/ci_register.py): top-level calls
    # with constant arguments, (stage, runner_config) or suite, and a __main__ block that calls something.
    import ast

    tree = ast.parse(EXAMPLE.read_text())
    calls = {node.value.func.id: {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
             for node in tree.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
             and isinstance(node.value.func, ast.Name)}
    assert set(calls["register_cuda_ci"]) == {"est_time", "stage", "runner_config"}
    assert set(calls["register_amd_ci"]) == {"est_time", "suite"}
    main = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert main and any(isinstance(n, ast.Call) for n in ast.walk(main[0]))


def test_sglang_example_cases_are_valid_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import types

    from hicache_fuzz.harness.model.case import Case
    from hicache_fuzz.kernels.registry import load_registry
    from hicache_fuzz.oracles.contract import Platform, Verdict, predict

    stub = types.ModuleType("sglang.test.ci.ci_register")
    stub.register_cuda_ci = stub.register_amd_ci = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    for name in ("sglang", "sglang.test", "sglang.test.ci"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.test.ci.ci_register", stub)
    spec = importlib.util.spec_from_file_location("sglang_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = load_registry()
    kinds = set()
    for name, body in module.CASES.items():
        case = Case.from_dict(body)
        backend = registry.get(case.backend)
        kinds.add(case.backend)
        for platform in (Platform("cuda", (9, 0)), Platform("rocm", (9, 4))):
            assert backend.unsupported_reason(case, platform) is None, (name, platform)
            verdict = predict(case, backend.plan(case, platform).entry, platform)
            assert verdict.verdict is Verdict.ACCEPT, (name, platform, verdict.describe())
    assert len(kinds) == 5


ROOT = Path(__file__).resolve().parents[2]


def _doc_example() -> str:
    text = (ROOT / "docs" / "pytest-plugin.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "hicache_case_runner(" in block
    return block


def test_the_doc_example_runs_verbatim_and_on_the_reference(pytester: pytest.Pytester) -> None:
    """The example names a committed seed that lists several backends: verbatim it skips here (no sglang) with
    the reason, never a CorpusError; on the reference backend the same seed passes; unnamed it is an error."""
    import shutil

    shutil.copytree(ROOT / "corpus" / "seeds", pytester.path / "corpus" / "seeds")
    example = _doc_example()
    seed = example.split('hicache_case_runner("', 1)[1].split('"', 1)[0]
    assert (ROOT / seed).is_file(), f"the doc example names {seed}, which does not exist"
    pytester.makepyfile(test_doc_example=example + f'''

def test_on_the_reference(hicache_case_runner):
    assert hicache_case_runner("{seed}", backend="reference").outcome.value == "pass"


def test_unnamed_backend_is_an_error(hicache_case_runner):
    with pytest.raises(ValueError, match="lists 5 backends"):
        hicache_case_runner("{seed}")
''')
    result = pytester.runpytest("-p", "hicache_fuzz", "--hicache-fuzz-platform", "cpu", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*needs a CUDA or ROCm GPU*"])  # the reason, from the sglang marker
