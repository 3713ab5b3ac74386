"""Listing parsers (AMDGPU assembly, SASS) and the check of one listing against the expectations."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from hicache_fuzz.harness.isa.modules import ModuleSpec
from hicache_fuzz.harness.isa.symbols import (
    CopyExpectation,
    KernelResult,
    MemoryAccess,
    expectation_for,
    parse_kernel_symbol,
    rocm_target,
)

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
    return rocm_target(arch).nontemporal


_AMDHSA_KERNEL = re.compile(r"^\s*\.amdhsa_kernel\s+(\S+)")
_AMDHSA_LDS = re.compile(r"^\s*\.amdhsa_group_segment_fixed_size\s+(\d+)")


def amdgpu_lds_bytes(text: str) -> dict[str, int]:
    """Static LDS (group segment) bytes per kernel, from the ``.amdhsa_kernel`` descriptors of a listing."""
    sizes: dict[str, int] = {}
    current: str | None = None
    for line in text.splitlines():
        kernel = _AMDHSA_KERNEL.match(line)
        if kernel:
            current = kernel.group(1)
            continue
        lds = _AMDHSA_LDS.match(line)
        if lds and current is not None:
            sizes[current] = int(lds.group(1))
    return sizes


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


