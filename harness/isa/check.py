"""Static ISA check of sglang's HiCache copy kernels: ``hicache-fuzz isa``.

The HiCache copy kernels (``kernels/jit/csrc/kvcacheio/hicache.cuh`` and the relayout kernels of
``staged_write_back.cuh``) move KV rows through ``load_nc``/``store_nc``: on CUDA inline PTX with
``L1::no_allocate``, on ROCm ``__builtin_nontemporal_load/store`` on native 2/4-wide vector types. This
check compiles the same translation units sglang's ``load_jit`` builds, device-only and without a GPU:

* ROCm (gfx90a, gfx942, gfx950) with upstream clang (``-x hip --cuda-device-only -S``), per target the newest
  clang that supports it: Debian's ``clang-19``, or for gfx950 (LLVM >= 20) the clang 22 of the ziglang
  wheel; a target without a compiler is reported skipped with the reason, never passed;
* CUDA (sm_90a) with ``nvcc -cubin`` and ``nvdisasm``;

then reads every global memory access of every copy kernel instantiation and requires:

1. every store and every data load carries the nontemporal hint: gfx94x ``nt``, gfx90a ``glc slc``,
   CUDA ``.NA`` (``LDG.E.NA.128`` / ``STG.E.NA.128``);
2. every nontemporal access is exactly as wide as the instantiation's package, derived from its template
   arguments the way ``pick_group_bytes`` does (16 B -> ``dwordx4`` / ``.128``, 8 B -> ``x2`` / ``.64``,
   4 B -> ``dword`` / 32-bit);
3. no load wider than 64 bits goes without the hint (index and pointer-table loads are at most 64 bits);
4. nontemporal loads and stores come in equal numbers, a non-zero multiple of what one copied element
   needs (rounds per element x K/V).

``--strict`` (ROCm) turns off the four LLVM passes that re-merge adjacent 32-bit accesses (SLP vectorizer,
AMDGPU LoadStoreVectorizer, DAG store merging, SILoadStoreOptimizer). clang 19 at -O3 turns a
``load_nc``/``store_nc`` scalarized into 4 x 32-bit nontemporal builtins back into one ``dwordx4 nt``, so
only strict mode sees that the source no longer asks for one wide access. The CUDA path is inline PTX,
which no optimizer splits or merges; ``--strict`` changes nothing there.

Exit codes of :func:`run`: 0 all checks pass, 1 a check failed, 2 bad usage or input, 3 the toolchain or
sglang's source is unavailable (nothing was checked).

Only the standard library (and the stdlib-only exit codes of hicache_fuzz.harness.model) is imported, so the
check runs without torch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from hicache_fuzz.harness.isa import fetch as isa_fetch
from hicache_fuzz.harness.isa import listing_cache
from hicache_fuzz.harness.isa.listings import (
    amdgpu_lds_bytes,
    amdgpu_nontemporal_modifiers,
    check_listing,
    count_accesses,
    find_violations,
    parse_amdgpu_assembly,
    parse_sass,
)
from hicache_fuzz.harness.isa.modules import TVM_FFI_INCLUDES, ModuleSpec, modules_for
from hicache_fuzz.harness.isa.mutants import MUTANTS, Mutant, apply_mutant, mutate_hicache_source
from hicache_fuzz.harness.isa.options import add_arguments
from hicache_fuzz.harness.isa.outputs import print_verdict, write_reports
from hicache_fuzz.harness.isa.plan import plan_or_empty, plan_targets
from hicache_fuzz.harness.isa.render import render_markdown, render_text
from hicache_fuzz.harness.isa.source import HOW_TO_GET_SGLANG, SglangSource, resolve_sglang_source
from hicache_fuzz.harness.isa.symbols import (
    BLOCK_SIZE,
    COPY_GROUP_THREADS,
    DEFAULT_ARCHES,
    DEFAULT_BLOCK_QUOTA,
    GROUP_BYTES,
    PACKAGE_BYTES,
    PLATFORM_CUDA,
    PLATFORM_ROCM,
    PLATFORMS,
    ROCM_TARGETS,
    BadInput,
    CopyExpectation,
    IsaReport,
    KernelName,
    KernelResult,
    MemoryAccess,
    ModuleResult,
    RocmTarget,
    SourceUnavailable,
    TemplateArgument,
    ToolchainUnavailable,
    expectation_for,
    parse_kernel_symbol,
    pick_group_bytes,
    rocm_target,
)
from hicache_fuzz.harness.isa.toolchains import (
    COMPILE_TIMEOUT_S,
    ROCM_STRICT_FLAGS,
    CudaToolchain,
    RocmToolchain,
    _compile_cuda_module,
    _compile_rocm_module,
    _CompileOutcome,
    cuda_arch_flags,
    cuda_compile_flags,
    find_cuda_toolchain,
    find_rocm_toolchain,
    find_rocm_toolchains,
    pick_rocm_toolchain,
    rocm_compile_flags,
)
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE, EXIT_USAGE
from hicache_fuzz.harness.model.progress import ProgressLine, eta_of_step

# The check's public names, wherever they are defined: tests and the gate import them from here.
__all__ = [
    "BLOCK_SIZE",
    "COMPILE_TIMEOUT_S",
    "COPY_GROUP_THREADS",
    "DEFAULT_ARCHES",
    "DEFAULT_BLOCK_QUOTA",
    "GROUP_BYTES",
    "HOW_TO_GET_SGLANG",
    "MUTANTS",
    "PACKAGE_BYTES",
    "PLATFORMS",
    "PLATFORM_CUDA",
    "PLATFORM_ROCM",
    "ROCM_STRICT_FLAGS",
    "ROCM_TARGETS",
    "TVM_FFI_INCLUDES",
    "BadInput",
    "CopyExpectation",
    "CudaToolchain",
    "IsaReport",
    "KernelName",
    "KernelResult",
    "MemoryAccess",
    "ModuleResult",
    "ModuleSpec",
    "Mutant",
    "RocmTarget",
    "RocmToolchain",
    "SglangSource",
    "SourceUnavailable",
    "TemplateArgument",
    "ToolchainUnavailable",
    "add_arguments",
    "amdgpu_lds_bytes",
    "amdgpu_nontemporal_modifiers",
    "apply_mutant",
    "check_cuda",
    "check_listing",
    "check_rocm",
    "count_accesses",
    "cuda_arch_flags",
    "cuda_compile_flags",
    "expectation_for",
    "find_cuda_toolchain",
    "find_rocm_toolchain",
    "find_rocm_toolchains",
    "find_violations",
    "main",
    "modules_for",
    "mutate_hicache_source",
    "parse_amdgpu_assembly",
    "parse_kernel_symbol",
    "parse_sass",
    "pick_group_bytes",
    "pick_rocm_toolchain",
    "render_markdown",
    "render_text",
    "resolve_sglang_source",
    "rocm_compile_flags",
    "rocm_target",
    "run",
    "skipped_report",
]


def _select_modules(platform: str, names: Sequence[str] | None) -> tuple[ModuleSpec, ...]:
    available = modules_for(platform)
    if not names:
        return available
    by_name = {module.name: module for module in available}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise BadInput(f"unknown {platform} module(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return tuple(by_name[name] for name in names)


def _as_source(source: SglangSource | pathlib.Path | str, cache_dir: pathlib.Path | None) -> SglangSource:
    return source if isinstance(source, SglangSource) else resolve_sglang_source(source, cache_dir)


def _check(
    report: IsaReport,
    modules: Sequence[ModuleSpec],
    compile_one: Callable[[ModuleSpec, pathlib.Path], _CompileOutcome],
    parse: Callable[[str], dict[str, list[MemoryAccess]]],
    hint: str,
    work_dir: pathlib.Path | None,
    jobs: int | None,
    progress: Callable[[str], None] | None = None,
) -> IsaReport:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hicache-isa-") as scratch:
        directory = work_dir or pathlib.Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        workers = max(1, jobs or os.cpu_count() or 1)
        compiled = 0

        def compile_counted(module: ModuleSpec) -> _CompileOutcome:
            nonlocal compiled
            outcome = compile_one(module, directory)
            compiled += 1  # under the GIL; the count is for display only
            if progress is not None:
                progress(f"{compiled}/{len(modules)} modules compiled and checked")
            return outcome

        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(compile_counted, modules))
        for outcome in outcomes:
            kernels = (
                []
                if outcome.error
                else check_listing(parse(outcome.listing), outcome.module, report.platform, hint)
            )
            report.modules.append(
                ModuleResult(
                    name=outcome.module.name,
                    compiled=not outcome.error,
                    seconds=round(outcome.seconds, 2),
                    kernels_found=sum(1 for kernel in kernels if kernel.symbol),
                    error=outcome.error,
                    output_path=str(outcome.output_path) if work_dir else "",
                    cached=outcome.cached,
                )
            )
            if outcome.error:
                report.errors.append(f"module {outcome.module.name} did not compile: {outcome.error}")
            elif report.platform == PLATFORM_ROCM:
                limit = rocm_target(report.arch).lds_bytes
                for symbol, lds in amdgpu_lds_bytes(outcome.listing).items():
                    if lds > limit:
                        report.errors.append(
                            f"{symbol} uses {lds} B of LDS, more than {report.arch}'s {limit} B per work-group"
                        )
            report.kernels.extend(kernels)
    report.seconds = round(time.monotonic() - started, 2)
    return report


def check_rocm(
    source_dir: SglangSource | pathlib.Path | str,
    arch: str,
    strict: bool = False,
    *,
    modules: Sequence[str] | None = None,
    toolchain: RocmToolchain | None = None,
    work_dir: pathlib.Path | None = None,
    jobs: int | None = None,
    cache_dir: pathlib.Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> IsaReport:
    """Compile the HiCache modules for one ROCm ``arch`` with clang and check their ISA.

    Raises ToolchainUnavailable / SourceUnavailable when nothing can be compiled, BadInput for a bad arch
    or module name. Compile errors of the kernels themselves are failures inside the report.
    """
    hint = " ".join(sorted(amdgpu_nontemporal_modifiers(arch)))
    selected = _select_modules(PLATFORM_ROCM, modules)
    source = _as_source(source_dir, cache_dir)
    tools = toolchain or pick_rocm_toolchain(arch, *find_rocm_toolchains(cache_dir))
    report = IsaReport(
        platform=PLATFORM_ROCM,
        arch=arch,
        strict=strict,
        sglang_source=source.origin,
        sglang_version=source.version,
        mutant="",
        compiler=f"{tools.clang} ({tools.clang_version}); headers: {tools.headers_origin}",
        compile_flags=rocm_compile_flags(arch, strict, tools, source),
    )
    command = [*tools.command, *report.compile_flags]
    compile_one = listing_cache.with_cache(
        lambda module, directory: _compile_rocm_module(module, arch, strict, tools, source, directory),
        cache_dir or isa_fetch.default_cache_dir(),
        lambda module: listing_cache.listing_key(module.translation_unit(source.csrc_dir), command,
                                                 tools.clang_version, source),
    )
    return _check(
        report,
        selected,
        compile_one,
        lambda listing: parse_amdgpu_assembly(listing, arch),
        hint,
        work_dir,
        jobs,
        progress,
    )


def skipped_report(platform: str, arch: str, strict: bool, source: SglangSource | None, reason: str) -> IsaReport:
    """The report of a target that was not checked (no compiler for it): never passed."""
    return IsaReport(
        platform=platform,
        arch=arch,
        strict=strict,
        sglang_source=source.origin if source else "",
        sglang_version=source.version if source else "",
        mutant="",
        compiler="",
        compile_flags=[],
        skipped=reason,
    )


def check_cuda(
    source_dir: SglangSource | pathlib.Path | str,
    arch: str = "sm_90a",
    strict: bool = False,
    *,
    modules: Sequence[str] | None = None,
    toolchain: CudaToolchain | None = None,
    work_dir: pathlib.Path | None = None,
    jobs: int | None = None,
    cache_dir: pathlib.Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> IsaReport:
    """Compile the HiCache modules for one CUDA ``arch`` with nvcc and check the SASS.

    ``strict`` is recorded but changes nothing: the CUDA path is inline PTX, which no optimizer merges.
    """
    cuda_arch_flags(arch)  # validates the arch before any work
    selected = _select_modules(PLATFORM_CUDA, modules)
    source = _as_source(source_dir, cache_dir)
    tools = toolchain or find_cuda_toolchain(cache_dir)
    report = IsaReport(
        platform=PLATFORM_CUDA,
        arch=arch,
        strict=strict,
        sglang_source=source.origin,
        sglang_version=source.version,
        mutant="",
        compiler=f"{tools.nvcc} ({tools.nvcc_version}); disassembler: {tools.nvdisasm}",
        compile_flags=cuda_compile_flags(arch, tools, source),
    )
    command = [str(tools.nvcc), *report.compile_flags, str(tools.nvdisasm)]
    versions = f"{tools.nvcc_version}; {listing_cache.tool_stamp(str(tools.nvdisasm))}"
    compile_one = listing_cache.with_cache(
        lambda module, directory: _compile_cuda_module(module, arch, tools, source, directory),
        cache_dir or isa_fetch.default_cache_dir(),
        lambda module: listing_cache.listing_key(module.translation_unit(source.csrc_dir), command,
                                                 versions, source),
    )
    return _check(
        report,
        selected,
        compile_one,
        parse_sass,
        ".NA (L1::no_allocate)",
        work_dir,
        jobs,
        progress,
    )


# ---------------------------------------------------------------------------------------------------------
# CLI


def run(args: argparse.Namespace) -> int:
    """Entry point of ``hicache-fuzz isa``; returns the exit code (see the module docstring)."""
    if args.list_modules:
        for platform in PLATFORMS:
            for module in modules_for(platform):
                print(f"{platform}\t{module.name}\t{module.header}\t{len(module.expected_kernels)} kernels")
        return EXIT_CLEAN
    if args.jobs is not None and args.jobs < 1:
        print("isa: --jobs must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    cache_dir = pathlib.Path(args.cache_dir) if args.cache_dir else isa_fetch.default_cache_dir()
    allow_fetch = not args.no_fetch
    if not allow_fetch:
        for platform in sorted({platform for platform, _arch in plan_or_empty(args)}):
            isa_fetch.report_offline(cache_dir, platform, "isa --offline")
    progress = ProgressLine(not getattr(args, "no_progress", False))
    try:
        return _run_checks(args, cache_dir, allow_fetch, progress)
    finally:
        progress.close()
        isa_fetch.set_progress(None)


@dataclasses.dataclass(frozen=True)
class _Checks:
    """What every target of one run shares, found once before anything compiles."""

    plan: list[tuple[str, str]]  # (platform, arch), in the order they are checked
    source: SglangSource  # the kernels checked: sglang's, or under --mutant a defective copy of them
    rocm_tools: list[RocmToolchain]  # every usable clang; each ROCm target takes the newest that supports it
    rocm_notes: list[str]  # why other clangs were not usable, for a target none supports
    cuda_tools: CudaToolchain | None  # None when the plan has no CUDA target
    cache_dir: pathlib.Path


def _run_checks(
    args: argparse.Namespace, cache_dir: pathlib.Path, allow_fetch: bool, progress: ProgressLine
) -> int:
    """Locate the sources and toolchains, check every target (of a mutant's copy under --mutant), report."""
    isa_fetch.set_progress(lambda text: progress.update(f"isa: {text}", force=True))
    try:
        progress.update("isa: locating sglang's kernel sources and the toolchain", force=True)
        checks = _locate(args, cache_dir, allow_fetch)
    except BadInput as error:
        return _usage_error(error, progress)
    except (ToolchainUnavailable, SourceUnavailable) as error:
        progress.clear()
        print(f"isa: UNAVAILABLE, nothing was checked: {error}", file=sys.stderr)
        if args.platform == "all" and isinstance(error, ToolchainUnavailable):
            print("isa: (--platform rocm or --platform cuda checks one path alone)", file=sys.stderr)
        return EXIT_UNAVAILABLE

    with tempfile.TemporaryDirectory(prefix="hicache-isa-mutant-") as mutant_dir:
        if args.mutant:
            try:
                mutated = apply_mutant(checks.source, args.mutant, pathlib.Path(mutant_dir))
            except BadInput as error:
                return _usage_error(error, progress)
            checks = dataclasses.replace(checks, source=mutated)
        reports = _check_targets(args, checks, progress)

    exit_code = _exit_code(reports)
    print_verdict(reports)
    write_reports(args, reports, exit_code)
    return exit_code


def _usage_error(error: BadInput, progress: ProgressLine) -> int:
    progress.clear()
    print(f"isa: {error}", file=sys.stderr)
    return EXIT_USAGE


def _locate(args: argparse.Namespace, cache_dir: pathlib.Path, allow_fetch: bool) -> _Checks:
    """The plan, sglang's source and the toolchains the plan needs.

    Raises BadInput for a bad target, mutant or module name, ToolchainUnavailable / SourceUnavailable when
    nothing could be checked.
    """
    plan = plan_targets(args)
    for platform, _arch in plan:
        _select_modules(platform, args.module)
    source = resolve_sglang_source(args.sglang_source, cache_dir)
    platforms = {platform for platform, _arch in plan}
    rocm_tools, rocm_notes = (
        find_rocm_toolchains(
            cache_dir,
            allow_fetch,
            args.clang,
            args.hip_include,
            args.tvm_ffi_include,
            args.rocm_device_lib_path,
        )
        if PLATFORM_ROCM in platforms
        else ([], [])
    )
    if PLATFORM_ROCM in platforms and not rocm_tools:
        raise ToolchainUnavailable(
            "no usable clang for ROCm: "
            + "; ".join(rocm_notes)
            + "; on Debian/Ubuntu: apt-get update && apt-get install -y --no-install-recommends clang-19 "
            "(or pass --clang PATH to a clang >= 19 with the AMDGPU backend)"
        )
    cuda_tools = (
        find_cuda_toolchain(cache_dir, allow_fetch, args.nvcc, args.nvdisasm, args.tvm_ffi_include)
        if PLATFORM_CUDA in platforms
        else None
    )
    return _Checks(plan, source, rocm_tools, rocm_notes, cuda_tools, cache_dir)


def _check_targets(args: argparse.Namespace, checks: _Checks, progress: ProgressLine) -> list[IsaReport]:
    """Every planned target in order, each report printed as soon as it is done."""
    reports: list[IsaReport] = []
    started = time.monotonic()
    for number, (platform, arch) in enumerate(checks.plan, start=1):
        on_module = _target_progress(progress, number, len(checks.plan), arch, started)
        on_module("compiling")
        reports.append(_check_target(args, checks, platform, arch, on_module, progress))
    return reports


def _target_progress(
    progress: ProgressLine, number: int, targets: int, arch: str, started: float
) -> Callable[[str], None]:
    """The progress callback of target `number` of `targets`: what it is doing, and the ETA of the run."""
    target_started = time.monotonic()

    def on_module(text: str) -> None:
        progress.update(
            f"isa: target {number}/{targets} {arch}: {text}, "
            f"{eta_of_step(number - 1, targets, target_started, started, time.monotonic())}",
            force=True,
        )

    return on_module


def _check_target(
    args: argparse.Namespace,
    checks: _Checks,
    platform: str,
    arch: str,
    on_module: Callable[[str], None],
    progress: ProgressLine,
) -> IsaReport:
    """Check one target and print its report; a ROCm target that no usable clang supports is skipped."""
    keep_dir = pathlib.Path(args.keep_dir) if args.keep_dir else None
    if platform == PLATFORM_ROCM:
        try:
            arch_tools = pick_rocm_toolchain(arch, checks.rocm_tools, checks.rocm_notes)
        except ToolchainUnavailable as error:
            report = skipped_report(platform, arch, args.strict, checks.source, str(error))
            report.mutant = args.mutant or ""
            print("\n".join(render_text(report)), flush=True)
            return report
        report = check_rocm(
            checks.source, arch, args.strict, modules=args.module, toolchain=arch_tools,
            work_dir=keep_dir, jobs=args.jobs, cache_dir=checks.cache_dir, progress=on_module,
        )  # fmt: skip
    else:
        report = check_cuda(
            checks.source, arch, args.strict, modules=args.module, toolchain=checks.cuda_tools,
            work_dir=keep_dir, jobs=args.jobs, cache_dir=checks.cache_dir, progress=on_module,
        )  # fmt: skip
    report.mutant = args.mutant or ""
    progress.print("\n".join(render_text(report)))
    return report


def _exit_code(reports: Sequence[IsaReport]) -> int:
    """0 when every target was checked and passed; 3 when none failed but some were skipped; else 1 (a failure,
    or no target at all)."""
    passed = all(report.passed for report in reports) and bool(reports)
    failed = any(not report.passed and not report.skipped for report in reports)
    skipped = any(report.skipped for report in reports)
    # A skipped target is not a pass: with no failure elsewhere the exit says "unavailable" (3).
    return EXIT_CLEAN if passed else (EXIT_FAILURES if failed or not skipped else EXIT_UNAVAILABLE)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.isa.check``: the same as ``hicache-fuzz isa``."""
    parser = argparse.ArgumentParser(prog="hicache-fuzz isa", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    args.argv = arguments
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
