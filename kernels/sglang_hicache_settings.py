"""The case knobs of ``sglang-hicache`` and what they mean (pure: no sglang, no GPU; used by generation, labels and
the drive)."""

from __future__ import annotations

import random
import zlib
from typing import Any, NamedTuple

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, PoolSpec
from hicache_fuzz.harness.model.space import SpaceProfile
from hicache_fuzz.kernels.sglang_pool import POOL_ROW_MENU
from hicache_fuzz.kernels.sglang_pool_calls import io_backend_for
from hicache_fuzz.oracles import pool_layouts, sequence, side_transfers
from hicache_fuzz.oracles.contract import EntryPoint

STANDARD, HISPARSE, K_ONLY, MAMBA = "standard", "hisparse", "k_only", "mamba"
NVFP4_INDEX_K, NVFP4_MAIN_KV = "nvfp4_index_k", "nvfp4_main_kv"
DSA, MXFP8 = "dsa", "mxfp8"
MAMBA_CLASS, DSA_CLASS, MXFP8_CLASS = "MambaPoolHost", "DSAIndexerPoolHost", "MHATokenToKVPoolMXFP8Host"
# Kinds resolved to a class of their own where the case fits it (else the standard class).
FITTED_KINDS = {MAMBA: MAMBA_CLASS, NVFP4_INDEX_K: "MiniMaxM3Nvfp4IndexKPoolHost",
                NVFP4_MAIN_KV: "MiniMaxM3Nvfp4MainKVPoolHost", DSA: DSA_CLASS, MXFP8: MXFP8_CLASS}
HYBRID, BASE = "hybrid", "base"
# The scheduler drives a flat MHA/MLA pool through the HybridCacheController over an anchor-only HostPoolGroup;
# HiCacheController itself is what the decode offload manager builds.
CONTROLLERS: tuple[str, ...] = (HYBRID, BASE)
_BY_ATTENTION = {
    Attention.MHA: "MHATokenToKVPoolHost",
    Attention.MLA: "MLATokenToKVPoolHost",
    Attention.MHA_ASYM: "AsymmetricMHATokenToKVPoolHost",
}
# Modelled classes are drawn far more often than the unmodelled ones, which come back unsupported with their
# reason (so campaign reports name what is out of reach) but cost a draw each. A kind that does not fit the
# drawn case resolves to the standard class (case_settings), so a kind that rarely fits (mamba: page size 1)
# costs no draws.
POOL_KINDS: tuple[str, ...] = ((STANDARD,) * 30 + (HISPARSE,) * 16 + (K_ONLY,) * 12 + (MAMBA,) * 16
                               + (NVFP4_INDEX_K,) * 8 + (NVFP4_MAIN_KV,) * 8 + (DSA,) * 8 + (MXFP8,) * 8
                               + pool_layouts.UNMODELLED)
# Production servers run either io backend (--hicache-io-backend kernel or direct), so the knob draws each as often;
# where the case's class moves its layout with one only, that one is taken (case_settings, io_backend_for), so each
# gets half the cases of a layout both move (layer_first; page_first_direct for the NVFP4 and Mamba pools).
IO_BACKENDS: tuple[str, ...] = pool_layouts.IO_BACKENDS
# start_layer is not a compile parameter: every pipeline-stage offset up to a 128-layer model's, with 0 (the
# first stage, and every model without pipeline parallelism) as often as all the others together.
START_LAYERS: tuple[int, ...] = (0,) * 127 + tuple(range(1, 128))
DRAFT_LAYERS: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 2, 3)
# The DSA indexer's index_topk_freq: 1 (every layer computes its own top-k and owns index keys, as DeepSeek V3.2)
# in half the cases, else every 2nd or 3rd layer does and the others reuse the previous layer's top-k (their index
# keys are elided: skip_topk_layers). Larger strides add device layers without index keys, which only cost memory.
INDEX_TOPK_FREQS: tuple[int, ...] = (1, 1, 2, 3)
# "" is the case's own transfer alone; the others are every program of 1..5 operations valid on any geometry.
PROGRAMS: tuple[str, ...] = ("",) * 40 + sequence.valid_programs(5)
# Side pools of the hybrid controller's group: "" (anchor only, as the scheduler groups a flat pool) in most
# cases, else a K-only index pool (PoolName.INDEXER, as sparse-attention models add one), a Mamba state pool
# (PoolName.MAMBA, as hybrid linear-attention models do), or both (a hybrid model with an indexer; appended last, so
# that a draw of any other value is the draw it was before). Their capability flags join the group's
# (can_use_write_back_jit of every child / of some child), which decide the controller's index placement. Classes
# in the group's name order (sglang grants side pools sorted by name: indexer before mamba).
SIDE_BOTH = f"{K_ONLY}+{MAMBA}"
SIDE_POOLS: tuple[str, ...] = ("",) * 4 + (K_ONLY, MAMBA, SIDE_BOTH)
SIDE_POOL_CLASSES: dict[str, tuple[str, ...]] = {K_ONLY: ("MHATokenToKOnlyPoolHost",), MAMBA: (MAMBA_CLASS,),
                                                  SIDE_BOTH: ("MHATokenToKOnlyPoolHost", MAMBA_CLASS)}
# Whether the side pools move with the anchor (oracles/side_transfers.py): "" (they move nothing, only their flags
# join the group's) in half the cases, else every transfer names them in extra_pools with their own host
# allocation. SIDE_TRANSFER_VALUES adds "full" (the side pool asked last holds room for one back-up and refuses the
# others), which only SIDE_GROUPS_PROFILE draws: a case of it needs a side pool, which its profile guarantees.
SIDE_TRANSFERS: tuple[str, ...] = ("", side_transfers.SIDE_TRANSFER_ON)
SIDE_TRANSFER_VALUES: tuple[str, ...] = (*SIDE_TRANSFERS, side_transfers.SIDE_TRANSFER_FULL)
LAYOUTS = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD)
# Row widths (bytes) joining the backend's row menu (POOL_ROW_MENU, compiled at start-up) as a campaign goes on.
ROW_GROWTH: tuple[int, ...] = (640, 768, 1280, 1536, 2560)
# The widths whose JIT modules the backend builds anyway (compile_jobs, prefetch): a DSA indexer pool on page_first
# builds the staged write-back module of its page-row width (page_size * E) in its constructor on CUDA, one compile
# (8-10 s) per width, so a DSA case takes page_first only where that width is one of these. The MXFP8 pool's
# constructor builds the staged modules of its payload row (E) and of its per-page scale block (4 * E): an MXFP8
# case needs both among these (E = 128, 256, 512 and 640 give blocks of 512, 1024, 2048 and 2560 bytes).
COMPILED_ROWS = frozenset(POOL_ROW_MENU + ROW_GROWTH)
# Each pool class of a kind stores a few shapes (its attention kinds, layouts, the Mamba pool's page size 1), and the
# generator draws a case's shape before its pool kind, so a kind lands on a shape its class cannot hold (and falls
# back to the standard class) most of the time. Each kind therefore owns PROFILE_PER_MILLE indices in 1,000 that
# draw from its class's shapes with the kind set (CaseSpace.profiles), so that every class is reached in a short
# campaign: the backend is costly (relative_case_cost), a 60-s campaign or a 20,000-case dry run generates only
# about 70 distinct cases of it, and the standard classes, which the other sglang backends reach too, keep the
# plain draws (two thirds).
PROFILE_PER_MILLE = 50
#
# The MXFP8 pool stores one shape only (MHA page_first, 128-token pages, rows of 32-byte multiples, no draft
# layers), which the plain draw reaches about once in 15,000 cases. Its profile's rows are those of the start-up
# menu whose scale blocks (4 x E) are in that menu too, so no profile case waits for a growth row's compile, and
# it takes the full case budget: a 128-token page of wide rows over many layers does not fit the small one.
MXFP8_ROWS: tuple[int, ...] = tuple(r for r in POOL_ROW_MENU if r % pool_layouts.MXFP8_BLOCK == 0
                                    and pool_layouts.mxfp8_scale_page_bytes(r) in POOL_ROW_MENU)
MXFP8_PROFILE = SpaceProfile(
    name=MXFP8, per_mille=PROFILE_PER_MILLE,
    changes=(("layouts", (HostLayout.PAGE_FIRST,)), ("attentions", (Attention.MHA,)),
             ("page_sizes", (pool_layouts.MXFP8_PAGE_SIZE,)), ("row_bytes", MXFP8_ROWS),
             ("small_rate", 0.0)),
    tuning=(("pool_kind", (MXFP8,)), ("draft_layers", (0,))))
CLASS_OF_KIND = {HISPARSE: "HiSparseMHATokenToKVPoolHost", K_ONLY: "MHATokenToKOnlyPoolHost", **FITTED_KINDS}
# Classes the HiSparse coordinator drives (sglang's HiSparseHostPoolMixin), whose host slots the ``requests`` knob
# puts in its request table (oracles/sequence.py). sglang's MLA host pool has the mixin too (the DSA HiSparse
# coordinator's); this backend drives it through the HiCache controllers only.
REQUEST_SLOT_CLASSES = frozenset({"HiSparseMHATokenToKVPoolHost"})


def request_schedules(count: int, backups: int, seed: int = 0) -> tuple[str, ...]:
    """`count` values of the ``requests`` knob (oracles/sequence.py), each with an entry for `backups` back-ups,
    drawn from `seed` (the campaign's, so that each campaign seed draws schedules of its own). Each entry names the
    previous entry's request (step 0's request 0 before the first) in almost half the entries, so that requests are
    extended, else a new request or one of rows 0-2; its start is mostly the request's end (an extension, unaligned
    after an unaligned count), else a token before or after it, its allocated length or one before that, or token 0;
    its count is 0, 1, one page and one token either side of it, or the case's tokens or one fewer. Together they
    take the pages a request lacks and stay within the pages it has, from starts on and off page boundaries."""
    rng = random.Random(seed)
    starts = ("end",) * 8 + ("end-1",) * 3 + ("end+1", "end+1", "alloc", "alloc", "alloc", "alloc-1", "alloc-1", "0",
                                                "0")
    counts = ("0", "0", "1", "1", "1", "1", "p-1", "p-1", "p", "p", "p+1", "p+1", "p+1", "n", "n", "n-1", "n-1")
    out = []
    for _ in range(count):
        previous, entries = "0", []
        for _ in range(backups):
            roll = rng.random()
            request = previous if roll < 0.45 else sequence.NEW_REQUEST if roll < 0.65 else str(rng.randrange(3))
            entries.append(f"{request}:{rng.choice(starts)}:{rng.choice(counts)}")
            previous = request if request != sequence.NEW_REQUEST else previous
        out.append(",".join(entries))
    return tuple(out)


# The HiSparse profile's ``requests`` draws: every back-up of a generated program (at most 5) has an entry. A few
# empty values plan each back-up as a request of its own over the case's tokens (the model without request slots,
# through the coordinator's calls). A schedule costs no compile, so the menu is not fixed: each campaign seed draws
# SCHEDULES_PER_SEED of its own (more than a 60-s campaign's HiSparse cases), and a case keeps its value in its
# tuning, so a reproducer replays without the menu.
EMPTY_SCHEDULES, SCHEDULES_PER_SEED, SCHEDULE_BACKUPS = 8, 248, 5


def request_schedule_menu(seed: int | None) -> tuple[str, ...]:
    """The ``requests`` values the HiSparse profile of campaign seed `seed` draws from (seed None: seed 0's)."""
    return ("",) * EMPTY_SCHEDULES + request_schedules(SCHEDULES_PER_SEED, SCHEDULE_BACKUPS,
                                                       seed=zlib.crc32(f"requests:{seed or 0}".encode()))
# The host pools of a DSA model under prefill context parallelism (oracles/pool_layouts.py, the two layer-sharded
# sections): the MLA host pool, and the DSA indexer beside it (its device pool is the same layer-split one).
# "size/rank/remainder" says the case is rank `rank`'s share of a stage whose layers are split over `size` CP ranks
# and leave `remainder` over (the stage's layer count follows from the case's layers), "" that the pool is not
# sharded. Every legal triple (2..4 ranks, each rank, each remainder), all of them together in one case in four.
LAYER_SHARD_KEY = "layer_shard"
LAYER_SHARD_VALUES: tuple[str, ...] = tuple(f"{size}/{rank}/{remainder}" for size in (2, 3, 4)
                                            for rank in range(size) for remainder in range(size))
LAYER_SHARDS: tuple[str, ...] = ("",) * (3 * len(LAYER_SHARD_VALUES)) + LAYER_SHARD_VALUES
SHARDED_CLASSES = frozenset({"MLATokenToKVPoolHost", DSA_CLASS})
# The device pool's rows: "packed" (one row after another, every device pool sglang builds by default) or
# "token_major" (--enable-unified-memory: per-layer views of one buffer whose slot entry holds every layer's rows,
# oracles/pool_layouts.py, the token-major section), one case in four.
DEVICE_ROWS_KEY = "device_rows"
PACKED, TOKEN_MAJOR = "packed", "token_major"
DEVICE_ROWS: tuple[str, ...] = (PACKED,) * 3 + (TOKEN_MAJOR,)
# The classes sglang builds over a unified pool's views (the standard MHA and MLA host pools); the unified pool
# lays rows out in 16-byte units and refuses others (--enable-unified-memory does not start). With packed draft
# layers the host pool refuses strided target rows when it is built (oracles/pool_layouts.py, the token-major
# section): those cases are predicted rejections (contract_entry).
TOKEN_MAJOR_CLASSES = frozenset(_BY_ATTENTION.values())
UNIFIED_ROW_ALIGN = 16
# Layer-sharded MLA pools are rare in the plain draws (one attention kind in three, the standard class, one case in
# four): a profile of their own draws MLA cases on the layouts whose back-up the sharded pool makes, the knob set.
# Its rows are DeepSeek's latent rows (512 + 64 elements) in fp8 and bf16: 576 bytes, which the JIT kernels do not
# take at most page sizes (the TMA kernel's 32-row chunks must tile the page, the register kernel's 128-byte groups
# the row), so that the sharded layer_first back-up with kernel io takes sgl_kernel's per-layer op, its other
# branch, and page_first is refused as the contract predicts (contract_entry); and 1152 bytes, which the register
# kernel takes. The plain draws give sharded cases every other row and page_first_direct, refused too.
LAYER_SHARD_PROFILE = SpaceProfile(
    name=LAYER_SHARD_KEY, per_mille=PROFILE_PER_MILLE // 2,
    changes=(("layouts", (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST)), ("attentions", (Attention.MLA,)),
             ("row_bytes", (576, 1152))),
    tuning=(("pool_kind", (STANDARD,)), (LAYER_SHARD_KEY, LAYER_SHARD_VALUES)))
# Layer-sharded DSA indexer cases need three rare draws at once (the DSA kind, a layout it stores, the knob), which
# the DSA class profile meets in one of its cases in four: a profile of their own at the same share as the sharded
# MLA one. Half its layouts are layer_first, whose back-ups move; page_first (where the indexer's page row is a
# compiled width, else the standard MLA pool, sharded too) and page_first_direct are refused at the first back-up
# (predicted rejections). Its cases are small (the small budget only): the anchor's device pool holds the whole
# stage, up to size x index_topk_freq times the case's layers, with the other ranks' layers kept full.
DSA_SHARD_PROFILE = SpaceProfile(
    name=f"{DSA}_{LAYER_SHARD_KEY}", per_mille=PROFILE_PER_MILLE // 2,
    changes=(("layouts", (HostLayout.LAYER_FIRST, HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST,
                          HostLayout.PAGE_FIRST_DIRECT)), ("attentions", (Attention.MLA,)), ("small_rate", 1.0)),
    tuning=(("pool_kind", (DSA,)), (LAYER_SHARD_KEY, LAYER_SHARD_VALUES)))

# Side pools that refuse their grant (side_transfer "full", oracles/side_transfers.py) need a group with side pools:
# the hybrid controller over a standard, unsharded KV anchor on a layout a side pool takes, which the plain draws
# meet in a few cases in a hundred, and two side pools need page size 1 as well. So "full" is drawn by a profile of
# its own only (appended last: the indices of the other profiles and of the plain draws are theirs as before), which
# pins what puts side pools in the group and draws page size 1 in half its cases. Two cases in three ask for both
# side pools: at page size 1 on page_first / page_first_direct both fit, and the Mamba pool, asked last, refuses
# after the K-only pool's grant (rolled back); elsewhere the K-only pool alone, which refuses itself. Two in three
# refuse ("full"), the others move every side pool ("on"). Every case has a program: the refusals come at its
# back-ups.
SIDE_GROUPS_PROFILE = SpaceProfile(
    name="side_groups", per_mille=PROFILE_PER_MILLE // 2,
    changes=(("layouts", (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT)),
             ("page_sizes", (1, 1, 1, 2, 3, 16))),
    tuning=(("controller", (HYBRID,)), ("pool_kind", (STANDARD,)), (LAYER_SHARD_KEY, ("",)),
            ("side_pool", (K_ONLY, SIDE_BOTH, SIDE_BOTH)), (sequence.OPS_KEY, sequence.valid_programs(5)),
            (side_transfers.SIDE_TRANSFER_KEY, (side_transfers.SIDE_TRANSFER_FULL, side_transfers.SIDE_TRANSFER_FULL,
                                                side_transfers.SIDE_TRANSFER_ON))))


def class_profile(kind: str, seed: int | None = None) -> SpaceProfile:
    """The profile of a pool kind: the attention kinds and layouts its class stores (with some io backend), page
    size 1 for a class of one slot per page, the kind set. The HiSparse profile's cases hold their host slots in
    the HiSparse coordinator's request table (a ``requests`` value of campaign seed `seed`'s
    request_schedule_menu), always have a program and no draft layers (the class packs none)."""
    cls = pool_layouts.pool_class(CLASS_OF_KIND[kind])
    stored = cls.layouts_for(pool_layouts.KERNEL) | cls.layouts_for(pool_layouts.DIRECT)
    changes: list[tuple[str, object]] = [
        ("layouts", tuple(layout for layout in LAYOUTS if layout in stored)),
        ("attentions", tuple(a for a in (Attention.MHA, Attention.MLA, Attention.MHA_ASYM) if a in cls.attentions))]
    if cls.slot_pages:
        changes.append(("page_sizes", (1,)))
    tuning: list[tuple[str, tuple[int | str | bool, ...]]] = [("pool_kind", (kind,))]
    if CLASS_OF_KIND[kind] in REQUEST_SLOT_CLASSES:
        tuning += [("draft_layers", (0,)), (sequence.OPS_KEY, sequence.valid_programs(5)),
                   (sequence.REQUESTS_KEY, request_schedule_menu(seed))]
    return SpaceProfile(name=kind, per_mille=PROFILE_PER_MILLE, changes=tuple(changes), tuning=tuple(tuning))


def profiles(seed: int | None) -> tuple[SpaceProfile, ...]:
    """The backend's profiles for campaign seed `seed` (CaseSpace.menu_seed)."""
    return (*(class_profile(kind, seed) for kind in CLASS_OF_KIND if kind != MXFP8), MXFP8_PROFILE,
            LAYER_SHARD_PROFILE, DSA_SHARD_PROFILE, SIDE_GROUPS_PROFILE)


def case_settings(case: Case) -> tuple[str, str, int, int]:
    """(pool class name, io backend, start layer, draft layers) of a case.

    The knobs say what to prefer; the case's attention kind and layout (drawn by the generator) decide what
    exists: ``hisparse`` is the HiSparse MHA pool on an MHA layer_first case and the standard class otherwise,
    ``k_only`` the K-only pool on a one-component case and the standard class otherwise, ``mamba`` the Mamba
    state pool on a two-component page_first / page_first_direct case of page size 1 and the standard class
    otherwise, ``nvfp4_index_k`` / ``nvfp4_main_kv`` MiniMax M3's NVFP4 page-row pools on a one-component
    layer_first / page_first_direct case and the standard class otherwise, ``dsa`` the DSA indexer pool on a
    one-component layer_first / page_first / page_first_direct case (page_first: see COMPILED_ROWS) and the
    standard class otherwise, ``mxfp8`` the MXFP8 pool on an MHA page_first case of page size 128 without draft
    layers whose rows are whole 32-element scale blocks and whose payload row and scale block are compiled widths
    (COMPILED_ROWS), the standard class otherwise, and ``io_backend`` is replaced by the other io backend where only
    that one moves the layout for the class (sglang_pool_calls.io_backend_for, the rule sglang-pool's knob follows
    too). Coverage labels and the plan's path name what was resolved."""
    kind = case.tuning_value("pool_kind", STANDARD)
    attention, layout = case.pools[0].attention, case.layout
    name = _BY_ATTENTION[attention]
    if kind == HISPARSE and attention is Attention.MHA and layout is HostLayout.LAYER_FIRST:
        name = "HiSparseMHATokenToKVPoolHost"
    elif kind == K_ONLY and attention is Attention.MLA:
        name = "MHATokenToKOnlyPoolHost"
    elif kind in FITTED_KINDS and _fits(FITTED_KINDS[str(kind)], case):
        name = FITTED_KINDS[str(kind)]
    elif kind not in (STANDARD, HISPARSE, K_ONLY, *FITTED_KINDS):
        name = str(kind)
    io_backend = str(case.tuning_value("io_backend", pool_layouts.KERNEL))
    cls = pool_layouts.POOL_CLASSES.get(name)
    if cls is not None and cls.modelled:
        io_backend = io_backend_for(cls, layout, io_backend)
    drafts = _int(case.tuning_value("draft_layers", 0))
    return name, io_backend, _int(case.tuning_value("start_layer", 0)), min(drafts, case.layers - 1)


class LayerShard(NamedTuple):
    """A layer-sharded case's stage (oracles/pool_layouts.py, the layer-sharded sections)."""

    size: int  # CP ranks the stage's layers are split over
    rank: int  # the rank whose share the case is
    remainder: int  # the stage's layers modulo size
    stage_layers: int  # the device pool's layers (L)
    start: int  # the first local layer the rank owns
    # the layers it owns: the case's target layers for the MLA pool; for the DSA indexer its MLA anchor's, of which
    # those that own index keys are the case's target layers
    owned: int
    host_target_layers: int  # the MLA host pool's target layers, ceil(L / size)

    @property
    def label(self) -> str:
        return f"{self.size}/{self.rank}/{self.remainder}"


def layer_shard_knob(case: Case) -> tuple[int, int, int] | None:
    """(size, rank, remainder) of the ``layer_shard`` knob (None: not sharded). Raises ValueError for a value that
    names no legal split."""
    value = case.tuning_value(LAYER_SHARD_KEY, "")
    if value == "":
        return None
    parts = str(value).split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{LAYER_SHARD_KEY} {value!r} is not size/rank/remainder")
    size, rank, remainder = (int(p) for p in parts)
    if size < 2 or not (0 <= rank < size and 0 <= remainder < size):
        raise ValueError(f"{LAYER_SHARD_KEY} {value!r}: sglang splits over 2 or more ranks, rank and remainder "
                         f"below the size")
    return size, rank, remainder


def layer_shard(case: Case) -> LayerShard | None:
    """The case's layer shard: the ``layer_shard`` knob where the case's class is one sglang builds sharded for a
    DSA model under prefill context parallelism (the MLA host pool of its KV rows, the DSA indexer beside it), None
    otherwise (or for a value that names no legal split: the case is then unsupported, layer_shard_problem)."""
    try:
        return _layer_shard(case)
    except ValueError:
        return None


def layer_shard_problem(case: Case) -> str | None:
    """Why the case's ``layer_shard`` value names no legal split (None if it does, or if the knob is unset)."""
    try:
        _layer_shard(case)
    except ValueError as exc:
        return str(exc)
    return None


def _layer_shard(case: Case) -> LayerShard | None:
    name, _io, first, drafts = case_settings(case)
    knob = layer_shard_knob(case)
    if knob is None or name not in SHARDED_CLASSES or case.layers - drafts < 1:
        return None
    size, rank, remainder = knob
    if name == DSA_CLASS:
        # the case's target layers are the rank's layers that own index keys: the stage is found from them
        freq = index_topk_freq(case)
        if freq < 1 or first < 0:
            return None
        try:
            stage = pool_layouts.dsa_shard_stage_layers(case.layers - drafts, size, rank, remainder, first, freq)
        except ValueError as exc:
            raise ValueError(f"{LAYER_SHARD_KEY} {case.tuning_value(LAYER_SHARD_KEY)!r}: {exc}") from None
        start, end = pool_layouts.layer_shard_range(rank, size, stage)
        return LayerShard(size, rank, remainder, stage, start, end - start,
                          pool_layouts.shard_host_target_layers(stage, size))
    owned = case.layers - drafts
    stage = pool_layouts.shard_stage_layers(owned, size, rank, remainder)
    start, end = pool_layouts.layer_shard_range(rank, size, stage)
    if end - start != owned:
        raise AssertionError(f"harness: rank {rank} of {size} owns {end - start} of {stage} layers, not {owned}")
    return LayerShard(size, rank, remainder, stage, start, owned, pool_layouts.shard_host_target_layers(stage, size))


def device_target_layers(case: Case) -> int:
    """The target layers of the case's device pool: the stage's for a layer-sharded case (the case holds the
    rank's share), the case's target layers otherwise (the DSA indexer's anchor: host_pool_layers)."""
    shard = layer_shard(case)
    return shard.stage_layers if shard is not None else case.layers - case_settings(case)[3]


def device_rows(case: Case) -> str:
    """``token_major`` where the case asks for it (``device_rows`` knob) and sglang builds its class over a
    unified pool's views: the standard MHA and MLA host pools, rows of 16-byte multiples (the unified pool's
    unit), an MLA pool only at start layer 0 (sglang's unified MLA pool has no layer range of its own: it is built
    for the first stage's ids), not layer-sharded; ``packed`` otherwise. Packed draft layers beside token-major
    target rows are the draft model's private pool, which the host pool refuses where the target rows are strided
    (target_rows_strided; a predicted rejection, contract_entry)."""
    if case.tuning_value(DEVICE_ROWS_KEY, PACKED) != TOKEN_MAJOR:
        return PACKED
    name, _io, start, _drafts = case_settings(case)
    spec = case.pools[0]
    if name not in TOKEN_MAJOR_CLASSES or layer_shard(case) is not None:
        return PACKED
    if spec.attention is Attention.MLA and start != 0:
        return PACKED
    if any(spec.row_bytes(c) % UNIFIED_ROW_ALIGN for c in spec.components):
        return PACKED
    return TOKEN_MAJOR


def target_rows_strided(case: Case) -> bool:
    """Whether a token-major case's target device rows are strided (oracles/pool_layouts.py,
    ``token_major_rows_strided``): the host pool then moves them by the entry stride and refuses packed draft rows
    beside them; False for packed rows."""
    if device_rows(case) != TOKEN_MAJOR:
        return False
    spec = case.pools[0]
    return pool_layouts.token_major_rows_strided(case.layers - case_settings(case)[3],
                                                  tuple(spec.row_bytes(c) for c in spec.components))


def contract_entry(case: Case) -> EntryPoint:
    """The contract entry point of the case (oracles/contract.py): ``DSA_SHARDED`` for a layer-sharded DSA
    indexer (its back-ups are refused on layouts other than layer_first), ``MLA_SHARDED`` for a layer-sharded MLA
    pool (its back-ups are refused on page_first without the JIT kernel and on page_first_direct),
    ``MIXED_ROW_STRIDES`` for packed draft layers beside strided token-major target rows (the host pool refuses them
    when built), else the reference's."""
    name, _io, _start, drafts = case_settings(case)
    if name == DSA_CLASS and layer_shard(case) is not None:
        return EntryPoint.DSA_SHARDED
    if name == "MLATokenToKVPoolHost" and layer_shard(case) is not None:
        return EntryPoint.MLA_SHARDED
    if drafts > 0 and target_rows_strided(case):
        return EntryPoint.MIXED_ROW_STRIDES
    return EntryPoint.REFERENCE


def controller_kind(case: Case) -> str:
    """The case's controller. The Mamba state pool is driven by HiCacheController: in production it is a side
    pool of the HybridCacheController's group (moved through ``extra_pools``), which this backend does not build,
    and an anchor-only group of a Mamba pool is no configuration sglang makes. The DSA indexer pool is driven by
    the HybridCacheController whatever the knob says: it exists only in the group beside its MLA anchor, as
    sglang's DSA stack builds it."""
    kind = str(case.tuning_value("controller", HYBRID))
    if kind == HYBRID and case.tuning_value("pool_kind") == MAMBA and _fits(MAMBA_CLASS, case):
        return BASE
    if case.tuning_value("pool_kind") == DSA and _fits(DSA_CLASS, case):
        return HYBRID
    return kind


def side_pools(case: Case) -> tuple[str, ...]:
    """The classes of the side pools in the case's group, in the group's name order (empty for none): those of the
    ``side_pool`` knob where the case has a group (the hybrid controller over a standard KV anchor) and the class's
    constructor takes the case's layout (and, for the Mamba pool, its page size 1); a class that does not fit is
    left out."""
    wanted = SIDE_POOL_CLASSES.get(str(case.tuning_value("side_pool", "")), ())
    if not wanted or controller_kind(case) != HYBRID or case_settings(case)[0] not in _BY_ATTENTION.values():
        return ()
    if layer_shard(case) is not None:  # sglang shards a DSA model's pools, whose group has no such side pool
        return ()
    return tuple(name for name in wanted if _side_fits(name, case))


def _side_fits(name: str, case: Case) -> bool:
    cls = pool_layouts.pool_class(name)
    layouts = cls.layouts_for(pool_layouts.KERNEL) | cls.layouts_for(pool_layouts.DIRECT)
    return case.layout in layouts and not (cls.slot_pages and case.page_size != 1)


def side_pool(case: Case) -> str:
    """The side pools of the case's group as one label: their classes joined with ``+`` ("" for none)."""
    return "+".join(side_pools(case))


def side_transfer(case: Case) -> bool:
    """Whether the case's side pools move with the anchor's transfers (the ``side_transfer`` knob ``on`` or
    ``full``, where the case has side pools)."""
    return bool(side_pools(case)) and case.tuning_value(side_transfers.SIDE_TRANSFER_KEY, "") in (
        side_transfers.SIDE_TRANSFER_ON, side_transfers.SIDE_TRANSFER_FULL)


def side_refusals(case: Case) -> bool:
    """Whether the case's last side pool holds room for one back-up and refuses the others (``full``;
    oracles/sequence.py plans the refusals wherever the knob says so, so a case without side pools does not run)."""
    return side_transfer(case) and sequence.side_refusals(case)


def index_topk_freq(case: Case) -> int:
    """The case's ``index_topk_freq`` knob (-1 if it is not a positive integer)."""
    freq = _int(case.tuning_value("index_topk_freq", 1))
    return freq if freq >= 1 else -1


def skip_topk_layers(case: Case) -> tuple[bool, ...]:
    """The DSA indexer's ``skip_topk_layers`` for the case's pipeline stage: one flag per target device layer
    (empty for other classes, or for a knob that is not a positive integer). The case's target layers are the
    layers that own index keys (oracles/pool_layouts.py), so the stage runs from ``start_layer`` up to the next
    owning layer after the last of them, skipped layers in between and after them included; a layer-sharded case's
    stage is its shard's (``layer_shard``: the rank's range holds the case's target layers). Which global layer
    ``g`` skips is sglang's default rule (``dsa_layer_skips_topk`` with ``index_topk_freq``,
    ``pool_layouts.skips_topk``): ``max(g - 1, 0) % freq != 0``."""
    name, _io, start, drafts = case_settings(case)
    freq = index_topk_freq(case)
    if name != DSA_CLASS or freq < 1 or start < 0:
        return ()
    shard = layer_shard(case)
    if shard is not None:
        return tuple(pool_layouts.skips_topk(layer, freq) for layer in range(start, start + shard.stage_layers))
    owned_left, layer = case.layers - drafts, start
    flags: list[bool] = []
    while True:
        skip = pool_layouts.skips_topk(layer, freq)
        if not skip and owned_left == 0:
            return tuple(flags)
        flags.append(skip)
        owned_left -= not skip
        layer += 1


def dsa_index_layers(case: Case) -> tuple[int, ...]:
    """The stage-local device layers of a DSA case's target layers (its indexer's host layers, in order): the stage's
    layers that own index keys, of the rank's owned range where the case is layer-sharded (oracles/pool_layouts.py);
    empty for other classes."""
    skip = skip_topk_layers(case)
    shard = layer_shard(case)
    if shard is not None and skip:
        return pool_layouts.dsa_shard_index_layers(skip, shard.start, shard.start + shard.owned)
    return pool_layouts.owned_device_layers(skip)


def host_pool_layers(case: Case) -> int:
    """The layers sglang's host pool of the case is built with (its ``layer_num``: ``target_layer_num`` plus one per
    packed draft buffer). For the DSA indexer pool the host pool in question is the MLA anchor's, built over a device
    pool of every target layer of the stage, skipped ones included (:func:`skip_topk_layers`), and the drafts
    (sglang_hicache_drive's ``_build_dsa``), so it holds more layers than the case where layers skip top-k. A
    layer-sharded MLA pool (a DSA case's anchor included) holds ``ceil(L / size)`` target layers, more than the
    rank's share where it owns fewer (:func:`layer_shard`), and the drafts. For every other case it is the case's
    layers: target and drafts (sglang_hicache_drive's ``build``), every layer of the target model
    (sglang_pool_calls). Where page_first_direct hands sglang's MLA host pool fewer pages than this, it cannot build
    its per-layer views (findings/trigger.py's ``host_pages``)."""
    name, _io, _start, drafts = case_settings(case)
    shard = layer_shard(case)
    if shard is not None:
        return shard.host_target_layers + max(drafts, 0)
    skip = skip_topk_layers(case)
    if name == DSA_CLASS and skip:
        return len(skip) + max(drafts, 0)
    return case.layers


def _fits(name: str, case: Case) -> bool:
    """Whether the class stores the case's attention kind, layout (with some io backend), page size and rows (and,
    for the DSA indexer on page_first and the MXFP8 pool, whether the widths its constructor compiles are among
    COMPILED_ROWS; for the MXFP8 pool, whether the case has no draft layers)."""
    cls = pool_layouts.pool_class(name)
    layouts = cls.layouts_for(pool_layouts.KERNEL) | cls.layouts_for(pool_layouts.DIRECT)
    spec = case.pools[0]
    rows = [spec.row_bytes(c) for c in spec.components]
    stored = spec.attention in cls.attentions and case.layout in layouts and (
        not cls.slot_pages or case.page_size == 1) and (
        not cls.only_page_size or case.page_size == cls.only_page_size) and all(r % cls.row_align == 0 for r in rows)
    if name == DSA_CLASS and case.layout is HostLayout.PAGE_FIRST:
        return stored and case.page_size * rows[0] in COMPILED_ROWS
    if name == MXFP8_CLASS:
        # sglang refuses packed draft layers for this pool when it is built (the server does not start): a drafted
        # case is not one of its cases
        drafts = min(_int(case.tuning_value("draft_layers", 0)), case.layers - 1)
        return stored and drafts <= 0 and all(
            r in COMPILED_ROWS and pool_layouts.mxfp8_scale_page_bytes(r) in COMPILED_ROWS for r in rows)
    return stored


def _int(value: Any) -> int:
    return value if type(value) is int else -1


def operation_kinds(case: Case) -> tuple[str, ...]:
    """The operation kinds a case's sequence performs (step 0's transfer included), sorted; under request slots
    those of its planned steps (``release`` for an evict, ``reserve`` for a load-back case's slots)."""
    if sequence.request_slots(case):
        try:
            return tuple(sorted({step.op for step in sequence.plan_steps(case)}))
        except sequence.SequenceError:
            pass
    first = sequence.BACKUP if case.direction is Direction.WRITE_BACK else sequence.LOAD
    try:
        ops = sequence.program(case)
    except sequence.SequenceError:
        ops = ()
    return tuple(sorted({first, *ops}))


def k_only_heads(spec: PoolSpec) -> tuple[int, int]:
    """(heads, head_dim) of a K-only pool for the case's one-component row of spec.head_dim elements: as many heads
    (8, 4, 2 or 1) as divide it; any split gives the same bytes."""
    heads = next(h for h in (8, 4, 2, 1) if spec.head_dim % h == 0)
    return heads, spec.head_dim // heads


def request_slot_kinds(case: Case) -> tuple[str, ...]:
    """What a request-slot case's grants do (oracles/sequence.py), sorted: ``empty`` (no tokens), ``first_pages``
    (pages for a request that held none), ``more_pages`` (pages added to a request's), ``in_pages`` (tokens within
    the pages it holds), ``unaligned_start`` (a grant from a token inside a page); empty for other cases."""
    if not sequence.request_slots(case):
        return ()
    try:
        steps = sequence.plan_steps(case)
    except sequence.SequenceError:
        return ()
    kinds = set()
    for step in steps:
        if step.op not in (sequence.BACKUP, sequence.RESERVE):
            continue
        held_before = len(step.table[step.request]) - step.new_pages * case.page_size
        if not step.host_indices:
            kinds.add("empty")
        elif step.new_pages:
            kinds.add("more_pages" if held_before else "first_pages")
        else:
            kinds.add("in_pages")
        if step.host_indices and step.start % case.page_size:
            kinds.add("unaligned_start")
    return tuple(sorted(kinds))
