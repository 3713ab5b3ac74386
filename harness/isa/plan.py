"""The targets one ``hicache-fuzz isa`` run checks, from its options."""

from __future__ import annotations

import argparse

from hicache_fuzz.harness.isa.listings import amdgpu_nontemporal_modifiers
from hicache_fuzz.harness.isa.mutants import MUTANTS
from hicache_fuzz.harness.isa.symbols import DEFAULT_ARCHES, PLATFORM_CUDA, PLATFORM_ROCM, PLATFORMS, BadInput
from hicache_fuzz.harness.isa.toolchains import cuda_arch_flags


def _platform_of_arch(arch: str) -> str:
    if arch.startswith("gfx"):
        return PLATFORM_ROCM
    if arch.startswith("sm_"):
        return PLATFORM_CUDA
    raise BadInput(f"--arch {arch!r} is neither a ROCm gfx* nor a CUDA sm_* target")


def plan_targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (platform, arch) pairs to check, in order."""
    platforms = PLATFORMS if args.platform == "all" else (args.platform,)
    if args.mutant:
        mutant_platform = MUTANTS[args.mutant].platform
        if args.platform == "all":
            platforms = (mutant_platform,)
        elif mutant_platform != args.platform:
            raise BadInput(
                f"mutant {args.mutant} changes the {mutant_platform} path; use --platform {mutant_platform}"
            )
    if not args.arch:
        return [(platform, arch) for platform in platforms for arch in DEFAULT_ARCHES[platform]]
    plan = []
    for arch in args.arch:
        platform = _platform_of_arch(arch)
        if platform not in platforms:
            raise BadInput(f"--arch {arch} is a {platform} target but --platform is {args.platform}")
        if platform == PLATFORM_ROCM:
            amdgpu_nontemporal_modifiers(arch)
        else:
            cuda_arch_flags(arch)
        plan.append((platform, arch))
    return plan


def plan_or_empty(args: argparse.Namespace) -> list[tuple[str, str]]:
    try:
        return plan_targets(args)
    except BadInput:
        return []  # reported with exit 2 by the check itself
