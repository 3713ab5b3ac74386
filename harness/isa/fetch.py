"""Run-time fetching of what the static ISA check compiles against.

Nothing fetched here is committed to the repository: the ROCm HIP headers, tvm-ffi's headers, NVIDIA's
disassembler and sglang's kernel sources are downloaded on first use into a cache folder and reused after.

* HIP headers and device libraries: Debian bookworm's HIP 5.2 headers are too old for sglang (no
  ``hip/hip_bf16.h``), so the ``libamdhip64-dev`` (HIP 5.7.1) and ``rocm-device-libs-17`` packages of
  Debian *trixie* are downloaded with a private apt configuration (the system's sources and state are
  left untouched) and unpacked with ``dpkg -x``. sglang also uses two HIP 6.2 launch types; a one-file
  overlay adds them (see ``HIP_RUNTIME_OVERLAY``).
* tvm-ffi headers and ``nvdisasm`` come from PyPI wheels (``pip download --no-deps``), unpacked, not
  installed.
* sglang's kernels come from its wheel or sdist; only ``kernels/jit/csrc`` and ``kernels/jit/include``
  are extracted.

Only the standard library is used so that ``hicache-fuzz isa`` works before anything else is installed.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# sglang 0.5.23 pins apache-tvm-ffi==0.1.11; its headers are what sglang's JIT build compiles against.
DEFAULT_TVM_FFI_VERSION = "0.1.11"
# The sglang release whose kernels the committed reports describe.
DEFAULT_SGLANG_VERSION = "0.5.23"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Debian trixie's HIP is the oldest with hip_bf16.h; bookworm's 5.2.3 lacks it. Its device libraries
# (ROCm 6.0, LLVM-17 bitcode) have the gfx90a/gfx942 and code-object-v5 ABI files clang 19 links.
HIP_DEBIAN_SUITE = "trixie"
HIP_HEADERS_PACKAGE = "libamdhip64-dev"
DEVICE_LIBS_PACKAGE = "rocm-device-libs-17"

# sglang's utils.cuh fills a hipLaunchConfig_t (HIP >= 6.2) and launches through hipLaunchKernelGGL on
# ROCm, reading only gridDim/blockDim/dynamicSmemBytes/stream/numAttrs. HIP 5.7 lacks both types, so this
# overlay declares them; it is searched before the real headers and includes them with #include_next.
HIP_RUNTIME_OVERLAY = """\
#pragma once
// Written by hicache-fuzz (harness/isa/fetch.py): HIP 5.7 headers + the two HIP 6.2 launch types
// sglang's utils.cuh names. Device code generation does not depend on them.
#include_next <hip/hip_runtime.h>
#if HIP_VERSION < 60200000
typedef struct hipLaunchAttribute {
  int id;
  char pad[64];
} hipLaunchAttribute;
typedef struct hipLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  size_t dynamicSmemBytes;
  hipStream_t stream;
  hipLaunchAttribute* attrs;
  unsigned int numAttrs;
} hipLaunchConfig_t;
#endif
"""

# Path of the kernel that every sglang layout (installed package, wheel, sdist) contains under its root.
HICACHE_CUH_SUFFIX = "sglang/kernels/jit/csrc/kvcacheio/hicache.cuh"


class FetchError(RuntimeError):
    """Something the check needs could not be found or downloaded; the message says how to provide it."""


def default_cache_dir() -> pathlib.Path:
    """Where fetched headers and tools are kept between runs."""
    explicit = os.environ.get("HICACHE_FUZZ_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit) / "isa"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "hicache-fuzz" / "isa"


# The progress line of the command running the check (harness/model/progress.py), if any: told what is being
# fetched and how many fetch steps (downloads, unpacks) are done.
_progress: Callable[[str], None] | None = None
_steps_done = 0


def set_progress(callback: Callable[[str], None] | None) -> None:
    global _progress, _steps_done
    _progress, _steps_done = callback, 0


def _run(command: Sequence[str], what: str, cwd: pathlib.Path | None = None) -> None:
    global _steps_done
    if _progress is not None:
        _progress(f"{what} ({_steps_done} fetch steps done)")
    try:
        completed = subprocess.run(
            list(command), cwd=cwd, capture_output=True, text=True, check=False, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise FetchError(f"{what}: {' '.join(command)} could not run: {error}") from error
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout)[-2000:]
        raise FetchError(f"{what}: {' '.join(command)} exited {completed.returncode}:\n{tail}")
    _steps_done += 1
    if _progress is not None:
        _progress(f"{what}: done ({_steps_done} fetch steps done)")


def pip_download(requirement: str, dest: pathlib.Path) -> pathlib.Path:
    """Download one distribution (no dependencies) with pip and return the downloaded file."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", requirement, "-d", str(dest)],
        f"downloading {requirement} from PyPI",
    )
    new_files = sorted(set(dest.iterdir()) - before)
    if new_files:
        return new_files[0]
    # pip skips a download whose file is already in dest; find it by the project name.
    project = requirement.split("=")[0].split("<")[0].split(">")[0].strip().replace("-", "_").lower()
    for candidate in sorted(dest.iterdir()):
        if candidate.name.replace("-", "_").lower().startswith(project):
            return candidate
    raise FetchError(f"pip reported success for {requirement} but left no file in {dest}")


# ---------------------------------------------------------------------------------------------------------
# HIP headers


@dataclass(frozen=True)
class RocmDeviceFiles:
    """What clang needs to compile HIP device code without a ROCm install.

    ``include_dirs`` are searched in this order with -isystem (the overlay first, then HIP's headers);
    ``device_lib_dir`` holds ockl.bc & co. Without them (``-nogpulib``) threadIdx/blockIdx/blockDim/gridDim
    stay external calls to ``__ockl_get_*`` inside the copy loops, which production code never has.
    """

    include_dirs: tuple[pathlib.Path, ...]
    device_lib_dir: pathlib.Path
    origin: str


# (Debian trixie package, a file that proves it is unpacked, relative to the unpack root)
ROCM_DEVICE_PACKAGES = (
    (HIP_HEADERS_PACKAGE, "usr/include/hip/hip_bf16.h"),
    (DEVICE_LIBS_PACKAGE, "usr/lib/llvm-17/lib/clang/17/amdgcn/bitcode/ockl.bc"),
)


DEBIAN_MIRROR_ENV = "HICACHE_FUZZ_DEBIAN_MIRROR"


def _debian_mirror() -> str:
    """$HICACHE_FUZZ_DEBIAN_MIRROR, else the Debian mirror the machine already uses (so the trixie request goes
    where apt normally goes), else deb.debian.org."""
    explicit = os.environ.get(DEBIAN_MIRROR_ENV, "").strip()
    if explicit:
        return explicit.rstrip("/")
    sources_dir = pathlib.Path("/etc/apt/sources.list.d")
    candidates: list[str] = []
    if sources_dir.is_dir():
        for sources_file in sorted(sources_dir.glob("*.sources")):
            for line in sources_file.read_text(errors="replace").splitlines():
                if line.startswith("URIs:"):
                    candidates.extend(line.split()[1:])
    legacy = pathlib.Path("/etc/apt/sources.list")
    if legacy.is_file():
        for line in legacy.read_text(errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "deb":
                candidates.append(fields[1])
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return DEFAULT_DEBIAN_MIRROR


def ensure_rocm_device_files(cache_dir: pathlib.Path, allow_fetch: bool = True) -> RocmDeviceFiles:
    """HIP 5.7.1 headers and LLVM-17 ROCm device libraries from Debian trixie, fetched once into the cache."""
    root = cache_dir / "rocm"
    unpacked = root / "unpacked"
    missing = [package for package, proof in ROCM_DEVICE_PACKAGES if not (unpacked / proof).is_file()]
    if missing:
        if not allow_fetch:
            raise FetchError(
                f"{', '.join(missing)} not found under {unpacked} and fetching is disabled; run once without "
                "--no-fetch, or pass --hip-include DIR (HIP >= 5.7 headers with hip/hip_bf16.h) and "
                "--rocm-device-lib-path DIR (ROCm device libraries: ockl.bc, oclc_*.bc)"
            )
        announce_downloads(cache_dir)
        _download_debian_packages(root, unpacked, missing)
    overlay_dir = root / "overlay"
    overlay_header = overlay_dir / "hip" / "hip_runtime.h"
    if not overlay_header.is_file() or overlay_header.read_text() != HIP_RUNTIME_OVERLAY:
        overlay_header.parent.mkdir(parents=True, exist_ok=True)
        overlay_header.write_text(HIP_RUNTIME_OVERLAY)
    return RocmDeviceFiles(
        include_dirs=(overlay_dir, unpacked / "usr" / "include"),
        device_lib_dir=(unpacked / ROCM_DEVICE_PACKAGES[1][1]).parent,
        origin=(
            f"Debian {HIP_DEBIAN_SUITE} {HIP_HEADERS_PACKAGE} + {DEVICE_LIBS_PACKAGE} "
            "(+ hicache-fuzz launch-type overlay)"
        ),
    )


def _download_debian_packages(
    root: pathlib.Path,
    unpacked: pathlib.Path,
    packages: Sequence[str],
    suites: dict[str, str] | None = None,
    proofs: Sequence[tuple[str, str]] = ROCM_DEVICE_PACKAGES,
) -> None:
    """Download ``packages`` (each from ``suites[package]``, default trixie) with a private apt
    configuration and unpack them under ``unpacked``."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise FetchError(
                f"fetching {', '.join(packages)} needs Debian's {tool}, which is not on PATH; on another "
                "system pass --hip-include DIR and --rocm-device-lib-path DIR"
            )
    suite_of = {package: (suites or {}).get(package, HIP_DEBIAN_SUITE) for package in packages}
    apt_dir = root / "apt"
    (apt_dir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    source_list = apt_dir / "sources.list"
    mirror = _debian_mirror()
    source_list.write_text("".join(f"deb {mirror} {suite} main\n" for suite in sorted(set(suite_of.values()))))
    # A private list, state and cache: the machine's own apt configuration is never changed.
    apt_options = [
        "-o", f"Dir::Etc::sourcelist={source_list}",
        "-o", "Dir::Etc::sourceparts=/nonexistent",
        "-o", f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o", f"Dir::Cache={apt_dir / 'cache'}",
        # Downloading into a root-owned folder; the _apt sandbox user could not write there.
        "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip
    suites_text = "/".join(sorted(set(suite_of.values())))
    _run(["apt-get", *apt_options, "-qq", "update"], f"reading the Debian {suites_text} package lists")
    for package in packages:
        for old in apt_dir.glob(f"{package}_*.deb"):
            old.unlink()
        _run(
            ["apt-get", *apt_options, "-qq", "download", f"{package}/{suite_of[package]}"],
            f"downloading {package} from Debian {suite_of[package]}",
            cwd=apt_dir,
        )
        debs = sorted(apt_dir.glob(f"{package}_*.deb"))
        if not debs:
            raise FetchError(f"apt-get download left no {package} .deb in {apt_dir}")
        _run(["dpkg", "-x", str(debs[-1]), str(unpacked)], f"unpacking {debs[-1].name}")
    for package, proof in proofs:
        if package in packages and not (unpacked / proof).is_file():
            raise FetchError(f"{package} unpacked without {proof}")


# ---------------------------------------------------------------------------------------------------------
# A newer clang for gfx950 (LLVM >= 20)

# Debian bookworm and trixie ship clang 19 at most as an installable compiler (trixie's clang-22 needs
# glibc >= 2.38). The ziglang wheel on PyPI is a static zig binary that embeds a complete clang with the
# AMDGPU backend (``zig clang`` is that clang's driver, unchanged); it runs on any x86_64 Linux. It lacks
# clang's HIP/CUDA wrapper headers, which come from the architecture-independent libclang-common-22-dev
# (the same 22.1.8 release), and gfx950 needs ROCm device libraries that know it (rocm-device-libs-21,
# ROCm 7.0, LLVM-21 bitcode, which clang 22 reads).
ZIGLANG_REQUIREMENT = "ziglang==0.17.0"  # zig 0.17.0 embeds clang 22.1.8
BUNDLED_CLANG_MAJOR = 22
BUNDLED_LLVM_PACKAGES = (
    ("libclang-common-22-dev", "usr/lib/llvm-22/lib/clang/22/include/__clang_hip_runtime_wrapper.h"),
    ("rocm-device-libs-21", "usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode/oclc_isa_version_950.bc"),
)
BUNDLED_LLVM_SUITES = {"libclang-common-22-dev": "trixie", "rocm-device-libs-21": "sid"}


@dataclass(frozen=True)
class BundledClang:
    """``zig clang`` plus the resource headers and ROCm device libraries it is used with."""

    launcher: tuple[str, ...]  # the command that is clang: (path/to/zig, "clang")
    resource_dir: pathlib.Path
    device_lib_dir: pathlib.Path
    origin: str


def installed_zig() -> pathlib.Path | None:
    """The zig binary of an installed ``ziglang`` package (pip install ziglang), located without importing."""
    import importlib.util

    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = pathlib.Path(next(iter(spec.submodule_search_locations))) / "zig"
    return binary if binary.is_file() else None


def ensure_bundled_clang(cache_dir: pathlib.Path, allow_fetch: bool = True) -> BundledClang:
    """clang 22 from the ziglang wheel (installed, or downloaded into the cache) with its HIP headers and
    ROCm 7.0 device libraries from Debian, fetched once."""
    root = cache_dir / "llvm-22"
    zig = installed_zig()
    origin = "installed ziglang package"
    if zig is None:
        zig = root / "ziglang" / "unpacked" / "ziglang" / "zig"
        origin = f"{ZIGLANG_REQUIREMENT} wheel (cached)"
        if not zig.is_file():
            if not allow_fetch:
                raise FetchError(
                    f"no clang >= 20: {ZIGLANG_REQUIREMENT} is not installed and fetching is disabled "
                    f"(pip install {ZIGLANG_REQUIREMENT}, or pass --clang PATH to a clang >= 20)"
                )
            announce_downloads(cache_dir)
            wheel = pip_download(ZIGLANG_REQUIREMENT, root / "ziglang" / "download")
            _extract_members(wheel, root / "ziglang" / "unpacked", lambda name: name.startswith("ziglang/"))
            if not zig.is_file():
                raise FetchError(f"{wheel.name} has no ziglang/zig")
    if not os.access(zig, os.X_OK):
        try:
            zig.chmod(zig.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as error:
            raise FetchError(f"{zig} is not executable and cannot be made so: {error}") from error
    unpacked = root / "unpacked"
    missing = [package for package, proof in BUNDLED_LLVM_PACKAGES if not (unpacked / proof).is_file()]
    if missing:
        if not allow_fetch:
            raise FetchError(
                f"{', '.join(missing)} not found under {unpacked} and fetching is disabled; run once without "
                "--no-fetch"
            )
        announce_downloads(cache_dir)
        _download_debian_packages(root, unpacked, missing, BUNDLED_LLVM_SUITES, BUNDLED_LLVM_PACKAGES)
    return BundledClang(
        launcher=(str(zig), "clang"),
        resource_dir=(unpacked / BUNDLED_LLVM_PACKAGES[0][1]).parent.parent,
        device_lib_dir=(unpacked / BUNDLED_LLVM_PACKAGES[1][1]).parent,
        origin=(
            f"zig clang ({origin}) + Debian trixie libclang-common-22-dev + Debian sid rocm-device-libs-21"
        ),
    )


# ---------------------------------------------------------------------------------------------------------
# tvm-ffi headers


def installed_tvm_ffi_include_dirs() -> tuple[pathlib.Path, ...] | None:
    """tvm-ffi's header folders from the installed package, located without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = pathlib.Path(next(iter(spec.submodule_search_locations)))
    include = package_dir / "include"
    if (include / "tvm" / "ffi" / "function.h").is_file() and (include / "dlpack" / "dlpack.h").is_file():
        return (include,)
    return None


def ensure_tvm_ffi_headers(
    cache_dir: pathlib.Path, version: str = DEFAULT_TVM_FFI_VERSION, allow_fetch: bool = True
) -> tuple[pathlib.Path, ...]:
    """Header folders of apache-tvm-ffi ``version``, unpacked from its wheel into the cache."""
    root = cache_dir / f"tvm-ffi-{version}"
    include = root / "unpacked" / "tvm_ffi" / "include"
    if (include / "tvm" / "ffi" / "function.h").is_file():
        return (include,)
    if not allow_fetch:
        raise FetchError(
            f"tvm-ffi headers not found in {include} and fetching is disabled; install "
            f"apache-tvm-ffi=={version} or pass --tvm-ffi-include DIR"
        )
    announce_downloads(cache_dir)
    wheel = pip_download(f"apache-tvm-ffi=={version}", root / "download")
    _extract_members(wheel, root / "unpacked", lambda name: name.startswith("tvm_ffi/include/"))
    if not (include / "tvm" / "ffi" / "function.h").is_file():
        raise FetchError(f"{wheel.name} has no tvm_ffi/include/tvm/ffi/function.h")
    return (include,)


# ---------------------------------------------------------------------------------------------------------
# nvdisasm


def ensure_nvdisasm(cache_dir: pathlib.Path, allow_fetch: bool = True) -> pathlib.Path:
    """An ``nvdisasm`` binary: on PATH, next to nvcc in the CUDA toolkit, or from the PyPI wheel."""
    on_path = shutil.which("nvdisasm")
    if on_path:
        return pathlib.Path(on_path)
    for cuda_root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cuda_root and (pathlib.Path(cuda_root) / "bin" / "nvdisasm").is_file():
            return pathlib.Path(cuda_root) / "bin" / "nvdisasm"
    root = cache_dir / "nvdisasm"
    binary = root / "unpacked" / "nvidia" / "cu13" / "bin" / "nvdisasm"
    if not binary.is_file():
        if not allow_fetch:
            raise FetchError(
                "nvdisasm not found (not on PATH, not in $CUDA_HOME/bin) and fetching is disabled; "
                "pip download --no-deps nvidia-cuda-nvdisasm and pass --nvdisasm PATH"
            )
        announce_downloads(cache_dir)
        wheel = pip_download("nvidia-cuda-nvdisasm", root / "download")
        _extract_members(wheel, root / "unpacked", lambda name: name.endswith("/bin/nvdisasm"))
        found = sorted((root / "unpacked").rglob("nvdisasm"))
        if not found:
            raise FetchError(f"{wheel.name} has no bin/nvdisasm")
        binary = found[0]
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


# ---------------------------------------------------------------------------------------------------------
# sglang sources


def _archive_names(archive: pathlib.Path) -> list[str]:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            return zipped.namelist()
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tarred:
            return tarred.getnames()
    raise FetchError(f"{archive} is neither a wheel/zip nor a tar archive")


def _extract_members(archive: pathlib.Path, dest: pathlib.Path, wanted: Callable[[str], bool]) -> None:
    """Extract the members of a zip or tar archive whose names ``wanted`` accepts."""
    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            for name in zipped.namelist():
                if wanted(name) and not name.endswith("/"):
                    zipped.extract(name, dest)
        return
    with tarfile.open(archive) as tarred:
        members = [member for member in tarred.getmembers() if member.isfile() and wanted(member.name)]
        # The "data" filter refuses absolute paths, links out of dest and device files.
        if hasattr(tarfile, "data_filter"):
            tarred.extractall(dest, members=members, filter="data")
        else:  # Python < 3.10.12 has no extraction filters; the members are plain files checked above.
            for member in members:
                if member.name.startswith("/") or ".." in pathlib.PurePosixPath(member.name).parts:
                    raise FetchError(f"{archive}: refusing member {member.name}")
            tarred.extractall(dest, members=members)


def extract_sglang_kernels(archive: pathlib.Path, cache_dir: pathlib.Path) -> pathlib.Path:
    """Extract ``kernels/jit/{csrc,include}`` of an sglang wheel or sdist; returns the ``jit`` folder."""
    names = _archive_names(archive)
    marker = next((name for name in names if name.endswith(HICACHE_CUH_SUFFIX)), None)
    if marker is None:
        raise FetchError(f"{archive} contains no {HICACHE_CUH_SUFFIX}")
    prefix = marker[: -len("csrc/kvcacheio/hicache.cuh")]  # ".../sglang/kernels/jit/"
    stamp = f"{archive.name}-{archive.stat().st_size}"
    dest = cache_dir / "sglang-src" / stamp
    jit_dir = dest / prefix
    # sglang/_version.py names the release; it sits two levels above kernels/jit.
    version_file = prefix[: -len("kernels/jit/")] + "_version.py"
    if not (jit_dir / "csrc" / "kvcacheio" / "hicache.cuh").is_file() or not (dest / version_file).is_file():
        _extract_members(
            archive,
            dest,
            lambda name: name.startswith((prefix + "csrc/", prefix + "include/")) or name == version_file,
        )
    return jit_dir


def fetch_sglang_archive(cache_dir: pathlib.Path, version: str = DEFAULT_SGLANG_VERSION) -> pathlib.Path:
    """Download sglang ``version`` (wheel or sdist, whichever pip picks) into the cache, once."""
    download_dir = cache_dir / "sglang-download" / version
    existing = find_cached_sglang_archive(cache_dir, version)
    if existing is not None:
        return existing
    announce_downloads(cache_dir)
    return pip_download(f"sglang=={version}", download_dir)


def find_cached_sglang_archive(cache_dir: pathlib.Path, version: str) -> pathlib.Path | None:
    download_dir = cache_dir / "sglang-download" / version
    if not download_dir.is_dir():
        return None
    for candidate in sorted(download_dir.iterdir()):
        if candidate.name.startswith(f"sglang-{version}") and candidate.suffix in (".whl", ".gz", ".zip"):
            return candidate
    return None


# ---------------------------------------------------------------------------------------------------------
# What a first run downloads, said before it starts

# The ISA check's only network use, fetched once into the cache. Sizes as measured for the x86_64 files; the
# Debian share is the package lists (trixie and sid, read by a private apt state) and four .debs.
DOWNLOAD_PLAN = (
    ("PyPI", f"{ZIGLANG_REQUIREMENT} (clang 22, for gfx950)", 101),
    ("PyPI", f"sglang=={DEFAULT_SGLANG_VERSION} wheel (its kernel sources are read; it is not installed)", 39),
    ("PyPI", f"apache-tvm-ffi=={DEFAULT_TVM_FFI_VERSION} wheel (headers)", 3),
    ("Debian", "trixie + sid package lists and 4 .debs: HIP headers, ROCm device libraries, clang 22's HIP "
               "headers", 500),
)
_announced = False


def download_notice(cache_dir: pathlib.Path) -> str:
    """What a first run fetches, how big, where it goes, and how to pre-fetch, mirror or avoid it."""
    items = "; ".join(f"{what} ~{size} MB from {'the pip index' if origin == 'PyPI' else _debian_mirror()}"
                      for origin, what, size in DOWNLOAD_PLAN)
    total = sum(size for _origin, _what, size in DOWNLOAD_PLAN)
    return (
        f"hicache-fuzz isa: first use of the ISA cache {cache_dir}: downloading what the check compiles against, "
        f"once, about {total} MB in all: {items}. Pre-fetch it (e.g. in a CI cache step) with `python -m "
        f"hicache_fuzz.harness.isa.fetch {cache_dir}`; a mirror: PIP_INDEX_URL for the wheels, "
        f"{DEBIAN_MIRROR_ENV}=URL for the Debian packages; none of it: `gate --offline` / `isa --no-fetch` use "
        "only what the cache holds and name what is missing."
    )


def announce_downloads(cache_dir: pathlib.Path) -> None:
    """Print the download notice on stderr once per process (also when stderr is not a terminal: CI logs)."""
    global _announced
    if not _announced:
        _announced = True
        print(download_notice(cache_dir), file=sys.stderr, flush=True)


def report_offline(cache_dir: pathlib.Path, platform: str, who: str) -> list[str]:
    """Offline: say on stderr what the cache lacks for `platform` (nothing when it is complete); returns it."""
    missing = missing_from_cache(cache_dir, platform)
    if missing:
        print(f"hicache-fuzz {who}: the ISA cache {cache_dir} lacks {'; '.join(missing)}. Nothing is downloaded; "
              f"what needs them is reported unavailable or skipped. Fetch them where there is network: `python -m "
              f"hicache_fuzz.harness.isa.fetch {cache_dir}` (or copy that folder here).", file=sys.stderr, flush=True)
    return missing


def missing_from_cache(cache_dir: pathlib.Path, platform: str = "rocm") -> list[str]:
    """What the check for `platform` would still have to download into `cache_dir` (empty: nothing)."""
    missing: list[str] = []
    if platform == "rocm":
        unpacked = cache_dir / "rocm" / "unpacked"
        missing += [f"{package} (Debian {HIP_DEBIAN_SUITE})" for package, proof in ROCM_DEVICE_PACKAGES
                    if not (unpacked / proof).is_file()]
        cached_zig = cache_dir / "llvm-22" / "ziglang" / "unpacked" / "ziglang" / "zig"
        if installed_zig() is None and not cached_zig.is_file():
            missing.append(f"{ZIGLANG_REQUIREMENT} (PyPI; or pip install it)")
        llvm_unpacked = cache_dir / "llvm-22" / "unpacked"
        missing += [f"{package} (Debian {BUNDLED_LLVM_SUITES[package]})"
                    for package, proof in BUNDLED_LLVM_PACKAGES if not (llvm_unpacked / proof).is_file()]
    tvm_header = cache_dir / f"tvm-ffi-{DEFAULT_TVM_FFI_VERSION}" / "unpacked" / "tvm_ffi" / "include" / "tvm"
    if installed_tvm_ffi_include_dirs() is None and not (tvm_header / "ffi" / "function.h").is_file():
        missing.append(f"apache-tvm-ffi=={DEFAULT_TVM_FFI_VERSION} headers (PyPI)")
    if find_cached_sglang_archive(cache_dir, DEFAULT_SGLANG_VERSION) is None:
        missing.append(f"sglang=={DEFAULT_SGLANG_VERSION} wheel (PyPI; not needed where sglang is installed)")
    return missing



def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.isa.fetch [CACHE_DIR]``: fetch everything ahead of time (CI)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m hicache_fuzz.harness.isa.fetch",
        description="Fetch what the static ISA check compiles against (HIP headers, ROCm device libraries, "
        "clang 22, tvm-ffi headers, sglang's kernel sources) into the cache, ahead of time.",
    )
    parser.add_argument("cache_dir", nargs="?", type=pathlib.Path, default=None, metavar="CACHE_DIR",
                        help="default: $HICACHE_FUZZ_CACHE_DIR/isa, else ~/.cache/hicache-fuzz/isa")
    cache_dir = parser.parse_args(argv).cache_dir or default_cache_dir()
    try:
        rocm = ensure_rocm_device_files(cache_dir)
        try:
            bundled: BundledClang | str = ensure_bundled_clang(cache_dir)
        except FetchError as error:  # gfx950 is then reported skipped by the check, with this reason
            bundled = str(error)
        tvm = ensure_tvm_ffi_headers(cache_dir)
        archive = fetch_sglang_archive(cache_dir)
        jit_dir = extract_sglang_kernels(archive, cache_dir)
    except FetchError as error:
        print(f"isa_fetch: {error}", file=sys.stderr)
        return 3
    print(f"HIP headers: {', '.join(map(str, rocm.include_dirs))}; device libraries: {rocm.device_lib_dir}")
    if isinstance(bundled, BundledClang):
        print(f"clang {BUNDLED_CLANG_MAJOR} for gfx950: {' '.join(bundled.launcher)}; {bundled.origin}")
    else:
        print(f"clang {BUNDLED_CLANG_MAJOR} for gfx950 unavailable (gfx950 will be skipped): {bundled}")
    print(f"tvm-ffi headers: {', '.join(map(str, tvm))}")
    print(f"sglang {DEFAULT_SGLANG_VERSION}: {archive} -> {jit_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
