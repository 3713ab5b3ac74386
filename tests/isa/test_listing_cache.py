"""The ISA check's listing cache: a warm check compiles nothing, and any change to what went into the compiler
(sglang's kernel sources, the toolchain, the flags) compiles again. A fake clang (a script that writes a fixed
listing and counts its runs) stands in for the compiler, so this runs without clang."""

from __future__ import annotations

import pathlib
import stat

import pytest

from hicache_fuzz.harness.isa import check as isa
from hicache_fuzz.harness.isa import listing_cache

MODULE = isa.modules_for("rocm")[0].name


def fake_clang(tmp_path: pathlib.Path, fail: bool = False) -> pathlib.Path:
    """A 'clang' that appends one line to runs.txt per call and writes an empty listing to the -o path."""
    script = tmp_path / ("clang-fails" if fail else "clang-fake")
    runs = tmp_path / "runs.txt"
    body = "exit 1" if fail else 'while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done; echo "\t.text" > "$out"'
    script.write_text(f"#!/bin/sh\necho run >> {runs}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def runs(tmp_path: pathlib.Path) -> int:
    path = tmp_path / "runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def toolchain(clang: pathlib.Path, version: str = "clang version 19.1.7") -> isa.RocmToolchain:
    libs = clang.parent / "libs"
    libs.mkdir(exist_ok=True)
    return isa.RocmToolchain(clang, version, (), libs, (), "test", clang_major=19)


def source(tmp_path: pathlib.Path, name: str = "sglang") -> isa.SglangSource:
    jit = tmp_path / name / "sglang" / "kernels" / "jit"
    (jit / "csrc" / "kvcacheio").mkdir(parents=True)
    (jit / "csrc" / "kvcacheio" / "hicache.cuh").write_text("#pragma once\n")
    (jit / "include").mkdir()
    return isa.SglangSource(jit, jit / "csrc", "0.5.23", str(tmp_path / name))


def check(tmp_path: pathlib.Path, src: isa.SglangSource, tools: isa.RocmToolchain,
          strict: bool = False) -> isa.IsaReport:
    return isa.check_rocm(src, "gfx942", strict, modules=[MODULE], toolchain=tools, cache_dir=tmp_path / "cache",
                          jobs=1)


def test_a_warm_check_compiles_nothing_and_reports_the_cached_listing(tmp_path: pathlib.Path) -> None:
    src, tools = source(tmp_path), toolchain(fake_clang(tmp_path))
    cold = check(tmp_path, src, tools)
    assert runs(tmp_path) == 1 and not cold.modules[0].cached
    warm = check(tmp_path, src, tools)
    assert runs(tmp_path) == 1 and warm.modules[0].cached
    assert [k.counts for k in warm.kernels] == [k.counts for k in cold.kernels]  # same listing, same verdict
    assert "cached listing" in "\n".join(isa.render_text(warm))


def test_a_changed_kernel_source_compiles_again(tmp_path: pathlib.Path) -> None:
    src, tools = source(tmp_path), toolchain(fake_clang(tmp_path))
    check(tmp_path, src, tools)
    (src.csrc_dir / "kvcacheio" / "hicache.cuh").write_text("#pragma once\n// changed\n")
    assert not check(tmp_path, src, tools).modules[0].cached and runs(tmp_path) == 2
    (src.include_dir / "new.h").write_text("// a header added\n")
    assert not check(tmp_path, src, tools).modules[0].cached and runs(tmp_path) == 3


def test_the_same_bytes_in_another_folder_hit(tmp_path: pathlib.Path) -> None:
    """A mutant's copy lives in a fresh temporary folder each run; its key depends on bytes, not the path."""
    tools = toolchain(fake_clang(tmp_path))
    check(tmp_path, source(tmp_path, "first"), tools)
    assert check(tmp_path, source(tmp_path, "second"), tools).modules[0].cached and runs(tmp_path) == 1


def test_a_changed_toolchain_or_flags_compile_again(tmp_path: pathlib.Path) -> None:
    src, clang = source(tmp_path), fake_clang(tmp_path)
    check(tmp_path, src, toolchain(clang))
    assert not check(tmp_path, src, toolchain(clang, "clang version 19.1.8")).modules[0].cached  # version
    assert not check(tmp_path, src, toolchain(clang), strict=True).modules[0].cached  # flags
    clang.write_text(clang.read_text() + "# rebuilt\n")  # the same version line, another binary
    assert not check(tmp_path, src, toolchain(clang)).modules[0].cached
    assert runs(tmp_path) == 4


def test_compile_errors_are_not_cached(tmp_path: pathlib.Path) -> None:
    src, tools = source(tmp_path), toolchain(fake_clang(tmp_path, fail=True))
    assert check(tmp_path, src, tools).errors and check(tmp_path, src, tools).errors
    assert runs(tmp_path) == 2
    assert not (tmp_path / "cache" / listing_cache.CACHE_SUBDIR).exists()


def test_the_cache_can_be_switched_off(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(listing_cache.SWITCH_ENV, "off")
    src, tools = source(tmp_path), toolchain(fake_clang(tmp_path))
    check(tmp_path, src, tools)
    assert not check(tmp_path, src, tools).modules[0].cached and runs(tmp_path) == 2
