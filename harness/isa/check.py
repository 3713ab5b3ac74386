"""Static ISA check of sglang's HiCache copy kernels: ``hicache-fuzz isa``.

The HiCache copy kernels (``kernels/jit/csrc/kvcacheio/hicache.cuh`` and the relayout kernels of
``staged_write_back.cuh``) move KV rows through ``load_nc``/``store_nc``: on CUDA inline PTX with
``L1::no_allocate``, on ROCm ``__builtin_nontemporal_load/store`` on native 2/4-wide vector types. This
check compiles the same translation units sglang's ``load_jit`` builds, device-only and without a GPU:

* ROCm (gfx90a, gfx942) with Debian's upstream ``clang-19`` (``-x hip --cuda-device-only -S``);
* CUDA (sm_90a) with ``nvcc -cubin`` and ``nvdisasm``;

then reads every global memory access of every copy kernel instantiation and requires:

1. every store and every data load carries the nontemporal hint: gfx94x ``nt``, gfx90a ``glc slc``,
   CUDA ``.NA`` (``LDG.E.NA.128`` / ``STG.E.NA.128``);
2. every nontemporal access is exactly as wide as the instantiation's package, derived from its template
   arguments the way ``pick_group_bytes`` does (16 B -> ``dwordx4`` / ``.128``, 8 B -> ``x2`` / ``.64``,
   4 B -> ``dword`` / 32-bit);
3. no load wider than 64 bits goes without the hint (index and pointer-table loads are at most 64 bits);
4. nontemporal loads and stores come in equal numbers, a non-zero multiple of what one copied element
   needs (rounds per element x K/V).

``--strict`` (ROCm) turns off the four LLVM passes that re-merge adjacent 32-bit accesses (SLP vectorizer,
AMDGPU LoadStoreVectorizer, DAG store merging, SILoadStoreOptimizer). clang 19 at -O3 turns a
``load_nc``/``store_nc`` scalarized into 4 x 32-bit nontemporal builtins back into one ``dwordx4 nt``, so
only strict mode sees that the source no longer asks for one wide access. The CUDA path is inline PTX,
which no optimizer splits or merges; ``--strict`` changes nothing there.

Exit codes of :func:`run`: 0 all checks pass, 1 a check failed, 2 bad usage or input, 3 the toolchain or
sglang's source is unavailable (nothing was checked).

Only the standard library (and the stdlib-only exit codes of hicache_fuzz.harness.model) is imported, so the
check runs without torch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hicache_fuzz.harness.isa import fetch as isa_fetch
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE, EXIT_USAGE

PLATFORM_ROCM = "rocm"
PLATFORM_CUDA = "cuda"
PLATFORMS = (PLATFORM_ROCM, PLATFORM_CUDA)
DEFAULT_ARCHES: dict[str, tuple[str, ...]] = {
    PLATFORM_ROCM: ("gfx90a", "gfx942"),
    PLATFORM_CUDA: ("sm_90a",),
}

# Mirrors of sglang 0.5.23's kernels/ops/kvcache/hicache.py: the logical copy group, the copy-round widths
# pick_group_bytes() tries (widest first), the default block quota and the block size load_jit is given.
COPY_GROUP_THREADS = 32
GROUP_BYTES: dict[str, tuple[int, ...]] = {PLATFORM_ROCM: (128, 64, 32, 16), PLATFORM_CUDA: (128,)}
DEFAULT_BLOCK_QUOTA: dict[str, int] = {PLATFORM_ROCM: 32, PLATFORM_CUDA: 2}
BLOCK_SIZE = 1024
PACKAGE_BYTES = (4, 8, 16)

# The passes that re-merge adjacent 32-bit accesses; each one alone is enough to merge a scalarized
# load_nc back into one dwordx4 (docs/isa.md).
ROCM_STRICT_FLAGS: tuple[str, ...] = (
    "-fno-slp-vectorize",
    "-mllvm", "-amdgpu-load-store-vectorizer=false",
    "-mllvm", "-combiner-store-merging=false",
    "-Xclang", "-target-feature", "-Xclang", "-load-store-opt",
)  # fmt: skip

# What tvm-ffi's load_inline prepends to every unit sglang generates (utils/compile/spec.py).
TVM_FFI_INCLUDES = (
    "tvm/ffi/container/tensor.h",
    "tvm/ffi/dtype.h",
    "tvm/ffi/error.h",
    "tvm/ffi/extra/c_env_api.h",
    "tvm/ffi/function.h",
)

COMPILE_TIMEOUT_S = 600


class ToolchainUnavailable(RuntimeError):
    """A compiler, header set or disassembler is missing; the message says how to install it."""


class SourceUnavailable(RuntimeError):
    """sglang's kernel sources could not be found; the message says how to get them."""


class BadInput(ValueError):
    """An argument is malformed or inconsistent (exit code 2)."""


# ---------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class MemoryAccess:
    """One global memory instruction of a kernel.

    ``nontemporal`` is the streaming hint the copy kernels must carry: ``nt`` on gfx94x, ``glc slc`` on
    gfx90a, ``.NA`` (L1::no_allocate) in SASS.
    """

    space: str  # "global", "flat", "buffer" (AMDGPU); "global" (LDG/STG) or "generic" (LD/ST) in SASS
    direction: str  # "load" or "store"
    width_bits: int
    nontemporal: bool
    instruction: str


@dataclass(frozen=True)
class CopyExpectation:
    """What a copy kernel instantiation's template arguments imply for its data accesses."""

    width_bits: int  # package width; 0 when no 4/8/16-byte package tiles the element
    accesses_per_element: int  # nontemporal loads (and stores) that copying one element takes
    derivation: str


@dataclass
class KernelResult:
    module: str
    kernel: str  # readable instantiation, e.g. hicache_transfer_per_layer<int64_t, 256, 4, 32, 1024, false>
    symbol: str  # mangled name
    expected_width_bits: int
    expected_accesses_per_element: int
    derivation: str
    counts: dict[str, int]  # "global_load.128.nt" -> 4, "global_load.64" -> 2, ...
    violations: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations


@dataclass
class ModuleResult:
    name: str
    compiled: bool
    seconds: float
    kernels_found: int
    error: str = ""
    output_path: str = ""


@dataclass
class IsaReport:
    """The result of checking one (platform, arch, strict) combination."""

    platform: str
    arch: str
    strict: bool
    sglang_source: str
    sglang_version: str
    mutant: str
    compiler: str
    compile_flags: list[str]
    modules: list[ModuleResult] = field(default_factory=list)
    kernels: list[KernelResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        # Never green on an empty check: no kernels means nothing was verified.
        return (
            not self.errors
            and bool(self.kernels)
            and all(module.compiled for module in self.modules)
            and all(kernel.passed for kernel in self.kernels)
        )

    def failures(self) -> list[str]:
        lines = [f"{self.platform}/{self.arch}: {error}" for error in self.errors]
        for kernel in self.kernels:
            lines.extend(f"{self.platform}/{self.arch} {kernel.kernel}: {v}" for v in kernel.violations)
        if not self.kernels and not self.errors:
            lines.append(f"{self.platform}/{self.arch}: no kernel was checked")
        return lines

    def to_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["passed"] = self.passed
        for kernel_data, kernel in zip(data["kernels"], self.kernels, strict=True):
            kernel_data["passed"] = kernel.passed
        return data


# ---------------------------------------------------------------------------------------------------------
# Kernel instantiations: mangled names and what their template arguments imply


@dataclass(frozen=True)
class TemplateArgument:
    type_code: str  # Itanium builtin type code: i int32_t, l int64_t, j uint32_t, m uint64_t, b bool
    value: int | None  # None for a type argument


@dataclass(frozen=True)
class KernelName:
    family: str
    arguments: tuple[TemplateArgument, ...]

    def readable(self) -> str:
        return f"{self.family}<{', '.join(_render_argument(a) for a in self.arguments)}>"


_TYPE_NAMES = {"i": "int32_t", "l": "int64_t", "j": "uint32_t", "m": "uint64_t", "b": "bool"}


def _render_argument(argument: TemplateArgument) -> str:
    if argument.value is None:
        return _TYPE_NAMES.get(argument.type_code, argument.type_code)
    if argument.type_code == "b":
        return "true" if argument.value else "false"
    return str(argument.value)


def parse_kernel_symbol(symbol: str) -> KernelName | None:
    """Decode ``_ZN6sglang<len><name>I<args>E...`` for templates with builtin type and integer arguments.

    Only the shapes the HiCache kernels have are understood; anything else returns None.
    """
    match = re.match(r"_ZN6sglang(\d+)", symbol)
    if match is None:
        return None
    name_length = int(match.group(1))
    name_start = match.end()
    family = symbol[name_start : name_start + name_length]
    position = name_start + name_length
    if len(family) != name_length or symbol[position : position + 1] != "I":
        return None
    position += 1
    arguments: list[TemplateArgument] = []
    while position < len(symbol) and symbol[position] != "E":
        if symbol[position] == "L":
            literal = re.match(r"L([ijlmb])(n?)(\d+)E", symbol[position:])
            if literal is None:
                return None
            value = int(literal.group(3)) * (-1 if literal.group(2) else 1)
            arguments.append(TemplateArgument(literal.group(1), value))
            position += literal.end()
        elif symbol[position] in _TYPE_NAMES:
            arguments.append(TemplateArgument(symbol[position], None))
            position += 1
        else:
            return None
    if position >= len(symbol):
        return None
    return KernelName(family, tuple(arguments))


def pick_group_bytes(platform: str, element_bytes: int, lanes_per_worker: int) -> int:
    """Mirror of ``pick_group_bytes`` in hicache.cuh: the widest copy round whose package is 4/8/16 B."""
    for group in GROUP_BYTES[platform]:
        if group % lanes_per_worker or element_bytes % group:
            continue
        if group // lanes_per_worker in PACKAGE_BYTES:
            return group
    return 0


def expectation_for(kernel: KernelName, platform: str) -> CopyExpectation | None:
    """The package width and per-element access count a copy kernel instantiation implies.

    Returns None for kernels this check does not cover (none of the copy families).
    """
    values = [argument.value for argument in kernel.arguments]
    if kernel.family in ("hicache_transfer_per_layer", "hicache_transfer_all_layer"):
        # <T, kElementSize, kUnroll, kBlockQuota, kBlockSize, kIsMLA>
        if len(values) != 6 or None in values[1:]:
            return None
        element_bytes, unroll, is_mla = int(values[1] or 0), int(values[2] or 0), bool(values[5])
        if unroll <= 0 or COPY_GROUP_THREADS % unroll:
            return CopyExpectation(0, 0, f"unroll {unroll} does not divide {COPY_GROUP_THREADS}")
        lanes = COPY_GROUP_THREADS // unroll
        group = pick_group_bytes(platform, element_bytes, lanes)
        if group == 0:
            return CopyExpectation(0, 0, f"no 4/8/16 B package tiles {element_bytes} B across {lanes} lanes")
        components = 1 if is_mla else 2
        rounds = element_bytes // group
        package = group // lanes
        derivation = (
            f"{element_bytes} B element, unroll {unroll}: {lanes} lanes x {package} B per {group} B round, "
            f"{rounds} round(s) x {components} ({'K' if is_mla else 'K,V'})"
        )
        return CopyExpectation(package * 8, rounds * components, derivation)
    if kernel.family in ("hicache_relayout_kernel", "hicache_transfer_per_layer_page_unified"):
        # relayout: <Index, kElementSize, kIsMLA>;
        # page-unified load-back: <T, kElementSize, kBlockSize, kIsMLA>.
        # Both move one 16-byte vector per K and V (relayout) or per item (page-unified) and iteration.
        if not values or values[-1] is None:
            return None
        is_mla = bool(values[-1])
        components = 1 if is_mla or kernel.family.endswith("page_unified") else 2
        derivation = f"16 B vector per thread, {components} per iteration"
        return CopyExpectation(128, components, derivation)
    if kernel.family == "hicache_page_unified_relayout_kernel":
        return CopyExpectation(128, 1, "16 B vector per thread, 1 per iteration")
    return None


# ---------------------------------------------------------------------------------------------------------
# Modules: the translation units sglang's load_jit generates


@dataclass(frozen=True)
class ModuleSpec:
    """One JIT module: a kernel header plus the exported wrappers that instantiate its kernels."""

    name: str
    header: str  # relative to kernels/jit/csrc
    wrappers: tuple[tuple[str, str], ...]  # (export name, function expression) as in load_jit(cuda_wrappers=)
    expected_kernels: tuple[str, ...]  # readable instantiations that must appear in the ISA
    platforms: tuple[str, ...]

    def translation_unit(self, csrc_dir: pathlib.Path) -> str:
        lines = [f"#include <{header}>" for header in TVM_FFI_INCLUDES]
        lines.append(f'#include "{(csrc_dir / self.header).as_posix()}"')
        lines.append("namespace sglang {")
        lines += [
            f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({function}));" for export, function in self.wrappers
        ]
        lines.append("}  // namespace sglang")
        return "\n".join(lines) + "\n"


_INDEX_TYPES = ("int32_t", "int64_t")
_BOOLS = ("false", "true")


def _hicache_module(platform: str, element_bytes: int, unroll: int) -> ModuleSpec:
    quota = DEFAULT_BLOCK_QUOTA[platform]
    args = f"{element_bytes}, {unroll}, {quota}, {BLOCK_SIZE}"
    wrappers = tuple(
        (f"launch_{entry}", f"&HiCacheKernel<{args}>::run_{entry}")
        for entry in ("one", "all", "one_mla", "all_mla")
    )
    expected = tuple(
        f"hicache_transfer_{scope}_layer<{index}, {args}, {mla}>"
        for scope in ("per", "all")
        for index in _INDEX_TYPES
        for mla in _BOOLS
    )
    return ModuleSpec(
        f"hicache-e{element_bytes}-u{unroll}", "kvcacheio/hicache.cuh", wrappers, expected, (platform,)
    )


def _page_unified_load_module(platform: str, element_bytes: int) -> ModuleSpec:
    quota = DEFAULT_BLOCK_QUOTA[platform]
    args = f"{element_bytes}, 1, {quota}, {BLOCK_SIZE}"
    wrappers = (
        ("launch_one_page_unified", f"&HiCacheKernel<{args}>::run_one_page_unified<false>"),
        ("launch_one_mla_page_unified", f"&HiCacheKernel<{args}>::run_one_page_unified<true>"),
    )
    expected = tuple(
        f"hicache_transfer_per_layer_page_unified<{index}, {element_bytes}, {BLOCK_SIZE}, {mla}>"
        for index in _INDEX_TYPES
        for mla in _BOOLS
    )
    return ModuleSpec(
        f"hicache-page-unified-e{element_bytes}", "kvcacheio/hicache.cuh", wrappers, expected, (platform,)
    )


def _staged_module(platform: str, element_bytes: int, unroll: int) -> ModuleSpec:
    quota = DEFAULT_BLOCK_QUOTA[platform]
    args = f"{element_bytes}, {unroll}, {quota}, {BLOCK_SIZE}"
    wrappers = (
        ("launch_all_lf_pf_staged", f"&HiCacheStagedWriteBackKernel<{args}>::run_all_lf_pf_staged"),
        ("launch_all_mla_lf_pf_staged", f"&HiCacheStagedWriteBackKernel<{args}>::run_all_mla_lf_pf_staged"),
    )
    expected = tuple(
        f"hicache_relayout_kernel<{index}, {element_bytes}, {mla}>"
        for index in _INDEX_TYPES
        for mla in _BOOLS
    )
    return ModuleSpec(
        f"staged-e{element_bytes}-u{unroll}",
        "kvcacheio/staged_write_back.cuh",
        wrappers,
        expected,
        (platform,),
    )


def _page_unified_write_back_module(platform: str, group_bytes: int) -> ModuleSpec:
    # sglang builds one module per is_mla; both go into one unit here to halve the compile time.
    wrappers = (
        ("launch", f"&HiCachePageUnifiedWriteBackKernel<{group_bytes}, false>::run"),
        ("launch_mla", f"&HiCachePageUnifiedWriteBackKernel<{group_bytes}, true>::run"),
    )
    expected = tuple(
        f"hicache_page_unified_relayout_kernel<{index}, {group_bytes}, {mla}>"
        for index in _INDEX_TYPES
        for mla in _BOOLS
    )
    return ModuleSpec(
        f"page-unified-wb-g{group_bytes}", "kvcacheio/staged_write_back.cuh", wrappers, expected, (platform,)
    )


def modules_for(platform: str) -> tuple[ModuleSpec, ...]:
    """The instantiations checked per platform, chosen to cover every package width and kernel family.

    Element sizes follow sglang's default unroll (4 up to 512 B, 2 up to 1024 B, else 1). ROCm adds the
    narrow copy rounds only it has (GROUP_BYTES 64/32): 576 B is DeepSeek's fp8 MLA row.
    """
    if platform not in PLATFORMS:
        raise BadInput(f"unknown platform {platform!r}")
    modules = [
        _hicache_module(platform, 256, 4),  # 16 B packages (dwordx4 / .128)
        _hicache_module(platform, 1024, 2),  # 8 B packages (dwordx2 / .64)
        _hicache_module(platform, 2048, 1),  # 4 B packages (dword / 32-bit), by design for E > 1024
        _page_unified_load_module(platform, 256),
        _staged_module(platform, 256, 4),
        _page_unified_write_back_module(platform, 256),
    ]
    if platform == PLATFORM_ROCM:
        modules += [
            _hicache_module(platform, 576, 2),  # 64 B rounds -> 4 B packages
            _hicache_module(platform, 192, 4),  # 64 B rounds -> 8 B packages
        ]
    return tuple(modules)


# ---------------------------------------------------------------------------------------------------------
# Parsing: AMDGPU assembly (clang -S) and SASS (nvdisasm)

_AMDGPU_FUNCTION_LABEL = re.compile(r"^([A-Za-z_][\w$]*):")
_AMDGPU_FUNCTION_END = re.compile(r"^\.Lfunc_end\d+:")
_AMDGPU_MEMORY_OP = re.compile(r"^\s+(global|flat|buffer)_(load|store)_(\w+)(.*)$")
_AMDGPU_WIDTHS = (
    ("dwordx4", 128),
    ("dwordx3", 96),
    ("dwordx2", 64),
    ("dword", 32),
    ("short", 16),
    ("ushort", 16),
    ("sshort", 16),
    ("byte", 8),
    ("ubyte", 8),
    ("sbyte", 8),
)


def amdgpu_nontemporal_modifiers(arch: str) -> frozenset[str]:
    """The cache-policy bits LLVM sets for a nontemporal global access on ``arch``."""
    base = arch.split(":")[0]
    if base in ("gfx940", "gfx941", "gfx942"):
        return frozenset({"nt"})
    if base in ("gfx90a", "gfx908"):
        return frozenset({"glc", "slc"})
    raise BadInput(
        f"ROCm arch {arch!r} is not supported by this check (supported: gfx90a, gfx908, gfx940-942)"
    )


def _amdgpu_width(suffix: str) -> int:
    for name, bits in _AMDGPU_WIDTHS:
        if suffix == name or suffix.startswith(name + "_"):
            return bits
    return 0


def parse_amdgpu_assembly(text: str, arch: str) -> dict[str, list[MemoryAccess]]:
    """Global/flat/buffer loads and stores per function symbol of a ``clang -S`` AMDGPU listing."""
    wanted = amdgpu_nontemporal_modifiers(arch)
    functions: dict[str, list[MemoryAccess]] = {}
    current: str | None = None
    for line in text.splitlines():
        label = _AMDGPU_FUNCTION_LABEL.match(line)
        if label:
            current = label.group(1)
            functions.setdefault(current, [])
            continue
        if _AMDGPU_FUNCTION_END.match(line):
            current = None
            continue
        operation = _AMDGPU_MEMORY_OP.match(line)
        if operation is None or current is None:
            continue
        space, direction, suffix, operands = operation.groups()
        modifiers = set(operands.replace(",", " ").split())
        functions[current].append(
            MemoryAccess(
                space=space,
                direction=direction,
                width_bits=_amdgpu_width(suffix),
                nontemporal=wanted <= modifiers,
                instruction=line.strip(),
            )
        )
    return functions


_SASS_FUNCTION = re.compile(r"^\.text\.(\S+):\s*$")
_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_.]*)(.*?)\s*;")
_SASS_WIDTHS = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}


def parse_sass(text: str) -> dict[str, list[MemoryAccess]]:
    """Global (LDG/STG) and generic (LD/ST) memory instructions per function of an nvdisasm listing."""
    functions: dict[str, list[MemoryAccess]] = {}
    current: str | None = None
    for line in text.splitlines():
        header = _SASS_FUNCTION.match(line)
        if header:
            current = header.group(1)
            functions.setdefault(current, [])
            continue
        instruction = _SASS_INSTRUCTION.match(line)
        if instruction is None or current is None:
            continue
        opcode, *modifiers = instruction.group(1).split(".")
        if opcode not in ("LDG", "STG", "LD", "ST"):
            continue
        width = next((_SASS_WIDTHS[m] for m in modifiers if m in _SASS_WIDTHS), 32)
        functions[current].append(
            MemoryAccess(
                space="global" if opcode.endswith("G") else "generic",
                direction="load" if opcode.startswith("LD") else "store",
                width_bits=width,
                nontemporal="NA" in modifiers,
                instruction=" ".join((instruction.group(1) + instruction.group(2)).split()),
            )
        )
    return functions


# ---------------------------------------------------------------------------------------------------------
# The rules


def count_accesses(accesses: Sequence[MemoryAccess]) -> dict[str, int]:
    counts = Counter(
        f"{a.space}_{a.direction}.{a.width_bits}{'.nt' if a.nontemporal else ''}" for a in accesses
    )
    return dict(sorted(counts.items()))


def find_violations(accesses: Sequence[MemoryAccess], expectation: CopyExpectation, hint: str) -> list[str]:
    """Every reason the accesses of one copy kernel fall short of ``expectation``; empty when they pass.

    ``hint`` names the nontemporal marking in messages (``nt``, ``glc slc``, ``.NA``).
    """
    if expectation.width_bits == 0:
        return [f"configuration has no valid copy package ({expectation.derivation})"]
    want = expectation.width_bits
    violations: list[str] = []
    loads = [a for a in accesses if a.direction == "load"]
    stores = [a for a in accesses if a.direction == "store"]
    nt_loads = [a for a in loads if a.nontemporal]
    nt_stores = [a for a in stores if a.nontemporal]

    # A copy kernel stores nothing but copied data, so every store must be a streaming one.
    plain_stores = [a for a in stores if not a.nontemporal]
    if plain_stores:
        violations.append(
            f"{len(plain_stores)} store(s) without the nontemporal hint ({hint}), "
            f"e.g. `{plain_stores[0].instruction}`"
        )
    # Index and layer-pointer loads are at most 64 bits wide; a wider plain load is copied data.
    wide_plain_loads = [a for a in loads if not a.nontemporal and a.width_bits > 64]
    if wide_plain_loads:
        violations.append(
            f"{len(wide_plain_loads)} load(s) wider than 64 bits without the nontemporal hint ({hint}), "
            f"e.g. `{wide_plain_loads[0].instruction}`"
        )
    for direction, group in (("load", nt_loads), ("store", nt_stores)):
        if not group:
            violations.append(f"no nontemporal {direction} ({hint}) at all")
            continue
        wrong_width = [a for a in group if a.width_bits != want]
        if wrong_width:
            widths = ", ".join(f"{bits}-bit" for bits in sorted({a.width_bits for a in wrong_width}))
            violations.append(
                f"{len(wrong_width)} of {len(group)} nontemporal {direction}s are {widths}, "
                f"expected {want}-bit "
                f"({expectation.derivation}), e.g. `{wrong_width[0].instruction}`"
            )
        elif len(group) % expectation.accesses_per_element:
            violations.append(
                f"{len(group)} nontemporal {direction}s, not a multiple of the "
                f"{expectation.accesses_per_element} one element takes ({expectation.derivation})"
            )
    if nt_loads and nt_stores and len(nt_loads) != len(nt_stores):
        violations.append(f"{len(nt_loads)} nontemporal loads but {len(nt_stores)} nontemporal stores")
    return violations


def check_listing(
    functions: dict[str, list[MemoryAccess]],
    module: ModuleSpec,
    platform: str,
    hint: str,
) -> list[KernelResult]:
    """Apply the rules to every copy kernel of one module's listing; missing expected kernels fail."""
    results: list[KernelResult] = []
    found: set[str] = set()
    for symbol, accesses in functions.items():
        kernel = parse_kernel_symbol(symbol)
        if kernel is None:
            continue
        expectation = expectation_for(kernel, platform)
        if expectation is None:
            continue
        readable = kernel.readable()
        found.add(readable)
        results.append(
            KernelResult(
                module=module.name,
                kernel=readable,
                symbol=symbol,
                expected_width_bits=expectation.width_bits,
                expected_accesses_per_element=expectation.accesses_per_element,
                derivation=expectation.derivation,
                counts=count_accesses(accesses),
                violations=find_violations(accesses, expectation, hint),
            )
        )
    for missing in module.expected_kernels:
        if missing not in found:
            results.append(
                KernelResult(
                    module=module.name,
                    kernel=missing,
                    symbol="",
                    expected_width_bits=0,
                    expected_accesses_per_element=0,
                    derivation="",
                    counts={},
                    violations=["expected instantiation not found in the compiled code"],
                )
            )
    return results


# ---------------------------------------------------------------------------------------------------------
# sglang sources and mutants


@dataclass(frozen=True)
class SglangSource:
    """Where sglang's JIT kernels are read from.

    ``csrc_dir`` normally is ``jit_dir / "csrc"``; a mutant self-test points it at a modified copy.
    """

    jit_dir: pathlib.Path  # .../sglang/kernels/jit, holding csrc/ and include/
    csrc_dir: pathlib.Path
    version: str
    origin: str

    @property
    def include_dir(self) -> pathlib.Path:
        return self.jit_dir / "include"


HOW_TO_GET_SGLANG = (
    "install sglang (pip install sglang==0.5.23) or download it without installing "
    "(pip download --no-deps sglang==0.5.23 -d DIR) and pass --sglang-source DIR/sglang-0.5.23-*.whl "
    "(a wheel, an sdist, or an unpacked folder containing sglang/kernels/jit)"
)


def _read_version(package_dir: pathlib.Path) -> str:
    version_file = package_dir / "_version.py"
    if version_file.is_file():
        match = re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]", version_file.read_text(errors="replace"))
        if match:
            return match.group(1)
    for metadata in sorted(package_dir.parent.glob("sglang-*.dist-info/METADATA")):
        match = re.search(r"^Version:\s*(\S+)", metadata.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match.group(1)
    return "unknown"


def _find_jit_dir(root: pathlib.Path) -> pathlib.Path | None:
    candidates = [
        root,
        root / "kernels" / "jit",
        root / "sglang" / "kernels" / "jit",
        root / "python" / "sglang" / "kernels" / "jit",
    ]
    for candidate in candidates:
        if (candidate / "csrc" / "kvcacheio" / "hicache.cuh").is_file() and (candidate / "include").is_dir():
            return candidate
    return None


def resolve_sglang_source(
    path: pathlib.Path | str | None, cache_dir: pathlib.Path | None = None
) -> SglangSource:
    """Locate sglang's kernels: a folder, a wheel/sdist (extracted into the cache) or the installed one."""
    cache = cache_dir or isa_fetch.default_cache_dir()
    if path is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SourceUnavailable(
                f"sglang is not installed and --sglang-source was not given; {HOW_TO_GET_SGLANG}"
            )
        package_dir = pathlib.Path(next(iter(spec.submodule_search_locations)))
        jit_dir = _find_jit_dir(package_dir)
        if jit_dir is None:
            raise SourceUnavailable(
                f"the installed sglang at {package_dir} has no kernels/jit/csrc/kvcacheio/hicache.cuh "
                f"(too old or too new for this check); {HOW_TO_GET_SGLANG}"
            )
        return SglangSource(
            jit_dir, jit_dir / "csrc", _read_version(package_dir), f"installed package {package_dir}"
        )
    source = pathlib.Path(path).expanduser().resolve()
    if not source.exists():
        raise SourceUnavailable(f"--sglang-source {source} does not exist; {HOW_TO_GET_SGLANG}")
    if source.is_file():
        try:
            jit_dir = isa_fetch.extract_sglang_kernels(source, cache)
        except isa_fetch.FetchError as error:
            raise BadInput(str(error)) from error
        version_match = re.match(r"sglang-([0-9][^-]*?)(?:-|\.tar|\.zip)", source.name)
        version = version_match.group(1) if version_match else _read_version(jit_dir.parent.parent)
        return SglangSource(jit_dir, jit_dir / "csrc", version, f"archive {source}")
    found = _find_jit_dir(source)
    if found is None:
        raise SourceUnavailable(
            f"--sglang-source {source} contains no kernels/jit/csrc/kvcacheio/hicache.cuh; "
            f"{HOW_TO_GET_SGLANG}"
        )
    return SglangSource(found, found / "csrc", _read_version(found.parent.parent), f"folder {source}")


@dataclass(frozen=True)
class Mutant:
    """A deliberate defect in a copy of hicache.cuh that a check must catch (the checks' self-test)."""

    name: str
    platform: str
    description: str
    replacements: tuple[tuple[str, str], ...]  # (regex, replacement), each must match at least once


_NT_LOAD_VECTOR = r"native_uint{n} tmp = __builtin_nontemporal_load\(reinterpret_cast<const native_uint{n}\*>\(src\)\);\s*return __builtin_bit_cast\(uint{n}, tmp\);"  # noqa: E501
_NT_STORE_VECTOR = r"__builtin_nontemporal_store\(__builtin_bit_cast\(native_uint{n}, value\), reinterpret_cast<native_uint{n}\*>\(dst\)\);"  # noqa: E501
_COMPONENTS = ("x", "y", "z", "w")


def _scalar_loads(width: int) -> str:
    loads = ", ".join(f"__builtin_nontemporal_load(&src->{c})" for c in _COMPONENTS[:width])
    return f"return uint{width}{{{loads}}};"


def _scalar_stores(width: int) -> str:
    return " ".join(f"__builtin_nontemporal_store(value.{c}, &dst->{c});" for c in _COMPONENTS[:width])


def _ptx_scalar_loads(width: int) -> str:
    return "\\n\\t".join(f"ld.global.L1::no_allocate.b32 %{i},[%{width}+{4 * i}];" for i in range(width))


def _ptx_scalar_stores(width: int) -> str:
    return "\\n\\t".join(f"st.global.L1::no_allocate.b32 [%0+{4 * i}],%{i + 1};" for i in range(width))


MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "rocm-scalarized",
            PLATFORM_ROCM,
            "ROCm load_nc/store_nc for uint2/uint4 issue 2/4 separate 32-bit nontemporal builtins instead of "
            "one "
            "native vector access (clang -O3 re-merges them; only --strict sees it)",
            (
                (_NT_LOAD_VECTOR.format(n=2), _scalar_loads(2)),
                (_NT_LOAD_VECTOR.format(n=4), _scalar_loads(4)),
                (_NT_STORE_VECTOR.format(n=2), _scalar_stores(2)),
                (_NT_STORE_VECTOR.format(n=4), _scalar_stores(4)),
            ),
        ),
        Mutant(
            "rocm-plain",
            PLATFORM_ROCM,
            "ROCm load_nc/store_nc become plain loads/stores (the nontemporal builtins are defined away)",
            (
                (
                    r"#pragma once\n",
                    "#pragma once\n#ifdef USE_ROCM\n#define __builtin_nontemporal_load(p) (*(p))\n"
                    "#define __builtin_nontemporal_store(v, p) ((void)(*(p) = (v)))\n#endif\n",
                ),
            ),
        ),
        Mutant(
            "rocm-narrow-group",
            PLATFORM_ROCM,
            "ROCm pick_group_bytes skips the 128-byte round, so 16-byte packages shrink to 8 bytes",
            ((r"return group_fits\(bytes, lanes_per_worker, 128\)\s*\?\s*128u", "return false ? 128u"),),
        ),
        Mutant(
            "cuda-scalarized",
            PLATFORM_CUDA,
            "CUDA load_nc/store_nc for uint2/uint4 issue 32-bit ld/st.global.L1::no_allocate "
            "instead of v2/v4",
            (
                (re.escape("ld.global.L1::no_allocate.v2.b32 {%0,%1},[%2];"), _ptx_scalar_loads(2)),
                (re.escape("ld.global.L1::no_allocate.v4.b32 {%0,%1,%2,%3},[%4];"), _ptx_scalar_loads(4)),
                (re.escape("st.global.L1::no_allocate.v2.b32 [%0],{%1,%2};"), _ptx_scalar_stores(2)),
                (re.escape("st.global.L1::no_allocate.v4.b32 [%0],{%1,%2,%3,%4};"), _ptx_scalar_stores(4)),
            ),
        ),
        Mutant(
            "cuda-plain",
            PLATFORM_CUDA,
            "CUDA load_nc/store_nc lose the L1::no_allocate qualifier",
            ((re.escape(".global.L1::no_allocate."), ".global."),),
        ),
    )
}


def mutate_hicache_source(text: str, mutant: Mutant) -> str:
    """Apply ``mutant`` to the text of hicache.cuh; raises BadInput when the source lacks a pattern."""
    for pattern, replacement in mutant.replacements:
        # The replacement is literal C++ text; escape backslashes so re does not read \n in it.
        text, count = re.subn(pattern, replacement.replace("\\", "\\\\"), text)
        if count == 0:
            raise BadInput(
                f"mutant {mutant.name}: hicache.cuh has no match for /{pattern}/ (sglang changed?)"
            )
    return text


def apply_mutant(source: SglangSource, mutant_name: str, dest: pathlib.Path) -> SglangSource:
    """A copy of the source's kvcacheio kernels under ``dest`` with ``mutant_name`` applied to hicache.cuh."""
    mutant = MUTANTS.get(mutant_name)
    if mutant is None:
        raise BadInput(f"unknown mutant {mutant_name!r}; known: {', '.join(sorted(MUTANTS))}")
    csrc_copy = dest / "csrc"
    if csrc_copy.exists():
        shutil.rmtree(csrc_copy)
    shutil.copytree(source.csrc_dir / "kvcacheio", csrc_copy / "kvcacheio")
    header = csrc_copy / "kvcacheio" / "hicache.cuh"
    header.write_text(mutate_hicache_source(header.read_text(), mutant))
    return SglangSource(source.jit_dir, csrc_copy, source.version, f"{source.origin} + mutant {mutant_name}")


# ---------------------------------------------------------------------------------------------------------
# Toolchains


@dataclass(frozen=True)
class RocmToolchain:
    clang: pathlib.Path
    clang_version: str
    hip_include_dirs: tuple[pathlib.Path, ...]
    device_lib_dir: pathlib.Path
    tvm_ffi_include_dirs: tuple[pathlib.Path, ...]
    headers_origin: str


@dataclass(frozen=True)
class CudaToolchain:
    nvcc: pathlib.Path
    nvcc_version: str
    nvdisasm: pathlib.Path
    tvm_ffi_include_dirs: tuple[pathlib.Path, ...]


def _tool_version(tool: pathlib.Path) -> str:
    try:
        completed = subprocess.run(
            [str(tool), "--version"], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolchainUnavailable(f"{tool} does not run: {error}") from error
    if completed.returncode != 0:
        raise ToolchainUnavailable(
            f"{tool} --version exited {completed.returncode}: {completed.stderr[-500:]}"
        )
    lines = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
    if not lines:
        return "unknown"
    # clang prints its version first; nvcc prints it last ("Build cuda_13.0.r13.0/...").
    return lines[0] if "clang" in lines[0] else lines[-1]


def _resolve_tool(
    explicit: str | None, names: Sequence[str], fallbacks: Sequence[str]
) -> pathlib.Path | None:
    if explicit:
        found = shutil.which(explicit)
        return pathlib.Path(found) if found else None
    for name in names:
        found = shutil.which(name)
        if found:
            return pathlib.Path(found)
    for fallback in fallbacks:
        if pathlib.Path(fallback).is_file():
            return pathlib.Path(fallback)
    return None


def _tvm_ffi_includes(
    explicit: Sequence[str], cache_dir: pathlib.Path, allow_fetch: bool
) -> tuple[pathlib.Path, ...]:
    if explicit:
        return tuple(pathlib.Path(directory) for directory in explicit)
    installed = isa_fetch.installed_tvm_ffi_include_dirs()
    if installed:
        return installed
    try:
        return isa_fetch.ensure_tvm_ffi_headers(cache_dir, allow_fetch=allow_fetch)
    except isa_fetch.FetchError as error:
        raise ToolchainUnavailable(str(error)) from error


def find_rocm_toolchain(
    cache_dir: pathlib.Path | None = None,
    allow_fetch: bool = True,
    clang: str | None = None,
    hip_include: Sequence[str] = (),
    tvm_ffi_include: Sequence[str] = (),
    device_lib_path: str | None = None,
) -> RocmToolchain:
    """clang-19 plus HIP headers, ROCm device libraries and tvm-ffi headers (fetched when allowed)."""
    cache = cache_dir or isa_fetch.default_cache_dir()
    clang_path = _resolve_tool(clang, ("clang-19",), ("/usr/lib/llvm-19/bin/clang",))
    if clang_path is None:
        raise ToolchainUnavailable(
            f"{clang or 'clang-19'} not found; on Debian/Ubuntu: apt-get update && "
            "apt-get install -y --no-install-recommends clang-19 (or pass --clang PATH to a clang >= 19 "
            "with the AMDGPU backend)"
        )
    version = _tool_version(clang_path)
    if hip_include and device_lib_path:
        hip_dirs = tuple(pathlib.Path(directory) for directory in hip_include)
        device_libs, origin = pathlib.Path(device_lib_path), "--hip-include / --rocm-device-lib-path"
    else:
        try:
            fetched = isa_fetch.ensure_rocm_device_files(cache, allow_fetch=allow_fetch)
        except isa_fetch.FetchError as error:
            raise ToolchainUnavailable(str(error)) from error
        hip_dirs = tuple(pathlib.Path(d) for d in hip_include) or fetched.include_dirs
        device_libs = pathlib.Path(device_lib_path) if device_lib_path else fetched.device_lib_dir
        origin = fetched.origin
    if not (device_libs / "ockl.bc").is_file():
        raise ToolchainUnavailable(f"no ockl.bc in the ROCm device library folder {device_libs}")
    tvm_dirs = _tvm_ffi_includes(tvm_ffi_include, cache, allow_fetch)
    return RocmToolchain(clang_path, version, hip_dirs, device_libs, tvm_dirs, origin)


def find_cuda_toolchain(
    cache_dir: pathlib.Path | None = None,
    allow_fetch: bool = True,
    nvcc: str | None = None,
    nvdisasm: str | None = None,
    tvm_ffi_include: Sequence[str] = (),
) -> CudaToolchain:
    """nvcc plus nvdisasm (fetched from PyPI when the toolkit lacks it) and tvm-ffi headers."""
    cache = cache_dir or isa_fetch.default_cache_dir()
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nvcc_path = _resolve_tool(nvcc, ("nvcc",), (f"{cuda_home}/bin/nvcc",))
    if nvcc_path is None:
        raise ToolchainUnavailable(
            f"{nvcc or 'nvcc'} not found; install the CUDA toolkit (>= 12.4 for sm_90a with C++20) or "
            "pip install nvidia-cuda-nvcc, and put nvcc on PATH or pass --nvcc PATH"
        )
    version = _tool_version(nvcc_path)
    if nvdisasm:
        disassembler = _resolve_tool(nvdisasm, (), ())
        if disassembler is None:
            raise ToolchainUnavailable(f"--nvdisasm {nvdisasm} not found")
    else:
        try:
            disassembler = isa_fetch.ensure_nvdisasm(cache, allow_fetch=allow_fetch)
        except isa_fetch.FetchError as error:
            raise ToolchainUnavailable(str(error)) from error
    tvm_dirs = _tvm_ffi_includes(tvm_ffi_include, cache, allow_fetch)
    return CudaToolchain(nvcc_path, version, disassembler, tvm_dirs)


# ---------------------------------------------------------------------------------------------------------
# Compiling and checking


def rocm_compile_flags(arch: str, strict: bool, toolchain: RocmToolchain, source: SglangSource) -> list[str]:
    """sglang's ROCm JIT flags (arch.py, toolchain.py) plus what plain upstream clang needs without ROCm."""
    fp8 = "-DHIP_FP8_TYPE_FNUZ=1" if "gfx942" in arch else "-DHIP_FP8_TYPE_E4M3=1"
    flags = [
        "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-S",
        # No ROCm install: the device libraries come from their own folder (ockl inlines threadIdx and
        # friends, as in a real build) and -nogpuinc keeps clang from looking for a ROCm path, so clang's
        # own HIP wrapper is included by hand.
        f"--rocm-device-lib-path={toolchain.device_lib_dir}",
        "-nogpuinc", "-include", "__clang_hip_runtime_wrapper.h",
        "-DUSE_ROCM", "-std=c++20", "-O3", fp8,
        "-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-fno-gpu-rdc",
        "-Wno-unused-result",
    ]  # fmt: skip
    for directory in toolchain.hip_include_dirs:
        flags += ["-isystem", str(directory)]
    flags += ["-I", str(source.include_dir)]
    for directory in toolchain.tvm_ffi_include_dirs:
        flags += ["-I", str(directory)]
    if strict:
        flags += list(ROCM_STRICT_FLAGS)
    return flags


def cuda_arch_flags(arch: str) -> list[str]:
    """``sm_90a`` -> sglang's -gencode target plus its SGL_CUDA_ARCH define."""
    match = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    if match is None:
        raise BadInput(f"CUDA arch {arch!r} is not of the form sm_<major><minor>[a|f], e.g. sm_90a")
    major, minor, suffix = int(match.group(1)), int(match.group(2)), match.group(3)
    target = f"{major}{minor}{suffix}"
    return [f"-gencode=arch=compute_{target},code=sm_{target}", f"-DSGL_CUDA_ARCH={major * 100 + minor * 10}"]


def cuda_compile_flags(arch: str, toolchain: CudaToolchain, source: SglangSource) -> list[str]:
    flags = ["-cubin", *cuda_arch_flags(arch), "-std=c++20", "-O3", "--expt-relaxed-constexpr"]
    flags += ["-Xcompiler", "-fPIC", "-I", str(source.include_dir)]
    for directory in toolchain.tvm_ffi_include_dirs:
        flags += ["-I", str(directory)]
    return flags


@dataclass
class _CompileOutcome:
    module: ModuleSpec
    listing: str
    seconds: float
    error: str
    output_path: pathlib.Path


def _run_compiler(command: list[str]) -> tuple[int, str, str]:
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=COMPILE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {COMPILE_TIMEOUT_S} s: {' '.join(command)}"
    except OSError as error:
        return 127, "", f"could not run {command[0]}: {error}"
    return completed.returncode, completed.stdout, completed.stderr


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _compile_rocm_module(
    module: ModuleSpec,
    arch: str,
    strict: bool,
    toolchain: RocmToolchain,
    source: SglangSource,
    work_dir: pathlib.Path,
) -> _CompileOutcome:
    stem = f"{module.name}-{_safe_name(arch)}{'-strict' if strict else ''}"
    unit = work_dir / f"{stem}.hip"
    assembly = work_dir / f"{stem}.s"
    unit.write_text(module.translation_unit(source.csrc_dir))
    command = [
        str(toolchain.clang),
        *rocm_compile_flags(arch, strict, toolchain, source),
        str(unit),
        "-o",
        str(assembly),
    ]
    started = time.monotonic()
    returncode, _stdout, stderr = _run_compiler(command)
    seconds = time.monotonic() - started
    if returncode != 0:
        return _CompileOutcome(module, "", seconds, f"clang exited {returncode}:\n{stderr[-4000:]}", assembly)
    return _CompileOutcome(module, assembly.read_text(errors="replace"), seconds, "", assembly)


def _compile_cuda_module(
    module: ModuleSpec, arch: str, toolchain: CudaToolchain, source: SglangSource, work_dir: pathlib.Path
) -> _CompileOutcome:
    stem = f"{module.name}-{_safe_name(arch)}"
    unit = work_dir / f"{stem}.cu"
    cubin = work_dir / f"{stem}.cubin"
    sass = work_dir / f"{stem}.sass"
    unit.write_text(module.translation_unit(source.csrc_dir))
    command = [str(toolchain.nvcc), *cuda_compile_flags(arch, toolchain, source), str(unit), "-o", str(cubin)]
    started = time.monotonic()
    returncode, _stdout, stderr = _run_compiler(command)
    if returncode != 0:
        seconds = time.monotonic() - started
        return _CompileOutcome(module, "", seconds, f"nvcc exited {returncode}:\n{stderr[-4000:]}", sass)
    returncode, listing, stderr = _run_compiler([str(toolchain.nvdisasm), str(cubin)])
    seconds = time.monotonic() - started
    if returncode != 0:
        return _CompileOutcome(module, "", seconds, f"nvdisasm exited {returncode}:\n{stderr[-4000:]}", sass)
    sass.write_text(listing)
    return _CompileOutcome(module, listing, seconds, "", sass)


def _select_modules(platform: str, names: Sequence[str] | None) -> tuple[ModuleSpec, ...]:
    available = modules_for(platform)
    if not names:
        return available
    by_name = {module.name: module for module in available}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise BadInput(f"unknown {platform} module(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return tuple(by_name[name] for name in names)


def _as_source(source: SglangSource | pathlib.Path | str, cache_dir: pathlib.Path | None) -> SglangSource:
    return source if isinstance(source, SglangSource) else resolve_sglang_source(source, cache_dir)


def _check(
    report: IsaReport,
    modules: Sequence[ModuleSpec],
    compile_one: Callable[[ModuleSpec, pathlib.Path], _CompileOutcome],
    parse: Callable[[str], dict[str, list[MemoryAccess]]],
    hint: str,
    work_dir: pathlib.Path | None,
    jobs: int | None,
) -> IsaReport:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hicache-isa-") as scratch:
        directory = work_dir or pathlib.Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        workers = max(1, jobs or os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(lambda module: compile_one(module, directory), modules))
        for outcome in outcomes:
            kernels = (
                []
                if outcome.error
                else check_listing(parse(outcome.listing), outcome.module, report.platform, hint)
            )
            report.modules.append(
                ModuleResult(
                    name=outcome.module.name,
                    compiled=not outcome.error,
                    seconds=round(outcome.seconds, 2),
                    kernels_found=sum(1 for kernel in kernels if kernel.symbol),
                    error=outcome.error,
                    output_path=str(outcome.output_path) if work_dir else "",
                )
            )
            if outcome.error:
                report.errors.append(f"module {outcome.module.name} did not compile: {outcome.error}")
            report.kernels.extend(kernels)
    report.seconds = round(time.monotonic() - started, 2)
    return report


def check_rocm(
    source_dir: SglangSource | pathlib.Path | str,
    arch: str,
    strict: bool = False,
    *,
    modules: Sequence[str] | None = None,
    toolchain: RocmToolchain | None = None,
    work_dir: pathlib.Path | None = None,
    jobs: int | None = None,
    cache_dir: pathlib.Path | None = None,
) -> IsaReport:
    """Compile the HiCache modules for one ROCm ``arch`` with clang and check their ISA.

    Raises ToolchainUnavailable / SourceUnavailable when nothing can be compiled, BadInput for a bad arch
    or module name. Compile errors of the kernels themselves are failures inside the report.
    """
    hint = " ".join(sorted(amdgpu_nontemporal_modifiers(arch)))
    selected = _select_modules(PLATFORM_ROCM, modules)
    source = _as_source(source_dir, cache_dir)
    tools = toolchain or find_rocm_toolchain(cache_dir)
    report = IsaReport(
        platform=PLATFORM_ROCM,
        arch=arch,
        strict=strict,
        sglang_source=source.origin,
        sglang_version=source.version,
        mutant="",
        compiler=f"{tools.clang} ({tools.clang_version}); headers: {tools.headers_origin}",
        compile_flags=rocm_compile_flags(arch, strict, tools, source),
    )
    return _check(
        report,
        selected,
        lambda module, directory: _compile_rocm_module(module, arch, strict, tools, source, directory),
        lambda listing: parse_amdgpu_assembly(listing, arch),
        hint,
        work_dir,
        jobs,
    )


def check_cuda(
    source_dir: SglangSource | pathlib.Path | str,
    arch: str = "sm_90a",
    strict: bool = False,
    *,
    modules: Sequence[str] | None = None,
    toolchain: CudaToolchain | None = None,
    work_dir: pathlib.Path | None = None,
    jobs: int | None = None,
    cache_dir: pathlib.Path | None = None,
) -> IsaReport:
    """Compile the HiCache modules for one CUDA ``arch`` with nvcc and check the SASS.

    ``strict`` is recorded but changes nothing: the CUDA path is inline PTX, which no optimizer merges.
    """
    cuda_arch_flags(arch)  # validates the arch before any work
    selected = _select_modules(PLATFORM_CUDA, modules)
    source = _as_source(source_dir, cache_dir)
    tools = toolchain or find_cuda_toolchain(cache_dir)
    report = IsaReport(
        platform=PLATFORM_CUDA,
        arch=arch,
        strict=strict,
        sglang_source=source.origin,
        sglang_version=source.version,
        mutant="",
        compiler=f"{tools.nvcc} ({tools.nvcc_version}); disassembler: {tools.nvdisasm}",
        compile_flags=cuda_compile_flags(arch, tools, source),
    )
    return _check(
        report,
        selected,
        lambda module, directory: _compile_cuda_module(module, arch, tools, source, directory),
        parse_sass,
        ".NA (L1::no_allocate)",
        work_dir,
        jobs,
    )


# ---------------------------------------------------------------------------------------------------------
# Output


def _format_counts(counts: dict[str, int]) -> str:
    return " ".join(f"{key}={value}" for key, value in counts.items()) or "(no memory accesses)"


def render_text(report: IsaReport) -> list[str]:
    title = f"{report.platform} {report.arch}{' --strict' if report.strict else ''}"
    if report.mutant:
        title += f" [mutant {report.mutant}]"
    lines = [f"== {title}: sglang {report.sglang_version} ({report.sglang_source})"]
    for module in report.modules:
        state = f"{module.kernels_found} kernels" if module.compiled else "COMPILE FAILED"
        lines.append(f"  module {module.name}: {state}, {module.seconds:.1f} s")
    for kernel in report.kernels:
        verdict = "PASS" if kernel.passed else "FAIL"
        lines.append(f"  {verdict} {kernel.kernel}: {_format_counts(kernel.counts)}")
        lines.extend(f"       - {violation}" for violation in kernel.violations)
    lines.extend(f"  ERROR {error}" for error in report.errors)
    checked = sum(1 for kernel in report.kernels if kernel.symbol)
    failed = sum(1 for kernel in report.kernels if not kernel.passed)
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"  {verdict}: {checked} kernel instantiations checked, {failed} failing, {report.seconds:.1f} s"
    )
    return lines


def render_markdown(reports: Sequence[IsaReport], command: str) -> str:
    lines = ["# HiCache ISA check", "", f"Command: `{command}`", ""]
    lines += ["| platform | arch | strict | mutant | sglang | kernels | failing | result | seconds |"]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for report in reports:
        checked = sum(1 for kernel in report.kernels if kernel.symbol)
        failed = sum(1 for kernel in report.kernels if not kernel.passed)
        lines.append(
            f"| {report.platform} | {report.arch} | {'yes' if report.strict else 'no'} "
            f"| {report.mutant or '-'} "
            f"| {report.sglang_version} | {checked} | {failed} | {'PASS' if report.passed else 'FAIL'} "
            f"| {report.seconds:.1f} |"
        )
    for report in reports:
        lines += ["", f"## {report.platform} {report.arch}{' strict' if report.strict else ''}", ""]
        lines += ["| kernel | expected | accesses | result |", "|---|---|---|---|"]
        for kernel in report.kernels:
            expected = f"{kernel.expected_width_bits}-bit, {kernel.expected_accesses_per_element}/element"
            result = "PASS" if kernel.passed else "FAIL: " + "; ".join(kernel.violations)
            lines.append(f"| `{kernel.kernel}` | {expected} | {_format_counts(kernel.counts)} | {result} |")
        lines.extend(f"\nERROR: {error}" for error in report.errors)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hicache-fuzz isa``."""
    parser.add_argument(
        "--platform",
        choices=(*PLATFORMS, "all"),
        default="all",
        help="which compiler path to check (default: all)",
    )
    parser.add_argument(
        "--arch",
        action="append",
        default=None,
        metavar="ARCH",
        help="target, repeatable: gfx90a, gfx942, gfx942:sramecc+:xnack- (ROCm), sm_90a (CUDA); "
        "default gfx90a + gfx942 for rocm, sm_90a for cuda",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="ROCm: disable the LLVM passes that re-merge 32-bit accesses, so a scalarized load_nc/store_nc "
        "shows as 32-bit accesses instead of being merged back into dwordx4",
    )
    parser.add_argument(
        "--sglang-source",
        metavar="PATH",
        default=None,
        help="sglang wheel, sdist or folder containing sglang/kernels/jit (default: the installed sglang)",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="write the full results as JSON")
    parser.add_argument("--markdown", metavar="PATH", default=None, help="write a Markdown summary")
    parser.add_argument(
        "--keep-dir",
        metavar="DIR",
        default=None,
        help="keep generated units and listings (.s / .sass) in DIR",
    )
    parser.add_argument(
        "--module",
        action="append",
        default=None,
        metavar="NAME",
        help="check only this module, repeatable (e.g. hicache-e256-u4; see --list-modules)",
    )
    parser.add_argument("--list-modules", action="store_true", help="print the modules per platform and exit")
    parser.add_argument(
        "--mutant",
        choices=sorted(MUTANTS),
        default=None,
        help="self-test: check a copy of hicache.cuh with this defect; the check must FAIL (exit 1)",
    )
    parser.add_argument("--clang", default=None, help="clang for ROCm (default: clang-19)")
    parser.add_argument(
        "--rocm-device-lib-path",
        default=None,
        metavar="DIR",
        help="ROCm device libraries, ockl.bc and oclc_*.bc (default: Debian trixie's rocm-device-libs-17)",
    )
    parser.add_argument(
        "--nvcc", default=None, help="nvcc for CUDA (default: nvcc on PATH, $CUDA_HOME/bin/nvcc)"
    )
    parser.add_argument(
        "--nvdisasm", default=None, help="nvdisasm (default: on PATH, toolkit, else PyPI wheel)"
    )
    parser.add_argument(
        "--hip-include", action="append", default=[], metavar="DIR", help="HIP header folder, repeatable"
    )
    parser.add_argument(
        "--tvm-ffi-include",
        action="append",
        default=[],
        metavar="DIR",
        help="tvm-ffi header folder, repeatable",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="where fetched headers/tools are kept "
        "(default: $HICACHE_FUZZ_CACHE_DIR/isa, else ~/.cache/hicache-fuzz/isa)",
    )
    parser.add_argument("--no-fetch", action="store_true", help="never download headers or tools")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")


def _platform_of_arch(arch: str) -> str:
    if arch.startswith("gfx"):
        return PLATFORM_ROCM
    if arch.startswith("sm_"):
        return PLATFORM_CUDA
    raise BadInput(f"--arch {arch!r} is neither a ROCm gfx* nor a CUDA sm_* target")


def _plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (platform, arch) pairs to check, in order."""
    platforms = PLATFORMS if args.platform == "all" else (args.platform,)
    if args.mutant:
        mutant_platform = MUTANTS[args.mutant].platform
        if args.platform == "all":
            platforms = (mutant_platform,)
        elif mutant_platform != args.platform:
            raise BadInput(
                f"mutant {args.mutant} changes the {mutant_platform} path; use --platform {mutant_platform}"
            )
    if not args.arch:
        return [(platform, arch) for platform in platforms for arch in DEFAULT_ARCHES[platform]]
    plan = []
    for arch in args.arch:
        platform = _platform_of_arch(arch)
        if platform not in platforms:
            raise BadInput(f"--arch {arch} is a {platform} target but --platform is {args.platform}")
        if platform == PLATFORM_ROCM:
            amdgpu_nontemporal_modifiers(arch)
        else:
            cuda_arch_flags(arch)
        plan.append((platform, arch))
    return plan


def run(args: argparse.Namespace) -> int:
    """Entry point of ``hicache-fuzz isa``; returns the exit code (see the module docstring)."""
    if args.list_modules:
        for platform in PLATFORMS:
            for module in modules_for(platform):
                print(f"{platform}\t{module.name}\t{module.header}\t{len(module.expected_kernels)} kernels")
        return EXIT_CLEAN
    if args.jobs is not None and args.jobs < 1:
        print("isa: --jobs must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    cache_dir = pathlib.Path(args.cache_dir) if args.cache_dir else isa_fetch.default_cache_dir()
    allow_fetch = not args.no_fetch
    try:
        plan = _plan(args)
        for platform, _arch in plan:
            _select_modules(platform, args.module)
        source = resolve_sglang_source(args.sglang_source, cache_dir)
        rocm_tools = (
            find_rocm_toolchain(
                cache_dir,
                allow_fetch,
                args.clang,
                args.hip_include,
                args.tvm_ffi_include,
                args.rocm_device_lib_path,
            )
            if any(platform == PLATFORM_ROCM for platform, _ in plan)
            else None
        )
        cuda_tools = (
            find_cuda_toolchain(cache_dir, allow_fetch, args.nvcc, args.nvdisasm, args.tvm_ffi_include)
            if any(platform == PLATFORM_CUDA for platform, _ in plan)
            else None
        )
    except BadInput as error:
        print(f"isa: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (ToolchainUnavailable, SourceUnavailable) as error:
        print(f"isa: UNAVAILABLE, nothing was checked: {error}", file=sys.stderr)
        if args.platform == "all" and isinstance(error, ToolchainUnavailable):
            print("isa: (--platform rocm or --platform cuda checks one path alone)", file=sys.stderr)
        return EXIT_UNAVAILABLE

    reports: list[IsaReport] = []
    with tempfile.TemporaryDirectory(prefix="hicache-isa-mutant-") as mutant_dir:
        try:
            checked_source = (
                apply_mutant(source, args.mutant, pathlib.Path(mutant_dir)) if args.mutant else source
            )
        except BadInput as error:
            print(f"isa: {error}", file=sys.stderr)
            return EXIT_USAGE
        for platform, arch in plan:
            keep_dir = pathlib.Path(args.keep_dir) if args.keep_dir else None
            if platform == PLATFORM_ROCM:
                report = check_rocm(
                    checked_source, arch, args.strict, modules=args.module, toolchain=rocm_tools,
                    work_dir=keep_dir, jobs=args.jobs, cache_dir=cache_dir,
                )  # fmt: skip
            else:
                report = check_cuda(
                    checked_source, arch, args.strict, modules=args.module, toolchain=cuda_tools,
                    work_dir=keep_dir, jobs=args.jobs, cache_dir=cache_dir,
                )  # fmt: skip
            report.mutant = args.mutant or ""
            reports.append(report)
            print("\n".join(render_text(report)), flush=True)

    passed = all(report.passed for report in reports) and bool(reports)
    exit_code = EXIT_CLEAN if passed else EXIT_FAILURES
    if not passed:
        print("isa: FAIL")
        for report in reports:
            for failure in report.failures():
                print(f"  {failure}")
    else:
        total = sum(len(report.kernels) for report in reports)
        print(f"isa: PASS ({total} kernel instantiations over {len(reports)} targets)")
    own_argv = getattr(args, "argv", None)  # set by main(); under hicache-fuzz's CLI sys.argv has "isa"
    command = (
        "hicache-fuzz isa " + " ".join(own_argv)
        if own_argv is not None
        else "hicache-fuzz " + " ".join(sys.argv[1:])
    )
    if args.json:
        document = {
            "tool": "hicache-fuzz isa",
            "command": command,
            "passed": passed,
            "exit_code": exit_code,
            "reports": [report.to_json() for report in reports],
        }
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.markdown).write_text(render_markdown(reports, command))
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.isa.check``: the same as ``hicache-fuzz isa``."""
    parser = argparse.ArgumentParser(prog="hicache-fuzz isa", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    args.argv = arguments
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
