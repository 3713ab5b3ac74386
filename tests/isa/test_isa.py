"""Tests of the static ISA check (``hicache-fuzz isa``).

Two kinds:

* fast ones on small ISA/SASS listings captured from real compiles of sglang 0.5.23 (always run);
* compile-based ones that build sglang 0.5.23's kernels with clang-19 (ROCm) and nvcc (CUDA): each check
  passes on the real source and FAILS on a mutated copy of hicache.cuh. They are skipped, with the reason,
  only when clang-19 / nvcc / the sglang source cannot be had; ``.ci/isa.sh`` installs them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil

import pytest

from hicache_fuzz.harness.isa import check as isa
from hicache_fuzz.harness.isa import fetch as isa_fetch

SGLANG_VERSION = "0.5.23"

# ---------------------------------------------------------------------------------------------------------
# Captured listings (trimmed to the memory instructions and the function boundaries)

PER_LAYER_MHA_SYMBOL = "_ZN6sglang26hicache_transfer_per_layerIlLl256ELj4ELj32ELj1024ELb0EEEvNS_19HicacheKernelParamsE"

GFX942_VECTOR = f"""\
{PER_LAYER_MHA_SYMBOL}: ; @{PER_LAYER_MHA_SYMBOL}
	s_load_dword s3, s[0:1], 0x40
	s_load_dwordx16 s[4:19], s[0:1], 0x0
.LBB1_2:                                ; =>This Inner Loop Header: Depth=1
	global_load_dwordx2 v[12:13], v[12:13], off
	global_load_dwordx2 v[26:27], v[10:11], off
	global_load_dwordx4 v[10:13], v[28:29], off nt
	global_load_dwordx4 v[14:17], v[28:29], off offset:128 nt
	global_load_dwordx4 v[18:21], v[30:31], off nt
	global_load_dwordx4 v[22:25], v[30:31], off offset:128 nt
	global_store_dwordx4 v[28:29], v[10:13], off nt
	global_store_dwordx4 v[28:29], v[14:17], off offset:128 nt
	global_store_dwordx4 v[26:27], v[18:21], off nt
	global_store_dwordx4 v[26:27], v[22:25], off offset:128 nt
	s_cbranch_execnz .LBB1_2
.LBB1_3:
	s_endpgm
.Lfunc_end1:
	.size	{PER_LAYER_MHA_SYMBOL}, .Lfunc_end1-{PER_LAYER_MHA_SYMBOL}
__hip_cuid_0:
	.byte	0
"""

# The same kernel from the scalarized mutant in --strict mode: one 16-byte package became 4 dword ops.
GFX942_SCALARIZED = (
    f"""\
{PER_LAYER_MHA_SYMBOL}:
	global_load_dwordx2 v[12:13], v[12:13], off
	global_load_dwordx2 v[26:27], v[10:11], off
"""
    + "".join(
        f"\tglobal_load_dword v{6 + i}, v[4:5], off offset:{offset} nt\n"
        for i, offset in enumerate(o + base for base in (0, 128) for o in (0, 4, 8, 12))
    )
    * 2
    + "".join(
        f"\tglobal_store_dword v[2:3], v{6 + i}, off offset:{offset} nt\n"
        for i, offset in enumerate(o + base for base in (0, 128) for o in (0, 4, 8, 12))
    )
    * 2
    + ".Lfunc_end1:\n"
)

GFX90A_VECTOR = f"""\
{PER_LAYER_MHA_SYMBOL}:
	global_load_dwordx2 v[2:3], v[2:3], off
	global_load_dwordx2 v[58:59], v[0:1], off
	global_load_dwordx4 v[0:3], v[8:9], off glc slc
	global_load_dwordx4 v[4:7], v[8:9], off offset:128 glc slc
	global_load_dwordx4 v[12:15], v[10:11], off glc slc
	global_load_dwordx4 v[16:19], v[10:11], off offset:128 glc slc
	global_store_dwordx4 v[8:9], v[0:3], off glc slc
	global_store_dwordx4 v[8:9], v[4:7], off offset:128 glc slc
	global_store_dwordx4 v[20:21], v[12:15], off glc slc
	global_store_dwordx4 v[20:21], v[16:19], off offset:128 glc slc
.Lfunc_end1:
"""

CUDA_MLA_SYMBOL = "_ZN6sglang26hicache_transfer_per_layerIlLl256ELj4ELj2ELj1024ELb1EEEvNS_19HicacheKernelParamsE"

SASS_VECTOR = f"""\
	.section	.text.{CUDA_MLA_SYMBOL},"ax",@progbits
.text.{CUDA_MLA_SYMBOL}:
        /*0070*/               @P0 EXIT ;
        /*0150*/                   LDG.E.64 R2, desc[UR4][R2.64] ;
        /*0170*/                   LDG.E.64 R4, desc[UR4][R4.64] ;
        /*02c0*/                   LDG.E.NA.128 R8, desc[UR4][R12.64] ;
        /*02d0*/                   LDG.E.NA.128 R12, desc[UR4][R12.64+0x80] ;
        /*0300*/              @!P1 STG.E.NA.128 desc[UR4][R28.64], R8 ;
        /*0310*/                   STG.E.NA.128 desc[UR4][R28.64+0x80], R12 ;
        /*0320*/                   STL.64 [R1], R2 ;
        /*0330*/                   EXIT ;
"""


def _access(direction: str, width: int, nontemporal: bool) -> isa.MemoryAccess:
    return isa.MemoryAccess(
        "global", direction, width, nontemporal, f"{direction}{width}{' nt' if nontemporal else ''}"
    )


X4_KV = isa.CopyExpectation(128, 4, "test: 16 B packages, 2 rounds x K,V")


# ---------------------------------------------------------------------------------------------------------
# Fast tests: names, expectations, parsers, rules


def test_parse_kernel_symbol_gives_the_template_arguments() -> None:
    kernel = isa.parse_kernel_symbol(PER_LAYER_MHA_SYMBOL)
    assert kernel is not None
    assert kernel.readable() == "hicache_transfer_per_layer<int64_t, 256, 4, 32, 1024, false>"
    relayout = isa.parse_kernel_symbol("_ZN6sglang23hicache_relayout_kernelIiLl256ELb1EEEvNS_21HicacheRelayoutParamsE")
    assert relayout is not None and relayout.readable() == "hicache_relayout_kernel<int32_t, 256, true>"


@pytest.mark.parametrize(
    "symbol", ["__hip_cuid_0", "_ZN3foo3barEv", "_ZN6sglang6deviceEv", "_ZN6sglang4kernIN2ns1TEEEvv"]
)
def test_parse_kernel_symbol_rejects_other_shapes(symbol: str) -> None:
    assert isa.parse_kernel_symbol(symbol) is None


@pytest.mark.parametrize(
    ("platform", "element_bytes", "unroll", "group"),
    [
        ("rocm", 256, 4, 128),
        ("rocm", 576, 2, 64),  # DeepSeek fp8 MLA row: only the ROCm narrow rounds tile it
        ("cuda", 576, 2, 0),
        ("rocm", 192, 4, 64),
        ("rocm", 96, 4, 32),
        ("rocm", 2048, 1, 128),
        ("cuda", 1024, 2, 128),
        ("rocm", 656, 2, 0),  # GLM bf16 row: no package fits anywhere
    ],
)
def test_pick_group_bytes_mirrors_the_kernel(platform: str, element_bytes: int, unroll: int, group: int) -> None:
    assert isa.pick_group_bytes(platform, element_bytes, 32 // unroll) == group


@pytest.mark.parametrize(
    ("readable_args", "platform", "width", "per_element"),
    [
        ((256, 4, False), "rocm", 128, 4),
        ((256, 4, True), "rocm", 128, 2),
        ((1024, 2, False), "cuda", 64, 16),
        ((2048, 1, True), "cuda", 32, 16),
        ((576, 2, False), "rocm", 32, 18),
        ((576, 2, False), "cuda", 0, 0),
    ],
)
def test_expectation_for_register_kernels(
    readable_args: tuple[int, int, bool], platform: str, width: int, per_element: int
) -> None:
    element_bytes, unroll, is_mla = readable_args
    arguments = (
        isa.TemplateArgument("l", None),
        isa.TemplateArgument("l", element_bytes),
        isa.TemplateArgument("j", unroll),
        isa.TemplateArgument("j", 32),
        isa.TemplateArgument("j", 1024),
        isa.TemplateArgument("b", int(is_mla)),
    )
    expectation = isa.expectation_for(isa.KernelName("hicache_transfer_all_layer", arguments), platform)
    assert expectation is not None
    assert (expectation.width_bits, expectation.accesses_per_element) == (width, per_element)


def test_expectation_for_relayout_and_page_unified_kernels() -> None:
    index, size = isa.TemplateArgument("i", None), isa.TemplateArgument("l", 256)
    mla, mha = isa.TemplateArgument("b", 1), isa.TemplateArgument("b", 0)
    relayout_mha = isa.expectation_for(isa.KernelName("hicache_relayout_kernel", (index, size, mha)), "rocm")
    relayout_mla = isa.expectation_for(isa.KernelName("hicache_relayout_kernel", (index, size, mla)), "rocm")
    assert relayout_mha is not None and (relayout_mha.width_bits, relayout_mha.accesses_per_element) == (
        128,
        2,
    )
    assert relayout_mla is not None and relayout_mla.accesses_per_element == 1
    page_unified = isa.KernelName(
        "hicache_transfer_per_layer_page_unified", (index, size, isa.TemplateArgument("j", 1024), mha)
    )
    expectation = isa.expectation_for(page_unified, "cuda")
    assert expectation is not None and (expectation.width_bits, expectation.accesses_per_element) == (128, 1)
    assert isa.expectation_for(isa.KernelName("hicache_tma_kernel", (index,)), "cuda") is None


def test_parse_amdgpu_gfx942_vector_listing() -> None:
    functions = isa.parse_amdgpu_assembly(GFX942_VECTOR, "gfx942")
    assert set(functions) == {PER_LAYER_MHA_SYMBOL, "__hip_cuid_0"}
    counts = isa.count_accesses(functions[PER_LAYER_MHA_SYMBOL])
    assert counts == {"global_load.128.nt": 4, "global_load.64": 2, "global_store.128.nt": 4}
    assert functions["__hip_cuid_0"] == []  # code after .Lfunc_end is not the kernel's


def test_parse_amdgpu_gfx90a_needs_both_glc_and_slc() -> None:
    functions = isa.parse_amdgpu_assembly(GFX90A_VECTOR, "gfx90a")
    assert isa.count_accesses(functions[PER_LAYER_MHA_SYMBOL])["global_store.128.nt"] == 4
    only_glc = GFX90A_VECTOR.replace(" glc slc", " glc")
    stores = [a for a in isa.parse_amdgpu_assembly(only_glc, "gfx90a")[PER_LAYER_MHA_SYMBOL] if a.direction == "store"]
    assert stores and not any(access.nontemporal for access in stores)
    # gfx942 spells nontemporal "nt": gfx90a's bits mean nothing there.
    gfx942_view = isa.parse_amdgpu_assembly(GFX90A_VECTOR, "gfx942")[PER_LAYER_MHA_SYMBOL]
    assert not any(access.nontemporal for access in gfx942_view)


def test_parse_sass_listing() -> None:
    accesses = isa.parse_sass(SASS_VECTOR)[CUDA_MLA_SYMBOL]
    # STL (local spill) is not a global access; the predicated STG is.
    assert isa.count_accesses(accesses) == {
        "global_load.128.nt": 2,
        "global_load.64": 2,
        "global_store.128.nt": 2,
    }
    assert accesses[-1].instruction == "STG.E.NA.128 desc[UR4][R28.64+0x80], R12"


def test_vector_listings_pass_the_rules() -> None:
    for listing, arch in ((GFX942_VECTOR, "gfx942"), (GFX90A_VECTOR, "gfx90a")):
        accesses = isa.parse_amdgpu_assembly(listing, arch)[PER_LAYER_MHA_SYMBOL]
        assert isa.find_violations(accesses, X4_KV, "nt") == []
    mla = isa.CopyExpectation(128, 2, "test: 16 B packages, 2 rounds x K")
    assert isa.find_violations(isa.parse_sass(SASS_VECTOR)[CUDA_MLA_SYMBOL], mla, ".NA") == []


def test_scalarized_listing_fails_on_width() -> None:
    accesses = isa.parse_amdgpu_assembly(GFX942_SCALARIZED, "gfx942")[PER_LAYER_MHA_SYMBOL]
    violations = isa.find_violations(accesses, X4_KV, "nt")
    assert len(violations) == 2
    assert violations[0].startswith("16 of 16 nontemporal loads are 32-bit, expected 128-bit")
    assert "global_load_dword v6, v[4:5], off offset:0 nt" in violations[0]
    assert violations[1].startswith("16 of 16 nontemporal stores are 32-bit")


def test_plain_listing_fails_on_the_missing_hint() -> None:
    plain = GFX942_VECTOR.replace(" nt\n", "\n")
    accesses = isa.parse_amdgpu_assembly(plain, "gfx942")[PER_LAYER_MHA_SYMBOL]
    violations = isa.find_violations(accesses, X4_KV, "nt")
    assert any(v.startswith("4 store(s) without the nontemporal hint (nt)") for v in violations)
    assert any(v.startswith("4 load(s) wider than 64 bits without the nontemporal hint") for v in violations)
    assert "no nontemporal load (nt) at all" in violations
    assert "no nontemporal store (nt) at all" in violations


def test_narrow_packages_fail_when_64_bit_plain_loads_hide_among_index_loads() -> None:
    # 8-byte packages that lost their hint look like index loads; the stores and the counts give them away.
    expectation = isa.CopyExpectation(64, 16, "test: 8 B packages")
    accesses = [_access("load", 64, False)] * 18 + [_access("store", 64, False)] * 16
    violations = isa.find_violations(accesses, expectation, "nt")
    assert "no nontemporal load (nt) at all" in violations
    assert any("16 store(s) without the nontemporal hint" in v for v in violations)


def test_partial_loss_of_the_hint_fails_on_counts() -> None:
    accesses = [_access("load", 128, True)] * 3 + [_access("load", 128, False)] + [_access("store", 128, True)] * 4
    violations = isa.find_violations(accesses, X4_KV, "nt")
    assert any(v.startswith("1 load(s) wider than 64 bits") for v in violations)
    assert any(v.startswith("3 nontemporal loads, not a multiple of the 4") for v in violations)
    assert "3 nontemporal loads but 4 nontemporal stores" in violations


def test_unrolled_loop_passes_and_invalid_configuration_fails() -> None:
    unrolled = [_access("load", 128, True)] * 28 + [_access("store", 128, True)] * 28  # nvcc unrolls by 7
    assert isa.find_violations(unrolled, X4_KV, ".NA") == []
    invalid = isa.CopyExpectation(0, 0, "no 4/8/16 B package tiles 656 B across 16 lanes")
    assert isa.find_violations(unrolled, invalid, ".NA") == [
        "configuration has no valid copy package (no 4/8/16 B package tiles 656 B across 16 lanes)"
    ]


def test_check_listing_reports_expected_kernels_that_are_missing() -> None:
    module = next(m for m in isa.modules_for("rocm") if m.name == "hicache-e256-u4")
    results = isa.check_listing(isa.parse_amdgpu_assembly(GFX942_VECTOR, "gfx942"), module, "rocm", "nt")
    by_kernel = {result.kernel: result for result in results}
    assert by_kernel["hicache_transfer_per_layer<int64_t, 256, 4, 32, 1024, false>"].passed
    missing = by_kernel["hicache_transfer_all_layer<int32_t, 256, 4, 32, 1024, true>"]
    assert missing.violations == ["expected instantiation not found in the compiled code"]
    assert len(results) == len(module.expected_kernels)


def test_translation_unit_has_load_jit_shape(tmp_path: pathlib.Path) -> None:
    module = next(m for m in isa.modules_for("cuda") if m.name == "hicache-e256-u4")
    unit = module.translation_unit(tmp_path)
    lines = unit.splitlines()
    assert lines[:5] == [f"#include <{header}>" for header in isa.TVM_FFI_INCLUDES]
    assert lines[5] == f'#include "{tmp_path.as_posix()}/kvcacheio/hicache.cuh"'
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch_all_mla, (&HiCacheKernel<256, 4, 2, 1024>::run_all_mla));" in lines
    assert lines[-1] == "}  // namespace sglang"


def test_empty_report_is_never_green() -> None:
    report = isa.IsaReport("rocm", "gfx942", True, "nowhere", "0", "", "clang", [])
    assert not report.passed
    assert report.failures() == ["rocm/gfx942: no kernel was checked"]


def _fake_toolchain(tmp_path: pathlib.Path, major: int, isa_versions: tuple[str, ...]) -> isa.RocmToolchain:
    libs = tmp_path / f"libs-{major}"
    libs.mkdir()
    for version in isa_versions:
        (libs / f"oclc_isa_version_{version}.bc").write_bytes(b"")
    return isa.RocmToolchain(pathlib.Path(f"/opt/clang-{major}"), f"clang version {major}.1.0", (), libs, (), "test",
                             clang_major=major)


def test_gfx950_is_a_default_target_with_its_own_rules() -> None:
    assert isa.DEFAULT_ARCHES["rocm"] == ("gfx90a", "gfx942", "gfx950")
    gfx950 = isa.rocm_target("gfx950:sramecc+:xnack-")
    assert gfx950.nontemporal == frozenset({"nt"}) and gfx950.wavefront_size == 64
    assert gfx950.lds_bytes == 160 * 1024 and isa.rocm_target("gfx942").lds_bytes == 64 * 1024
    assert gfx950.fp8_define == "-DHIP_FP8_TYPE_E4M3=1" and isa.rocm_target("gfx942").fp8_define.endswith("FNUZ=1")
    assert not gfx950.llvm_supports(19) and gfx950.llvm_supports(20) and gfx950.llvm_supports(22)
    assert isa.rocm_target("gfx940").llvm_supports(19) and not isa.rocm_target("gfx940").llvm_supports(20)
    with pytest.raises(isa.BadInput, match="gfx1100"):
        isa.rocm_target("gfx1100")


def test_each_target_gets_the_newest_clang_that_supports_it(tmp_path: pathlib.Path) -> None:
    old = _fake_toolchain(tmp_path, 19, ("90a", "940", "942"))
    new = _fake_toolchain(tmp_path, 22, ("90a", "940", "942", "950"))
    assert isa.pick_rocm_toolchain("gfx942", [old, new]) is new
    assert isa.pick_rocm_toolchain("gfx950", [old, new]) is new
    assert isa.pick_rocm_toolchain("gfx940", [old, new]) is old  # removed in LLVM 20
    with pytest.raises(isa.ToolchainUnavailable) as missing:
        isa.pick_rocm_toolchain("gfx950", [old], ["clang 22 (ziglang==0.17.0): fetching is disabled"])
    message = str(missing.value)
    assert "is LLVM 19, gfx950 needs LLVM >= 20" in message and "fetching is disabled" in message
    assert "pip install ziglang" in message
    # A new enough clang whose device libraries do not know the target does not fit either.
    no_libs = _fake_toolchain(tmp_path, 21, ("942",))
    assert "no oclc_isa_version_950.bc" in no_libs.unsupported_reason("gfx950")


def test_a_skipped_target_is_never_green() -> None:
    report = isa.skipped_report("rocm", "gfx950", True, None, "no compiler for gfx950")
    assert not report.passed and report.to_json()["status"] == "skipped"
    assert report.failures() == ["rocm/gfx950: SKIPPED, not checked: no compiler for gfx950"]
    assert "SKIPPED" in isa.render_markdown([report], "cmd") and "SKIPPED" in "\n".join(isa.render_text(report))


def test_lds_sizes_are_read_from_the_kernel_descriptors() -> None:
    listing = "\t.amdhsa_kernel _Zk1\n\t\t.amdhsa_group_segment_fixed_size 0\n\t.end_amdhsa_kernel\n" \
              "\t.amdhsa_kernel _Zk2\n\t\t.amdhsa_group_segment_fixed_size 98304\n\t.end_amdhsa_kernel\n"
    assert isa.amdgpu_lds_bytes(listing) == {"_Zk1": 0, "_Zk2": 98304}


def test_mutant_on_foreign_source_is_bad_input() -> None:
    with pytest.raises(isa.BadInput, match="rocm-scalarized"):
        isa.mutate_hicache_source("#pragma once\nint main() {}\n", isa.MUTANTS["rocm-scalarized"])


# ---------------------------------------------------------------------------------------------------------
# CLI exit codes without compiling


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hicache-fuzz isa")
    isa.add_arguments(parser)
    return parser.parse_args(argv)


def _fake_sglang(root: pathlib.Path) -> pathlib.Path:
    jit = root / "sglang" / "kernels" / "jit"
    (jit / "csrc" / "kvcacheio").mkdir(parents=True)
    (jit / "csrc" / "kvcacheio" / "hicache.cuh").write_text("#pragma once\n")
    (jit / "include").mkdir()
    return root


def test_run_bad_arch_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert isa.run(_parse(["--arch", "gfx1100", "--sglang-source", "/nonexistent"])) == isa.EXIT_USAGE
    assert "not supported" in capsys.readouterr().err
    assert isa.run(_parse(["--platform", "cuda", "--arch", "gfx942"])) == isa.EXIT_USAGE
    assert isa.run(_parse(["--platform", "cuda", "--mutant", "rocm-plain"])) == isa.EXIT_USAGE
    assert isa.run(_parse(["--module", "no-such-module", "--platform", "rocm"])) == isa.EXIT_USAGE


def test_run_without_sglang_source_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    assert isa.run(_parse(["--platform", "rocm", "--sglang-source", "/nonexistent/sglang"])) == isa.EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert "nothing was checked" in error and "pip download --no-deps sglang==0.5.23" in error


def test_run_without_clang_is_unavailable(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(
        [
            "--platform",
            "rocm",
            "--clang",
            "/nonexistent/clang-19",
            "--sglang-source",
            str(_fake_sglang(tmp_path)),
        ]
    )
    assert isa.run(args) == isa.EXIT_UNAVAILABLE
    assert "apt-get install -y --no-install-recommends clang-19" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# Compile-based tests: pass on sglang 0.5.23, fail on mutants


@pytest.fixture(scope="session")
def isa_cache_dir() -> pathlib.Path:
    return isa_fetch.default_cache_dir()


@pytest.fixture(scope="session")
def sglang_source(isa_cache_dir: pathlib.Path) -> isa.SglangSource:
    """sglang 0.5.23's kernels: $HICACHE_FUZZ_SGLANG_SOURCE, the installed package, or the cached wheel."""
    explicit = os.environ.get("HICACHE_FUZZ_SGLANG_SOURCE")
    if explicit:
        return _pinned(isa.resolve_sglang_source(explicit, isa_cache_dir))
    try:
        installed = isa.resolve_sglang_source(None, isa_cache_dir)
        if installed.version == SGLANG_VERSION:
            return installed
    except isa.SourceUnavailable:
        pass
    try:
        archive = isa_fetch.fetch_sglang_archive(isa_cache_dir, SGLANG_VERSION)
    except isa_fetch.FetchError as error:
        pytest.skip(f"sglang {SGLANG_VERSION} source unavailable (not installed, download failed): {error}")
    return _pinned(isa.resolve_sglang_source(archive, isa_cache_dir))


def _pinned(source: isa.SglangSource) -> isa.SglangSource:
    if source.version != SGLANG_VERSION:
        pytest.skip(f"{source.origin} is sglang {source.version}; these tests pin {SGLANG_VERSION}")
    return source


@pytest.fixture(scope="session")
def rocm_toolchain(isa_cache_dir: pathlib.Path) -> isa.RocmToolchain:
    if shutil.which("clang-19") is None:
        pytest.skip("clang-19 is not installed (apt-get install -y --no-install-recommends clang-19; .ci/isa.sh does)")
    try:
        return isa.find_rocm_toolchain(isa_cache_dir)
    except isa.ToolchainUnavailable as error:
        pytest.skip(f"ROCm headers/device libraries unavailable: {error}")


@pytest.fixture(scope="session")
def gfx950_toolchain(isa_cache_dir: pathlib.Path) -> isa.RocmToolchain:
    """The newest clang that supports gfx950 (clang 22 of the ziglang wheel unless the machine has one)."""
    try:
        return isa.pick_rocm_toolchain("gfx950", *isa.find_rocm_toolchains(isa_cache_dir))
    except isa.ToolchainUnavailable as error:
        pytest.skip(f"no compiler for gfx950: {error}")


@pytest.fixture(scope="session")
def cuda_toolchain(isa_cache_dir: pathlib.Path) -> isa.CudaToolchain:
    try:
        return isa.find_cuda_toolchain(isa_cache_dir)
    except isa.ToolchainUnavailable as error:
        pytest.skip(f"CUDA toolchain unavailable: {error}")


def _mutated(source: isa.SglangSource, mutant: str, tmp_path: pathlib.Path) -> isa.SglangSource:
    return isa.apply_mutant(source, mutant, tmp_path / mutant)


@pytest.mark.network
def test_every_mutant_applies_to_sglang_0_5_23(sglang_source: isa.SglangSource, tmp_path: pathlib.Path) -> None:
    for name in isa.MUTANTS:
        mutated = _mutated(sglang_source, name, tmp_path)
        original = (sglang_source.csrc_dir / "kvcacheio" / "hicache.cuh").read_text()
        assert (mutated.csrc_dir / "kvcacheio" / "hicache.cuh").read_text() != original
        assert (mutated.csrc_dir / "kvcacheio" / "staged_write_back.cuh").is_file()


# Strict on both archs (the criterion) and production flags on one; .ci/isa.sh runs the full grid.
@pytest.mark.parametrize(
    ("arch", "strict"),
    [("gfx90a", True), ("gfx942", True), ("gfx942", False)],
    ids=["gfx90a-strict", "gfx942-strict", "gfx942-default"],
)
@pytest.mark.network
def test_rocm_passes_on_sglang_0_5_23(
    sglang_source: isa.SglangSource, rocm_toolchain: isa.RocmToolchain, arch: str, strict: bool
) -> None:
    report = isa.check_rocm(sglang_source, arch, strict, toolchain=rocm_toolchain)
    assert report.passed, "\n".join(report.failures())
    assert len(report.kernels) == sum(len(m.expected_kernels) for m in isa.modules_for("rocm"))


@pytest.mark.network
def test_rocm_scalarized_mutant_is_remerged_without_strict(
    sglang_source: isa.SglangSource, rocm_toolchain: isa.RocmToolchain, tmp_path: pathlib.Path
) -> None:
    """Why --strict exists: at production flags clang 19 turns the scalarized accesses back into dwordx4."""
    mutated = _mutated(sglang_source, "rocm-scalarized", tmp_path)
    report = isa.check_rocm(mutated, "gfx942", False, modules=["hicache-e256-u4"], toolchain=rocm_toolchain)
    assert report.passed, "\n".join(report.failures())


@pytest.mark.network
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_rocm_strict_fails_on_scalarized_mutant(
    sglang_source: isa.SglangSource, rocm_toolchain: isa.RocmToolchain, tmp_path: pathlib.Path, arch: str
) -> None:
    mutated = _mutated(sglang_source, "rocm-scalarized", tmp_path)
    report = isa.check_rocm(mutated, arch, True, modules=["hicache-e256-u4"], toolchain=rocm_toolchain)
    assert not report.passed
    assert report.kernels and all(not kernel.passed for kernel in report.kernels)
    for kernel in report.kernels:
        assert any("are 32-bit, expected 128-bit" in violation for violation in kernel.violations), kernel


@pytest.mark.network
@pytest.mark.parametrize(("mutant", "arch"), [("rocm-plain", "gfx90a"), ("rocm-narrow-group", "gfx942")])
def test_rocm_default_fails_on_mutant(
    sglang_source: isa.SglangSource,
    rocm_toolchain: isa.RocmToolchain,
    tmp_path: pathlib.Path,
    mutant: str,
    arch: str,
) -> None:
    mutated = _mutated(sglang_source, mutant, tmp_path)
    report = isa.check_rocm(mutated, arch, False, modules=["hicache-e256-u4"], toolchain=rocm_toolchain)
    assert report.kernels and all(not kernel.passed for kernel in report.kernels)
    expected_message = "without the nontemporal hint" if mutant == "rocm-plain" else "are 64-bit, expected 128-bit"
    assert all(any(expected_message in v for v in kernel.violations) for kernel in report.kernels)


@pytest.mark.network
def test_cli_strict_scalarized_mutant_exits_1_with_json(
    sglang_source: isa.SglangSource,
    rocm_toolchain: isa.RocmToolchain,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report_path = tmp_path / "isa.json"
    args = _parse(
        [
            "--platform", "rocm", "--arch", "gfx942", "--strict", "--module", "hicache-e1024-u2",
            "--mutant", "rocm-scalarized", "--sglang-source", str(sglang_source.jit_dir),
            "--json", str(report_path),
        ]
    )  # fmt: skip
    assert isa.run(args) == isa.EXIT_FAILURES
    output = capsys.readouterr().out
    assert "isa: FAIL" in output and "are 32-bit, expected 64-bit" in output
    document = json.loads(report_path.read_text())
    assert document["passed"] is False and document["exit_code"] == 1
    assert document["reports"][0]["mutant"] == "rocm-scalarized"


@pytest.mark.network
def test_cuda_passes_on_sglang_0_5_23(sglang_source: isa.SglangSource, cuda_toolchain: isa.CudaToolchain) -> None:
    report = isa.check_cuda(sglang_source, "sm_90a", toolchain=cuda_toolchain)
    assert report.passed, "\n".join(report.failures())
    assert len(report.kernels) == sum(len(m.expected_kernels) for m in isa.modules_for("cuda"))


@pytest.mark.parametrize(
    ("mutant", "expected_message"),
    [("cuda-scalarized", "are 32-bit, expected 128-bit"), ("cuda-plain", "without the nontemporal hint")],
)
@pytest.mark.network
def test_cuda_fails_on_mutant(
    sglang_source: isa.SglangSource,
    cuda_toolchain: isa.CudaToolchain,
    tmp_path: pathlib.Path,
    mutant: str,
    expected_message: str,
) -> None:
    mutated = _mutated(sglang_source, mutant, tmp_path)
    report = isa.check_cuda(mutated, "sm_90a", modules=["hicache-e256-u4"], toolchain=cuda_toolchain)
    assert report.kernels and all(not kernel.passed for kernel in report.kernels)
    assert all(any(expected_message in v for v in kernel.violations) for kernel in report.kernels)


@pytest.mark.network
def test_gfx950_passes_on_sglang_0_5_23_and_strict_catches_the_scalarized_mutant(
    sglang_source: isa.SglangSource, gfx950_toolchain: isa.RocmToolchain, tmp_path: pathlib.Path
) -> None:
    report = isa.check_rocm(sglang_source, "gfx950", True, modules=["hicache-e256-u4"], toolchain=gfx950_toolchain)
    assert report.passed, "\n".join(report.failures())
    assert all(kernel.counts.get("global_store.128.nt", 0) + kernel.counts.get("flat_store.128.nt", 0)
               for kernel in report.kernels)
    mutated = _mutated(sglang_source, "rocm-scalarized", tmp_path)
    broken = isa.check_rocm(mutated, "gfx950", True, modules=["hicache-e256-u4"], toolchain=gfx950_toolchain)
    assert broken.kernels and all(not kernel.passed for kernel in broken.kernels)
