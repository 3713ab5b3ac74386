"""`tox -e fuzz-cpu` right where the README's quick start leaves a new user: a virtualenv (on an interpreter
without torch) holding torch and `pip install -e '.[dev]'`, tox run from it. tox's envs see the base
interpreter's site-packages, not that virtualenv's; toxfile.py points them at the calling interpreter's torch.

To avoid downloading torch (~200 MB) the test's virtualenv gets this machine's torch through a .pth file, the
stand-in for `pip install torch --index-url https://download.pytorch.org/whl/cpu`; everything else is the
quick start's own commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# An interpreter of the same minor version that cannot import torch: the "fresh machine" of the quick start.
BASE_CANDIDATES = (f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}", "/usr/bin/python3")


def bare_python() -> str | None:
    for candidate in BASE_CANDIDATES:
        if not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run([candidate, "-c", "import sys, venv; print(sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)
        has_torch = subprocess.run([candidate, "-c", "import torch"], capture_output=True, check=False)
        if probe.stdout.strip() == str(sys.version_info[:2]) and has_torch.returncode != 0:
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.network  # pip and tox install the small dependencies (setuptools, numpy, pytest, ...)
def test_tox_fuzz_cpu_runs_right_after_the_quick_start(tmp_path: Path) -> None:
    base = bare_python()
    if base is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} without torch at "
                    f"{' or '.join(BASE_CANDIDATES)} to build the quick start's virtualenv from")
    venv = tmp_path / "quickstart"
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "machine_torch.pth").write_text(str(Path(torch.__file__).resolve().parent.parent) + "\n")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("HICACHE_FUZZ_", "VIRTUAL_ENV", "PYTHONPATH", "TOX_"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", ".[dev]"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    tox = [str(venv / "bin" / "tox")] if (venv / "bin" / "tox").exists() else [str(python), "-m", "tox"]
    completed = subprocess.run([*tox, "--workdir", str(tmp_path / "tox"), "-e", "fuzz-cpu", "--", "5"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    assert "linked" in output and "hicache_fuzz_torch_site.pth" in output  # the pre-check linked the torch
    assert "cases in" in output
    shutil.rmtree(tmp_path / "tox", ignore_errors=True)
