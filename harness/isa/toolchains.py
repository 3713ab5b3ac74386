"""Toolchains (clang for ROCm, nvcc + nvdisasm for CUDA), their flags, and compiling one module.

ROCm: every clang the machine has is a candidate (``clang-N`` on PATH or under /usr/lib/llvm-N, and the
clang 22 embedded in the ziglang wheel, see fetch.py); each target is compiled with the newest candidate
that supports it (:data:`~hicache_fuzz.harness.isa.symbols.ROCM_TARGETS` says which LLVM majors do, and the
candidate's ROCm device libraries must know the target). A target no candidate supports is reported as
skipped, with the candidates found and why each does not fit; never as passed.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hicache_fuzz.harness.isa import fetch as isa_fetch
from hicache_fuzz.harness.isa.modules import ModuleSpec
from hicache_fuzz.harness.isa.source import SglangSource
from hicache_fuzz.harness.isa.symbols import BadInput, ToolchainUnavailable, rocm_target

# The passes that re-merge adjacent 32-bit accesses; each one alone is enough to merge a scalarized
# load_nc back into one dwordx4 (docs/isa.md).
ROCM_STRICT_FLAGS: tuple[str, ...] = (
    "-fno-slp-vectorize",
    "-mllvm", "-amdgpu-load-store-vectorizer=false",
    "-mllvm", "-combiner-store-merging=false",
    "-Xclang", "-target-feature", "-Xclang", "-load-store-opt",
)  # fmt: skip

COMPILE_TIMEOUT_S = 600


# ---------------------------------------------------------------------------------------------------------
# Toolchains


@dataclass(frozen=True)
class RocmToolchain:
    clang: pathlib.Path
    clang_version: str
    hip_include_dirs: tuple[pathlib.Path, ...]
    device_lib_dir: pathlib.Path
    tvm_ffi_include_dirs: tuple[pathlib.Path, ...]
    headers_origin: str
    clang_major: int = 0
    launcher: tuple[str, ...] = ()  # the command that runs this clang, when not the clang path alone
    extra_flags: tuple[str, ...] = ()  # e.g. -resource-dir for the embedded clang

    @property
    def command(self) -> tuple[str, ...]:
        return self.launcher or (str(self.clang),)

    def unsupported_reason(self, arch: str) -> str:
        """Why this clang cannot compile for ``arch`` ("" when it can)."""
        target = rocm_target(arch)
        if not target.llvm_supports(self.clang_major):
            return f"{self.clang_version} is LLVM {self.clang_major}, {target.arch} needs {target.llvm_range()}"
        isa_file = self.device_lib_dir / f"oclc_isa_version_{target.arch.removeprefix('gfx')}.bc"
        if not isa_file.is_file():
            return f"its ROCm device libraries ({self.device_lib_dir}) have no {isa_file.name}"
        return ""


@dataclass(frozen=True)
class CudaToolchain:
    nvcc: pathlib.Path
    nvcc_version: str
    nvdisasm: pathlib.Path
    tvm_ffi_include_dirs: tuple[pathlib.Path, ...]


def _tool_version(tool: pathlib.Path) -> str:
    try:
        completed = subprocess.run(
            [str(tool), "--version"], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolchainUnavailable(f"{tool} does not run: {error}") from error
    if completed.returncode != 0:
        raise ToolchainUnavailable(
            f"{tool} --version exited {completed.returncode}: {completed.stderr[-500:]}"
        )
    lines = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
    if not lines:
        return "unknown"
    # clang prints its version first; nvcc prints it last ("Build cuda_13.0.r13.0/...").
    return lines[0] if "clang" in lines[0] else lines[-1]


def clang_major(version: str) -> int:
    """``Debian clang version 19.1.7 (3~deb12u1)`` -> 19; 0 when there is no version number."""
    match = re.search(r"clang version (\d+)\.", version)
    return int(match.group(1)) if match else 0


def _resolve_tool(
    explicit: str | None, names: Sequence[str], fallbacks: Sequence[str]
) -> pathlib.Path | None:
    if explicit:
        found = shutil.which(explicit)
        return pathlib.Path(found) if found else None
    for name in names:
        found = shutil.which(name)
        if found:
            return pathlib.Path(found)
    for fallback in fallbacks:
        if pathlib.Path(fallback).is_file():
            return pathlib.Path(fallback)
    return None


def _tvm_ffi_includes(
    explicit: Sequence[str], cache_dir: pathlib.Path, allow_fetch: bool
) -> tuple[pathlib.Path, ...]:
    if explicit:
        return tuple(pathlib.Path(directory) for directory in explicit)
    installed = isa_fetch.installed_tvm_ffi_include_dirs()
    if installed:
        return installed
    try:
        return isa_fetch.ensure_tvm_ffi_headers(cache_dir, allow_fetch=allow_fetch)
    except isa_fetch.FetchError as error:
        raise ToolchainUnavailable(str(error)) from error


def find_rocm_toolchain(
    cache_dir: pathlib.Path | None = None,
    allow_fetch: bool = True,
    clang: str | None = None,
    hip_include: Sequence[str] = (),
    tvm_ffi_include: Sequence[str] = (),
    device_lib_path: str | None = None,
) -> RocmToolchain:
    """clang-19 plus HIP headers, ROCm device libraries and tvm-ffi headers (fetched when allowed)."""
    cache = cache_dir or isa_fetch.default_cache_dir()
    clang_path = _resolve_tool(clang, ("clang-19",), ("/usr/lib/llvm-19/bin/clang",))
    if clang_path is None:
        raise ToolchainUnavailable(
            f"{clang or 'clang-19'} not found; on Debian/Ubuntu: apt-get update && "
            "apt-get install -y --no-install-recommends clang-19 (or pass --clang PATH to a clang >= 19 "
            "with the AMDGPU backend)"
        )
    version = _tool_version(clang_path)
    if hip_include and device_lib_path:
        hip_dirs = tuple(pathlib.Path(directory) for directory in hip_include)
        device_libs, origin = pathlib.Path(device_lib_path), "--hip-include / --rocm-device-lib-path"
    else:
        try:
            fetched = isa_fetch.ensure_rocm_device_files(cache, allow_fetch=allow_fetch)
        except isa_fetch.FetchError as error:
            raise ToolchainUnavailable(str(error)) from error
        hip_dirs = tuple(pathlib.Path(d) for d in hip_include) or fetched.include_dirs
        device_libs = pathlib.Path(device_lib_path) if device_lib_path else fetched.device_lib_dir
        origin = fetched.origin
    if not (device_libs / "ockl.bc").is_file():
        raise ToolchainUnavailable(f"no ockl.bc in the ROCm device library folder {device_libs}")
    tvm_dirs = _tvm_ffi_includes(tvm_ffi_include, cache, allow_fetch)
    major = clang_major(version)
    if major >= isa_fetch.BUNDLED_CLANG_MAJOR - 1 and not device_lib_path:
        # LLVM-17 device libraries know no gfx950; a clang >= 21 reads the ROCm 7.0 ones.
        try:
            newer = isa_fetch.ensure_bundled_clang(cache, allow_fetch)
            device_libs, origin = newer.device_lib_dir, f"{origin}; device libraries: {newer.origin}"
        except isa_fetch.FetchError:
            pass
    return RocmToolchain(clang_path, version, hip_dirs, device_libs, tvm_dirs, origin, major)


SYSTEM_CLANG_MAJORS = tuple(range(30, 18, -1))  # clang-30 .. clang-19, newest first


def find_rocm_toolchains(
    cache_dir: pathlib.Path | None = None,
    allow_fetch: bool = True,
    clang: str | None = None,
    hip_include: Sequence[str] = (),
    tvm_ffi_include: Sequence[str] = (),
    device_lib_path: str | None = None,
) -> tuple[list[RocmToolchain], list[str]]:
    """Every usable ROCm clang, newest first, and a note per candidate that could not be used.

    With ``clang`` only that one. Otherwise clang-N (PATH, /usr/lib/llvm-N/bin) for N = 30..19, and the
    clang 22 embedded in the ziglang wheel (installed, or fetched with its headers when allowed).
    """
    cache = cache_dir or isa_fetch.default_cache_dir()
    if clang:
        return [find_rocm_toolchain(cache, allow_fetch, clang, hip_include, tvm_ffi_include, device_lib_path)], []
    toolchains: list[RocmToolchain] = []
    notes: list[str] = []
    seen: set[pathlib.Path] = set()
    for major in SYSTEM_CLANG_MAJORS:
        path = _resolve_tool(None, (f"clang-{major}",), (f"/usr/lib/llvm-{major}/bin/clang",))
        if path is None or path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            toolchains.append(
                find_rocm_toolchain(cache, allow_fetch, str(path), hip_include, tvm_ffi_include, device_lib_path)
            )
        except ToolchainUnavailable as error:
            notes.append(f"{path}: {error}")
    try:
        toolchains.append(
            bundled_rocm_toolchain(cache, allow_fetch, hip_include, tvm_ffi_include, device_lib_path)
        )
    except ToolchainUnavailable as error:
        notes.append(f"clang {isa_fetch.BUNDLED_CLANG_MAJOR} ({isa_fetch.ZIGLANG_REQUIREMENT}): {error}")
    if not toolchains and not notes:
        notes.append("no clang-N (N >= 19) on PATH or under /usr/lib/llvm-N/bin")
    toolchains.sort(key=lambda toolchain: toolchain.clang_major, reverse=True)
    return toolchains, notes


def bundled_rocm_toolchain(
    cache_dir: pathlib.Path,
    allow_fetch: bool = True,
    hip_include: Sequence[str] = (),
    tvm_ffi_include: Sequence[str] = (),
    device_lib_path: str | None = None,
) -> RocmToolchain:
    """The clang 22 of the ziglang wheel (``zig clang``) with its resource headers and ROCm 7.0 device libs."""
    try:
        bundled = isa_fetch.ensure_bundled_clang(cache_dir, allow_fetch)
        hip_files = None if hip_include else isa_fetch.ensure_rocm_device_files(cache_dir, allow_fetch)
    except isa_fetch.FetchError as error:
        raise ToolchainUnavailable(str(error)) from error
    version = _launcher_version(bundled.launcher)
    hip_dirs = tuple(pathlib.Path(d) for d in hip_include) or (hip_files.include_dirs if hip_files else ())
    device_libs = pathlib.Path(device_lib_path) if device_lib_path else bundled.device_lib_dir
    if not (device_libs / "ockl.bc").is_file():
        raise ToolchainUnavailable(f"no ockl.bc in the ROCm device library folder {device_libs}")
    headers = (
        "--hip-include"
        if hip_include
        else f"Debian {isa_fetch.HIP_DEBIAN_SUITE} {isa_fetch.HIP_HEADERS_PACKAGE} (+ hicache-fuzz launch-type overlay)"
    )
    return RocmToolchain(
        clang=pathlib.Path(bundled.launcher[0]),
        clang_version=version,
        hip_include_dirs=hip_dirs,
        device_lib_dir=device_libs,
        tvm_ffi_include_dirs=_tvm_ffi_includes(tvm_ffi_include, cache_dir, allow_fetch),
        headers_origin=f"{headers}; {bundled.origin}",
        clang_major=clang_major(version),
        launcher=bundled.launcher,
        extra_flags=("-resource-dir", str(bundled.resource_dir)),
    )


def _launcher_version(launcher: Sequence[str]) -> str:
    try:
        completed = subprocess.run(
            [*launcher, "--version"], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolchainUnavailable(f"{' '.join(launcher)} does not run: {error}") from error
    first = next((line.strip() for line in completed.stdout.splitlines() if line.strip()), "")
    if completed.returncode != 0 or "clang version" not in first:
        raise ToolchainUnavailable(
            f"{' '.join(launcher)} --version exited {completed.returncode}: {completed.stderr[-300:]}"
        )
    return first


def pick_rocm_toolchain(arch: str, toolchains: Sequence[RocmToolchain], notes: Sequence[str] = ()) -> RocmToolchain:
    """The newest of ``toolchains`` that supports ``arch``; ToolchainUnavailable says why none does."""
    reasons = []
    for toolchain in sorted(toolchains, key=lambda candidate: candidate.clang_major, reverse=True):
        reason = toolchain.unsupported_reason(arch)
        if not reason:
            return toolchain
        reasons.append(f"{toolchain.clang}: {reason}")
    target = rocm_target(arch)
    found = "; ".join([*reasons, *notes]) or "no clang found"
    raise ToolchainUnavailable(
        f"no compiler for {arch} ({target.products}, needs {target.llvm_range()} and ROCm device libraries "
        f"that know it); found: {found}. To enable: pip install {isa_fetch.ZIGLANG_REQUIREMENT} (clang "
        f"{isa_fetch.BUNDLED_CLANG_MAJOR}; the check fetches its headers from Debian) or pass --clang PATH"
    )


def find_cuda_toolchain(
    cache_dir: pathlib.Path | None = None,
    allow_fetch: bool = True,
    nvcc: str | None = None,
    nvdisasm: str | None = None,
    tvm_ffi_include: Sequence[str] = (),
) -> CudaToolchain:
    """nvcc plus nvdisasm (fetched from PyPI when the toolkit lacks it) and tvm-ffi headers."""
    cache = cache_dir or isa_fetch.default_cache_dir()
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nvcc_path = _resolve_tool(nvcc, ("nvcc",), (f"{cuda_home}/bin/nvcc",))
    if nvcc_path is None:
        raise ToolchainUnavailable(
            f"{nvcc or 'nvcc'} not found; install the CUDA toolkit (>= 12.4 for sm_90a with C++20) or "
            "pip install nvidia-cuda-nvcc, and put nvcc on PATH or pass --nvcc PATH"
        )
    version = _tool_version(nvcc_path)
    if nvdisasm:
        disassembler = _resolve_tool(nvdisasm, (), ())
        if disassembler is None:
            raise ToolchainUnavailable(f"--nvdisasm {nvdisasm} not found")
    else:
        try:
            disassembler = isa_fetch.ensure_nvdisasm(cache, allow_fetch=allow_fetch)
        except isa_fetch.FetchError as error:
            raise ToolchainUnavailable(str(error)) from error
    tvm_dirs = _tvm_ffi_includes(tvm_ffi_include, cache, allow_fetch)
    return CudaToolchain(nvcc_path, version, disassembler, tvm_dirs)


# ---------------------------------------------------------------------------------------------------------
# Compiling and checking


def rocm_compile_flags(arch: str, strict: bool, toolchain: RocmToolchain, source: SglangSource) -> list[str]:
    """sglang's ROCm JIT flags (arch.py, toolchain.py) plus what plain upstream clang needs without ROCm."""
    target = rocm_target(arch)
    flags = [*toolchain.extra_flags,
        "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-S",
        # No ROCm install: the device libraries come from their own folder (ockl inlines threadIdx and
        # friends, as in a real build) and -nogpuinc keeps clang from looking for a ROCm path, so clang's
        # own HIP wrapper is included by hand.
        f"--rocm-device-lib-path={toolchain.device_lib_dir}",
        "-nogpuinc", "-include", "__clang_hip_runtime_wrapper.h",
        "-DUSE_ROCM", "-std=c++20", "-O3", target.fp8_define,
        # HIP's headers read the wavefront size from this macro, which clang 22 no longer predefines.
        f"-D__AMDGCN_WAVEFRONT_SIZE={target.wavefront_size}",
        "-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-fno-gpu-rdc",
        "-Wno-unused-result",
    ]  # fmt: skip
    for directory in toolchain.hip_include_dirs:
        flags += ["-isystem", str(directory)]
    flags += ["-I", str(source.include_dir)]
    for directory in toolchain.tvm_ffi_include_dirs:
        flags += ["-I", str(directory)]
    if strict:
        flags += list(ROCM_STRICT_FLAGS)
    return flags


def cuda_arch_flags(arch: str) -> list[str]:
    """``sm_90a`` -> sglang's -gencode target plus its SGL_CUDA_ARCH define."""
    match = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    if match is None:
        raise BadInput(f"CUDA arch {arch!r} is not of the form sm_<major><minor>[a|f], e.g. sm_90a")
    major, minor, suffix = int(match.group(1)), int(match.group(2)), match.group(3)
    target = f"{major}{minor}{suffix}"
    return [f"-gencode=arch=compute_{target},code=sm_{target}", f"-DSGL_CUDA_ARCH={major * 100 + minor * 10}"]


def cuda_compile_flags(arch: str, toolchain: CudaToolchain, source: SglangSource) -> list[str]:
    flags = ["-cubin", *cuda_arch_flags(arch), "-std=c++20", "-O3", "--expt-relaxed-constexpr"]
    flags += ["-Xcompiler", "-fPIC", "-I", str(source.include_dir)]
    for directory in toolchain.tvm_ffi_include_dirs:
        flags += ["-I", str(directory)]
    return flags


@dataclass
class _CompileOutcome:
    module: ModuleSpec
    listing: str
    seconds: float
    error: str
    output_path: pathlib.Path
    cached: bool = False  # read from the listing cache (harness/isa/listing_cache.py), not compiled


def _run_compiler(command: list[str]) -> tuple[int, str, str]:
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=COMPILE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {COMPILE_TIMEOUT_S} s: {' '.join(command)}"
    except OSError as error:
        return 127, "", f"could not run {command[0]}: {error}"
    return completed.returncode, completed.stdout, completed.stderr


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _compile_rocm_module(
    module: ModuleSpec,
    arch: str,
    strict: bool,
    toolchain: RocmToolchain,
    source: SglangSource,
    work_dir: pathlib.Path,
) -> _CompileOutcome:
    stem = f"{module.name}-{_safe_name(arch)}{'-strict' if strict else ''}"
    unit = work_dir / f"{stem}.hip"
    assembly = work_dir / f"{stem}.s"
    unit.write_text(module.translation_unit(source.csrc_dir))
    command = [
        *toolchain.command,
        *rocm_compile_flags(arch, strict, toolchain, source),
        str(unit),
        "-o",
        str(assembly),
    ]
    started = time.monotonic()
    returncode, _stdout, stderr = _run_compiler(command)
    seconds = time.monotonic() - started
    if returncode != 0:
        return _CompileOutcome(module, "", seconds, f"clang exited {returncode}:\n{stderr[-4000:]}", assembly)
    return _CompileOutcome(module, assembly.read_text(errors="replace"), seconds, "", assembly)


def _compile_cuda_module(
    module: ModuleSpec, arch: str, toolchain: CudaToolchain, source: SglangSource, work_dir: pathlib.Path
) -> _CompileOutcome:
    stem = f"{module.name}-{_safe_name(arch)}"
    unit = work_dir / f"{stem}.cu"
    cubin = work_dir / f"{stem}.cubin"
    sass = work_dir / f"{stem}.sass"
    unit.write_text(module.translation_unit(source.csrc_dir))
    command = [str(toolchain.nvcc), *cuda_compile_flags(arch, toolchain, source), str(unit), "-o", str(cubin)]
    started = time.monotonic()
    returncode, _stdout, stderr = _run_compiler(command)
    if returncode != 0:
        seconds = time.monotonic() - started
        return _CompileOutcome(module, "", seconds, f"nvcc exited {returncode}:\n{stderr[-4000:]}", sass)
    returncode, listing, stderr = _run_compiler([str(toolchain.nvdisasm), str(cubin)])
    seconds = time.monotonic() - started
    if returncode != 0:
        return _CompileOutcome(module, "", seconds, f"nvdisasm exited {returncode}:\n{stderr[-4000:]}", sass)
    sass.write_text(listing)
    return _CompileOutcome(module, listing, seconds, "", sass)


