"""The case space: the menus and bounds every generator draws from (vocabulary shared by the generator, the
backends that narrow it, and the commands that widen it)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hicache_fuzz.harness.model.case import (
    Attention,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    KVDtype,
    Scope,
)

# Row sizes in bytes around every entry point's rule: 16-byte (TMA/staged), 8-byte (AOT), 32/64/128-byte HIP
# bands, 128-byte CUDA register rounds, real models (576 DeepSeek fp8, 656 GLM bf16, 1152 DeepSeek bf16, 528
# = 512 + 16 scale bytes, 2064), and the 32 KiB TMA stage limit.
ROW_BYTES_MENU = (
    128, 256, 64, 32, 16, 512, 576, 1024, 1152, 2048, 656, 528, 96, 48, 24, 8, 12, 2064, 1040, 4096, 8192, 32768,
    32784,
)
PAGE_COUNT_BIAS = (1, 2, 3, 4, 63, 64, 65, 128, 129)
CASE_BYTE_BUDGET = 8 << 20  # per case, all pools, device + host: keeps CPU campaigns fast



@dataclass(frozen=True)
class CaseSpace:
    """Menus the generator draws from. Narrow it to fit a backend, widen it to explore."""

    directions: tuple[Direction, ...] = (Direction.WRITE_BACK, Direction.LOAD_BACK)
    scopes: tuple[Scope, ...] = (Scope.ALL_LAYERS, Scope.ONE_LAYER)
    layouts: tuple[HostLayout, ...] = tuple(HostLayout)
    attentions: tuple[Attention, ...] = (Attention.MHA, Attention.MLA, Attention.MHA_ASYM)
    dtypes: tuple[KVDtype, ...] = (KVDtype.BF16, KVDtype.FP8, KVDtype.FP16, KVDtype.FP32)
    row_bytes: tuple[int, ...] = ROW_BYTES_MENU
    heads: tuple[int, ...] = (1, 2, 4, 8)
    page_sizes: tuple[int, ...] = (1, 16, 4, 2, 8, 32, 64)
    layer_counts: tuple[int, ...] = (1, 2, 3, 4, 8)
    page_counts: tuple[int, ...] = PAGE_COUNT_BIAS
    max_pages: int = 160
    index_dtypes: tuple[IndexDtype, ...] = (IndexDtype.INT64, IndexDtype.INT32)
    index_devices: tuple[IndexDevice, ...] = (IndexDevice.DEVICE, IndexDevice.CPU, IndexDevice.PINNED)
    # Per-side overrides of index_devices, for backends whose callers fix one side's placement (the host pools
    # get host indices from the host allocator, on the CPU). Same number of draws either way.
    host_index_devices: tuple[IndexDevice, ...] | None = None
    device_index_devices: tuple[IndexDevice, ...] | None = None
    allocators: tuple[HostAllocator, ...] = (HostAllocator.PIN_MEMORY, HostAllocator.HOST_REGISTER,
                                             HostAllocator.PAGEABLE)
    max_pools: int = 3
    invalid_rate: float = 0.1  # share of cases with one deliberate contract violation
    irregular_rate: float = 0.25  # share with irregular in-page runs (non-contiguous, misaligned)
    empty_rate: float = 0.02  # share of zero-length transfers (B13); uniform page counts reach 0 too rarely
    byte_budget: int = CASE_BYTE_BUDGET
    backend: str = "reference"
    tuning_menus: tuple[tuple[str, tuple[int | str | bool, ...]], ...] = ()
    # Menu growth, for backends where every row size is a compile (sglang's JIT kernels): row_bytes_growth[k]
    # joins row_bytes from campaign index (k + 1) * grow_every on. A pure function of the index, so shards
    # and resumed campaigns still draw the same case i; the campaign compiles each next row in the background
    # (Backend.prefetch) before any case can draw it.
    row_bytes_growth: tuple[int, ...] = ()
    grow_every: int = 0

    def narrowed(self, **changes: object) -> CaseSpace:
        return replace(self, **changes)  # type: ignore[arg-type]

    def growth_stage(self, index: int) -> int:
        """How many rows of row_bytes_growth case `index` may draw."""
        if not self.row_bytes_growth or self.grow_every <= 0:
            return 0
        return min(len(self.row_bytes_growth), index // self.grow_every)

    def at_index(self, index: int) -> CaseSpace:
        """The space case `index` is drawn from: row_bytes plus the rows grown by then."""
        stage = self.growth_stage(index)
        if not stage:
            return self
        grown = tuple(r for r in self.row_bytes_growth[:stage] if r not in self.row_bytes)
        return replace(self, row_bytes=self.row_bytes + grown, row_bytes_growth=(), grow_every=0)

    def rows_of_stage(self, stage: int) -> tuple[int, ...]:
        """The rows that join the menu at growth stage `stage` (1-based; empty past the end)."""
        if not 1 <= stage <= len(self.row_bytes_growth):
            return ()
        row = self.row_bytes_growth[stage - 1]
        return () if row in self.row_bytes else (row,)
