"""The contract model: for each entry point, which inputs it must accept, must reject, or leaves undefined.

A backend names the entry point a case goes to (its plan); :func:`predict` says what that entry point must
do with the case on the given platform, and which semantics its result follows. The harness compares the
backend's behaviour with this prediction: a rejection of an input predicted valid is "wrongly rejected", a
return from an input predicted invalid is "wrongly accepted".

``UNDEFINED`` marks inputs whose behaviour sglang does not define (out-of-range indices handed to kernels
that never bounds-check, duplicate destinations racing). Running them proves nothing and may corrupt the
process, so the runner does not execute them.

Bounds checks (:data:`BOUNDS_CHECKS`): the one table of which entry points check which index list against its
pool before touching memory. An out-of-range index on a checked side must be rejected (so the generator's
indices exactly at the bound, harness/generation/generate.py, test the check's off-by-ones); on an unchecked side
it stays undefined.

Rules and their sources: docs/semantics.md section 3 (table 3.6 is the summary).

Geometry is not an entry-point rule: every positive page size (powers of two or not: a server's --page-size
is any positive integer), head count, head dim, layer count and transfer length is legal for every entry
point here; where a kernel has a limit (the TMA kernel's page_size % rows_per_chunk, the 16-byte rows of the
staged path) it is a selection between implementations or a row rule below, never a page-size rule. The
generator therefore draws these over their whole range (docs/generation.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from hicache_fuzz.harness.model.case import (
    INDEX_LIMIT,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    Scope,
)
from hicache_fuzz.harness.model.copy_rules import TMA_MAX_ROW_BYTES
from hicache_fuzz.harness.model.jit_gate import TMA_ROW_ALIGN_BYTES, register_tiles_row, tma_takes_row
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.oracles import pool_layouts, sequence
from hicache_fuzz.oracles.transfer import Semantics, token_pairs


class EntryPoint(str, Enum):
    REFERENCE = "reference"  # the intended transfer: bounds-checked, any index placement
    JIT_REGISTER = "jit_register"  # transfer_hicache_{one,all}_layer[_mla], register kernel
    JIT_TMA = "jit_tma"  # same Python entry, TMA kernel
    JIT_STAGED = "jit_staged"  # transfer_hicache_all_layer[_mla]_staged_lf_pf
    JIT_PAGE_UNIFIED = "jit_page_unified"  # page-unified load-back / staged write-back
    AOT = "aot"  # sgl_kernel.kvcacheio transfer_kv_* (per-token)
    AOT_DIRECT = "aot_direct"  # transfer_kv_direct
    AOT_PAGE_FIRST_DIRECT = "aot_page_first_direct"  # transfer_kv_*_direct_{lf_pf,pf_lf}
    # sglang's host pools driven through the HiCache controllers where the pool refuses what the oracle states
    # (oracles/pool_layouts.py): the reference's semantics otherwise
    DSA_SHARDED = "dsa_sharded"  # DSAIndexerPoolHost over a layer-sharded device pool
    MLA_SHARDED = "mla_sharded"  # MLATokenToKVPoolHost over a layer-sharded device pool
    MIXED_ROW_STRIDES = "mixed_row_strides"  # a KV host pool over token-major target and packed draft device rows


class Verdict(str, Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    UNDEFINED = "undefined"


@dataclass(frozen=True)
class Prediction:
    verdict: Verdict
    semantics: Semantics
    reasons: tuple[str, ...] = ()

    def describe(self) -> str:
        return self.verdict.value + (": " + "; ".join(self.reasons) if self.reasons else "")


# ---- platform rules ----------------------------------------------------------------------------------

# The copy-round rules (row tiling, unroll, TMA chunk rows) live in harness/model/copy_rules.py, shared with
# the sglang backends and the ISA check; which JIT kernel takes a row on a platform in harness/model/jit_gate.py,
# shared with the sglang backends.


def hicache_jit_takes_row(row_bytes: int, page_size: int, platform: Platform) -> bool:
    """A host pool's ``can_use_jit``: ``(_is_cuda or _is_hip) and can_use_hicache_jit_kernel(page_size=,
    element_size=)`` (sglang/kernels/ops/kvcache/hicache.py), the TMA kernel where it takes the row, else the
    register kernel where the row tiles its copy rounds (harness/model/jit_gate.py). The TMA switch
    (``SGLANG_HICACHE_TMA_TRANSFER``) is taken at sglang's default, on."""
    return platform.kind != "cpu" and (tma_takes_row(row_bytes, page_size, platform)
                                       or register_tiles_row(row_bytes, platform))


# ---- the prediction -----------------------------------------------------------------------------------

def semantics_of(entry: EntryPoint, case: Case) -> Semantics:
    page_unified_write = case.layout is HostLayout.PAGE_UNIFIED and case.direction is Direction.WRITE_BACK
    if entry is EntryPoint.JIT_STAGED:
        return Semantics.PAGE_ALIGNED if page_unified_write else Semantics.PAGE_RUNS
    if entry is EntryPoint.AOT_PAGE_FIRST_DIRECT:
        return Semantics.PAGE_ALIGNED_HOST
    if entry in (EntryPoint.REFERENCE, EntryPoint.JIT_PAGE_UNIFIED, EntryPoint.DSA_SHARDED,
                 EntryPoint.MLA_SHARDED, EntryPoint.MIXED_ROW_STRIDES):
        if case.layout is HostLayout.PAGE_FIRST_DIRECT:
            return Semantics.PAGE_ALIGNED_HOST
        if page_unified_write:
            return Semantics.PAGE_ALIGNED
    return Semantics.PER_TOKEN


def _destinations(case: Case, semantics: Semantics) -> list[int]:
    """Every destination row the transfer writes (page-granular transfers expanded to whole pages)."""
    host_tokens, device_rows = token_pairs(case, semantics)
    return (host_tokens if case.direction is Direction.WRITE_BACK else device_rows).tolist()


class Side(str, Enum):
    HOST = "host"
    DEVICE = "device"


@dataclass(frozen=True)
class BoundsCheck:
    """The index lists an entry point checks against their pool before it touches memory, per direction."""

    write_back: frozenset[Side] = frozenset()
    load_back: frozenset[Side] = frozenset()

    def sides(self, direction: Direction) -> frozenset[Side]:
        return self.write_back if direction is Direction.WRITE_BACK else self.load_back


_BOTH_SIDES = frozenset(Side)
# Every entry point, checked or not (a new entry point must say). Sources: sglang 0.5.23's kernels compute
# addresses from the indices unchecked, except the page_unified write-back, whose launcher checks every
# destination (host) page id against the host tensor's page count before the launch (staged_write_back.cuh,
# "destination page out of range"); its source (device) pages are the caller's promise. The reference checks
# everything.
BOUNDS_CHECKS: dict[EntryPoint, BoundsCheck] = {
    EntryPoint.REFERENCE: BoundsCheck(_BOTH_SIDES, _BOTH_SIDES),
    EntryPoint.JIT_REGISTER: BoundsCheck(),
    EntryPoint.JIT_TMA: BoundsCheck(),
    EntryPoint.JIT_STAGED: BoundsCheck(),
    EntryPoint.JIT_PAGE_UNIFIED: BoundsCheck(write_back=frozenset({Side.HOST})),
    EntryPoint.AOT: BoundsCheck(),
    EntryPoint.AOT_DIRECT: BoundsCheck(),
    EntryPoint.AOT_PAGE_FIRST_DIRECT: BoundsCheck(),
    # the host pools check no index: their callers (the allocators) hand out slots and rows in range
    EntryPoint.DSA_SHARDED: BoundsCheck(),
    EntryPoint.MLA_SHARDED: BoundsCheck(),
    EntryPoint.MIXED_ROW_STRIDES: BoundsCheck(),
}


INT32_MAX = (1 << 31) - 1


def boundary_indices(size: int, dtype: IndexDtype) -> tuple[int, ...]:
    """The out-of-range indices exactly at a side's bounds, for a pool of `size` rows: the first row past it,
    the one after, -1, and the largest index the dtype holds (for int64 the largest the case model takes,
    2^62 - 1, which keeps every ``index + page offset`` inside int64). Every one is out of range, so an entry
    point that checks that side must reject each."""
    largest = (INT32_MAX,) if dtype is IndexDtype.INT32 else (INT32_MAX, INDEX_LIMIT - 1)
    return (size, size + 1, -1, *largest)


def bounds_checked(entry: EntryPoint, direction: Direction) -> frozenset[Side]:
    """The index sides `entry` bounds-checks when moving in `direction` (empty: none, out of range is undefined)."""
    check = BOUNDS_CHECKS.get(entry)
    return check.sides(direction) if check is not None else frozenset()


def _out_of_range(case: Case, semantics: Semantics) -> dict[Side, str]:
    """The first out-of-range index of each side, as a reason, by side."""
    reasons: dict[Side, str] = {}
    S, R, ps = case.host_slots, case.device_rows, case.page_size
    h, d = case.host_indices, case.device_indices
    if semantics is Semantics.PER_TOKEN:
        bad_h = [x for x in h if not 0 <= x < S]
        bad_d = [x for x in d if not 0 <= x < R]
    else:
        firsts_h = h[: len(h) - len(h) % ps : ps]
        firsts_d = d[: len(d) - len(d) % ps : ps]
        aligned_h = semantics in (Semantics.PAGE_ALIGNED_HOST, Semantics.PAGE_ALIGNED)
        aligned_d = semantics is Semantics.PAGE_ALIGNED
        bad_h = [x for x in firsts_h if not (x >= 0 and (x // ps * ps if aligned_h else x) + ps <= S)]
        bad_d = [x for x in firsts_d if not (x >= 0 and (x // ps * ps if aligned_d else x) + ps <= R)]
    if bad_h:
        reasons[Side.HOST] = f"host index {bad_h[0]} outside [0, {S})"
    if bad_d:
        reasons[Side.DEVICE] = f"device index {bad_d[0]} outside [0, {R})"
    return reasons


def predict(case: Case, entry: EntryPoint, platform: Platform) -> Prediction:
    """What `entry` must do with `case` on `platform`."""
    semantics = semantics_of(entry, case)
    reject: list[str] = []
    undefined: list[str] = []
    n_h, n_d = len(case.host_indices), len(case.device_indices)
    if n_h != n_d:
        reject.append(f"index lists differ in length ({n_h} host, {n_d} device)")
    page_granular = semantics is not Semantics.PER_TOKEN
    if page_granular and n_h % case.page_size:
        reject.append(f"{n_h} indices is not a whole number of {case.page_size}-token pages")

    checked = bounds_checked(entry, case.direction)
    for side, reason in _out_of_range(case, semantics).items():
        if side in checked:
            reject.append(reason)
        else:  # unchecked (B14): what the kernel does with it is undefined, not a rejection
            undefined.append(f"{reason} (not bounds-checked there)")
    duplicates = len(set(dsts := _destinations(case, semantics))) != len(dsts)
    if entry is EntryPoint.REFERENCE:
        if duplicates:
            reject.append("duplicate destinations")
    elif duplicates:
        undefined.append("duplicate destinations (the winner is unspecified)")

    rules = _ENTRY_RULES[entry]
    reject += rules(case, platform)

    if reject:
        return Prediction(Verdict.REJECT, semantics, tuple(reject))
    if undefined:
        return Prediction(Verdict.UNDEFINED, semantics, tuple(undefined))
    return Prediction(Verdict.ACCEPT, semantics)


# ---- per-entry rules (each returns the reasons the entry must reject the case) ---------------------------

def _rows(case: Case) -> list[int]:
    return sorted({pool.row_bytes(c) for pool in case.pools for c in pool.components})


def _index_rules(case: Case, *, host_ok: set[IndexDevice], device_ok: set[IndexDevice],
                 host_dtypes: set[IndexDtype], device_dtypes: set[IndexDtype], same_dtype: bool) -> list[str]:
    out = []
    if case.host_index.device not in host_ok:
        out.append(f"host indices on {case.host_index.device.value} (needs {sorted(d.value for d in host_ok)})")
    if case.device_index.device not in device_ok:
        out.append(f"device indices on {case.device_index.device.value} (needs {sorted(d.value for d in device_ok)})")
    if case.host_index.dtype not in host_dtypes:
        out.append(f"host indices are {case.host_index.dtype.value}")
    if case.device_index.dtype not in device_dtypes:
        out.append(f"device indices are {case.device_index.dtype.value}")
    if same_dtype and case.host_index.dtype is not case.device_index.dtype:
        out.append("host and device index dtypes differ")
    return out


_ANY_DEVICE = set(IndexDevice)
_GPU = {IndexDevice.DEVICE}
_BOTH_DTYPES = set(IndexDtype)
_INT64 = {IndexDtype.INT64}


def _reference_rules(case: Case, platform: Platform) -> list[str]:
    return []


def _register_rules(case: Case, platform: Platform) -> list[str]:
    out = _index_rules(case, host_ok=_GPU, device_ok=_GPU, host_dtypes=_BOTH_DTYPES,
                       device_dtypes=_BOTH_DTYPES, same_dtype=True)
    if platform.kind == "cpu":
        out.append("the JIT register kernel needs a CUDA or ROCm device")
    unroll = case.tuning_value("unroll")
    for row in _rows(case):
        if not register_tiles_row(row, platform, unroll):
            out.append(f"row of {row} bytes does not tile the {'HIP' if platform.is_hip else 'CUDA'} copy rounds")
    if case.layout in (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD, HostLayout.PAGE_UNIFIED):
        out.append(f"the register kernel has no {case.layout.value} addressing")
    if case.n == 0:
        out.append("zero-length launch (num_blocks == 0)")
    return out


def _tma_rules(case: Case, platform: Platform) -> list[str]:
    out = _index_rules(case, host_ok=_GPU, device_ok=_GPU, host_dtypes=_BOTH_DTYPES,
                       device_dtypes=_BOTH_DTYPES, same_dtype=True)
    if not platform.has_tma:
        out.append("TMA needs CUDA sm90+")
    for row in _rows(case):
        if row % TMA_ROW_ALIGN_BYTES:
            out.append(f"row of {row} bytes is not a multiple of {TMA_ROW_ALIGN_BYTES}")
        if row > TMA_MAX_ROW_BYTES:
            out.append(f"row of {row} bytes exceeds the {TMA_MAX_ROW_BYTES}-byte shared-memory stage")
    if case.layout in (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD, HostLayout.PAGE_UNIFIED):
        out.append(f"the TMA kernel has no {case.layout.value} addressing")
    return out


def _staged_rules(case: Case, platform: Platform) -> list[str]:
    page_unified = case.layout is HostLayout.PAGE_UNIFIED
    # Zero pages: the chunk loop launches nothing, so the kernel's own index checks never run (on a GPU, CPU
    # int32 / pinned indices are accepted when empty). The page_first path checks nothing before its loop
    # (hicache.py:440); the page_unified write-back checks its group row before its loop (hicache.py:809, 816),
    # so that rule holds for an empty transfer too.
    empty = case.n == 0 and not case.device_indices and platform.kind != "cpu"
    if empty and not page_unified:
        return []
    out = [] if empty else _index_rules(case, host_ok={IndexDevice.CPU, IndexDevice.PINNED}, device_ok=_GPU,
                                        host_dtypes=_INT64, device_dtypes=_BOTH_DTYPES, same_dtype=False)
    if platform.kind == "cpu":
        out.append("the staged write-back needs a CUDA or ROCm device")
    if case.direction is not Direction.WRITE_BACK or case.scope is not Scope.ALL_LAYERS:
        out.append("the staged path is an all-layer write-back")
    if case.layout is not HostLayout.PAGE_FIRST and not page_unified:
        out.append(f"the staged path writes page_first (or page_unified), not {case.layout.value}")
    for pool in case.pools:
        for c in pool.components:
            unit = pool.row_bytes(c) // pool.head_groups if page_unified else pool.row_bytes(c)
            if unit % 16:
                out.append(f"{pool.name}.{c} row unit of {unit} bytes is not a multiple of 16")
    return out


def page_unified_layout_rules(case: Case) -> list[str]:
    """Why sglang's page_unified host layout must refuse to lay out a pool of `case` (``PageUnifiedLayout``,
    sglang/srt/mem_cache/pool_host/page_unified.py, which the pool's constructor builds), in the oracle's terms: one
    head group's token row (``heads / head_groups`` heads of ``head_dim`` elements; an MLA pool's whole latent row)
    is the kernels' copy unit, moved as 16-byte vectors, so it must be a multiple of 16 bytes. Its other rules
    (positive geometry, head groups dividing the heads, one head and one group for MLA) hold for every valid case
    (harness/model/case.py validates them), so a refusal for them is wrong."""
    return [f"{pool.name}.{c} group row is not a multiple of 16 bytes"
            for pool in case.pools for c in pool.components if (pool.row_bytes(c) // pool.head_groups) % 16]


def _page_unified_rules(case: Case, platform: Platform) -> list[str]:
    # The page_unified host layout's rule (page_unified_layout_rules) binds both directions: the backend builds its
    # host tensor through sglang's host pool. The staged write-back's row unit on page_unified is the same group
    # row, so its rules state it already.
    if case.direction is Direction.WRITE_BACK:
        return _staged_rules(case, platform)
    # One symbolic index dtype for both lists (hicache.cuh:691-695), as for the register kernel.
    out = _index_rules(case, host_ok=_GPU, device_ok=_GPU, host_dtypes=_BOTH_DTYPES,
                       device_dtypes=_BOTH_DTYPES, same_dtype=True)
    if platform.kind == "cpu":
        out.append("the page-unified load-back needs a CUDA or ROCm device")
    if case.layout is not HostLayout.PAGE_UNIFIED or case.scope is not Scope.ONE_LAYER:
        out.append("the page-unified load-back reads one layer of a page_unified pool")
    return out + page_unified_layout_rules(case)


def _aot_rules(case: Case, platform: Platform) -> list[str]:
    out = _index_rules(case, host_ok=_GPU, device_ok=_GPU, host_dtypes=_INT64, device_dtypes=_INT64,
                       same_dtype=False)
    if platform.kind == "cpu":
        out.append("sgl_kernel.kvcacheio needs a CUDA or ROCm device")
    for row in _rows(case):
        if row % 8:
            out.append(f"item size {row} is not a multiple of 8")
    if case.layout in (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_UNIFIED):
        out.append(f"no per-token AOT op for {case.layout.value}")
    if case.n == 0:
        out.append("zero-length transfer divides by zero in the launcher (by reading)")
    return out


def _aot_direct_rules(case: Case, platform: Platform) -> list[str]:
    out = _index_rules(case, host_ok=_ANY_DEVICE, device_ok=_ANY_DEVICE, host_dtypes=_INT64,
                       device_dtypes=_INT64, same_dtype=False)
    if case.n % case.page_size:
        out.append(f"{case.n} indices is not a multiple of page_size {case.page_size}")
    if case.layout is not HostLayout.LAYER_FIRST:
        out.append("transfer_kv_direct moves layer_first pools")
    return out


def _aot_page_first_direct_rules(case: Case, platform: Platform) -> list[str]:
    out = _index_rules(case, host_ok=_ANY_DEVICE, device_ok=_ANY_DEVICE, host_dtypes=_INT64,
                       device_dtypes=_INT64, same_dtype=False)
    if case.layout is not HostLayout.PAGE_FIRST_DIRECT:
        out.append("the direct page ops move page_first_direct pools")
    return out


def _dsa_sharded_rules(case: Case, platform: Platform) -> list[str]:
    """The layer-sharded DSA indexer backs up layer_first only (pool_layouts.dsa_shard_backup_refusal): a case whose
    sequence backs up on another layout must be refused at that back-up; loads move on every layout."""
    why = pool_layouts.dsa_shard_backup_refusal(case.layout)
    return [why] if why and _backs_up(case) else []


def _mla_sharded_rules(case: Case, platform: Platform) -> list[str]:
    """The layer-sharded MLA pool backs up layer_first, and page_first where the JIT one-layer kernel takes its row
    at its page size (pool_layouts.mla_shard_backup_refusal, the gate hicache_jit_takes_row): a case whose sequence
    backs up elsewhere must be refused at that back-up; loads move on every layout."""
    spec = case.pools[0]
    jit = hicache_jit_takes_row(spec.row_bytes(spec.components[0]), case.page_size, platform)
    why = pool_layouts.mla_shard_backup_refusal(case.layout, jit)
    return [why] if why and _backs_up(case) else []


def _backs_up(case: Case) -> bool:
    """Whether the case's sequence (oracles/sequence.py) has a back-up: step 0 of a write-back, or one in its
    program (a program that does not parse has none here: the backend does not run the case)."""
    if case.direction is Direction.WRITE_BACK:
        return True
    try:
        return sequence.BACKUP in sequence.program(case)
    except sequence.SequenceError:
        return False


def _mixed_row_strides_rules(case: Case, platform: Platform) -> list[str]:
    """Every case: the host pool refuses the device rows when it is built (pool_layouts, the token-major section).
    A backend plans this entry only for a pool whose target rows are strided beside packed draft rows."""
    return [pool_layouts.MIXED_ROW_STRIDES_REFUSAL]


_ENTRY_RULES = {
    EntryPoint.REFERENCE: _reference_rules,
    EntryPoint.JIT_REGISTER: _register_rules,
    EntryPoint.JIT_TMA: _tma_rules,
    EntryPoint.JIT_STAGED: _staged_rules,
    EntryPoint.JIT_PAGE_UNIFIED: _page_unified_rules,
    EntryPoint.AOT: _aot_rules,
    EntryPoint.AOT_DIRECT: _aot_direct_rules,
    EntryPoint.AOT_PAGE_FIRST_DIRECT: _aot_page_first_direct_rules,
    EntryPoint.DSA_SHARDED: _dsa_sharded_rules,
    EntryPoint.MLA_SHARDED: _mla_sharded_rules,
    EntryPoint.MIXED_ROW_STRIDES: _mixed_row_strides_rules,
}


# ---- rule identities -------------------------------------------------------------------------------------

# Every reason above, named by the rule it states, in priority order: when an implementation accepts an input
# that breaks several rules, the first broken rule in this order is the bug's primary rule (its identity,
# harness/findings/identity.py). Structural rules come first (they decide what the transfer even is), then
# index placement and dtype, then row geometry, layout and platform: the most specific check an
# implementation can forget ranks first.
RULE_PRIORITY: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    ("index-lengths", r"^index lists differ in length"),
    ("page-multiple", r"is not a whole number of \d+-token pages|is not a multiple of page_size"),
    ("index-out-of-range", r"^(host|device) index -?\d+ outside"),
    ("duplicate-destinations", r"^duplicate destinations"),
    ("host-index-device", r"^host indices on "),
    ("device-index-device", r"^device indices on "),
    ("host-index-dtype", r"^host indices are "),
    ("device-index-dtype", r"^device indices are "),
    ("index-dtypes-differ", r"^host and device index dtypes differ"),
    ("zero-length", r"^zero-length"),
    ("row-tiling", r"does not tile the \w+ copy rounds"),
    ("row-multiple", r"is not a multiple of (16|8)\b|row is not a multiple of 16 bytes"),
    ("row-too-large", r"-byte shared-memory stage"),
    ("direction-scope", r"is an all-layer write-back|reads one layer of a page_unified pool"),
    ("layout", r"has no \w+ addressing|writes page_first|no per-token AOT op|moves layer_first pools"
               r"|move page_first_direct pools"),
    ("platform", r"needs a CUDA or ROCm device|needs CUDA sm90"),
    ("layer-sharded-backup", r"layer-sharded DSA indexer backs up layer_first only|layer-sharded MLA back-up "),
    ("mixed-row-strides", r"refuses device rows of mixed strides"),
))


def rule_of(reason: str) -> str:
    """The rule a reason states ("other:<reason>" for one this table does not know)."""
    for name, pattern in RULE_PRIORITY:
        if pattern.search(reason):
            return name
    return "other:" + reason


def rules_of(reasons: Sequence[str]) -> list[str]:
    return [rule_of(reason) for reason in reasons]


def primary_rule(reasons: Sequence[str]) -> str:
    """The first broken rule in RULE_PRIORITY (unknown rules last, in text order): deterministic."""
    order = {name: rank for rank, (name, _) in enumerate(RULE_PRIORITY)}
    rules = rules_of(reasons)
    if not rules:
        return "none"
    return min(rules, key=lambda rule: (order.get(rule, len(order)), rule))
