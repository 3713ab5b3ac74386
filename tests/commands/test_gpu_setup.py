"""The GPU set-up files that can be checked without a GPU (or a docker daemon).

* docs/docker/Dockerfile.{cuda,rocm}: a lint of our own — base image pinned by tag, torch pinned by a pip
  constraint before any install and never installed or upgraded, sglang and the harness installed with
  ``--no-deps``, a smoke step running ``hicache-fuzz backends``.
* docs/gpu/make-bundle.sh downloads exactly the wheel list that docs/gpu.md states (a recording ``python3``
  stands in for pip), and the sgl_kernel stand-in imports, raises when called and is reported as a stand-in.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cuda": ROOT / "docs/docker/Dockerfile.cuda", "rocm": ROOT / "docs/docker/Dockerfile.rocm"}
WHEEL_LIST = ROOT / "docs/gpu/bundle-wheels.txt"
BUNDLE_SCRIPT = ROOT / "docs/gpu/make-bundle.sh"
STANDIN = ROOT / "docs/gpu/sgl_kernel_stub"
TORCH_REQUIREMENT = re.compile(r"^(torch)([<>=!~\[ ]|$)", re.IGNORECASE)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, arguments = pending.partition(" ")
        result.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, f"{path}: unterminated continuation line"
    return result


def wheel_requirements() -> list[str]:
    lines = (line.strip() for line in WHEEL_LIST.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def pip_installs(arguments: str) -> list[list[str]]:
    """The argument lists of every ``pip install`` inside one RUN command."""
    lexer = shlex.shlex(arguments, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(word)
    found = []
    for words in commands:
        for i in range(len(words) - 1):
            if words[i] == "pip" and words[i + 1] == "install":
                found.append(words[i + 2:])
    return found


def base_image(dockerfile: list[tuple[str, str]]) -> str:
    args = dict(a.split("=", 1) for k, a in dockerfile if k == "ARG" and "=" in a)
    (source,) = [a for k, a in dockerfile if k == "FROM"]
    image = source.split()[0]
    return args[image[2:-1]] if image.startswith("${") else image


@pytest.mark.parametrize("platform", sorted(DOCKERFILES))
def test_dockerfile_pins_its_base_image_by_tag(platform: str) -> None:
    image = base_image(instructions(DOCKERFILES[platform]))
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest" and "/" not in tag, f"base image {image!r} is not pinned by a tag"
    assert ("rocm" in image) == (platform == "rocm") and ("cuda" in image) == (platform == "cuda")


@pytest.mark.parametrize("platform", sorted(DOCKERFILES))
def test_dockerfile_never_moves_the_images_torch(platform: str) -> None:
    dockerfile = instructions(DOCKERFILES[platform])
    constraint_at = next(i for i, (k, a) in enumerate(dockerfile) if k == "ENV" and a.startswith("PIP_CONSTRAINT="))
    pins = [a for k, a in dockerfile[:constraint_at] if k == "RUN" and "torch-constraint" in a]
    assert pins and "torch.__version__" in pins[0], "the constraint must pin the installed torch's exact version"
    for index, (keyword, arguments) in enumerate(dockerfile):
        if keyword != "RUN":
            continue
        for install in pip_installs(arguments):
            assert index > constraint_at, f"pip install before the torch constraint: {install}"
            assert not any(TORCH_REQUIREMENT.match(word) for word in install), f"installs torch: {install}"
            assert not {"-U", "--upgrade", "--force-reinstall"} & set(install), f"upgrades: {install}"
    assert not any(TORCH_REQUIREMENT.match(requirement) for requirement in wheel_requirements())


@pytest.mark.parametrize("platform", sorted(DOCKERFILES))
def test_dockerfile_installs_sglang_and_the_harness_without_dependencies(platform: str) -> None:
    installs = [i for k, a in instructions(DOCKERFILES[platform]) if k == "RUN" for i in pip_installs(a)]
    wheel_list = [i for i in installs if "docs/gpu/bundle-wheels.txt" in i]
    harness = [i for i in installs if "-e" in i and "." in i]
    assert wheel_list and all("--no-deps" in i for i in wheel_list), wheel_list
    assert harness and all("--no-deps" in i for i in harness), harness
    assert "sglang==0.5.23" in wheel_requirements()


@pytest.mark.parametrize("platform", sorted(DOCKERFILES))
def test_dockerfile_smoke_step_lists_the_backends(platform: str) -> None:
    runs = [a for k, a in instructions(DOCKERFILES[platform]) if k == "RUN"]
    assert "hicache-fuzz backends" in runs[-1]
    assert "import sglang.kernels.ops.kvcache.hicache" in runs[-1]
    assert (DOCKERFILES[platform].parent / f"{DOCKERFILES[platform].name}.dockerignore").is_file()


def test_the_docs_state_the_bundles_wheel_list() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    block = re.search(r"<!-- bundle-wheels -->\s*```text\n(.*?)```", text, re.DOTALL)
    assert block, "docs/gpu.md lacks the ```text block after <!-- bundle-wheels -->"
    assert block.group(1).split() == wheel_requirements()


def test_make_bundle_downloads_exactly_the_wheel_list(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    record = tmp_path / "pip-args.txt"
    # A python3 that records its arguments and "downloads" one empty wheel per requirement.
    (fake_bin / "python3").write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, pathlib
        args = sys.argv[1:]
        pathlib.Path({str(record)!r}).write_text("\\n".join(args))
        dest = pathlib.Path(args[args.index("--dest") + 1])
        for requirement in [a for a in args if "==" in a]:
            name, version = requirement.split("==")
            (dest / f"{{name}}-{{version}}-py3-none-any.whl").write_bytes(b"")
        """))
    (fake_bin / "python3").chmod(0o755)
    out = tmp_path / "bundle"
    path = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["bash", str(BUNDLE_SCRIPT), "--python", "3.11", "--out", str(out)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stderr
    args = record.read_text().split("\n")
    assert args[:3] == ["-m", "pip", "download"] and "--no-deps" in args
    assert args[args.index("--python-version") + 1] == "3.11"
    assert [a for a in args if "==" in a] == wheel_requirements()
    assert (out / "device-setup.sh").is_file() and (out / "sgl_kernel_stub/sgl_kernel/kvcacheio.py").is_file()
    assert len((out / "MANIFEST.txt").read_text().splitlines()) == 1 + len(wheel_requirements())


def test_make_bundle_builds_a_baseline_wheel_of_a_commit_and_keeps_its_corpus(tmp_path: Path) -> None:
    """--baseline REV: the harness as committed at REV (git archive, not the working tree) goes to pip wheel, and
    its corpus/sglang beside the wheel; a python3 stand-in records the calls instead of downloading or building."""
    fake_bin, calls = tmp_path / "bin", tmp_path / "calls.txt"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, pathlib
        args = sys.argv[1:]
        with open({str(calls)!r}, "a") as f:
            f.write(" ".join(args) + "\\n")
        if "--dest" in args:
            (pathlib.Path(args[args.index("--dest") + 1]) / "sglang-0.5.23-py3-none-any.whl").write_bytes(b"")
        if "wheel" in args:
            source = pathlib.Path(args[-1])
            assert (source / "pyproject.toml").is_file() and (source / "harness").is_dir(), source
            wheel_dir = pathlib.Path(args[args.index("--wheel-dir") + 1])
            (wheel_dir / "hicache_fuzz-0.1.0-py3-none-any.whl").write_bytes(b"")
        """))
    (fake_bin / "python3").chmod(0o755)
    out = tmp_path / "bundle"
    path = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["bash", str(BUNDLE_SCRIPT), "--out", str(out), "--baseline", "HEAD"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stderr
    wheel_call = [line for line in calls.read_text().splitlines() if line.startswith("-m pip wheel")]
    assert len(wheel_call) == 1 and "--no-deps" in wheel_call[0]
    assert (out / "baseline" / "hicache_fuzz-0.1.0-py3-none-any.whl").is_file()
    committed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "HEAD", "corpus/sglang/"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert sorted(p.name for p in (out / "baseline" / "corpus-sglang").iterdir()) == sorted(
        Path(name).name for name in committed)
    assert "make-bundle.sh: baseline " in done.stdout


def test_make_bundle_refuses_a_baseline_that_is_not_a_commit(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(BUNDLE_SCRIPT), "--out", str(tmp_path / "b"), "--baseline", "no-such-rev"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--baseline no-such-rev is not a commit" in done.stderr


def test_make_bundle_refuses_an_unknown_option() -> None:
    done = subprocess.run(["bash", str(BUNDLE_SCRIPT), "--no-such-option"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown option --no-such-option" in done.stderr


def test_the_sgl_kernel_stand_in_imports_raises_and_is_reported_as_such() -> None:
    code = textwrap.dedent("""\
        from sgl_kernel.kvcacheio import transfer_kv_per_layer
        from sgl_kernel.quantization import anything
        try:
            transfer_kv_per_layer(1, 2)
        except NotImplementedError as exc:
            print("raised:", exc)
        from hicache_fuzz.kernels.sglang_aot import aot_status
        print("aot:", aot_status())
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                              str(STANDIN), os.environ.get("PYTHONPATH", "")]))})
    assert done.returncode == 0, done.stderr
    assert "raised: sgl_kernel.kvcacheio.transfer_kv_per_layer is not available" in done.stdout
    assert "aot: (False, 'only an import-only sgl_kernel stand-in is installed" in done.stdout


def test_device_setup_refuses_a_python_without_torch(tmp_path: Path) -> None:
    bundle = tmp_path / ".gpu-bundle"
    bundle.mkdir()
    (bundle / "device-setup.sh").write_text((ROOT / "docs/gpu/device-setup.sh").read_text())
    no_torch = tmp_path / "python-without-torch"
    no_torch.write_text("#!/bin/sh\nexit 1\n")  # every `python -c ...` fails, as `import torch` would
    no_torch.chmod(0o755)
    done = subprocess.run(["bash", "-c", f"source {bundle / 'device-setup.sh'}"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60, env={**os.environ, "PYTHON": str(no_torch)})
    assert done.returncode == 3
    assert "has no torch: the bundle keeps the machine's torch and brings none" in done.stderr
