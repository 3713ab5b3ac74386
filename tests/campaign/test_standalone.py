"""Standalone reproducers (harness/findings/standalone.py): scripts for every sglang backend kind, executed on the CPU
with only torch and the fake sglang (tests/fake_sglang) importable; they must pass against the correct fake
and fail, naming the first differing byte, against the buggy one. The committed corpus scripts must be what
the generator writes now, and the script's fill must equal the harness's byte for byte."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.findings.standalone import (
    StandaloneUnsupported,
    stale_corpus_scripts,
    standalone_path,
    standalone_script,
    supports,
)
from hicache_fuzz.harness.findings.standalone_calls import CALLS
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.pipeline.materialize import materialize

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_sglang"
CORPUS = ROOT / "corpus" / "sglang"


def pool(attention: str = "mha", heads: int = 2, head_dim: int = 64, dtype: str = "bf16", name: str = "kv",
         **extra: Any) -> dict[str, Any]:
    return {"name": name, "attention": attention, "dtype": dtype, "heads": heads, "head_dim": head_dim, **extra}


def case(backend: str, direction: str, scope: str, layout: str, pools: list[dict[str, Any]], host: list[int],
         device: list[int], page_size: int = 1, host_index: str = "device", **extra: Any) -> dict[str, Any]:
    body = {"schema": 1, "backend": backend, "direction": direction, "scope": scope, "layout": layout,
            "pools": pools, "layers": 3, "page_size": page_size, "device_rows": 16, "host_slots": 16,
            "layer": 1, "host_indices": host, "device_indices": device, "seed": 5,
            "host_index": {"dtype": "int64", "device": host_index},
            "device_index": {"dtype": "int64", "device": "device"}}
    body.update(extra)
    return body


# Valid transfers (the contract accepts them on CUDA sm90) covering every backend kind, MHA and MLA, each
# direction and the layouts each kind moves; 256-byte rows tile the register kernel's 128-byte rounds.
MLA = pool("mla", heads=1, head_dim=128)
SYNTHETIC = {
    "jit-mha-lf-one-load": case("sglang-jit", "load_back", "one_layer", "layer_first", [pool()], [3, 9, 4], [5, 6, 12]),
    "jit-mla-pf-all-write": case("sglang-jit", "write_back", "all_layers", "page_first", [MLA], [0, 7], [2, 3]),
    "register-mha-pf-all-load": case("sglang-jit-register", "load_back", "all_layers", "page_first", [pool()],
                                     [1, 2, 15], [8, 9, 4], host_allocator="host_register"),
    "tma-mla-lf-one-write": case("sglang-jit-tma", "write_back", "one_layer", "layer_first", [MLA], [4, 5], [7, 1],
                                 tuning={"tma_page_size": False}),
    "staged-group-pages": case("sglang-staged", "write_back", "all_layers", "page_first",
                               [pool(), pool("mla", heads=1, head_dim=96, name="side")], [4, 5, 10, 11],
                               [2, 3, 8, 9], page_size=2, host_index="cpu"),
    "page-unified-mha-load": case("sglang-page-unified", "load_back", "one_layer", "page_unified",
                                  [pool(heads=4, head_dim=32, head_groups=2)], [5, 0, 13], [2, 9, 3], page_size=4),
    "page-unified-mla-write": case("sglang-page-unified", "write_back", "all_layers", "page_unified", [MLA],
                                   [8, 9, 10, 11], [4, 5, 6, 7], page_size=4, host_index="cpu"),
    "aot-mha-ph-write": case("sglang-aot", "write_back", "all_layers", "page_head", [pool()], [6, 7, 0, 1],
                             [3, 2, 9, 8], page_size=2),
    "aot-mha-lf-load": case("sglang-aot", "load_back", "one_layer", "layer_first", [pool()], [6, 1], [3, 2]),
    "aot-mla-pf-load": case("sglang-aot", "load_back", "one_layer", "page_first", [MLA], [6, 1], [3, 2]),
    "aot-mla-lf-write": case("sglang-aot", "write_back", "all_layers", "layer_first", [MLA], [6, 1], [3, 2]),
    "pool-group-pf-write": case("sglang-pool", "write_back", "all_layers", "page_first",
                                [pool(), pool("mla", heads=1, head_dim=576, name="side")], [4, 5, 6, 7],
                                [8, 9, 10, 11], page_size=2, host_index="cpu", tuning={"controller": "hybrid"}),
    "pool-mla-lf-load": case("sglang-pool", "load_back", "all_layers", "layer_first", [MLA], [4, 5], [8, 9],
                             page_size=2, host_index="cpu"),
    "pool-mha-lf-direct-load": case("sglang-pool", "load_back", "all_layers", "layer_first", [pool()],
                                    [6, 7, 2, 3], [8, 9, 10, 11], page_size=2, host_index="cpu",
                                    tuning={"io_backend": "direct"}),
}


def run_isolated(scripts: list[Path], tmp_path: Path, buggy: bool) -> dict[str, tuple[int, str]]:
    """Run the scripts with only torch + the fake sglang importable; {script name: (exit code, its output)}."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_SGLANG_BUG")}
    if buggy:
        env["FAKE_SGLANG_BUG"] = "1"
    done = subprocess.run([sys.executable, str(FAKE / "run_isolated.py"), *map(str, scripts)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    results: dict[str, tuple[int, str]] = {}
    output: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("EXIT "):
            _, code, path = line.split(" ", 2)
            results[Path(path).name] = (int(code), "\n".join(output))
            output = []
        else:
            output.append(line)
    assert len(results) == len(scripts), done.stdout + done.stderr
    return results


def write_scripts(cases: dict[str, dict[str, Any]], folder: Path) -> list[Path]:
    paths = []
    for name, body in cases.items():
        path = folder / f"{name}.py"
        path.write_text(standalone_script(body))
        paths.append(path)
    return paths


def test_every_backend_kind_has_a_synthetic_case() -> None:
    assert {body["backend"] for body in SYNTHETIC.values()} == set(CALLS)


def test_scripts_pass_on_correct_fake_and_fail_on_buggy_fake(tmp_path: Path) -> None:
    scripts = write_scripts(SYNTHETIC, tmp_path)
    for script in scripts:
        text = script.read_text()
        assert "hicache_fuzz" not in text.replace("hicache-fuzz", "")  # no import, not even in a comment
        assert "ACCEPT = True" in text, script.name
    correct = run_isolated(scripts, tmp_path, buggy=False)
    for name, (code, output) in correct.items():
        assert code == 0 and "PASS: every byte" in output, (name, output)
    broken = run_isolated(scripts, tmp_path, buggy=True)
    for name, (code, output) in broken.items():
        assert code == 1, (name, output)
        assert "bytes differ; first at storage byte" in output and "layer=" in output, (name, output)


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_committed_findings_reproduce_on_buggy_fake_only(tmp_path: Path) -> None:
    scripts = sorted(CORPUS.glob(f"*{'.standalone.py'}"))
    assert len(scripts) == len(list(CORPUS.glob("*.json"))) >= 8  # every committed finding has its script
    correct = run_isolated(scripts, tmp_path, buggy=False)
    assert all(code == 0 for code, _ in correct.values()), correct
    broken = run_isolated(scripts, tmp_path, buggy=True)
    assert all(code == 1 for code, _ in broken.values()), broken
    assert any("bytes differ" in output for _, output in broken.values())
    assert any("accepted an input it must reject" in output for _, output in broken.values())


def test_isolation_blocks_hicache_fuzz(tmp_path: Path) -> None:
    script = tmp_path / "imports_harness.py"
    script.write_text("import sys\nimport hicache_fuzz\nsys.exit(0)\n")
    code, output = run_isolated([script], tmp_path, buggy=False)[script.name]
    assert code == 2 and "blocked" in output


def test_committed_corpus_scripts_are_up_to_date() -> None:
    stale = stale_corpus_scripts(CORPUS)
    assert not stale, f"regenerate with: python -m hicache_fuzz.harness.findings.standalone corpus/sglang ({stale})"


@pytest.mark.parametrize("name", ["staged-group-pages", "page-unified-mha-load", "register-mha-pf-all-load"])
def test_script_fill_equals_harness_fill(name: str, tmp_path: Path) -> None:
    body = SYNTHETIC[name]
    path = tmp_path / "script.py"
    path.write_text(standalone_script(body))
    spec = importlib.util.spec_from_file_location("standalone_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    theirs = module.make_storages()
    mine = materialize(Case.from_dict(body), torch.device("cpu"))
    try:
        assert set(theirs) == {s.key for s in mine.storages()}
        for storage in mine.storages():
            assert torch.equal(theirs[storage.key], storage.raw), storage.key
    finally:
        mine.release()


def test_non_sglang_backend_has_no_standalone_form() -> None:
    assert not supports("reference")
    with pytest.raises(StandaloneUnsupported, match="sglang backends only"):
        standalone_script(case("reference", "load_back", "one_layer", "layer_first", [pool()], [1], [2]))


def test_reproducer_save_writes_standalone_script(tmp_path: Path) -> None:
    from hicache_fuzz.harness.findings.reproducer import save_reproducer
    from hicache_fuzz.harness.model.outcome import Outcome, Result

    the_case = Case.from_dict(SYNTHETIC["jit-mha-lf-one-load"])
    result = Result(the_case.case_id, the_case.backend, Outcome.MISMATCH, summary="bytes differ")
    json_path = save_reproducer(tmp_path, the_case, result)
    script = standalone_path(json_path)
    assert script.exists() and json.loads(json_path.read_text())["case"]["backend"] == "sglang-jit"
    assert "def test_" in script.read_text()


def test_real_mode_never_sees_the_fake(tmp_path: Path) -> None:
    # --real (the GPU check) must import the installed sglang, never tests/fake_sglang; none is installed here.
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("a real sglang is installed here: the check needs a machine without one")
    script = tmp_path / "which_sglang.py"
    script.write_text("import sys\ntry:\n    import sglang\nexcept ImportError:\n    sys.exit(3)\nsys.exit(0)\n")
    done = subprocess.run([sys.executable, str(FAKE / "run_isolated.py"), "--real", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert "sglang not importable" in done.stdout and f"EXIT 3 {script}" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(("init", "reason"), [
    ('raise OSError("libcommon_ops.so: undefined symbol: _ZN3c104cuda19CUDAErrorLogCaptureC1Ev")',
     "sgl_kernel (the AOT ops) does not load against torch"),
    ('raise ImportError("undefined symbol: _ZN3c104cuda19CUDAErrorLogCaptureC1Ev")',
     "sgl_kernel (the AOT ops) does not load against torch"),
])
def test_aot_script_exits_3_with_the_reason_when_sgl_kernel_does_not_load(tmp_path: Path, init: str,
                                                                          reason: str) -> None:
    # The GPU machine's case: the prebuilt sglang-kernel is built for another torch and its import fails.
    (tmp_path / "site" / "sgl_kernel").mkdir(parents=True)
    (tmp_path / "site" / "sgl_kernel" / "__init__.py").write_text(init + "\n")
    [script] = write_scripts({"aot": SYNTHETIC["aot-mha-ph-write"]}, tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, str(FAKE / "run_isolated.py"), "--real", str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert f"EXIT 3 {script}" in done.stdout, done.stdout + done.stderr
    assert f"SKIP: cannot run here: ImportError: {reason} {torch.__version__}" in done.stdout
    assert "undefined symbol" in done.stdout


def test_aot_script_without_sgl_kernel_names_sgl_kernel_not_torch(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    [script] = write_scripts({"aot": SYNTHETIC["aot-mha-ph-write"]}, tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, str(FAKE / "run_isolated.py"), "--real", str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert f"EXIT 3 {script}" in done.stdout, done.stdout + done.stderr
    assert "SKIP: cannot run here: sgl_kernel is not importable" in done.stdout, done.stdout
    assert "does not load against torch" not in done.stdout


def test_aot_script_exits_3_against_the_import_only_stand_in(tmp_path: Path) -> None:
    [script] = write_scripts({"aot": SYNTHETIC["aot-mla-pf-load"]}, tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "PYTHONPATH": str(ROOT / "docs" / "gpu" / "sgl_kernel_stub")}
    done = subprocess.run([sys.executable, str(FAKE / "run_isolated.py"), "--real", str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert f"EXIT 3 {script}" in done.stdout, done.stdout + done.stderr
    assert "NotImplementedError" in done.stdout and "import-only sgl_kernel stand-in" in done.stdout
