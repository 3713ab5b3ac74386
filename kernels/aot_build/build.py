"""Build sglang's AOT kvcacheio ops for the torch that is installed, with torch's own extension builder.

Inputs: the pinned ``transfer.cu`` fetched by ``fetch_sources`` (never stored in this repository) and this
project's ``csrc/register.cc`` (the op schemas sglang's Python calls) plus three small stand-in headers for
the helper headers transfer.cu includes. Output, in ``--out`` (default ``.aot-build/``):
``hicache_fuzz_kvcacheio.so`` and ``build_info.json`` (where the sources came from, the torch and CUDA/HIP
versions it was built against, the architectures, the compiler, how long it took).

    python -m hicache_fuzz.kernels.aot_build.fetch_sources --dest .aot-src
    python -m hicache_fuzz.kernels.aot_build.build --src .aot-src --out .aot-build

CUDA: nvcc from ``CUDA_HOME`` (or on PATH); ``TORCH_CUDA_ARCH_LIST`` picks the architectures (default: the
visible GPU's). ROCm: the same command with a ROCm build of torch: torch's builder hipifies the .cu file
(and this project's headers) into the build folder, compiles with hipcc and defines USE_ROCM, which selects
transfer.cu's ROCm branches; ``PYTORCH_ROCM_ARCH`` picks the GPUs (e.g. gfx942). See docs/aot.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hicache_fuzz.kernels.aot_build.fetch_sources import DEFAULT_DEST, SourceError, load_manifest, verify

HERE = Path(__file__).parent
REGISTRATION = HERE / "csrc" / "register.cc"
SHIM_HEADERS = HERE / "csrc" / "include"
LIBRARY_NAME = "hicache_fuzz_kvcacheio"
INFO_NAME = "build_info.json"
DEFAULT_OUT = Path(".aot-build")


def _compiler_version() -> str:
    import torch
    from torch.utils import cpp_extension

    if getattr(torch.version, "hip", None):
        tool = Path(cpp_extension.ROCM_HOME or "/opt/rocm") / "bin" / "hipcc"
    else:
        tool = Path(cpp_extension.CUDA_HOME or "") / "bin" / "nvcc"
    try:
        out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False, timeout=60)
    except OSError as exc:
        return f"{tool}: {exc}"
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return f"{tool}: {lines[-1] if lines else out.stderr.strip()[:200]}"


def _arch_list() -> str:
    import torch

    if getattr(torch.version, "hip", None):
        return os.environ.get("PYTORCH_ROCM_ARCH", "torch default (visible GPUs)")
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor} (visible GPU)"
    return "torch default (no GPU visible: all supported architectures)"


def build(src: Path = DEFAULT_DEST, out: Path = DEFAULT_OUT, *, verbose: bool = False) -> dict[str, Any]:
    """Compile and load the library; returns (and writes) the build record. Raises SourceError or the
    compiler's error (torch raises RuntimeError with the compiler output)."""
    import torch
    from torch.utils import cpp_extension

    repository, commit, files = load_manifest()
    sources: list[Path] = []
    for pinned in files:
        path = src / pinned.path
        if not path.is_file():
            raise SourceError(f"{pinned.path}: not under {src}; run fetch_sources first")
        verify(pinned, path.read_bytes())
        if pinned.role == "build":
            sources.append(path.resolve())
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cpp_extension.load(
        name=LIBRARY_NAME,
        sources=[*map(str, sources), str(REGISTRATION)],
        extra_include_paths=[str(SHIM_HEADERS)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"],
        build_directory=str(out),
        is_python_module=False,
        verbose=verbose,
    )
    seconds = time.perf_counter() - started
    library = out / f"{LIBRARY_NAME}.so"
    info: dict[str, Any] = {
        "library": library.name,
        "library_sha256": hashlib.sha256(library.read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "arch": _arch_list(),
        "compiler": _compiler_version(),
        "python": platform.python_version(),
        "upstream": {
            "repository": repository,
            "commit": commit,
            "files": [{"path": f.path, "sha256": f.sha256, "role": f.role} for f in files],
        },
        "registration": REGISTRATION.name,
        "build_seconds": round(seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / INFO_NAME).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=DEFAULT_DEST, help="fetched sources (default .aot-src)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="build folder (default .aot-build)")
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)
    try:
        info = build(args.src, args.out, verbose=args.verbose)
    except SourceError as exc:
        print(f"aot build: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"aot build failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
