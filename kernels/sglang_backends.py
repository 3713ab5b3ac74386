"""Index of the backends that run sglang 0.5.23's real HiCache transfer code (registry family module).

Each backend lives in its own small module; none imports sglang or touches a GPU until probe()/run().

=========================  ==========================================================================
sglang-jit                 JIT one/all-layer, MHA/MLA, sglang's own TMA gate        (sglang_jit.py)
sglang-jit-register        same, TMA gate forced off: register kernel                (sglang_jit.py)
sglang-jit-tma             same, TMA gate forced on (CUDA sm90+)                     (sglang_jit.py)
sglang-staged              JIT staged write-back layer_first -> page_first           (sglang_staged.py)
sglang-page-unified        JIT page_unified load-back / staged write-back            (sglang_page_unified.py)
sglang-pool                MHA/MLA host pools, HostPoolGroup, controller placement   (sglang_pool.py)
sglang-aot                 sgl_kernel.kvcacheio AOT ops                              (sglang_aot.py)
=========================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import compile_books
from hicache_fuzz.kernels.sglang_aot import SglangAotBackend
from hicache_fuzz.kernels.sglang_jit import SglangJitBackend, SglangJitRegisterBackend, SglangJitTmaBackend
from hicache_fuzz.kernels.sglang_page_unified import SglangPageUnifiedBackend
from hicache_fuzz.kernels.sglang_pool import SglangPoolBackend
from hicache_fuzz.kernels.sglang_staged import SglangStagedBackend
from hicache_fuzz.oracles.contract import Platform

BACKENDS = (
    SglangJitBackend,
    SglangJitRegisterBackend,
    SglangJitTmaBackend,
    SglangStagedBackend,
    SglangPageUnifiedBackend,
    SglangPoolBackend,
    SglangAotBackend,
)


def warm_up_backends(backends: Iterable[Any], platform: Platform, space: CaseSpace | None = None) -> float:
    """Compile, in parallel threads, every JIT module the backends' narrowed spaces can draw; wall seconds.

    Backends that declare no compile jobs (Backend.compile_jobs), or that are unavailable, add nothing. Call it
    once before a campaign so compile time is reported apart from run time (the backends' compile books sum
    both)."""
    return compile_books.warm_up(backends, platform, space or CaseSpace())


def warm_up(
    space: CaseSpace | None = None, platform: Platform | None = None, names: Iterable[str] | None = None
) -> float:
    """warm_up(space) -> seconds: compile the menus of all (or the named) sglang backends up front."""
    if platform is None:
        from hicache_fuzz.harness.model.platform import detect

        platform = detect().platform
    chosen = [cls() for cls in BACKENDS if names is None or cls.name in set(names)]
    return warm_up_backends(chosen, platform, space)
