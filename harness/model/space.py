"""The case space: the menus, ranges and size distribution every generator draws from (vocabulary shared by the
generator, the backends that narrow it, and the commands and space files that widen it).

Every numeric dimension has a *menu* (edges and production values, drawn often) and a *range* it is also drawn
from uniformly inside the bucket the schedule asks for, so the whole legal range is reachable and the menus only
bias it. Legality is the contract's business (:mod:`hicache_fuzz.oracles.contract`): every positive page size,
head count, head dim and layer count is a legal case for the reference; backends narrow the space to what they
implement (``Backend.case_space``).

Cost stays proportional to bytes through the size distribution, not through caps: most cases are fitted to a
small budget, the others to ``byte_budget``, and a ``tail_rate`` share to a budget drawn log-uniformly up to
``byte_budget * tail_factor``; a long transfer over narrow rows fits a small budget.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, fields, replace

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
CASE_BYTE_BUDGET = 8 << 20  # typical case, all pools, device + host
# Page sizes: every positive value is legal for the reference and the host pools; the menu holds powers of two
# (server defaults), non-powers of two (any --page-size a server accepts) and 63/100-style odd values.
PAGE_SIZE_MENU = (1, 16, 4, 2, 8, 32, 64, 3, 5, 7, 12, 24, 48, 63, 100, 128, 256)
# Head counts per rank: 1..128 with the production ones (GQA 8, Llama 32/64/128, 40 for some 13B/70B shards).
HEADS_MENU = (1, 2, 4, 8, 16, 32, 40, 64, 128, 3, 6, 12, 20, 24, 48, 96)
# Head-group counts of page_unified pools (the generator draws those dividing the heads; the page_unified
# backend compiles a module per group width).
HEAD_GROUPS_MENU = (1, 2, 4, 8)
# Head dims of real models: 64..256 MHA, 512/576 MLA latents (kv_lora_rank [+ rope]), 80/96/192 odd ones.
HEAD_DIM_MENU = (128, 64, 80, 96, 192, 256, 512, 576, 32, 16, 8)
# Layers: 61 DeepSeek-V3, 126 Llama-3-405B, 80 Llama-70B, 1..8 small, powers of two and their neighbours.
LAYER_MENU = (1, 2, 3, 4, 8, 61, 126, 5, 7, 16, 32, 64, 80, 127, 128)
MAX_TOKENS = 1 << 17  # transfers reach past 65,536 tokens (65,535 is the CUDA grid y/z limit)


TuningMenus = tuple[tuple[str, tuple[int | str | bool, ...]], ...]


@dataclass(frozen=True)
class SpaceProfile:
    """A narrowed copy of a backend's space that `per_mille` of a campaign's indices draw from.

    The generator draws a case's shape (layout, attention kind, page size, rows) before its tuning knobs, so a knob
    value whose class stores only one rare shape (MXFP8's page_first, 128-token pages, a few row widths) would be
    drawn almost only on shapes that cannot hold it and fall back to the standard class. A profile draws its share
    of indices from that shape with the knob set. Which indices is a function of the index and the campaign seed
    (CaseSpace.profile_at), so shards and resumed campaigns agree on it, and a backend that runs only some indices
    of a campaign (the costly ones) meets other profiles under another seed."""

    name: str
    per_mille: int
    changes: tuple[tuple[str, object], ...] = ()  # CaseSpace.narrowed arguments
    tuning: TuningMenus = ()  # knob menus replaced (the others stay as the space has them)

    def applied_to(self, space: CaseSpace) -> CaseSpace:
        menus = dict(space.tuning_menus)
        menus.update(dict(self.tuning))
        # no covering-array pins: the schedule's buckets are those of the whole space, not of the profile
        return space.narrowed(**dict(self.changes), tuning_menus=tuple(menus.items()), profiles=(), schedule=False)


@dataclass(frozen=True)
class CaseSpace:
    """Menus and ranges the generator draws from. Narrow it to fit a backend, widen it to explore."""

    directions: tuple[Direction, ...] = (Direction.WRITE_BACK, Direction.LOAD_BACK)
    scopes: tuple[Scope, ...] = (Scope.ALL_LAYERS, Scope.ONE_LAYER)
    layouts: tuple[HostLayout, ...] = tuple(HostLayout)
    attentions: tuple[Attention, ...] = (Attention.MHA, Attention.MLA, Attention.MHA_ASYM)
    dtypes: tuple[KVDtype, ...] = (KVDtype.BF16, KVDtype.FP8, KVDtype.FP16, KVDtype.FP32)
    row_bytes: tuple[int, ...] = ROW_BYTES_MENU
    heads: tuple[int, ...] = HEADS_MENU
    # Geometry draws (heads x head_dim x itemsize) beside the row menu; () = rows from row_bytes only (a
    # backend whose every row size is a compile narrows row_bytes, which turns this off, see narrowed()).
    head_dims: tuple[int, ...] = HEAD_DIM_MENU
    page_sizes: tuple[int, ...] = PAGE_SIZE_MENU
    max_page_size: int = 256  # page sizes are also drawn uniformly up to this (0: menu only)
    layer_counts: tuple[int, ...] = LAYER_MENU
    max_layers: int = 128  # layer counts are also drawn uniformly up to this (0: menu only)
    page_counts: tuple[int, ...] = PAGE_COUNT_BIAS
    max_pages: int = MAX_TOKENS
    max_tokens: int = MAX_TOKENS  # per transfer; pages are capped at max_tokens // page_size
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
    partial_rate: float = 0.1  # share of valid partial last pages (legal for per-token entry points)
    long_rate: float = 0.004  # share of transfers just past 65,536 tokens (costly on the CPU: ~0.3-0.8 s each)
    big_pool_rate: float = 0.15  # share of pools far larger than the transfer (indices near 2^k, > 2^16 rows)
    # The size distribution (budgets are log-uniform inside each class): small_rate of the cases fit
    # small_budget, the rest byte_budget, and a tail_rate share a budget up to byte_budget * tail_factor.
    byte_budget: int = CASE_BYTE_BUDGET
    small_budget: int = 256 << 10
    small_rate: float = 0.75
    tail_rate: float = 0.02
    honour_rate: float = 0.35  # share of cases whose budget rises to fit the scheduled buckets (see generate)
    tail_factor: int = 8
    schedule: bool = True  # draw scheduled dimensions from a covering array (see harness/generation/pairwise.py)
    backend: str = "reference"
    tuning_menus: TuningMenus = ()
    # Narrowed sub-spaces a share of the indices draw from (SpaceProfile); their shares add up to at most 1000.
    profiles: tuple[SpaceProfile, ...] = ()
    # Menu growth, for backends where every row size is a compile (sglang's JIT kernels): row_bytes_growth[k]
    # joins row_bytes from campaign index (k + 1) * grow_every on. A pure function of the index, so shards
    # and resumed campaigns still draw the same case i; the campaign compiles each next row in the background
    # (Backend.prefetch) before any case can draw it.
    row_bytes_growth: tuple[int, ...] = ()
    grow_every: int = 0
    # The campaign seed that picks a backend's sample of a menu whose every value is a compile (rows of
    # sglang's JIT kernels, see rotating_sample); None: no seed, the whole menu (jit-warm without --seed).
    # Not settable from a space file: a campaign sets it from its own seed.
    menu_seed: int | None = None

    def narrowed(self, **changes: object) -> CaseSpace:
        """A copy with `changes`. Narrowing a menu also narrows its range to the menu unless the range is given
        too: a backend that lists its page sizes (or rows, or layers) means those, not the default range."""
        implied: dict[str, object] = {}
        if "page_sizes" in changes and "max_page_size" not in changes:
            implied["max_page_size"] = 0
        if "row_bytes" in changes and "head_dims" not in changes:
            implied["head_dims"] = ()
        if "layer_counts" in changes and "max_layers" not in changes:
            implied["max_layers"] = 0
        return replace(self, **{**implied, **changes})  # type: ignore[arg-type]

    def growth_stage(self, index: int) -> int:
        """How many rows of row_bytes_growth case `index` may draw."""
        if not self.row_bytes_growth or self.grow_every <= 0:
            return 0
        return min(len(self.row_bytes_growth), index // self.grow_every)

    def at_index(self, index: int) -> CaseSpace:
        """The space case `index` is drawn from: row_bytes plus the rows grown by then, narrowed to the index's
        profile if it has one."""
        space = self
        stage = self.growth_stage(index)
        if stage:
            grown = tuple(r for r in self.row_bytes_growth[:stage] if r not in self.row_bytes)
            space = replace(self, row_bytes=self.row_bytes + grown, row_bytes_growth=(), grow_every=0)
        profile = self.profile_at(index)
        return profile.applied_to(space) if profile is not None else space

    def profile_at(self, index: int) -> SpaceProfile | None:
        """The profile case `index` draws from, if any: a hash of the campaign seed (menu_seed) and the index picks
        one slot in 1000, and the profiles own consecutive slots in their order."""
        if not self.profiles:
            return None
        slot = zlib.crc32(f"hicache-fuzz-profile:{self.menu_seed}:{index}".encode()) % 1000
        for profile in self.profiles:
            if slot < profile.per_mille:
                return profile
            slot -= profile.per_mille
        return None

    def rows_of_stage(self, stage: int) -> tuple[int, ...]:
        """The rows that join the menu at growth stage `stage` (1-based; empty past the end)."""
        if not 1 <= stage <= len(self.row_bytes_growth):
            return ()
        row = self.row_bytes_growth[stage - 1]
        return () if row in self.row_bytes else (row,)


SPACE_FIELDS = tuple(f.name for f in fields(CaseSpace))


def rotating_sample(menu: tuple[int, ...], seed: int | None, count: int) -> tuple[int, ...]:
    """`count` consecutive values of `menu` (wrapping round), starting at ``seed * count``: seeds s, s + 1, ...,
    s + ceil(len / count) - 1 together draw every value, so a handful of seeds covers a menu whose values each
    cost a compile while one campaign compiles only `count` of them. None (no seed): the whole menu."""
    if seed is None or count >= len(menu):
        return tuple(menu)
    start = (seed * count) % len(menu)
    return tuple(menu[(start + k) % len(menu)] for k in range(count))
