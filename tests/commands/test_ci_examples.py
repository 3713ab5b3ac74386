"""The CI examples (.ci/examples) follow sglang's AMD and NVIDIA CI conventions (docs/ci.md says which files).

Checked without running them: valid YAML; the AMD job runs on sglang's AMD runner labels inside sglang's CI
container (started by sglang's own script, which picks a ``rocm/sgl-dev`` image: never a bare PyTorch image
without sglang); the NVIDIA job runs on the runner label of sglang's ``1-gpu-large`` runner config with sglang's
install script; both pre-check the environment (exit 3 with the reason) and upload their reports always.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (pip install pyyaml)")

EXAMPLES = Path(__file__).resolve().parents[2] / ".ci" / "examples"


def _job(name: str) -> dict[str, Any]:
    workflow = yaml.safe_load((EXAMPLES / name).read_text())
    (job,) = workflow["jobs"].values()
    return job


def _commands(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def _uploads_always(job: dict[str, Any]) -> bool:
    return any(str(step.get("uses", "")).startswith("actions/upload-artifact") and step.get("if") == "always()"
               for step in job["steps"])


def test_amd_example_runs_in_sglangs_amd_ci_container_on_its_runner_labels() -> None:
    job = _job("amd-rocm-gate.yml")
    assert "linux-mi35x-gpu-1" in job["runs-on"] and "linux-{0}-1gpu-sglang" in job["runs-on"]
    commands = _commands(job)
    assert "bash scripts/ci/amd/amd_ci_start_container.sh --rocm-version" in commands
    assert "bash scripts/ci/amd/amd_ci_install_dependency.sh" in commands
    assert "scripts/ci/amd/amd_ci_exec.sh" in commands and "docker rm -f ci_sglang" in commands
    assert "container" not in job  # sglang's AMD CI starts its own container; no generic image
    assert "envcheck --platform rocm --sglang" in commands and "hicache-fuzz gate --platform rocm" in commands
    assert _uploads_always(job)


def test_nvidia_example_uses_sglangs_runner_config_label_and_install_script() -> None:
    job = _job("cuda-gate.yml")
    assert job["runs-on"] == "1-gpu-h100"  # scripts/ci/runner_configs.yml: 1-gpu-large
    commands = _commands(job)
    assert "bash scripts/ci/cuda/ci_install_dependency.sh" in commands
    assert "bash scripts/ci/cuda/ci_cleanup_venv.sh" in commands
    assert "envcheck --platform cuda --sglang" in commands and "hicache-fuzz gate --platform cuda" in commands
    assert _uploads_always(job)


@pytest.mark.parametrize("name", ["amd-rocm-gate.yml", "cuda-gate.yml"])
def test_no_example_uses_an_unpinned_or_sglang_less_image(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    assert ":latest" not in text and "rocm/pytorch" not in text
    assert "pip install torch" not in text and "--no-deps" in text
