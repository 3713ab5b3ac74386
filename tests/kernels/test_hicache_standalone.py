"""The standalone script of an sglang-hicache reproducer: with only torch and the fake sglang importable it passes
on the correct fake and names the failing step on a fake with a planted bug. A case with a side pool gets the side
pool in its group, as the drive builds it, and the script names the side pool where a planted bug moves its bytes
or withholds its host slots. A case with token-major device rows gets sglang's unified pool, and the script checks
the whole buffer, naming the slot and the row (or the entry bytes past the rows) of the first wrong byte."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.findings.standalone import StandaloneUnsupported, standalone_script, supports
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import (
    TOKEN_MAJOR,
    device_rows,
    side_pool,
    side_transfer,
    target_rows_strided,
)
from hicache_fuzz.oracles import sequence
from tests.kernels._hicache_helpers import (
    AOT_ROW,
    FAKE,
    JIT_ROW,
    SHARD_OPS,
    SM90,
    fake_sglang,
    hicache_case,
    run_on_cpu,
)

__all__ = ["fake_sglang"]  # the fixture, used by name

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


# ---- token-major device rows (sglang's unified pool) ---------------------------------------------------------------

def _token_major(attention: Attention, layout: HostLayout, io: str = "kernel", head_dim: int = 0, *,
                 layers: int = 3, v_head_dim: int | None = None, dtype: KVDtype = KVDtype.BF16,
                 **knobs: int | str) -> Case:
    case = hicache_case(attention, layout, layers=layers, io_backend=io, **{"device_rows": TOKEN_MAJOR, **knobs})
    spec = case.pools[0]
    if head_dim or v_head_dim or dtype is not KVDtype.BF16:
        case = case.replace(pools=(PoolSpec("kv", attention, dtype, spec.heads if attention is not Attention.MLA else 1,
                                            head_dim or spec.head_dim, v_head_dim=v_head_dim or spec.v_head_dim),))
    return case


# Every standard class on the layouts and io backends whose ops take token-major rows (the JIT kernels where they take
# the row, transfer_kv_direct; the asymmetric pool's every path), both controllers, a start layer, entry padding
# (MLA: 3 rows of 48 bytes in a 160-byte entry; asymmetric: 3 x (32 + 16) in 160), fp8 rows, an MLA pool whose one
# layer's row is its whole entry beside a packed draft layer, a side pool; and the two minimized findings on sglang
# 0.5.23's asymmetric pool (a page_first load-back with kernel io, a page_first_direct back-up with direct io).
TOKEN_MAJOR_CASES = {
    "tm-mha-pf-jit": _token_major(Attention.MHA, HostLayout.PAGE_FIRST, "kernel", 32, ops=SHARD_OPS, start_layer=2),
    "tm-mha-lf-direct-base": _token_major(Attention.MHA, HostLayout.LAYER_FIRST, "direct", ops="load,backup,load",
                                          controller="base"),
    "tm-mla-lf-direct-padding": _token_major(Attention.MLA, HostLayout.LAYER_FIRST, "direct", AOT_ROW, ops=SHARD_OPS),
    "tm-mla-pf-jit-fp8": _token_major(Attention.MLA, HostLayout.PAGE_FIRST, "kernel", 2 * JIT_ROW, dtype=KVDtype.FP8,
                                      ops="backup,load"),
    "tm-mla-one-layer-draft": _token_major(Attention.MLA, HostLayout.LAYER_FIRST, "kernel", 32, layers=2,
                                           draft_layers=1, ops="backup,load", controller="base"),
    "tm-mha-pf-jit-side": _token_major(Attention.MHA, HostLayout.PAGE_FIRST, "kernel", 32, ops="backup,load,evict",
                                       side_pool="k_only", side_transfer="on"),
    "tm-asym-pf-kernel": _token_major(Attention.MHA_ASYM, HostLayout.PAGE_FIRST, "kernel", ops=SHARD_OPS),
    "tm-asym-pfd-direct": _token_major(Attention.MHA_ASYM, HostLayout.PAGE_FIRST_DIRECT, "direct",
                                       ops="load,backup,load", controller="base"),
    # the load-back finding's shape (K and V rows unlike, as sglang builds the class; an entry without padding, so
    # that the misplaced rows are the first damage)
    "tm-asym-load-back-found": _token_major(Attention.MHA_ASYM, HostLayout.PAGE_FIRST, "kernel", layers=1).replace(
        pools=(PoolSpec("kv", Attention.MHA_ASYM, KVDtype.BF16, 1, 8, v_head_dim=24),), direction=Direction.LOAD_BACK,
        page_size=1, device_rows=2, host_slots=1, host_indices=(0,), device_indices=(1,)),
    "tm-asym-backup-found": _token_major(Attention.MHA_ASYM, HostLayout.PAGE_FIRST_DIRECT, "direct", layers=1).replace(
        pools=(PoolSpec("kv", Attention.MHA_ASYM, KVDtype.FP16, 1, 16, v_head_dim=8),), page_size=1, device_rows=2,
        host_slots=6, host_indices=(5,), device_indices=(1,)),
}
ASYMMETRIC = {name for name, case in TOKEN_MAJOR_CASES.items() if case.pools[0].attention is Attention.MHA_ASYM}


def test_token_major_cases_are_ones_the_backend_runs() -> None:
    backend = SglangHicacheBackend()
    for name, case in TOKEN_MAJOR_CASES.items():
        assert device_rows(case) == TOKEN_MAJOR, name
        assert backend.case_unsupported(case) is None and backend.transfer_unsupported(case, SM90) is None, name
    assert not target_rows_strided(TOKEN_MAJOR_CASES["tm-mla-one-layer-draft"])


def test_token_major_scripts_build_the_unified_pool_and_pass_on_the_correct_fake(tmp_path: Path) -> None:
    for name, (code, output) in _run(tmp_path, "", TOKEN_MAJOR_CASES).items():
        assert code == 0 and "PASS: every byte right after every step" in output, (name, output)
        text = (tmp_path / f"{name}.py").read_text()
        assert "UNIFIED, STORE_DTYPE = True" in text, name
        assert "hicache_fuzz" not in text.replace("hicache-fuzz", ""), name
    fp8 = (tmp_path / "tm-mla-pf-jit-fp8.py").read_text()
    assert "UNIFIED, STORE_DTYPE = True, torch.uint8" in fp8
    # the entry layout written in from the oracle's rule: 3 latent rows of 48 bytes, rounded up to 160
    padded = (tmp_path / "tm-mla-lf-direct-padding.py").read_text()
    assert "ENTRY, OFFSETS, ROW_BYTES, COMPONENTS = 160, [[0, 48, 96]], [48], ['kv']" in padded


def test_token_major_scripts_catch_rows_moved_by_the_packed_stride(tmp_path: Path) -> None:
    """``asym_packed_rows``: the asymmetric pool addresses device rows as sglang 0.5.23's does on token-major rows
    (row x row width from the layer's first row). Every asymmetric script fails at its first transfer: a load names
    the unified buffer's slot and row it damaged, a back-up the host bytes it read wrong; the other classes pass."""
    results = _run(tmp_path, "asym_packed_rows", TOKEN_MAJOR_CASES)
    assert {name for name, (code, _) in results.items() if code} == ASYMMETRIC, results
    for name in ASYMMETRIC:
        code, output = results[name]
        assert code == 1 and "FAIL at step 0" in output, (name, output)
        first = sequence.plan_steps(TOKEN_MAJOR_CASES[name])[0].op
        where = "unified device buffer, slot" if first == sequence.LOAD else "host component"
        assert f"FAIL at step 0 ({first}): {where}" in output, (name, output)
    # the found load-back: row 1's K lands on slot 0's V row (its entry is K_0 | V_0, 16 bytes each), and its V on
    # slot 1's K row
    assert ("FAIL at step 0 (load): unified device buffer, slot 0 (not a row this step addresses), the v row of layer "
            "0, byte 0:" in results["tm-asym-load-back-found"][1])
    assert "bytes differ, in slots [0, 1]" in results["tm-asym-load-back-found"][1]


def test_the_harness_catches_the_same_planted_bug(fake_sglang, monkeypatch) -> None:
    for name in sorted(ASYMMETRIC):
        assert run_on_cpu(TOKEN_MAJOR_CASES[name]).outcome is Outcome.PASS, name
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "asym_packed_rows")
    for name in sorted(ASYMMETRIC):
        result = run_on_cpu(TOKEN_MAJOR_CASES[name])
        assert result.outcome is Outcome.MISMATCH, (name, result.summary)
    found = run_on_cpu(TOKEN_MAJOR_CASES["tm-asym-load-back-found"])
    assert "bytes outside the addressed rows changed" in found.summary


def test_a_token_major_script_names_the_entry_bytes_past_the_rows(tmp_path: Path) -> None:
    """The script's naming of a wrong byte in the unified buffer, on bytes changed by hand: a row of a slot the step
    does not address, and an entry byte no row holds."""
    path = tmp_path / "padding.py"
    path.write_text(standalone_script({"case": TOKEN_MAJOR_CASES["tm-mla-lf-direct-padding"].to_dict()}))
    script = runpy.run_path(str(path), run_name="standalone")  # the constants and functions; sglang not imported
    entry, slots = script["ENTRY"], script["SIZE"] + script["PS"]
    want = torch.zeros(slots * entry, dtype=torch.uint8)
    assert script["unified_difference"](want, want.clone(), [1]) is None
    past = want.clone()
    past[entry + 150] = 7
    assert script["unified_difference"](want, past, [1]).startswith(
        "unified device buffer, slot 1, entry byte 150, past the layers' rows (no row holds it): expected 0x00 got "
        "0x07; 1 bytes differ, in slots [1]")
    row = want.clone()
    row[50] = 1
    assert script["unified_difference"](want, row, [1]).startswith(
        "unified device buffer, slot 0 (not a row this step addresses), the kv row of layer 1, byte 2:")


def test_token_major_rows_beside_packed_drafts_get_no_script() -> None:
    """The host pool must refuse them when it is built (a predicted rejection), which the script does not model."""
    case = _token_major(Attention.MHA, HostLayout.PAGE_FIRST, "kernel", 32, draft_layers=1, ops="backup")
    assert target_rows_strided(case)
    with pytest.raises(StandaloneUnsupported, match="packed draft layers"):
        standalone_script({"case": case.to_dict()})
