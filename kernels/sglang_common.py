"""Shared plumbing of the sglang backends: lazy import, probing, platform rules, path spying, compile budget.

Nothing here imports sglang (or touches a GPU) at module import time: every sglang import happens inside a
function, so ``hicache-fuzz backends`` works on a CPU-only machine and reports the sglang backends as
unavailable with the reason.

Path spying. sglang picks the implementation internally (register vs TMA kernel, staged write-back, AOT
fallback), so a backend cannot know which one ran from the call it made. :func:`install_spies` wraps the JIT
module factories of ``sglang.kernels.ops.kvcache.hicache`` (``_jit_hicache_module`` -> register,
``_jit_hicache_tma_module`` -> TMA, ...) so that every ``launch*`` call on a module they return is recorded,
and wraps the AOT ops the host-pool modules imported (``transfer_kv_*``). A backend runs inside
:func:`recording` and returns :func:`path_of` the recorded events; the runner compares that with its plan.

The factories are wrapped with our own per-key memo that also remembers failures: sglang's ``cache_once``
does not cache exceptions, so a row size that does not compile would cost one nvcc run (8-10 s) per case.
The memo also measures compile time (the first call per key), reported separately from run time, and
keeps compile refusals on disk for the next process (:mod:`refused_builds`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model import copy_rules, jit_gate
from hicache_fuzz.kernels.base import Availability
from hicache_fuzz.kernels.compile_books import SGLANG_BOOKS
from hicache_fuzz.kernels.refused_builds import RefusedBuilds
from hicache_fuzz.oracles.contract import Platform

SGLANG_VERSION = "0.5.23"
HICACHE_MODULE = "sglang.kernels.ops.kvcache.hicache"
TMA_ENV = "SGLANG_HICACHE_TMA_TRANSFER"
# sglang 0.5.23's staging chunk, used when sglang is not importable (pool_host/base.py:30); hicache.py's copy rounds,
# block quotas and TMA stage fall back to harness/model/copy_rules.py
STAGING_PAGE_CHUNK = 64

# Path names returned by run() and predicted by plan().
REGISTER, TMA, STAGED, PAGE_UNIFIED = "jit-register", "jit-tma", "jit-staged", "jit-page-unified"


class SglangUnavailable(RuntimeError):
    """sglang (or a GPU) is missing; the message is the reason shown by `hicache-fuzz backends`."""


# ---- lazy import and probe ----------------------------------------------------------------------------

_import_lock = threading.Lock()
_hicache: Any = None
_import_error: str | None = None


def hicache() -> Any:
    """The imported ``sglang.kernels.ops.kvcache.hicache`` module (spies installed); raises SglangUnavailable."""
    global _hicache, _import_error
    with _import_lock:
        if _hicache is not None:
            return _hicache
        if _import_error is not None:
            raise SglangUnavailable(_import_error)
        try:
            import importlib

            module = importlib.import_module(HICACHE_MODULE)
        except Exception as exc:  # ImportError, missing CUDA libs, a broken transitive dependency
            _import_error = f"cannot import {HICACHE_MODULE}: {type(exc).__name__}: {exc}"
            raise SglangUnavailable(_import_error) from None
        missing = missing_hooks(module)
        if missing:
            # Without these the path spy (or the rules) would silently switch off: refuse instead.
            _import_error = (
                f"{sglang_origin()} lacks what the harness hooks into (written against sglang {SGLANG_VERSION}): "
                f"{', '.join(missing)}"
            )
            raise SglangUnavailable(_import_error)
        _install_jit_spies(module)
        _hicache = module
        return module


def sglang_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("sglang")
    except Exception:
        return None


def sglang_origin() -> str:
    """Which sglang is under test: version, folder and, for a source checkout, its git commit."""
    import importlib.util

    version = sglang_version() or "(version unknown: no installed metadata)"
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return f"sglang {version}"
    folder = Path(spec.origin).resolve().parent
    commit = _checkout_commit(folder)
    return f"sglang {version} at {folder}" + (f", git commit {commit}" if commit else "")


def _checkout_commit(package_folder: Path) -> str | None:
    """HEAD of the sglang checkout the package is imported from (``<checkout>/python/sglang``), else None.

    The layout check keeps a site-packages folder that merely lies inside some other git repository from
    reporting that repository's commit."""
    try:
        done = subprocess.run(["git", "-C", str(package_folder), "rev-parse", "--show-toplevel", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        return None
    toplevel, commit = Path(lines[0]).resolve(), lines[1]
    return commit[:12] if toplevel / "python" / "sglang" == package_folder else None


def gpu_reason(platform: Platform) -> str | None:
    """Why there is no usable GPU for sglang's kernels (None if there is one)."""
    import torch

    if platform.kind == "cpu":
        if not torch.cuda.is_available():
            return f"no GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False)"
        return "the CPU platform was selected (run with --platform cuda or rocm)"
    if not torch.cuda.is_available():
        return f"no GPU: torch {torch.__version__} sees none"
    return None


def probe_sglang(platform: Platform) -> Availability:
    """Available iff a GPU is there and sglang's HiCache module imports."""
    why = gpu_reason(platform)
    if why is not None:
        return Availability(False, why)
    version = sglang_version()
    try:
        module = hicache()
    except SglangUnavailable as exc:
        return Availability(False, str(exc))
    missing = missing_pool_base_hooks()
    if missing:
        return Availability(False, f"{sglang_origin()} lacks what the harness hooks into: {', '.join(missing)}")
    rules = platform_rules(platform)
    note = "" if version == SGLANG_VERSION else f" (WARNING: harness models {SGLANG_VERSION})"
    drift = rules_drift(platform)
    return Availability(
        True,
        f"{sglang_origin()}{note}, {module.__name__}; {rules.describe()}" + (f"; RULE DRIFT: {drift}" if drift else ""),
    )


# ---- platform rules, read from sglang where possible ----------------------------------------------------


@dataclass(frozen=True)
class Rules:
    group_bytes: tuple[int, ...]
    block_quota: int
    tma_block_quota: int
    tma_stage_bytes: int
    staging_page_chunk: int
    source: str  # "sglang" or "fallback"

    def describe(self) -> str:
        return (
            f"GROUP_BYTES={self.group_bytes} DEFAULT_BLOCK_QUOTA={self.block_quota} "
            f"TMA_BLOCK_QUOTA={self.tma_block_quota} staging chunk {self.staging_page_chunk} pages "
            f"[{self.source}]"
        )


def _module_matches_platform(module: Any, platform: Platform) -> bool:
    return bool(getattr(module, "_is_hip", False)) == platform.is_hip


def platform_rules(platform: Platform) -> Rules:
    """The register-kernel copy rounds and block quotas for `platform`.

    sglang computes them at import from ``torch.version.hip``; when the imported module was built for the
    same platform kind they are read from it, otherwise (no sglang, or modelling the other platform) the
    harness's contract constants are used.
    """
    module = _hicache
    if module is not None and platform.kind != "cpu" and _module_matches_platform(module, platform):
        return Rules(
            tuple(module.GROUP_BYTES),
            int(module.DEFAULT_BLOCK_QUOTA),
            int(module.TMA_BLOCK_QUOTA),
            int(module.TMA_STAGE_BYTES),
            _staging_chunk(),
            "sglang",
        )
    groups = copy_rules.group_bytes(platform.is_hip)
    quota = copy_rules.block_quota(platform.is_hip)
    return Rules(
        tuple(groups), quota, copy_rules.TMA_BLOCK_QUOTA, copy_rules.TMA_MAX_ROW_BYTES, STAGING_PAGE_CHUNK, "fallback"
    )


def _staging_chunk() -> int:
    try:
        from sglang.srt.mem_cache.pool_host.base import _WRITE_BACK_STAGING_PAGE_CHUNK

        return int(_WRITE_BACK_STAGING_PAGE_CHUNK)
    except Exception:
        return STAGING_PAGE_CHUNK


def rules_drift(platform: Platform) -> str:
    """Differences between sglang's rules and the contract's constants ('' if none or not comparable)."""
    rules = platform_rules(platform)
    if rules.source != "sglang":
        return ""
    expected = copy_rules.group_bytes(platform.is_hip)
    out = []
    if tuple(expected) != rules.group_bytes:
        out.append(f"contract GROUP_BYTES {expected} != sglang {rules.group_bytes}")
    if rules.tma_stage_bytes != copy_rules.TMA_MAX_ROW_BYTES:
        out.append(f"contract TMA_MAX_ROW_BYTES {copy_rules.TMA_MAX_ROW_BYTES} != sglang {rules.tma_stage_bytes}")
    return "; ".join(out)


def default_unroll(row_bytes: int) -> int:
    return copy_rules.register_unroll(row_bytes)


def register_row_ok(row_bytes: int, platform: Platform, unroll: int | None = None) -> bool:
    """`_tiles_across_lanes` (harness/model/jit_gate.py) with the platform's copy rounds as sglang states them."""
    return jit_gate.register_tiles_row(row_bytes, platform, unroll, platform_rules(platform).group_bytes)


def tma_env_enabled() -> bool:
    value = os.environ.get(TMA_ENV)
    return value is None or value.strip().lower() not in ("0", "false", "no", "off", "")


def tma_selected(row_bytes: int, page_size: int | None, platform: Platform, mode: str | None = None) -> bool:
    """Prediction of ``use_hicache_tma_kernel`` (hicache.py:122-144) under a forcing `mode`.

    mode None follows the environment (as the process's cached gate does), "off" forces the register kernel,
    "on" evaluates the gate with the environment switch on (harness/model/jit_gate.py, with the TMA stage as
    sglang states it). ``fits_device`` is assumed true on sm90+.
    """
    if mode == "off" or (mode is None and not tma_env_enabled()):
        return False
    return jit_gate.tma_takes_row(row_bytes, page_size, platform, platform_rules(platform).tma_stage_bytes)


# ---- spies ------------------------------------------------------------------------------------------------

_events: list[str] | None = None
_compile_lock = threading.Lock()
BOOKS = SGLANG_BOOKS  # compile seconds, modules built, background seconds (kernels/compile_books.py)
_tma_mode = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collect the implementation events of the calls made inside the block."""
    global _events
    previous, _events = _events, []
    try:
        yield _events
    finally:
        _events = previous


def record(event: str) -> None:
    if _events is not None:
        _events.append(event)


def path_of(events: Iterable[str]) -> str:
    """The path string for a list of events: unique events in first-seen order, joined by '+'."""
    seen: list[str] = []
    for e in events:
        if e not in seen:
            seen.append(e)
    return "+".join(seen) if seen else "none"


class _LaunchSpy:
    """Wraps a JIT module; records `path` whenever one of its launch* entry points is called."""

    def __init__(self, module: Any, path: str) -> None:
        self._module = module
        self._path = path

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._module, name)
        if not name.startswith("launch"):
            return target

        def launch(*args: Any, **kwargs: Any) -> Any:
            record(self._path)
            return target(*args, **kwargs)

        return launch


def _memo_factory(original: Callable[..., Any], path: str, label: str,
                  refused: RefusedBuilds | None = None) -> Callable[..., Any]:
    results: dict[Any, Any] = {}
    failures: dict[Any, BaseException] = {}
    key_locks: dict[Any, threading.Lock] = {}

    def factory(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        if key in results:
            return results[key]
        if key in failures:
            raise failures[key]
        with _compile_lock:
            key_lock = key_locks.setdefault(key, threading.Lock())
        # One build per key: warm-up threads of several backends ask for the same modules at once, and a
        # build that fails (rows sglang refuses at compile time) leaves nothing on disk for the others to find.
        # Across processes, the module's lock (refused_builds.building): one builds, the others wait for it.
        with key_lock, refused.building(label, key) if refused is not None else contextlib.nullcontext():
            if key in results:
                return results[key]
            if key in failures:
                raise failures[key]
            # A refusal another process already paid nvcc for (kernels/refused_builds.py): the same error, now.
            recorded = refused.lookup(label, key) if refused is not None else None
            if recorded is not None:
                failures[key] = recorded
                raise recorded
            started = time.perf_counter()
            try:
                module = original(*args, **kwargs)
            except Exception as exc:
                failures[key] = exc
                if refused is not None:
                    refused.record(label, key, exc)
                raise
            finally:
                BOOKS.record(f"{label}{args or ''}{dict(kwargs)}", time.perf_counter() - started)
            results[key] = _LaunchSpy(module, path)
            return results[key]

    factory.__wrapped__ = original  # type: ignore[attr-defined]
    factory.hicache_fuzz_spy = True  # type: ignore[attr-defined]
    return factory


_FACTORIES = {
    "_jit_hicache_module": REGISTER,
    "_jit_hicache_tma_module": TMA,
    "_jit_hicache_staged_module": STAGED,
    "_jit_hicache_page_unified_module": PAGE_UNIFIED,
    "_jit_page_unified_write_back": PAGE_UNIFIED,
}

# Everything private the harness needs from sglang's HiCache module: the factories it wraps to spy on the path
# taken, the TMA gate it forces, the rule constants it reads (and ``_is_hip``, which says whose rules they
# are). Checked when sglang is imported: a missing name makes every sglang backend unavailable with the
# reason, because a renamed factory would otherwise leave its path unspied and the rules unread.
REQUIRED_HOOKS: tuple[str, ...] = (
    *_FACTORIES, "use_hicache_tma_kernel", "_is_hip", "GROUP_BYTES", "DEFAULT_BLOCK_QUOTA", "TMA_BLOCK_QUOTA",
    "TMA_STAGE_BYTES",
)
POOL_BASE_MODULE = "sglang.srt.mem_cache.pool_host.base"
POOL_BASE_HOOKS: tuple[str, ...] = ("_WRITE_BACK_STAGING_PAGE_CHUNK",)


def missing_hooks(module: Any) -> list[str]:
    """The names of REQUIRED_HOOKS that `module` (sglang's HiCache module) lacks, qualified."""
    return [f"{module.__name__}.{name}" for name in REQUIRED_HOOKS if not hasattr(module, name)]


def missing_pool_base_hooks() -> list[str]:
    """POOL_BASE_HOOKS the host-pool base module lacks (none when it does not import: the pool backend's own
    probe reports that)."""
    import importlib

    try:
        base = importlib.import_module(POOL_BASE_MODULE)
    except Exception:
        return []
    return [f"{POOL_BASE_MODULE}.{name}" for name in POOL_BASE_HOOKS if not hasattr(base, name)]


def _install_jit_spies(module: Any) -> None:
    refused = RefusedBuilds(getattr(module, "__file__", None))  # keyed by this sglang tree's sources
    for name, path in _FACTORIES.items():
        original = getattr(module, name, None)
        if original is None or getattr(original, "hicache_fuzz_spy", False):
            continue
        setattr(module, name, _memo_factory(original, path, name, refused))
    gate = module.use_hicache_tma_kernel
    if getattr(gate, "hicache_fuzz_spy", False):
        return
    uncached = getattr(gate, "__wrapped__", gate)

    def use_hicache_tma_kernel(**kwargs: Any) -> bool:
        mode = getattr(_tma_mode, "mode", None)
        if mode == "off":
            return False
        if mode == "on":
            saved = os.environ.get(TMA_ENV)
            os.environ[TMA_ENV] = "1"
            try:
                return bool(uncached(**kwargs))
            finally:
                if saved is None:
                    os.environ.pop(TMA_ENV, None)
                else:
                    os.environ[TMA_ENV] = saved
        return bool(gate(**kwargs))  # sglang's own gate: env read once per argument tuple (cache_once)

    use_hicache_tma_kernel.hicache_fuzz_spy = True  # type: ignore[attr-defined]
    module.use_hicache_tma_kernel = use_hicache_tma_kernel


@contextlib.contextmanager
def tma_forced(mode: str | None) -> Iterator[None]:
    """Force sglang's TMA gate 'on' (env switch on, rest of the rule applies) or 'off'; None leaves it."""
    previous = getattr(_tma_mode, "mode", None)
    _tma_mode.mode = mode
    try:
        yield
    finally:
        _tma_mode.mode = previous


_AOT_SPIED: set[str] = set()


def spy_aot_ops(module: Any) -> None:
    """Wrap every ``transfer_kv_*`` callable a module imported so that calling it records ``aot:<name>``."""
    if module.__name__ in _AOT_SPIED:
        return
    for name in dir(module):
        if not name.startswith("transfer_kv"):
            continue
        original = getattr(module, name)
        if not callable(original):
            continue

        def make(op: Callable[..., Any], op_name: str) -> Callable[..., Any]:
            def aot_op(*args: Any, **kwargs: Any) -> Any:
                record(f"aot:{op_name}")
                return op(*args, **kwargs)

            return aot_op

        setattr(module, name, make(original, name))
    _AOT_SPIED.add(module.__name__)


# ---- compile budget ---------------------------------------------------------------------------------------


def compile_parallel(jobs: Iterable[Callable[[], Any]], workers: int | None = None) -> float:
    """Run compile jobs in threads (nvcc runs out of process); wall seconds. Failures are remembered by the
    memo and surface when a case needs that module."""
    jobs = list(jobs)
    if not jobs:
        return 0.0
    started = time.perf_counter()

    def run(job: Callable[[], Any]) -> None:
        with contextlib.suppress(Exception):
            job()

    with ThreadPoolExecutor(max_workers=workers or min(16, len(jobs))) as pool:
        list(pool.map(run, jobs))
    return time.perf_counter() - started


_background: ThreadPoolExecutor | None = None
_background_lock = threading.Lock()


def compile_in_background(make_jobs: Callable[[], Iterable[Callable[[], Any]]], workers: int = 4) -> None:
    """Build the jobs `make_jobs` returns in a background thread and return at once (menu growth: the next
    rows compile while cases run). The jobs are made in the thread too: making them imports sglang, which a
    crash-isolated campaign's parent process has not done yet. A failed compile is memoized like any other;
    the built module lands in sglang's on-disk JIT cache, where the worker processes find it."""
    global _background

    def batch() -> None:
        started = time.perf_counter()
        with contextlib.suppress(Exception):
            compile_parallel(make_jobs(), workers)
        BOOKS.add_background(time.perf_counter() - started)

    with _background_lock:
        if _background is None:  # one batch at a time: growth stages are minutes apart
            _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hicache-fuzz-prefetch")
        _background.submit(batch)


# ---- small tensor helpers ---------------------------------------------------------------------------------


def ptr_table(tensors: Iterable[Any], device: Any) -> Any:
    """A uint64 device tensor of the tensors' device-accessible base addresses (one per layer)."""
    import torch

    from hicache_fuzz.kernels.buffers import to_device

    # Staged as int64 (the same bits): pinning and copying work on every dtype torch has had a while.
    table = torch.tensor([host_alias(t) for t in tensors], dtype=torch.uint64).view(torch.int64)
    return to_device(table, torch.device(device)).view(torch.uint64)


def host_alias(tensor: Any) -> int:
    """Address a kernel may dereference: the data pointer for device memory; for registered host memory the
    device alias (equal to the VA on CUDA with UVA; different on ROCm, so ask the runtime there)."""
    import torch

    ptr = int(tensor.data_ptr())
    if tensor.device.type != "cpu" or not getattr(torch.version, "hip", None):
        return ptr
    try:  # ROCm: hipHostGetDevicePointer through sglang's AOT helper when it loads
        from sgl_kernel.kvcacheio import get_device_accessible_ptr

        # sglang-kernel 0.4.10 signature: (tensor, device_index of the GPU that will dereference it)
        return int(get_device_accessible_ptr(tensor, torch.cuda.current_device()))
    except Exception:
        return ptr


def index_device_ok(tensor: Any) -> bool:
    return bool(tensor.is_cuda)


_PLATFORMS: dict[str, Platform] = {}


def platform_of(buffers: Any) -> Platform:
    """The platform of the process running `buffers` (a Materialized): for the rules a call depends on (the
    staging chunk). Asked of torch once per device."""
    key = str(buffers.device)
    if key not in _PLATFORMS:
        import torch

        if buffers.device.type == "cpu":
            _PLATFORMS[key] = Platform("cpu")
        else:
            kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
            _PLATFORMS[key] = Platform(kind, torch.cuda.get_device_capability(buffers.device))
    return _PLATFORMS[key]


# ---- pinned host registrations of a failed construction ------------------------------------------------

HOST_POOL_COMMON = "sglang.srt.mem_cache.pool_host.common"
# Held while a block's wrapper is installed: blocks in other threads wait, so each restores the function it found.
_registrations_lock = threading.RLock()


@contextlib.contextmanager
def registrations_released_on_failure(common: Any = None) -> Iterator[None]:
    """Unregister the host buffers sglang pinned inside this block if the block raises.

    sglang's host pools pin their buffers (``cudaHostRegister``, through ``pool_host/common.py``'s
    ``_cuda_host_register``) in their constructors and unpin them only in ``destroy()``. A constructor that raises
    after pinning leaves no object to destroy, and the registration outlives the buffer: the next buffer torch
    hands out at that address cannot be pinned (``cudaErrorHostMemoryAlreadyRegistered``), so every later case
    in the process would fail for a reason that is not its own. The buffers pinned while the block runs are
    noted (sglang's own function still pins them) and unpinned with sglang's ``_cuda_host_unregister`` if the
    block raises. `common` is that module (imported when not given; absent from sglang builds that have no
    such module, where this does nothing)."""
    if common is None:
        import importlib

        try:
            common = importlib.import_module(HOST_POOL_COMMON)
        except ImportError:
            common = None
    if getattr(common, "_cuda_host_register", None) is None or getattr(common, "_cuda_host_unregister", None) is None:
        yield
        return
    pinned: list[Any] = []
    with _registrations_lock:
        register, unregister = common._cuda_host_register, common._cuda_host_unregister

        def noting(buffer: Any, *args: Any, **kwargs: Any) -> None:
            register(buffer, *args, **kwargs)
            pinned.append(buffer)

        common._cuda_host_register = noting
        try:
            yield
        except BaseException:
            for buffer in pinned:
                unregister(buffer)
            raise
        finally:
            common._cuda_host_register = register
