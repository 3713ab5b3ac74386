"""Make ``sgl_kernel.kvcacheio`` work in this process: the real sglang-kernel if it loads, else this project's
build of the same ops (``build.py``), reached through a stand-in ``sgl_kernel`` package.

``activate()`` is what the backends call (once per process, before sglang's host-pool modules are imported:
they bind ``from sgl_kernel.kvcacheio import transfer_kv_*`` at import time). It returns an ``AotState``
saying whether the ops are callable, which implementation is in use and where it came from.

Order of preference:

1. the installed sglang-kernel, when it imports and its ops are registered (``source == "sglang-kernel"``);
2. the library built by ``build.py`` in ``$HICACHE_FUZZ_AOT_BUILD`` (default ``./.aot-build``), when it
   exists and was built against this torch (``source == "aot-build"``). Its ops are registered under
   ``torch.ops.sgl_kernel``; ``sgl_kernel.kvcacheio`` is then this project's stand-in module, whose wrappers
   forward to them with sglang's keyword names and defaults. If another import-only stand-in package is
   already imported as ``sgl_kernel``, only its ``kvcacheio`` submodule is replaced;
3. otherwise not available, with every reason on the way.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hicache_fuzz.kernels.aot_build.build import INFO_NAME, LIBRARY_NAME

BUILD_ENV = "HICACHE_FUZZ_AOT_BUILD"
STANDIN_ROOT = Path(__file__).with_name("sgl_kernel_standin")
PROBE_OP = "transfer_kv_per_layer"


@dataclass(frozen=True)
class AotState:
    available: bool
    source: str  # "sglang-kernel", "aot-build" or "none"
    reason: str  # what is in use and where it came from, or why nothing is
    info: dict[str, Any] = field(default_factory=dict)  # build_info.json of the build in use


def build_dir() -> Path:
    return Path(os.environ.get(BUILD_ENV) or ".aot-build").resolve()


def read_build(directory: Path | None = None) -> AotState:
    """Whether a usable build exists (does not load it)."""
    import torch

    directory = directory or build_dir()
    library = directory / f"{LIBRARY_NAME}.so"
    info_path = directory / INFO_NAME
    if not library.is_file() or not info_path.is_file():
        return AotState(
            False, "none",
            f"no AOT build in {directory} (not built: run python -m hicache_fuzz.kernels.aot_build.build, "
            f"or point {BUILD_ENV} at a build folder)",
        )
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return AotState(False, "none", f"unreadable {info_path}: {exc}")
    if info.get("torch") != torch.__version__:
        return AotState(
            False, "none",
            f"AOT build in {directory} was built for torch {info.get('torch')}, this is torch {torch.__version__} "
            "(C++ ABI differs: rebuild)",
            info,
        )
    return AotState(True, "aot-build", describe(directory, info), info)


def describe(directory: Path, info: dict[str, Any]) -> str:
    upstream = info.get("upstream", {})
    built = (info.get("cuda") and f"CUDA {info['cuda']}") or (info.get("hip") and f"HIP {info['hip']}") or "?"
    return (
        f"AOT build {directory / str(info.get('library', LIBRARY_NAME + '.so'))} "
        f"(sglang {upstream.get('repository', '?')}@{str(upstream.get('commit', '?'))[:12]}, "
        f"torch {info.get('torch')}, {built}, arch {info.get('arch')}, built {info.get('built_at')})"
    )


def _is_ours(module: ModuleType) -> bool:
    """True for this folder's stand-in package only, whose ``kvcacheio`` forwards to the built ops. The GPU
    bundle's import-only stand-in also declares itself a hicache-fuzz stand-in, but its ``kvcacheio`` holds
    placeholders that raise: it must have its submodule replaced, so it is told apart by where it lives."""
    try:
        return Path(str(module.__file__)).resolve().is_relative_to(STANDIN_ROOT.resolve())
    except (AttributeError, TypeError, OSError):
        return False


def _is_standin(module: ModuleType) -> bool:
    """True for this project's stand-ins and for other import-only stand-ins (placeholder attributes)."""
    # look in the module's own namespace: import-only stand-ins answer every getattr with a (truthy) placeholder
    if _is_ours(module) or vars(module).get("HICACHE_FUZZ_STANDIN") is True:
        return True
    kvcacheio = sys.modules.get(f"{module.__name__}.kvcacheio")
    op = getattr(kvcacheio, PROBE_OP, None) if kvcacheio is not None else None
    return "stub" in str(getattr(module, "__file__", "")) or type(op).__name__ == "Placeholder"


def _registered() -> bool:
    import torch

    try:
        return hasattr(torch.ops.sgl_kernel, PROBE_OP)
    except (AttributeError, RuntimeError):
        return False


def _real_sgl_kernel() -> tuple[ModuleType | None, str]:
    """(module, note): the imported sgl_kernel, or None with why it did not import."""
    try:
        module = importlib.import_module("sgl_kernel")
        importlib.import_module("sgl_kernel.kvcacheio")
    except Exception as exc:  # OSError: undefined symbol (torch ABI); ImportError: not installed
        for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
            del sys.modules[name]  # half-imported submodules must not shadow the stand-in
        return None, f"sgl_kernel does not load: {type(exc).__name__}: {str(exc)[:300]}"
    return module, ""


def _standin_kvcacheio() -> ModuleType:
    path = STANDIN_ROOT / "sgl_kernel" / "kvcacheio.py"
    spec = importlib.util.spec_from_file_location("sgl_kernel.kvcacheio", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _route_kvcacheio(package: ModuleType | None) -> None:
    """Make ``import sgl_kernel.kvcacheio`` return the stand-in wrappers (which call torch.ops.sgl_kernel)."""
    if package is None:
        sys.path.insert(0, str(STANDIN_ROOT))
        importlib.import_module("sgl_kernel")
        importlib.import_module("sgl_kernel.kvcacheio")
        return
    if _is_ours(package):
        importlib.import_module("sgl_kernel.kvcacheio")
        return
    module = _standin_kvcacheio()  # another stand-in package: replace only its kvcacheio submodule
    sys.modules["sgl_kernel.kvcacheio"] = module
    package.kvcacheio = module  # type: ignore[attr-defined]


_state: AotState | None = None


_activate_lock = threading.Lock()


def activate() -> AotState:
    """Make the AOT ops callable if at all possible (idempotent); the resulting state. Thread-safe: backends
    are probed in threads at once (pipeline/probe_cache.py), and a library loaded twice fails the second load."""
    with _activate_lock:
        return _activate()


def _activate() -> AotState:
    global _state
    if _state is not None:
        return _state
    import torch

    package, why_not = _real_sgl_kernel()
    if package is not None and not _is_standin(package) and _registered():
        version = getattr(package, "__version__", "?")
        _state = AotState(True, "sglang-kernel", f"sglang-kernel {version} ({package.__file__})")
        return _state
    if package is not None and not _is_standin(package):
        why_not = f"sgl_kernel {getattr(package, '__file__', '?')} imported but registers no {PROBE_OP}"
    elif package is not None:
        why_not = f"only an import-only sgl_kernel stand-in is installed ({getattr(package, '__file__', '?')})"
    found = read_build()
    if not found.available:
        _state = AotState(False, "none", f"{why_not}; {found.reason}", found.info)
        return _state
    library = build_dir() / f"{LIBRARY_NAME}.so"
    try:
        if not _registered():
            torch.ops.load_library(str(library))
        _route_kvcacheio(package)
    except Exception as exc:
        _state = AotState(False, "none", f"{why_not}; loading {library} failed: {type(exc).__name__}: {exc}",
                          found.info)
        return _state
    if not _registered():
        _state = AotState(False, "none", f"{library} loaded but registers no sgl_kernel.{PROBE_OP}", found.info)
        return _state
    _state = AotState(True, "aot-build", found.reason, found.info)
    return _state


def reset_for_tests() -> None:
    """Forget the cached state (tests only; a loaded library cannot be unloaded)."""
    global _state
    _state = None
