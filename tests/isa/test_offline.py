"""Offline and first-run behaviour of the ISA step: `--offline` downloads nothing and names what the cache lacks;
a first run says on stderr, before it downloads, what it fetches, how big, where to, and how to avoid it."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from hicache_fuzz.harness.commands.gate_phases import run_isa_checks
from hicache_fuzz.harness.isa import check as isa
from hicache_fuzz.harness.isa import fetch as isa_fetch


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every download attempt is recorded and fails (as it would offline)."""
    attempts: list[str] = []

    def refuse(*args: object, **kwargs: object) -> pathlib.Path:
        attempts.append(repr(args))
        raise isa_fetch.FetchError("network disabled by the test")

    monkeypatch.setattr(isa_fetch, "pip_download", refuse)
    monkeypatch.setattr(isa_fetch, "_download_debian_packages", refuse)
    monkeypatch.setattr(isa_fetch, "installed_zig", lambda: None)
    monkeypatch.setattr(isa_fetch, "installed_tvm_ffi_include_dirs", lambda: None)
    monkeypatch.setattr(isa_fetch, "_announced", False)
    return attempts


def test_missing_from_cache_names_every_download_of_an_empty_cache(tmp_path: pathlib.Path,
                                                                     no_network: list[str]) -> None:
    missing = isa_fetch.missing_from_cache(tmp_path, "rocm")
    text = "\n".join(missing)
    for name in ("libamdhip64-dev", "rocm-device-libs-17", "ziglang", "libclang-common-22-dev",
                 "rocm-device-libs-21", "apache-tvm-ffi", "sglang==0.5.23"):
        assert name in text
    assert isa_fetch.missing_from_cache(tmp_path, "cuda") == [m for m in missing if "tvm-ffi" in m or "sglang" in m]


def test_gate_offline_downloads_nothing_and_says_what_is_missing(
        tmp_path: pathlib.Path, no_network: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(no_isa=False, isa_cache_dir=str(tmp_path / "cache"), no_fetch=True,
                              sglang_source=None, isa_clang=None)
    rows = run_isa_checks("cpu", args, tmp_path / "artifacts")
    assert no_network == []  # nothing was even tried
    assert rows and all(row.status == "skipped" for row in rows)
    err = capsys.readouterr().err
    assert "gate --offline" in err and "lacks" in err and "libamdhip64-dev" in err
    assert f"python -m hicache_fuzz.harness.isa.fetch {tmp_path / 'cache'}" in err
    assert "downloading what the check compiles against" not in err  # no first-run notice: nothing fetched


def test_isa_offline_exits_3_naming_what_is_missing(tmp_path: pathlib.Path, no_network: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    isa.add_arguments(parser)
    jit = tmp_path / "sglang" / "sglang" / "kernels" / "jit"
    (jit / "csrc" / "kvcacheio").mkdir(parents=True)
    (jit / "csrc" / "kvcacheio" / "hicache.cuh").write_text("#pragma once\n")
    (jit / "include").mkdir()
    args = parser.parse_args(["--platform", "rocm", "--offline", "--cache-dir", str(tmp_path / "cache"),
                              "--sglang-source", str(tmp_path / "sglang"), "--clang", "/nonexistent/clang-19"])
    assert isa.run(args) == isa.EXIT_UNAVAILABLE
    assert no_network == []
    err = capsys.readouterr().err
    assert "isa --offline" in err and "rocm-device-libs-17" in err


def test_a_first_download_is_announced_once_on_stderr(tmp_path: pathlib.Path, no_network: list[str],
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isa_fetch.DEBIAN_MIRROR_ENV, "http://mirror.example/debian/")
    for _ in range(2):
        with pytest.raises(isa_fetch.FetchError):
            isa_fetch.fetch_sglang_archive(tmp_path)
    err = capsys.readouterr().err  # stderr, whatever it is connected to: CI logs see it
    assert err.count("downloading what the check compiles against") == 1
    assert str(tmp_path) in err and "MB" in err and "http://mirror.example/debian" in err
    assert "python -m hicache_fuzz.harness.isa.fetch" in err and "--offline" in err and "PIP_INDEX_URL" in err
    assert len(no_network) == 2
