"""The pre-check every tox env runs before its commands: is torch importable, is the platform there?

``python -m hicache_fuzz.harness.commands.envcheck --platform rocm [--sglang]`` exits 0 when the env can run, and 3 with
one line saying why not (no torch, a torch of the wrong build, no GPU, no sglang) otherwise — never a traceback.
It imports nothing heavy at module level, so it runs where torch is missing.

tox never installs torch (a CUDA or ROCm build must not be replaced, and one CPU torch is reused by every env).
The envs see the site-packages of the interpreter tox was started with (``system_site_packages``); a virtualenv
layered on top of it is *not* seen. For a torch that lives in such a virtualenv, set ``HICACHE_FUZZ_TORCH_SITE``
to its site-packages folder (several joined with ``os.pathsep``): this module then writes a ``.pth`` file into the
tox env, so every later command of that env imports that torch. docs/tox.md has the details.
"""

from __future__ import annotations

import argparse
import os
import site
import sys
import sysconfig
from pathlib import Path

TORCH_SITE_ENV = "HICACHE_FUZZ_TORCH_SITE"
PTH_NAME = "hicache_fuzz_torch_site.pth"
UNAVAILABLE = 3
CPU_TORCH_HINT = "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu"


class EnvironmentMissing(RuntimeError):
    """Something the env needs is not there; the message is the reason printed before exit 3."""


def link_torch_site(value: str) -> Path:
    """Make the folders of `value` (os.pathsep-separated) importable in this env and in its later processes."""
    folders = [Path(part).resolve() for part in value.split(os.pathsep) if part]
    missing = [str(folder) for folder in folders if not folder.is_dir()]
    if not folders or missing:
        raise EnvironmentMissing(f"{TORCH_SITE_ENV}={value!r}: not a folder: {', '.join(missing) or '(empty)'}")
    if sys.prefix == sys.base_prefix:
        raise EnvironmentMissing(
            f"{TORCH_SITE_ENV} is set but {sys.executable} is not a virtual environment; refusing to write a .pth "
            "file into the base interpreter"
        )
    target = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text("".join(f"{folder}\n" for folder in folders))
    for folder in folders:
        site.addsitedir(str(folder))
    return target


def torch_summary() -> str:
    """``torch <version> (<build>)`` for the importable torch; EnvironmentMissing when there is none."""
    try:
        import torch
    except ImportError as exc:
        raise EnvironmentMissing(
            f"torch is not importable by {sys.executable} ({type(exc).__name__}: {exc}). tox never installs "
            f"torch: install it into the interpreter tox runs with ({sys.base_prefix}), e.g. on a CPU machine "
            f"`{CPU_TORCH_HINT}`, or point {TORCH_SITE_ENV} at the site-packages of the virtualenv that has it"
        ) from None
    except Exception as exc:  # a broken build: missing shared libraries, ABI mismatch
        raise EnvironmentMissing(f"torch does not import: {type(exc).__name__}: {exc}") from None
    build = f"hip {torch.version.hip}" if getattr(torch.version, "hip", None) else (
        f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu")
    return f"torch {torch.__version__} ({build}) from {Path(torch.__file__).parent}"


def platform_summary(kind: str) -> str:
    """The machine description if the platform `kind` is present; EnvironmentMissing saying what was found."""
    from hicache_fuzz.harness.model.platform import PlatformUnavailable, require

    try:
        return require(kind).description
    except PlatformUnavailable as exc:
        raise EnvironmentMissing(str(exc)) from None


def sglang_summary() -> str:
    """The installed sglang's version and location (without importing it: its import takes seconds)."""
    from importlib import metadata, util

    spec = util.find_spec("sglang")
    if spec is None:
        raise EnvironmentMissing(
            f"sglang is not importable by {sys.executable}: the GPU envs fuzz sglang's real kernels; install it "
            "without moving torch (docs/gpu.md: `pip install --no-deps sglang==0.5.23` plus the wheels listed "
            "there, or docs/gpu/make-bundle.sh for a machine without network)"
        )
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        version = "unknown version (a source checkout on the path)"
    origin = Path(spec.origin).parent if spec.origin else "?"
    return f"sglang {version} from {origin}"


def check(platform: str, need_sglang: bool) -> list[str]:
    """The lines describing a usable env; EnvironmentMissing with the reason otherwise."""
    lines = []
    torch_site = os.environ.get(TORCH_SITE_ENV)
    if torch_site:
        lines.append(f"linked {torch_site} via {link_torch_site(torch_site)}")
    lines.append(torch_summary())
    lines.append(f"platform {platform}: {platform_summary(platform)}")
    if need_sglang:
        lines.append(sglang_summary())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hicache_fuzz.harness.commands.envcheck",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--platform", choices=("cpu", "cuda", "rocm"), default="cpu")
    parser.add_argument("--sglang", action="store_true", help="also require an importable sglang")
    args = parser.parse_args(argv)
    try:
        lines = check(args.platform, args.sglang)
    except EnvironmentMissing as exc:
        print(f"hicache-fuzz envcheck: unavailable: {exc}", file=sys.stderr, flush=True)
        return UNAVAILABLE
    for line in lines:
        print(f"hicache-fuzz envcheck: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
