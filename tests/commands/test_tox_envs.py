"""The tox envs: never install torch, pre-check torch/platform/sglang with exit 3, keep reports in a stable folder.

The pre-check (``python -m hicache_fuzz.harness.commands.envcheck``) is run here exactly as tox.ini runs it;
where tox is installed, ``tox -e fuzz-rocm`` itself runs on a CPU-only machine and must exit 3 with the reason.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.commands import envcheck

ROOT = Path(__file__).resolve().parents[2]
TOX_INI = ROOT / "tox.ini"
GPU_ENVS = ("fuzz-cuda", "fuzz-rocm", "gate-cuda", "gate-rocm")
ROCM_PRECHECK = "python -m hicache_fuzz.harness.commands.envcheck --platform {env:HICACHE_FUZZ_PLATFORM} --sglang"
no_rocm = pytest.mark.skipif(bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available(),
                             reason="a ROCm GPU is present: the rocm pre-check would pass here")


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(TOX_INI)
    return parser


def _envcheck(*args: str, env: dict[str, str] | None = None, block_torch: bool = False) -> subprocess.CompletedProcess:
    prefix = "import sys; sys.modules['torch'] = None; " if block_torch else "import sys; "
    code = prefix + "from hicache_fuzz.harness.commands.envcheck import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_no_env_installs_torch_and_every_env_prechecks() -> None:
    tox = _tox()
    for section in tox.sections():
        deps = tox.get(section, "deps", fallback="")
        assert not re.search(r"^\s*torch\b", deps, re.MULTILINE), f"[{section}] installs torch: {deps!r}"
    base_deps = tox.get("testenv", "deps")
    for tool in ("hypothesis", "pytest", "pytest-xdist"):
        assert re.search(rf"^\s*{re.escape(tool)}\b", base_deps, re.MULTILINE), f"[testenv] deps lack {tool}"
    assert tox.get("testenv", "package") == "skip"  # an editable install with its dependencies would pull torch
    assert "--no-deps" in tox.get("testenv", "commands_pre")
    assert "hicache_fuzz.harness.commands.envcheck --platform cpu" in tox.get("testenv", "commands_pre")
    assert ROCM_PRECHECK in tox.get("gpu", "commands_pre")
    for name in ("testenv:fuzz-{cuda,rocm}", "testenv:gate-{cpu,cuda,rocm}"):
        assert "commands_pre" in tox[name] and "deps" not in tox[name], f"[{name}] must keep the shared deps"


def test_gpu_reports_go_to_a_stable_folder_that_is_printed() -> None:
    text = TOX_INI.read_text()
    assert "{env_tmp_dir}" not in text  # tox empties it on every run
    fuzz = _tox()["testenv:fuzz-{cuda,rocm}"]
    assert "rocm: HICACHE_FUZZ_OUT = {toxworkdir}/fuzz-reports/rocm" in fuzz["set_env"]
    assert "cuda: HICACHE_FUZZ_OUT = {toxworkdir}/fuzz-reports/cuda" in fuzz["set_env"]
    assert "{env:HICACHE_FUZZ_OUT}" in fuzz["commands_post"]
    assert "gate-reports/{env:HICACHE_FUZZ_PLATFORM}" in _tox()["testenv:gate-{cpu,cuda,rocm}"]["commands_post"]


@no_rocm
def test_precheck_without_the_platform_exits_3_with_the_reason() -> None:
    done = _envcheck("--platform", "rocm", "--sglang")
    assert done.returncode == envcheck.UNAVAILABLE, done.stderr
    assert "unavailable: platform rocm requested but unavailable" in done.stderr
    assert "Traceback" not in done.stderr


def test_precheck_without_torch_exits_3_and_says_how_to_get_one() -> None:
    done = _envcheck("--platform", "rocm", block_torch=True)
    assert done.returncode == envcheck.UNAVAILABLE, done.stderr
    assert "torch is not importable" in done.stderr
    assert "tox never installs torch" in done.stderr and envcheck.CPU_TORCH_HINT in done.stderr
    assert "Traceback" not in done.stderr


def test_precheck_rejects_a_torch_site_that_is_not_a_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-site-packages"
    done = _envcheck("--platform", "cpu", env={envcheck.TORCH_SITE_ENV: str(missing)})
    assert done.returncode == envcheck.UNAVAILABLE
    assert f"not a folder: {missing}" in done.stderr


def test_precheck_passes_on_the_cpu_and_names_the_torch() -> None:
    done = _envcheck("--platform", "cpu")
    assert done.returncode == 0, done.stderr
    assert f"torch {torch.__version__}" in done.stdout and "platform cpu:" in done.stdout


def test_precheck_requires_sglang_for_the_gpu_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import util

    real_find_spec = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "sglang" else real_find_spec(name, *a))
    with pytest.raises(envcheck.EnvironmentMissing, match="sglang is not importable"):
        envcheck.sglang_summary()


@no_rocm
@pytest.mark.slow  # runs tox itself (env creation, installs)
@pytest.mark.skipif(shutil.which("tox") is None, reason="tox is not installed (pip install tox): the pre-check "
                    "commands are tested above without it")
def test_tox_fuzz_rocm_on_a_cpu_machine_exits_3_with_the_reason(tmp_path: Path) -> None:
    done = subprocess.run(["tox", "-c", str(TOX_INI), "--workdir", str(tmp_path / ".tox"), "-e", "fuzz-rocm"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != envcheck.TORCH_SITE_ENV})
    output = done.stdout + done.stderr
    assert done.returncode == envcheck.UNAVAILABLE, output[-3000:]
    assert "hicache-fuzz envcheck: unavailable:" in output
    # the pre-check stopped the env before any report: the last line says the folder was not created
    assert f"no fuzz reports: the env stopped before writing any ({tmp_path / '.tox'}/fuzz-reports/rocm was " \
           "not created)" in output


def test_a_virtualenv_torch_is_linked_into_the_env_with_a_pth_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_site = tmp_path / "tox-env-site-packages"
    env_site.mkdir()
    torch_site = tmp_path / "venv-site-packages"
    (torch_site / "fake_torch_marker").mkdir(parents=True)
    monkeypatch.setattr(envcheck.sysconfig, "get_paths", lambda: {"purelib": str(env_site)})
    monkeypatch.setattr(envcheck.sys, "prefix", str(tmp_path / "env"))
    monkeypatch.setattr(envcheck.sys, "base_prefix", str(tmp_path / "base"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    written = envcheck.link_torch_site(str(torch_site))
    assert written == env_site / envcheck.PTH_NAME
    assert written.read_text() == f"{torch_site.resolve()}\n"
    assert str(torch_site.resolve()) in sys.path  # this process sees it too, for the torch check that follows


def test_linking_refuses_to_write_into_a_base_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envcheck.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(envcheck.sys, "base_prefix", str(tmp_path))
    with pytest.raises(envcheck.EnvironmentMissing, match="not a virtual environment"):
        envcheck.link_torch_site(str(tmp_path))
