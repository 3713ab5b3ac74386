"""The sglang call of a standalone reproducer, per backend: the lines of Python that hand the case's tensors to
sglang, in the body of ``call_sglang(raw, host_idx, dev_idx)`` of the generated script (see
:mod:`hicache_fuzz.harness.findings.standalone`), which has ``typed(raw, pool, side)``, ``ptrs(tensors)``,
``DEVICE``, ``torch`` and ``os`` in scope.

For the kernel backends the call is not written here: it is the backend's own ``sglang_calls(case, platform)``
(kernels/sglang_call.py), the definition the backend runs, printed as source; this module adds only the import
and, for the JIT family, the TMA gate's environment switch the backend sets around its call. ``sglang-pool``
drives sglang's pool objects and has its own script section (standalone_pool.py), and so does
``sglang-page-unified``, whose calls take the host buffer of sglang's own host pools (standalone_page_unified.py).

``CALLS`` is keyed by backend name; a backend outside it gets no standalone script.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hicache_fuzz.harness.findings.standalone_page_unified import page_unified_call
from hicache_fuzz.harness.findings.standalone_pool import pool_call
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels import sglang_common
from hicache_fuzz.kernels.sglang_aot import SglangAotBackend
from hicache_fuzz.kernels.sglang_call import SglangCall
from hicache_fuzz.kernels.sglang_jit import SglangJitBackend, SglangJitRegisterBackend, SglangJitTmaBackend
from hicache_fuzz.kernels.sglang_staged import SglangStagedBackend
from hicache_fuzz.oracles.contract import Platform

CallTemplate = Callable[[Case, Platform], str]

HICACHE_IMPORT = ["from sglang.kernels.ops.kvcache import hicache"]

# The prebuilt sgl_kernel loads only against the torch it was built for: against another its import fails
# (ImportError or OSError: an undefined torch symbol). The script cannot run the op then: exit 3 (SKIP) with
# the reason and this torch's version. An import-only stand-in's ops raise NotImplementedError naming
# themselves when called (also a SKIP).
AOT_IMPORT = [
    "try:  # the prebuilt AOT ops load only against the torch they were built for",
    "    import sgl_kernel.kvcacheio as kvcacheio",
    "except Exception as exc:",
    "    if isinstance(exc, ModuleNotFoundError) and (exc.name or '').split('.')[0] == 'sgl_kernel':",
    "        raise  # absent, not broken: the SKIP line names sgl_kernel",
    '    raise ImportError(f"sgl_kernel (the AOT ops) does not load against torch {torch.__version__}: "',
    '                      f"{type(exc).__name__}: {exc}") from exc',
]




class _DescribesCalls(Protocol):
    def sglang_calls(self, case: Case, platform: Platform) -> list[SglangCall]: ...


def _calls(backend: _DescribesCalls, case: Case, platform: Platform) -> list[str]:
    return [call.source() for call in backend.sglang_calls(case, platform)]


def _tma_switch(mode: str | None) -> list[str]:
    """What the JIT backends' tma_forced(mode) does, as the script's environment switch."""
    if mode is None:
        return [f"# sglang's own TMA gate decides: {sglang_common.TMA_ENV} as in your environment (unset: on)"]
    value, what = ("0", "off: the register kernel") if mode == "off" else ("1", "on (the row/page rule still applies)")
    return [f'os.environ["{sglang_common.TMA_ENV}"] = "{value}"  # TMA gate {what}; read at the first call']


def _jit(backend: SglangJitBackend) -> CallTemplate:
    def template(case: Case, platform: Platform) -> str:
        lines = [*_tma_switch(backend.tma_mode), *HICACHE_IMPORT, ""]
        if backend.page_size_arg(case) is None:
            lines.append("# page_size=None: no page size, the TMA gate trusts the indices")
        return "\n".join(lines + _calls(backend, case, platform))
    return template


def _with_import(backend: _DescribesCalls, imports: list[str]) -> CallTemplate:
    def template(case: Case, platform: Platform) -> str:
        return "\n".join([*imports, "", *_calls(backend, case, platform)])
    return template


CALLS: dict[str, CallTemplate] = {
    "sglang-jit": _jit(SglangJitBackend()),
    "sglang-jit-register": _jit(SglangJitRegisterBackend()),
    "sglang-jit-tma": _jit(SglangJitTmaBackend()),
    "sglang-staged": _with_import(SglangStagedBackend(), HICACHE_IMPORT),
    "sglang-page-unified": page_unified_call,
    "sglang-aot": _with_import(SglangAotBackend(), AOT_IMPORT),
    "sglang-pool": pool_call,
}
