"""Bug identity (harness/findings/identity.py, harness/pipeline/damage.py): stable across seeds, geometry and
unrelated rule violations; separate for different bugs; computed from real reproducers, the committed GPU
findings included."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.findings.corpus import load_corpus, load_entry
from hicache_fuzz.harness.findings.identity import error_cause, identify, normalize_error
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import IndexDevice, IndexDtype, IndexSpec
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.damage import DAMAGE_FAMILY, DAMAGE_PRIORITY, fill_word, word_preimages
from hicache_fuzz.harness.pipeline.fill import fill_pattern
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import RULE_PRIORITY, EntryPoint, predict, primary_rule, rule_of

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = ROOT / "corpus" / "sglang"
GPU_REPRODUCERS = Path(__file__).resolve().parent / "gpu_reproducers"
CUDA = Platform("cuda", (9, 0))


# ---- the fill runs backwards ---------------------------------------------------------------------------------

def test_fill_words_invert_to_their_index() -> None:
    rng = random.Random(7)
    for _ in range(300):
        index, salt = rng.randrange(1 << 44), rng.randrange(-(1 << 63), 1 << 63)
        assert any((p ^ salt) & ((1 << 64) - 1) == index for p in word_preimages(fill_word(index, salt)))


def test_fill_word_is_what_fill_pattern_writes() -> None:
    raw = torch.empty(4096, dtype=torch.uint8)
    fill_pattern(raw, -987654321)
    for word in (0, 1, 17, 511):
        assert int.from_bytes(bytes(raw[word * 8 : word * 8 + 8].tolist()), "little") == fill_word(word, -987654321)


def test_every_damage_class_has_a_family() -> None:
    assert set(DAMAGE_PRIORITY) == set(DAMAGE_FAMILY)


# ---- contract rules --------------------------------------------------------------------------------------------

def test_every_reason_the_contract_gives_names_a_rule() -> None:
    """Predict many generated cases on every entry point and platform: no reason falls outside the table."""
    unnamed = set()
    for index in range(400):
        case = case_for_index(11, index, CaseSpace())
        for entry in EntryPoint:
            for platform in (Platform("cpu"), CUDA, Platform("rocm", (9, 4))):
                for reason in predict(case, entry, platform).reasons:
                    if rule_of(reason).startswith("other:"):
                        unnamed.add(normalize_error(reason))
    assert unnamed == set()


def test_primary_rule_is_the_first_in_priority_whatever_the_order() -> None:
    reasons = ["host indices are int32", "index lists differ in length (3 host, 2 device)",
               "host indices on device (needs ['cpu', 'pinned'])"]
    assert primary_rule(reasons) == primary_rule(list(reversed(reasons))) == "index-lengths"
    assert RULE_PRIORITY[0][0] == "index-lengths"


# ---- the committed GPU findings ----------------------------------------------------------------------------------

def _findings() -> list:
    return [e for e in load_corpus([FINDINGS]) if e.expect == "fail"]


def test_committed_findings_have_stable_distinct_identities() -> None:
    entries = _findings()
    assert len(entries) >= 8
    bugs = [e.bug for e in entries]
    assert bugs == [e.bug for e in _findings()]  # recomputed: the same every time
    assert len(set(bugs)) == len(bugs), "each committed finding is a bug of its own"
    for entry in entries:
        assert entry.observed is not None and identify(entry.observed, entry.case).bug == entry.bug


def test_staged_unequal_lengths_keeps_its_identity_under_unrelated_violations() -> None:
    """The measured false alarm: the same staged bug met with extra violations (index device, dtype, page
    alignment) got a new signature per combination. Its identity now names only the primary rule."""
    entry = load_entry(FINDINGS / "staged-unequal-index-lists-accepted.json")
    assert entry.observed is not None
    base = replace(entry.case, host_indices=(0, 1), device_indices=(0,))  # unequal, with a device side
    variants = [
        base,
        replace(base, host_index=IndexSpec(IndexDevice.DEVICE, base.host_index.dtype)),
        replace(base, host_index=IndexSpec(base.host_index.device, IndexDtype.INT32)),
        replace(base, host_index=IndexSpec(IndexDevice.DEVICE, IndexDtype.INT32)),
    ]
    reasons_seen = set()
    for case in variants:
        prediction = predict(case, EntryPoint.JIT_STAGED, CUDA)
        assert "index lists differ in length" in prediction.describe()
        reasons_seen.add(len(prediction.reasons))
        result = Result(case.case_id, "sglang-staged", Outcome.WRONGLY_ACCEPTED, "jit-staged", "none",
                        prediction.describe())
        assert identify(result, case).bug == entry.bug
    assert max(reasons_seen) >= 3  # the variants really broke more rules than the lengths one


def test_a_different_broken_rule_is_a_different_bug() -> None:
    entry = load_entry(FINDINGS / "staged-unequal-index-lists-accepted.json")
    other = Result("x", "sglang-staged", Outcome.WRONGLY_ACCEPTED, "jit-staged", "jit-staged",
                   "reject: host indices are int32")
    assert identify(other).bug != entry.bug


def test_a_valid_input_rejected_is_one_bug_per_path_whatever_check_fired() -> None:
    """zoo-first-index-of-page's remapped indices trip its duplicate check or (rarely) its bounds check: one
    bug, the misplaced write those made-up indices make where they pass the checks. The error text stays in the
    variant; another path, or a crash, stays apart; a path's other checks refusing a valid input are one bug."""
    def rejected(error: str, path: str = "zoo-first-index-of-page") -> Result:
        return Result("x", path, Outcome.WRONGLY_REJECTED, path, "none", "accept", error)

    duplicate = identify(rejected("BackendRejected: duplicate destination indices"))
    out_of_range = identify(rejected("BackendRejected: host index 4 out of range [0, 4)"))
    assert duplicate.bug == out_of_range.bug and duplicate.bug_key.endswith("|mismatch|misplaced")
    assert duplicate.variant != out_of_range.variant
    refusals = [identify(rejected(error, "jit-staged")) for error in (
        "RuntimeError: Tensor match failed: Device value [cuda:0] not in the allowed options", "staging buffer empty")]
    assert refusals[0].bug == refusals[1].bug and refusals[0].bug_key.endswith("|wrongly_rejected|valid")
    assert identify(rejected("BackendRejected: duplicate destination indices", "jit-staged")).bug != duplicate.bug
    crash = [Result("x", "sglang-jit", Outcome.CRASH, "jit-register", "", "accept", error)
             for error in ("CUDA error: misaligned address", "CUDA error: invalid argument")]
    assert identify(crash[0]).bug != identify(crash[1]).bug  # a crash keeps its error text


def test_a_gpu_error_is_named_by_the_runtime_message_whatever_noticed_it() -> None:
    """The zero-length launch of sglang's JIT kernels reaches the harness as torch's "AcceleratorError: CUDA
    error: invalid argument" or as the launcher's own "RuntimeError: Failed at .../hicache.cuh:532: CUDA error:
    invalid argument", depending on which call notices it first (both were seen on a GPU):
    the same bug, which must keep its identity (else the gate's replay and every campaign call it new)."""
    wordings = [
        "device error escaped the case: AcceleratorError: CUDA error: invalid argument\nSearch for ...",
        "device error escaped the case: RuntimeError: Failed at /x/sglang/kernels/jit/csrc/kvcacheio/"
        "hicache.cuh:532: CUDA error: invalid argument",
        "device error escaped the case: RuntimeError: Failed at /y/hicache.cuh:594: CUDA error: invalid argument",
        "HIP error: invalid argument",
    ]
    assert {error_cause(w) for w in wordings} == {"GPU error: invalid argument"}
    assert error_cause("CUDA error: misaligned address") != error_cause("CUDA error: invalid argument")
    assert error_cause("BackendRejected: host index 4 out of range") == normalize_error(
        "BackendRejected: host index 4 out of range")


def test_a_crash_on_input_the_contract_rejects_names_the_unchecked_rule_not_the_error() -> None:
    """A path that crashes on a zero-length list lacks that check, whatever the runtime calls the failed launch
    (CUDA: "invalid argument"; HIP may say "invalid configuration argument"): one bug, the error in the
    variant. On valid input the error still tells bugs apart."""
    def crash(error: str, prediction: str) -> Result:
        return Result("x", "sglang-jit", Outcome.CRASH, "", "", prediction, error)

    zero = "reject: zero-length launch (num_blocks == 0)"
    cuda = identify(crash("device error escaped the case: RuntimeError: Failed at a.cuh:1: CUDA error: invalid "
                          "argument", zero))
    hip = identify(crash("device error escaped the case: HIP error: invalid configuration argument", zero))
    assert cuda.bug == hip.bug and cuda.bug_key.endswith("|crash|unchecked|zero-length")
    assert cuda.variant != hip.variant
    out_of_range = identify(crash("CUDA error: invalid argument", "reject: host index 9 out of range [0, 8)"))
    assert out_of_range.bug != cuda.bug  # another unchecked rule, another bug
    valid = [identify(crash(f"CUDA error: {m}", "accept")) for m in ("misaligned address", "invalid argument")]
    assert valid[0].bug != valid[1].bug


def test_gpu_reproducers_with_the_launchers_wording_are_the_known_zero_length_bugs() -> None:
    """The three reproducers of that run (one per backend, launcher wording) have the identity of the
    committed finding of their backend (torch wording), so `--known corpus/sglang` knows them."""
    known = {e.case.backend: e.bug for e in _findings()
             if e.observed is not None and "zero-length" in identify(e.observed, e.case).bug_key}
    reproducers = sorted(GPU_REPRODUCERS.glob("zero-length-launch-*.json"))
    assert len(reproducers) == 3
    for path in reproducers:
        entry = load_entry(path)
        assert entry.observed is not None and "Failed at" in entry.observed.error
        assert known[entry.case.backend] == identify(entry.observed, entry.case).bug, path.name


# ---- zoo mutants: same bug, two seeds ----------------------------------------------------------------------------

def _bugs(backend_name: str, seed: int, cases: int) -> set[str]:
    registry = load_registry()
    backend = registry.get(backend_name)
    space = backend.case_space(CaseSpace(backend=backend_name), Platform("cpu"))
    bugs = set()
    for index in range(cases):
        case = case_for_index(seed, index, space)
        result = run_case(case, backend, Platform("cpu"), torch.device("cpu"))
        if result.outcome.is_failure:
            bugs.add(identify(result, case).bug)
    return bugs


@pytest.mark.parametrize("name", [pytest.param("zoo-kv-swapped-last-layer", marks=pytest.mark.slow),  # ~30 s
                                  "zoo-staging-chunk-64", "zoo-cpu-indices-rejected"])
def test_a_zoo_bug_raises_the_same_identities_from_two_seeds(name: str) -> None:
    first, second = _bugs(name, 1, 250), _bugs(name, 2, 250)
    assert first and first == second
    assert all(bug.startswith(name) for bug in first)  # the mutant's own path: never merged with another bug


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_different_zoo_bugs_never_share_an_identity() -> None:
    names = ["zoo-kv-swapped-last-layer", "zoo-staging-chunk-64", "zoo-offset-wrap-32bit"]
    seen = [_bugs(name, 3, 400) for name in names]
    assert all(seen)
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
