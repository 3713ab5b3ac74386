"""A small hand-built case for the sglang backends' CPU tests: two pages of 16 rows, two layers, one pool."""

from __future__ import annotations

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)


def mk(
    backend: str = "sglang-jit",
    *,
    direction: Direction = Direction.LOAD_BACK,
    scope: Scope = Scope.ONE_LAYER,
    layout: HostLayout = HostLayout.LAYER_FIRST,
    row: int = 256,
    dtype: KVDtype = KVDtype.BF16,
    attention: Attention = Attention.MHA,
    ps: int = 16,
    pages: int = 2,
    pools: tuple[PoolSpec, ...] | None = None,
    hidx: IndexSpec = IndexSpec(),  # noqa: B008 - frozen dataclass
    didx: IndexSpec = IndexSpec(),  # noqa: B008
    tuning: dict | None = None,
    allocator: HostAllocator = HostAllocator.PIN_MEMORY,
) -> Case:
    elems = row // dtype.itemsize
    if pools is None:
        heads = 1 if attention is Attention.MLA else 2
        pools = (PoolSpec("kv", attention, dtype, heads, elems // heads),)
    h = tuple(range(ps, ps + pages * ps))
    d = tuple(range(ps, ps + pages * ps))
    return Case(
        direction=direction,
        scope=scope,
        layout=layout,
        pools=pools,
        layers=2,
        page_size=ps,
        device_rows=(pages + 2) * ps,
        host_slots=(pages + 1) * ps,
        host_indices=h,
        device_indices=d,
        host_index=hidx,
        device_index=didx,
        host_allocator=allocator,
        backend=backend,
        tuning=make_tuning(tuning or {}),
    )
