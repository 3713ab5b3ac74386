"""The standalone script of an sglang-hicache reproducer: with only torch and the fake sglang importable it passes
on the correct fake and names the failing step on a fake with a planted bug. A case with a side pool gets the side
pool in its group, as the drive builds it, and the script names the side pool where a planted bug moves its bytes
or withholds its host slots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_fuzz.harness.findings.standalone import standalone_script, supports
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout
from hicache_fuzz.kernels.sglang_hicache_settings import side_pool, side_transfer
from tests.kernels._hicache_helpers import FAKE, hicache_case

CASES = {
    "mha-pf-hybrid": hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, page_size=33, pages=2, host_pages=5,
                                  device_pages=3, layers=3, ops="load,backup,evict,load", draft_layers=1,
                                  start_layer=4),
    "mla-pfd-direct-base": hicache_case(Attention.MLA, HostLayout.PAGE_FIRST_DIRECT, page_size=32, pages=2,
                                        host_pages=4, device_pages=3, layers=2, ops="backup,load",
                                        io_backend="direct", controller="base", draft_layers=1),
    "asym-load-back": hicache_case(Attention.MHA_ASYM, HostLayout.PAGE_FIRST, page_size=32, pages=1, host_pages=3,
                                   device_pages=2, layers=2, direction=Direction.LOAD_BACK, ops="evict,backup,load"),
    "k-only-lf-direct": hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, page_size=40, pages=2, host_pages=4,
                                     device_pages=3, layers=3, ops="backup,load,evict", pool_kind="k_only",
                                     io_backend="direct", start_layer=2),
    "hisparse-start": hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, page_size=32, pages=2, host_pages=4,
                                   device_pages=3, layers=2, ops="load,backup,load", pool_kind="hisparse",
                                   start_layer=3),
    "hisparse-requests": hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, page_size=32, pages=2, host_pages=6,
                                      device_pages=3, layers=2, ops="backup,backup,load,evict,backup,load",
                                      pool_kind="hisparse", start_layer=2, requests="0:end:p+1,0:end-1:1,new:alloc:0"),
    "hisparse-requests-load-back": hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, page_size=3, pages=2,
                                                host_pages=6, device_pages=3, layers=2, direction=Direction.LOAD_BACK,
                                                ops="backup,load,backup,evict,load", pool_kind="hisparse",
                                                requests="0:end:1,1:0:n"),
}
# Cases with a side pool in the hybrid controller's group: moving with every transfer (side_transfer=on), with its
# host slots from its own allocator, or moving nothing (its bytes must stay).
SIDE_CASES = {
    "k-only-side-moves": hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, page_size=2, layers=3,
                                      ops="backup,load,evict,backup,load", draft_layers=1, start_layer=2,
                                      side_pool="k_only", side_transfer="on"),
    "k-only-side-moves-lf-direct": hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, page_size=2, layers=2,
                                                ops="backup,backup,load,evict,load", io_backend="direct",
                                                side_pool="k_only", side_transfer="on"),
    "mamba-side-moves-load-back": hicache_case(Attention.MLA, HostLayout.PAGE_FIRST_DIRECT, page_size=1, layers=2,
                                               direction=Direction.LOAD_BACK, ops="load,backup,load,evict",
                                               io_backend="direct", side_pool="mamba", side_transfer="on"),
    "k-only-side-still": hicache_case(Attention.MHA_ASYM, HostLayout.PAGE_FIRST_DIRECT, page_size=2, layers=2,
                                      ops="backup,load", io_backend="direct", side_pool="k_only"),
    "mamba-side-still": hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, page_size=1, layers=3,
                                     ops="backup,evict,backup,load", draft_layers=1, side_pool="mamba"),
}
# The scripts of request-slot cases catch the planted bugs of the HiSparse request-slot allocation.
REQUEST_SLOT_BUGS = ("hisparse_len_row", "hisparse_pages_squared", "hisparse_empty_int32", "hisparse_slot0")


def _run(tmp_path: Path, bug: str, cases: dict[str, Case] = CASES) -> dict[str, tuple[int, str]]:
    scripts = []
    for name, case in cases.items():
        path = tmp_path / f"{name}.py"
        path.write_text(standalone_script({"case": case.to_dict(), "signature": "s"}))
        scripts.append(path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_SGLANG_BUG", "FAKE_SGLANG_POOL_BUG")}
    if bug:
        env["FAKE_SGLANG_POOL_BUG"] = bug
    done = subprocess.run([sys.executable, str(FAKE / "run_isolated.py"), *map(str, scripts)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert "loaded: none" in done.stdout, done.stdout + done.stderr  # nothing of this repository was imported
    out: dict[str, tuple[int, str]] = {}
    lines: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("EXIT "):
            _, code, script = line.split(" ", 2)
            out[Path(script).stem] = (int(code), "\n".join(lines))
            lines = []
        else:
            lines.append(line)
    assert set(out) == set(cases), done.stdout + done.stderr
    return out


def test_scripts_pass_on_the_correct_fake(tmp_path: Path) -> None:
    assert supports("sglang-hicache")
    for name, (code, output) in _run(tmp_path, "").items():
        assert code == 0 and "PASS: every byte right after every step" in output, (name, output)
        assert "hicache_fuzz" not in (tmp_path / f"{name}.py").read_text().replace("hicache-fuzz", "")


@pytest.mark.parametrize("bug", ["page32", "alloc_twice"])
def test_scripts_name_the_failing_step_on_a_planted_bug(tmp_path: Path, bug: str) -> None:
    results = _run(tmp_path, bug)
    failed = {name: output for name, (code, output) in results.items() if code == 1}
    assert failed, results
    for output in failed.values():
        assert "FAIL at step" in output
    if bug == "page32":  # every case backs up pages of 32 or more tokens
        assert set(failed) == {name for name, case in CASES.items() if case.page_size >= 32}


# Where each planted bug of the HiSparse request-slot allocation stops the request-slot scripts: a wrong grant or
# freed list is named at its step (exit 1); sglang's own assertion (a start past the allocated length, left by the
# length written to another row) or its failed allocation (page_size^2 too many slots) kills the script (exit 2).
REQUEST_SLOT_EXITS = {"hisparse_len_row": {"hisparse-requests": 2, "hisparse-requests-load-back": 2},
                      "hisparse_pages_squared": {"hisparse-requests": 2, "hisparse-requests-load-back": 2},
                      "hisparse_empty_int32": {"hisparse-requests": 1},  # the only one asking for no tokens
                      "hisparse_slot0": {"hisparse-requests": 1, "hisparse-requests-load-back": 1}}


@pytest.mark.parametrize("bug", REQUEST_SLOT_BUGS)
def test_request_slot_scripts_stop_on_the_planted_allocation_bugs(tmp_path: Path, bug: str) -> None:
    results = _run(tmp_path, bug)
    assert {name: code for name, (code, _) in results.items() if code} == REQUEST_SLOT_EXITS[bug], results
    for name, code in REQUEST_SLOT_EXITS[bug].items():
        assert code == 2 or "FAIL at step" in results[name][1]


def test_classes_the_script_cannot_build_get_no_script_and_say_why() -> None:
    """The Mamba state pool is built from buffer infos, not a KV device pool: no script is written for it (the JSON
    reproducer replays), and the refusal names the class."""
    from hicache_fuzz.harness.findings.standalone import StandaloneUnsupported

    mamba = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, page_size=1, pool_kind="mamba", ops="backup,load")
    with pytest.raises(StandaloneUnsupported, match="MambaPoolHost"):
        standalone_script({"case": mamba.to_dict(), "signature": "s"})
    assert "MHATokenToKVPoolHost" in standalone_script({"case": CASES["mha-pf-hybrid"].to_dict(), "signature": "s"})


def test_side_pool_scripts_build_the_side_pool_and_pass_on_the_correct_fake(tmp_path: Path) -> None:
    """The script builds the drive's side pool in the group; a moving one is granted and loads the oracle's side
    slots (printed at each step), the load-back case's own entry moving the anchor only."""
    for name, (code, output) in _run(tmp_path, "", SIDE_CASES).items():
        case = SIDE_CASES[name]
        assert side_pool(case), name
        assert code == 0 and "PASS: every byte right after every step" in output, (name, output)
        text = (tmp_path / f"{name}.py").read_text()
        assert f'SIDE, SIDE_MOVES, SIDE_DIM = "{side_pool(case)}", {side_transfer(case)}, 8' in text, name
        assert ("side slots" in output) == side_transfer(case), (name, output)
    load_back = _run(tmp_path, "", {"load-back": SIDE_CASES["mamba-side-moves-load-back"]})["load-back"][1]
    assert load_back.splitlines()[0] == "step 0 load: host slots [1, 3] -> device rows [2, 1]", load_back


# Which side-pool scripts each planted side-pool bug stops: side_write (every transfer of the hybrid controller also
# moves the group's side pools at the anchor's slots and rows) changes every side pool's bytes; side_host_swap
# (resolve_host_transfers never grants a side-pool transfer its slots) stops the moving side pools at their first
# back-up.
SIDE_BUG_FAILS = {"side_write": set(SIDE_CASES),
                  "side_host_swap": {name for name, case in SIDE_CASES.items() if side_transfer(case)}}


@pytest.mark.parametrize("bug", sorted(SIDE_BUG_FAILS))
def test_side_pool_scripts_name_the_side_pool_on_a_planted_side_pool_bug(tmp_path: Path, bug: str) -> None:
    results = _run(tmp_path, bug, SIDE_CASES)
    assert {name for name, (code, _) in results.items() if code} == SIDE_BUG_FAILS[bug], results
    for name in SIDE_BUG_FAILS[bug]:
        code, output = results[name]
        side = side_pool(SIDE_CASES[name])
        assert code == 1, (name, output)
        if bug == "side_write":
            assert f"): {side} side pool " in output, (name, output)  # its bytes, at the first transfer
        else:
            assert (f"(backup): resolve_host_transfers granted the {side} side pool host slots None, want [0"
                    in output), (name, output)
