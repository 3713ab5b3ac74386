"""Hand-picked smoke cases for the sglang backends on a GPU: each backend's main paths (directions, scopes,
layouts, MHA and MLA, bf16 and fp8, page sizes 1 to 32) plus the inputs each backend must reject (CPU indices
where the kernel needs device ones, a row size no kernel takes, pageable host memory for the staged path).

They are few and fixed so that a GPU machine with sglang answers "does every backend work at all" in seconds,
before a campaign. tests/gpu/test_sglang_gpu.py runs them; tests/gpu/test_smoke_cases.py checks on the CPU that
each one is a valid case for a registered backend, so an edit here cannot break the GPU run unseen.
"""

from __future__ import annotations

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)

WRITE, LOAD = Direction.WRITE_BACK, Direction.LOAD_BACK
ONE, ALL = Scope.ONE_LAYER, Scope.ALL_LAYERS
LF, PF, PU = HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_UNIFIED
CPU_INT64 = IndexSpec(IndexDtype.INT64, IndexDevice.CPU)
DEVICE_INT32 = IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE)
DEVICE_INT64 = IndexSpec()  # the default: int64 on the device
JIT_BACKENDS = ("sglang-jit", "sglang-jit-register", "sglang-jit-tma")


def smoke_case(backend: str, *, direction: Direction, scope: Scope, layout: HostLayout,
               attention: Attention = Attention.MHA, dtype: KVDtype = KVDtype.BF16, row_bytes: int = 256,
               heads: int = 2, page_size: int = 16, pages: int = 3, layers: int = 2,
               host_index: IndexSpec = DEVICE_INT64, device_index: IndexSpec = DEVICE_INT64, head_groups: int = 1,
               tuning: dict[str, int | str | bool] | None = None, pools: tuple[PoolSpec, ...] | None = None,
               reverse: bool = True, allocator: HostAllocator = HostAllocator.PIN_MEMORY) -> Case:
    """A case moving `pages` whole pages of the last layer: host pages taken from the end of a host pool one page
    larger than needed (reversed unless `reverse` is False, so the index order differs from the storage order),
    device pages 1..pages (page 0 is sglang's padding)."""
    elements = row_bytes // dtype.itemsize
    if pools is None:
        pools = ((PoolSpec("kv", attention, dtype, 1, elements),) if attention is Attention.MLA else
                 (PoolSpec("kv", attention, dtype, heads, elements // heads, head_groups=head_groups),))
    host_pages = pages + 1
    host_order = list(range(host_pages))[-pages:]
    if reverse:
        host_order.reverse()
    host = tuple(page * page_size + token for page in host_order for token in range(page_size))
    device = tuple(page * page_size + token for page in range(1, pages + 1) for token in range(page_size))
    return Case(direction=direction, scope=scope, layout=layout, pools=pools, layers=layers, page_size=page_size,
                device_rows=(pages + 2) * page_size, host_slots=host_pages * page_size, layer=layers - 1,
                host_indices=host, device_indices=device, host_index=host_index, device_index=device_index,
                host_allocator=allocator, backend=backend, tuning=make_tuning(tuning or {}), seed=1)


def _jit_cases() -> list[Case]:
    cases: list[Case] = []
    for backend in JIT_BACKENDS:
        for layout in (LF, PF):
            cases += [
                smoke_case(backend, direction=LOAD, scope=ONE, layout=layout),
                smoke_case(backend, direction=WRITE, scope=ALL, layout=layout, row_bytes=512, page_size=1, pages=65),
                smoke_case(backend, direction=LOAD, scope=ALL, layout=layout, attention=Attention.MLA,
                           dtype=KVDtype.FP8, row_bytes=576, page_size=32),
                smoke_case(backend, direction=WRITE, scope=ONE, layout=layout, attention=Attention.MLA,
                           row_bytes=1152, host_index=DEVICE_INT32, device_index=DEVICE_INT32),
            ]
        cases += [
            smoke_case(backend, direction=LOAD, scope=ONE, layout=LF, host_index=CPU_INT64),  # rejected
            smoke_case(backend, direction=LOAD, scope=ONE, layout=PF, row_bytes=96, page_size=4),  # no kernel: 96 B
            smoke_case(backend, direction=WRITE, scope=ALL, layout=PF, row_bytes=1024,
                       allocator=HostAllocator.HOST_REGISTER),
        ]
    cases.append(smoke_case("sglang-jit-tma", direction=LOAD, scope=ONE, layout=PF, row_bytes=1024,
                            tuning={"tma_page_size": False}))
    return cases


def _staged_cases() -> list[Case]:
    cases = [smoke_case("sglang-staged", direction=WRITE, scope=ALL, layout=PF, page_size=page_size, pages=pages,
                        host_index=CPU_INT64)
             for page_size, pages in ((1, 64), (1, 65), (16, 1), (16, 65), (4, 129))]
    return [*cases,
            smoke_case("sglang-staged", direction=WRITE, scope=ALL, layout=PF, attention=Attention.MLA,
                       dtype=KVDtype.FP8, row_bytes=576, pages=5, host_index=CPU_INT64, tuning={"staging_pages": 3}),
            smoke_case("sglang-staged", direction=WRITE, scope=ALL, layout=PF, row_bytes=128),  # device host idx
            smoke_case("sglang-staged", direction=WRITE, scope=ALL, layout=PF, host_index=CPU_INT64,
                       allocator=HostAllocator.PAGEABLE),
            smoke_case("sglang-staged", direction=WRITE, scope=ALL, layout=PF, row_bytes=48, page_size=2,
                       host_index=CPU_INT64)]


def _page_unified_cases() -> list[Case]:
    cases: list[Case] = []
    for attention, row_bytes, dtype, groups in ((Attention.MHA, 256, KVDtype.BF16, 2),
                                                (Attention.MLA, 576, KVDtype.FP8, 1)):
        cases += [
            smoke_case("sglang-page-unified", direction=LOAD, scope=ONE, layout=PU, attention=attention, dtype=dtype,
                       row_bytes=row_bytes, head_groups=groups),
            smoke_case("sglang-page-unified", direction=WRITE, scope=ALL, layout=PU, attention=attention,
                       dtype=dtype, row_bytes=row_bytes, pages=5, host_index=CPU_INT64,
                       tuning={"staging_pages": 3}, head_groups=groups),
        ]
    return cases


def _pool_cases() -> list[Case]:
    cases: list[Case] = []
    for layout in (LF, PF):
        for attention, row_bytes, dtype in ((Attention.MHA, 256, KVDtype.BF16), (Attention.MLA, 576, KVDtype.FP8),
                                            (Attention.MLA, 1152, KVDtype.BF16)):
            for direction, scope in ((WRITE, ALL), (LOAD, ONE), (LOAD, ALL)):
                cases.append(smoke_case("sglang-pool", direction=direction, scope=scope, layout=layout,
                                        attention=attention, dtype=dtype, row_bytes=row_bytes,
                                        page_size=32 if row_bytes == 576 else 16, host_index=CPU_INT64,
                                        reverse=False))
    group = (PoolSpec("kv", Attention.MHA, KVDtype.BF16, 2, 64),
             PoolSpec("side1", Attention.MLA, KVDtype.BF16, 1, 576),
             PoolSpec("side2", Attention.MHA, KVDtype.BF16, 1, 128, write_back_jit=False))
    for controller in ("hybrid", "base"):
        for pools in (group[:2], group):
            cases.append(smoke_case("sglang-pool", direction=WRITE, scope=ALL, layout=PF, pools=pools,
                                    host_index=CPU_INT64, reverse=False, tuning={"controller": controller}))
    return cases


def smoke_cases() -> list[Case]:
    """Every smoke case, in a fixed order (the GPU test ids come from the case ids)."""
    return [*_jit_cases(), *_staged_cases(), *_page_unified_cases(), *_pool_cases(),
            smoke_case("sglang-aot", direction=LOAD, scope=ONE, layout=LF)]
