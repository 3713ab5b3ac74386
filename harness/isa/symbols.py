"""Kernel symbols and what each instantiation must look like: platforms and arches, sglang's copy parameters, the
errors, the result types, and the expected memory accesses of a kernel from its template arguments."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from hicache_fuzz.harness.model import copy_rules

PLATFORM_ROCM = "rocm"
PLATFORM_CUDA = "cuda"
PLATFORMS = (PLATFORM_ROCM, PLATFORM_CUDA)
DEFAULT_ARCHES: dict[str, tuple[str, ...]] = {
    PLATFORM_ROCM: ("gfx90a", "gfx942", "gfx950"),
    PLATFORM_CUDA: ("sm_90a",),
}


@dataclass(frozen=True)
class RocmTarget:
    """What the check needs to know about one AMDGPU target.

    ``nontemporal`` is the set of cache-policy bits LLVM sets on a nontemporal global access;
    ``llvm_majors`` the upstream clang major versions that can compile for the target (gfx950 arrived in
    LLVM 20, gfx940/gfx941 were removed in LLVM 20); ``fp8_define`` is sglang's FP8 flavour (FNUZ on
    gfx94x, OCP E4M3 elsewhere). ``wavefront_size`` is passed to HIP's headers as
    ``__AMDGCN_WAVEFRONT_SIZE`` (clang 22 no longer predefines it); ``lds_bytes`` is the LDS per work-group,
    an upper bound the copy kernels (which use no LDS) are checked against.
    """

    arch: str
    products: str
    nontemporal: frozenset[str]
    llvm_majors: tuple[int, int | None]  # (first, last) upstream LLVM major; None: still supported
    fp8_define: str
    wavefront_size: int = 64
    lds_bytes: int = 64 * 1024

    def llvm_supports(self, major: int) -> bool:
        first, last = self.llvm_majors
        return major >= first and (last is None or major <= last)

    def llvm_range(self) -> str:
        first, last = self.llvm_majors
        return f"LLVM {first}..{last}" if last is not None else f"LLVM >= {first}"


_GFX94X_NT = frozenset({"nt"})
_GFX90A_NT = frozenset({"glc", "slc"})
# The check's own floor is clang 19 (the oldest it was validated with), whatever older LLVMs could do.
ROCM_TARGETS: dict[str, RocmTarget] = {
    "gfx908": RocmTarget("gfx908", "MI100", _GFX90A_NT, (19, None), "-DHIP_FP8_TYPE_E4M3=1"),
    "gfx90a": RocmTarget("gfx90a", "MI210/MI250/MI250X", _GFX90A_NT, (19, None), "-DHIP_FP8_TYPE_E4M3=1"),
    "gfx940": RocmTarget("gfx940", "MI300 (early)", _GFX94X_NT, (19, 19), "-DHIP_FP8_TYPE_FNUZ=1"),
    "gfx941": RocmTarget("gfx941", "MI300 (early)", _GFX94X_NT, (19, 19), "-DHIP_FP8_TYPE_FNUZ=1"),
    "gfx942": RocmTarget("gfx942", "MI300X/MI300A/MI325X", _GFX94X_NT, (19, None), "-DHIP_FP8_TYPE_FNUZ=1"),
    "gfx950": RocmTarget(
        "gfx950", "MI350X/MI355X", _GFX94X_NT, (20, None), "-DHIP_FP8_TYPE_E4M3=1", lds_bytes=160 * 1024
    ),
}


def rocm_target(arch: str) -> RocmTarget:
    """The target of ``arch`` (``gfx942`` or ``gfx942:sramecc+:xnack-``); BadInput when unknown."""
    base = arch.split(":")[0]
    if base not in ROCM_TARGETS:
        raise BadInput(
            f"ROCm arch {arch!r} is not supported by this check (supported: {', '.join(ROCM_TARGETS)})"
        )
    return ROCM_TARGETS[base]

# Mirrors of sglang 0.5.23's kernels/ops/kvcache/hicache.py: the logical copy group and the copy-round widths
# pick_group_bytes() tries (widest first) and the default block quota are the shared copy rules; the block
# size load_jit is given is the ISA check's own.
COPY_GROUP_THREADS = copy_rules.WARP_LANES
GROUP_BYTES: dict[str, tuple[int, ...]] = {PLATFORM_ROCM: copy_rules.group_bytes(is_hip=True),
                                           PLATFORM_CUDA: copy_rules.group_bytes(is_hip=False)}
DEFAULT_BLOCK_QUOTA: dict[str, int] = {PLATFORM_ROCM: copy_rules.block_quota(is_hip=True),
                                       PLATFORM_CUDA: copy_rules.block_quota(is_hip=False)}
BLOCK_SIZE = 1024
PACKAGE_BYTES = copy_rules.PACKAGE_BYTES

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
    cached: bool = False  # listing read from the cache (harness/isa/listing_cache.py), not compiled this run


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
    skipped: str = ""  # why this target was not checked (no compiler for it); never counts as passed

    @property
    def passed(self) -> bool:
        # Never green on an empty check: no kernels means nothing was verified.
        return (
            not self.skipped
            and not self.errors
            and bool(self.kernels)
            and all(module.compiled for module in self.modules)
            and all(kernel.passed for kernel in self.kernels)
        )

    def failures(self) -> list[str]:
        if self.skipped:
            return [f"{self.platform}/{self.arch}: SKIPPED, not checked: {self.skipped}"]
        lines = [f"{self.platform}/{self.arch}: {error}" for error in self.errors]
        for kernel in self.kernels:
            lines.extend(f"{self.platform}/{self.arch} {kernel.kernel}: {v}" for v in kernel.violations)
        if not self.kernels and not self.errors:
            lines.append(f"{self.platform}/{self.arch}: no kernel was checked")
        return lines

    def to_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["passed"] = self.passed
        data["status"] = "skipped" if self.skipped else ("passed" if self.passed else "failed")
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
    return copy_rules.copy_round(element_bytes, lanes_per_worker, GROUP_BYTES[platform])


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


