"""The case: a frozen, versioned, JSON-serializable description of one HiCache transfer.

A case is plain data. Everything that happens to it later (materializing tensors, predicting the result,
running a backend, comparing) is a pure function of the case, so the same case file gives the same bytes on
any machine. Loading validates every field and names the offending one in the error.

Structural validity (checked here) means "the case can be materialized": sizes are positive, the layout
exists for the attention kind, the pool fits in memory. Whether a *backend* must accept the transfer
(indices in range, index devices, row-size rules, ...) is the contract's question
(:mod:`hicache_fuzz.oracles.contract`), not this module's: out-of-range or mismatched index lists are
legal cases, because checking that backends reject them is part of the job.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hicache_fuzz.harness.model.json_input import (
    SAFE_NAME,
    InputError,
    expect_bool,
    expect_int,
    expect_keys,
    expect_str,
    parse_json,
    safe_name,
)

SCHEMA_VERSION = 1

# A case that would need more memory than this is rejected as impossible rather than left to OOM. Storages are
# counted rounded up to a power of two, as the host arena allocates them, so the scale tier's host pool past
# 2^32 bytes (rounded to 2^33) plus its device pool must fit: 16 GiB.
MAX_CASE_BYTES = 16 << 30


class CaseError(InputError):
    """A case (file, dict or constructor call) is malformed; the message names the field."""


class Direction(str, Enum):
    WRITE_BACK = "write_back"  # device pool -> host pool (backup)
    LOAD_BACK = "load_back"  # host pool -> device pool


class Scope(str, Enum):
    ONE_LAYER = "one_layer"  # the transfer touches `Case.layer` only
    ALL_LAYERS = "all_layers"  # the transfer touches every layer of the pool


class Attention(str, Enum):
    MHA = "mha"  # K and V rows of equal width
    MHA_ASYM = "mha_asym"  # K and V head dims differ (separate K and V tensors)
    MLA = "mla"  # one latent row per token


class HostLayout(str, Enum):
    LAYER_FIRST = "layer_first"
    PAGE_FIRST = "page_first"
    PAGE_FIRST_DIRECT = "page_first_direct"
    PAGE_HEAD = "page_head"
    PAGE_UNIFIED = "page_unified"


class KVDtype(str, Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"  # stored as uint8, as sglang does

    @property
    def itemsize(self) -> int:
        return {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}[self.value]


class IndexDevice(str, Enum):
    CPU = "cpu"  # pageable host memory
    PINNED = "pinned"  # page-locked host memory (CUDA/HIP "host" device in DLPack terms)
    DEVICE = "device"  # the accelerator (cuda:N / ROCm's cuda:N); on the CPU platform it is simulated


class IndexDtype(str, Enum):
    INT32 = "int32"
    INT64 = "int64"


class HostAllocator(str, Enum):
    PIN_MEMORY = "pin_memory"  # torch.empty(pin_memory=True): cudaHostAlloc / hipHostMalloc
    HOST_REGISTER = "host_register"  # mmap + cudaHostRegister: what sglang uses in production
    PAGEABLE = "pageable"  # plain malloc'd memory; kernels that dereference host memory must reject it


@dataclass(frozen=True)
class IndexSpec:
    """How one side's index list is handed to the backend."""

    dtype: IndexDtype = IndexDtype.INT64
    device: IndexDevice = IndexDevice.DEVICE


@dataclass(frozen=True)
class PoolSpec:
    """One pool pair (a device pool and its host pool) taking part in the transfer.

    Several pools in one case model sglang's HostPoolGroup: an anchor KV pool plus side pools that share the
    host and device index lists but have their own geometry and capability flags.

    Widths: for MHA a token row is ``heads * head_dim`` elements (``heads * v_head_dim`` for V of an
    asymmetric pool); for MLA ``heads`` must be 1 and ``head_dim`` is the latent width (kv_lora_rank +
    qk_rope_head_dim).
    """

    name: str = "kv"
    attention: Attention = Attention.MHA
    dtype: KVDtype = KVDtype.BF16
    heads: int = 1
    head_dim: int = 64
    v_head_dim: int | None = None
    head_groups: int = 1  # page_unified: heads are split into this many groups
    write_back_jit: bool = True  # the pool's own can_use_write_back_jit flag (groups may disagree)

    @property
    def components(self) -> tuple[str, ...]:
        return ("kv",) if self.attention is Attention.MLA else ("k", "v")

    def head_bytes(self, component: str) -> int:
        dim = self.v_head_dim if (component == "v" and self.v_head_dim is not None) else self.head_dim
        return dim * self.dtype.itemsize

    def row_bytes(self, component: str) -> int:
        """Bytes of one token row of `component` ('k', 'v' or 'kv')."""
        return self.heads * self.head_bytes(component)


@dataclass(frozen=True)
class Case:
    """One transfer. See README "Case format" for the JSON form."""

    direction: Direction
    scope: Scope
    layout: HostLayout
    pools: tuple[PoolSpec, ...]
    layers: int
    page_size: int
    device_rows: int  # rows per device layer (sglang: size + page_size, rows [0, page_size) are padding)
    host_slots: int  # host token slots S (a multiple of page_size)
    host_indices: tuple[int, ...]
    device_indices: tuple[int, ...]
    layer: int = 0  # the layer moved when scope is one_layer
    host_index: IndexSpec = field(default_factory=IndexSpec)
    device_index: IndexSpec = field(default_factory=IndexSpec)
    host_allocator: HostAllocator = HostAllocator.PIN_MEMORY
    backend: str = "reference"
    tuning: tuple[tuple[str, int | str | bool], ...] = ()  # backend knobs, sorted by name
    seed: int = 0  # salt of the data fill
    note: str = ""

    def __post_init__(self) -> None:
        validate(self)

    # ---- derived geometry --------------------------------------------------------------------------
    @property
    def host_pages(self) -> int:
        return self.host_slots // self.page_size

    @property
    def moved_layers(self) -> tuple[int, ...]:
        return (self.layer,) if self.scope is Scope.ONE_LAYER else tuple(range(self.layers))

    @property
    def n(self) -> int:
        return len(self.host_indices)

    @functools.cached_property
    def largest_index(self) -> int:
        """The largest index on either side (0 for an empty case). Kept in the case object, as wire_json is, so
        that a feed process computes it and the campaign parent's coverage reads it."""
        return max(max(self.host_indices, default=0), max(self.device_indices, default=0))

    def tuning_value(self, name: str, default: Any = None) -> Any:
        for key, value in self.tuning:
            if key == name:
                return value
        return default

    def replace(self, **changes: Any) -> Case:
        return dataclasses.replace(self, **changes)

    # ---- identity and serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "direction": self.direction.value,
            "scope": self.scope.value,
            "layout": self.layout.value,
            "pools": [_pool_to_dict(p) for p in self.pools],
            "layers": self.layers,
            "page_size": self.page_size,
            "device_rows": self.device_rows,
            "host_slots": self.host_slots,
            "layer": self.layer,
            "host_indices": list(self.host_indices),
            "device_indices": list(self.device_indices),
            "host_index": {"dtype": self.host_index.dtype.value, "device": self.host_index.device.value},
            "device_index": {"dtype": self.device_index.dtype.value, "device": self.device_index.device.value},
            "host_allocator": self.host_allocator.value,
            "backend": self.backend,
            "tuning": dict(self.tuning),
            "seed": self.seed,
            "note": self.note,
        }

    def to_json(self, indent: int | None = None) -> str:
        if indent is None:
            return self.wire_json
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @functools.cached_property
    def wire_json(self) -> str:
        """The case on one line: the worker protocol's and the batch journal's form. Computed once per case
        object and kept in it, so it travels with a pickled case: a feed process encodes its cases where it
        generates them and the campaign parent, which sends them to the workers, does not."""
        return json.dumps(self.to_dict())

    @functools.cached_property
    def case_id(self) -> str:
        """Content hash (the note excluded): equal cases have equal ids on every machine. Computed once per
        case object (it hashes the whole case, index lists included)."""
        body = self.to_dict()
        body.pop("note")
        digest = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return digest[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        return _case_from_dict(data)

    @classmethod
    def from_json(cls, text: str) -> Case:
        try:
            data = parse_json(text, "case")
        except InputError as exc:
            raise CaseError(str(exc)) from None
        if not isinstance(data, dict):
            raise CaseError(f"case: expected a JSON object, got {type(data).__name__}")
        return _case_from_dict(data)


# ---- validation ---------------------------------------------------------------------------------------

LAYOUTS_BY_ATTENTION: dict[Attention, frozenset[HostLayout]] = {
    Attention.MHA: frozenset(HostLayout),
    Attention.MHA_ASYM: frozenset({HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT}),
    Attention.MLA: frozenset(
        {HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_UNIFIED}
    ),
}


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise CaseError(f"{where}: {message}")


def _positive(value: Any, where: str) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, where,
             f"expected a positive integer, got {value!r}")


def _check_indices(values: tuple[Any, ...], where: str) -> None:
    # Cases of thousands of indices are built per fuzz case: the common all-valid list is checked with
    # C-level builtins (type() is int excludes bool and int subclasses); only a bad list is walked in
    # Python, to name its first bad element.
    if not values or (set(map(type, values)) == {int} and min(values) > -INDEX_LIMIT and max(values) < INDEX_LIMIT):
        return
    for i, value in enumerate(values):
        _require(type(value) is int, f"{where}[{i}]", f"expected an integer, got {value!r}")
        _require(-INDEX_LIMIT < value < INDEX_LIMIT, f"{where}[{i}]", f"{value} does not fit an int64 index")


INDEX_LIMIT = 1 << 62


def validate(case: Case) -> None:
    """Raise CaseError naming the field if `case` cannot be materialized."""
    _positive(case.layers, "case.layers")
    _positive(case.page_size, "case.page_size")
    _positive(case.device_rows, "case.device_rows")
    _positive(case.host_slots, "case.host_slots")
    _require(case.host_slots % case.page_size == 0, "case.host_slots",
             f"{case.host_slots} is not a multiple of page_size {case.page_size}")
    _require(type(case.layer) is int and 0 <= case.layer < case.layers, "case.layer",
             f"{case.layer!r} is not a layer of a {case.layers}-layer pool")
    _require(type(case.seed) is int and -INDEX_LIMIT < case.seed < INDEX_LIMIT, "case.seed",
             f"expected an integer, got {case.seed!r}")
    _require(isinstance(case.backend, str) and bool(SAFE_NAME.fullmatch(case.backend)), "case.backend",
             f"expected a backend name, got {case.backend!r}")
    for side, values in (("host_indices", case.host_indices), ("device_indices", case.device_indices)):
        _require(isinstance(values, tuple), f"case.{side}", "expected a tuple of integers")
        _check_indices(values, f"case.{side}")
    _require(len(case.pools) >= 1, "case.pools", "at least one pool is needed")
    names = [p.name for p in case.pools]
    for i, name in enumerate(names):  # pool names become storage keys ("<pool>/<side>") and script text
        _require(isinstance(name, str) and bool(SAFE_NAME.fullmatch(name)), f"case.pools[{i}].name",
                 f"{name!r} is not a safe name (letters, digits, _ . + -, not starting with a dot)")
    _require(len(set(names)) == len(names), "case.pools", f"pool names must be unique, got {names}")
    total = 0  # bytes allocated for the storages, each rounded as the host arena rounds it
    for i, pool in enumerate(case.pools):
        where = f"case.pools[{i}]"
        _positive(pool.heads, f"{where}.heads")
        _positive(pool.head_dim, f"{where}.head_dim")
        _positive(pool.head_groups, f"{where}.head_groups")
        _require(case.layout in LAYOUTS_BY_ATTENTION[pool.attention], f"{where}.attention",
                 f"layout {case.layout.value} does not exist for {pool.attention.value} pools")
        if pool.attention is Attention.MLA:
            _require(pool.heads == 1, f"{where}.heads", "MLA pools have one latent row per token (heads=1)")
        if pool.attention is Attention.MHA_ASYM:
            _require(pool.v_head_dim is not None, f"{where}.v_head_dim", "required for mha_asym")
            _positive(pool.v_head_dim, f"{where}.v_head_dim")
            # sglang builds its asymmetric host pool only where V's head dim differs from K's (equal: an mha pool)
            _require(pool.v_head_dim != pool.head_dim, f"{where}.v_head_dim",
                     f"equals head_dim={pool.head_dim}: that is an mha pool")
        else:
            _require(pool.v_head_dim is None, f"{where}.v_head_dim",
                     f"only mha_asym has one, not {pool.attention.value}")
        if case.layout is HostLayout.PAGE_UNIFIED:
            _require(pool.heads % pool.head_groups == 0, f"{where}.head_groups",
                     f"{pool.head_groups} does not divide heads={pool.heads}")
        else:
            _require(pool.head_groups == 1, f"{where}.head_groups", "only page_unified uses head groups")
        row_bytes = sum(pool.row_bytes(component) for component in pool.components) * case.layers
        total += allocated_bytes(row_bytes * case.host_slots) + allocated_bytes(row_bytes * case.device_rows)
    _require(total <= MAX_CASE_BYTES, "case",
             f"needs {total} bytes of storages (each rounded up to a power of two, as they are allocated), over "
             f"the {MAX_CASE_BYTES} limit")
    keys = [k for k, _ in case.tuning]
    _require(keys == sorted(set(keys)), "case.tuning", "keys must be unique and sorted (use make_tuning)")


def allocated_bytes(payload_bytes: int) -> int:
    """What one storage of `payload_bytes` really costs: guard bytes on both sides (well under 4 KiB), then
    the host arena's rounding up to a power of two (at least 4 KiB), so a case's real request is up to about
    twice its payload. The size limit counts this, so a case that passes it is not refused by the allocator
    for a reason the case file cannot show."""
    return 1 << max(12, (payload_bytes + 4096 - 1).bit_length())


def make_tuning(knobs: Mapping[str, int | str | bool]) -> tuple[tuple[str, int | str | bool], ...]:
    return tuple(sorted(knobs.items()))


# ---- dict <-> dataclass ------------------------------------------------------------------------------

def _pool_to_dict(pool: PoolSpec) -> dict[str, Any]:
    return {
        "name": pool.name,
        "attention": pool.attention.value,
        "dtype": pool.dtype.value,
        "heads": pool.heads,
        "head_dim": pool.head_dim,
        "v_head_dim": pool.v_head_dim,
        "head_groups": pool.head_groups,
        "write_back_jit": pool.write_back_jit,
    }


def _enum(kind: type[Enum], value: Any, where: str) -> Any:
    if not isinstance(value, str):
        choices = ", ".join(str(m.value) for m in kind)
        raise CaseError(f"{where}: expected one of {choices}, got {value!r}")
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise CaseError(f"{where}: {value[:80]!r} is not one of {choices}") from None


def _get(data: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in data:
        return data[key]
    if default is ...:
        raise CaseError(f"{where}.{key}: missing")
    return default


def _strict(check: Any, data: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
    """`data[key]` (or `default` when absent) through one of json_input's strict checks, as a CaseError."""
    if key not in data:
        return _get(data, key, where, default)
    try:
        return check(data[key], f"{where}.{key}")
    except InputError as exc:
        raise CaseError(str(exc)) from None


def _optional_int(value: Any, where: str) -> int | None:
    return None if value is None else expect_int(value, where)


def _int_list(value: Any, where: str) -> tuple[int, ...]:
    _require(isinstance(value, list), where, f"expected a list of integers, got {type(value).__name__}")
    return tuple(value)  # elements are checked (no bools, int64 range) by validate()


_POOL_KEYS = frozenset(f.name for f in dataclasses.fields(PoolSpec))


def _pool_from_dict(data: Any, where: str) -> PoolSpec:
    _require(isinstance(data, dict), where, "expected an object")
    unknown = sorted(set(data) - _POOL_KEYS)
    _require(not unknown, where, f"unknown field(s) {unknown}")
    return PoolSpec(
        name=_strict(safe_name, data, "name", where, "kv"),
        attention=_enum(Attention, _get(data, "attention", where, "mha"), f"{where}.attention"),
        dtype=_enum(KVDtype, _get(data, "dtype", where, "bf16"), f"{where}.dtype"),
        heads=_strict(expect_int, data, "heads", where),
        head_dim=_strict(expect_int, data, "head_dim", where),
        v_head_dim=_strict(_optional_int, data, "v_head_dim", where, None),
        head_groups=_strict(expect_int, data, "head_groups", where, 1),
        write_back_jit=_strict(expect_bool, data, "write_back_jit", where, True),
    )


def _index_spec(data: Any, where: str) -> IndexSpec:
    _require(isinstance(data, dict), where, "expected an object with dtype and device")
    unknown = sorted(set(data) - {"dtype", "device"})
    _require(not unknown, where, f"unknown field(s) {unknown}")
    return IndexSpec(
        dtype=_enum(IndexDtype, _get(data, "dtype", where, "int64"), f"{where}.dtype"),
        device=_enum(IndexDevice, _get(data, "device", where, "device"), f"{where}.device"),
    )


_CASE_KEYS = {
    "schema", "direction", "scope", "layout", "pools", "layers", "page_size", "device_rows", "host_slots", "layer",
    "host_indices", "device_indices", "host_index", "device_index", "host_allocator", "backend", "tuning", "seed",
    "note",
}


def _case_from_dict(data: Mapping[str, Any]) -> Case:
    where = "case"
    _require(isinstance(data, dict), where, f"expected an object, got {type(data).__name__}")
    schema = data.get("schema")
    # type() is int: `true == 1` in Python, and a boolean is no schema number
    _require(type(schema) is int and schema == SCHEMA_VERSION, "case.schema",
             f"expected {SCHEMA_VERSION}, got {schema!r}")
    try:
        expect_keys(data, _CASE_KEYS, where)
    except InputError as exc:
        raise CaseError(str(exc)) from None
    pools_raw = _get(data, "pools", where)
    _require(isinstance(pools_raw, list), "case.pools", "expected a list")
    tuning_raw = _get(data, "tuning", where, {})
    _require(isinstance(tuning_raw, dict), "case.tuning", "expected an object")
    for key, value in tuning_raw.items():
        _require(isinstance(value, int | str | bool), f"case.tuning.{key}", f"expected int, str or bool, got {value!r}")
    return Case(
        direction=_enum(Direction, _get(data, "direction", where), "case.direction"),
        scope=_enum(Scope, _get(data, "scope", where), "case.scope"),
        layout=_enum(HostLayout, _get(data, "layout", where), "case.layout"),
        pools=tuple(_pool_from_dict(p, f"case.pools[{i}]") for i, p in enumerate(pools_raw)),
        layers=_strict(expect_int, data, "layers", where),
        page_size=_strict(expect_int, data, "page_size", where),
        device_rows=_strict(expect_int, data, "device_rows", where),
        host_slots=_strict(expect_int, data, "host_slots", where),
        layer=_strict(expect_int, data, "layer", where, 0),
        host_indices=_int_list(_get(data, "host_indices", where), "case.host_indices"),
        device_indices=_int_list(_get(data, "device_indices", where), "case.device_indices"),
        host_index=_index_spec(_get(data, "host_index", where, {}), "case.host_index"),
        device_index=_index_spec(_get(data, "device_index", where, {}), "case.device_index"),
        host_allocator=_enum(HostAllocator, _get(data, "host_allocator", where, "pin_memory"), "case.host_allocator"),
        backend=_strict(expect_str, data, "backend", where, "reference"),
        tuning=make_tuning(tuning_raw),
        seed=_strict(expect_int, data, "seed", where, 0),
        note=_strict(expect_str, data, "note", where, ""),
    )


def page_runs_contiguous(indices: Sequence[int], page_size: int) -> bool:
    """True if every page-sized chunk of `indices` is a run of consecutive integers."""
    for start in range(0, len(indices) - len(indices) % page_size, page_size):
        first = indices[start]
        for t in range(1, page_size):
            if indices[start + t] != first + t:
                return False
    return True
