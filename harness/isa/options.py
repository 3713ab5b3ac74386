"""The options of ``hicache-fuzz isa`` (and ``python -m hicache_fuzz.harness.isa.check``)."""

from __future__ import annotations

import argparse

from hicache_fuzz.harness.isa.mutants import MUTANTS
from hicache_fuzz.harness.isa.symbols import PLATFORMS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hicache-fuzz isa``, in the order ``--help`` lists them."""
    _add_target_options(parser)
    _add_source_and_output_options(parser)
    _add_selection_options(parser)
    _add_toolchain_options(parser)
    _add_cache_and_run_options(parser)


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    """What is compiled for: the platform, the targets, strict mode."""
    parser.add_argument(
        "--platform",
        choices=(*PLATFORMS, "all"),
        default="all",
        help="which compiler path to check (default: all)",
    )
    parser.add_argument(
        "--arch",
        action="append",
        default=None,
        metavar="ARCH",
        help="target, repeatable: gfx90a, gfx942, gfx950, gfx942:sramecc+:xnack- (ROCm), sm_90a (CUDA); "
        "default gfx90a + gfx942 + gfx950 for rocm, sm_90a for cuda",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="ROCm: disable the LLVM passes that re-merge 32-bit accesses, so a scalarized load_nc/store_nc "
        "shows as 32-bit accesses instead of being merged back into dwordx4",
    )


def _add_source_and_output_options(parser: argparse.ArgumentParser) -> None:
    """Where sglang's kernels come from and where the results go."""
    parser.add_argument(
        "--sglang-source",
        metavar="PATH",
        default=None,
        help="sglang wheel, sdist or folder containing sglang/kernels/jit (default: the installed sglang)",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="write the full results as JSON")
    parser.add_argument("--markdown", metavar="PATH", default=None, help="write a Markdown summary")
    parser.add_argument(
        "--keep-dir",
        metavar="DIR",
        default=None,
        help="keep generated units and listings (.s / .sass) in DIR",
    )


def _add_selection_options(parser: argparse.ArgumentParser) -> None:
    """Which modules are checked, and the mutant self-test."""
    parser.add_argument(
        "--module",
        action="append",
        default=None,
        metavar="NAME",
        help="check only this module, repeatable (e.g. hicache-e256-u4; see --list-modules)",
    )
    parser.add_argument("--list-modules", action="store_true", help="print the modules per platform and exit")
    parser.add_argument(
        "--mutant",
        choices=sorted(MUTANTS),
        default=None,
        help="self-test: check a copy of hicache.cuh with this defect; the check must FAIL (exit 1)",
    )


def _add_toolchain_options(parser: argparse.ArgumentParser) -> None:
    """The compilers, disassembler, headers and device libraries, each found by default."""
    parser.add_argument(
        "--clang",
        default=None,
        help="clang for ROCm (default: per target the newest of clang-N on PATH / /usr/lib/llvm-N and the "
        "ziglang wheel's clang 22 that supports it)",
    )
    parser.add_argument(
        "--rocm-device-lib-path",
        default=None,
        metavar="DIR",
        help="ROCm device libraries, ockl.bc and oclc_*.bc (default: Debian trixie's rocm-device-libs-17)",
    )
    parser.add_argument(
        "--nvcc", default=None, help="nvcc for CUDA (default: nvcc on PATH, $CUDA_HOME/bin/nvcc)"
    )
    parser.add_argument(
        "--nvdisasm", default=None, help="nvdisasm (default: on PATH, toolkit, else PyPI wheel)"
    )
    parser.add_argument(
        "--hip-include", action="append", default=[], metavar="DIR", help="HIP header folder, repeatable"
    )
    parser.add_argument(
        "--tvm-ffi-include",
        action="append",
        default=[],
        metavar="DIR",
        help="tvm-ffi header folder, repeatable",
    )


def _add_cache_and_run_options(parser: argparse.ArgumentParser) -> None:
    """The download cache, offline use, parallel compiles and the progress line."""
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="where fetched headers/tools are kept "
        "(default: $HICACHE_FUZZ_CACHE_DIR/isa, else ~/.cache/hicache-fuzz/isa)",
    )
    parser.add_argument("--no-fetch", "--offline", dest="no_fetch", action="store_true",
                        help="download nothing: use only what the cache holds, and name what is missing")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")
