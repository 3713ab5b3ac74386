"""Bug identity: a name for the bug behind a failure, not for the case that showed it.

Two failures have the same identity when they have the same cause, whatever the seed, geometry, dtypes or
unrelated rule violations of their cases. The identity key is

    <implementation path> | <outcome> | <cause>

* implementation path: the path the backend planned (and the one that ran, where it differs), so sglang-jit
  and sglang-jit-register failing in the same register kernel share an identity, and each zoo mutant (whose
  path is its name) has its own; a crash or hang is placed at its backend (the process died before it could
  say which path ran);
* cause, by outcome:
  - wrongly accepted: the PRIMARY contract rule the input broke: of the rules it broke, the first in the
    contract's priority order (``oracles/contract.py`` RULE_PRIORITY), so a case that also breaks unrelated
    rules (page alignment, index device, index dtype) names the same bug as one that breaks only the rule
    the implementation forgot;
  - wrongly rejected: a valid input rejected is one bug per path ("valid"): which of the path's own checks
    fired (its error text) depends on the case and is part of the variant;
  - crash, hang on input the contract rejects: "unchecked" and the primary broken rule (the path lacks that
    check; the error, which depends on the runtime, is part of the variant);
  - crash, hang on valid input (and a rejection of an input the contract did not call valid): the
    normalized error (first line; numbers, addresses, paths and quoted values replaced; a GPU runtime error
    reduced to the runtime's own message, see ``error_cause``) and "valid";
  - mismatch: the family of the damage (``pipeline/damage.py``): missing (stale or truncated rows),
    misplaced (bytes of the wrong row, page, layer, component or pool, or written out of range), corrupt
    (bytes from no storage of the case) or source-modified; the exact classes (shifted, swapped, ...) are
    part of the variant, since which of them a misdirected write shows depends on the geometry;
  - unexpected path: which path ran instead.

A second, fine-grained key (the *variant*) adds the old per-case roles (which page, which layer, which pool,
the full list of broken rules): campaigns keep one reproducer per variant inside one bug's folder.

docs/identity.md explains the design and its limits.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hicache_fuzz.harness.model.case import Case, Direction
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.pipeline.damage import fill_bytes_at, storage_salts
from hicache_fuzz.oracles.contract import primary_rule, rules_of

_ADDRESSES = re.compile(r"0x[0-9a-fA-F]+")
_PATHS = re.compile(r"(?:/[\w.+-]+){2,}")
_NUMBERS = re.compile(r"[-+]?\d+(?:\.\d+)?")
_QUOTED = re.compile(r"'[^']*'")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
# "CUDA error: invalid argument", "HIP error: invalid device function": the runtime's message after it.
_GPU_RUNTIME_ERROR = re.compile(r"\b(?:CUDA|HIP) error: *(?P<message>.*)$")
# The index checks of the CPU reference (kernels/reference.py ``validate``), which every zoo mutant inherits. They
# run on the indices the implementation computed, after it read and expanded the case's: on an input the contract
# calls valid (every index in range, no duplicate destination) they can only fire on indices the path made up.
_MADE_UP_INDEX = re.compile(r"\b(?:host|device) index -?\d+ out of range|\bduplicate destination indices\b")
# The identity of a valid input rejected on made-up indices: the misplaced write those indices make where they
# happen to pass the checks (one bug, whichever way a case shows it).
MADE_UP_INDICES = (Outcome.MISMATCH.value, "misplaced")


def normalize_error(error: str) -> str:
    """First line of an error with addresses, paths, numbers and quoted values replaced by placeholders."""
    first_line = error.strip().splitlines()[0] if error.strip() else ""
    text = _ADDRESSES.sub("ADDR", first_line)
    text = _PATHS.sub("PATH", text)
    text = _QUOTED.sub("'S'", text)
    return _NUMBERS.sub("N", text)[:160]


def error_cause(error: str) -> str:
    """The part of an error that names its cause, for the identity.

    A GPU runtime error is named by the runtime's own message alone ("GPU error: invalid argument"). The
    same error code reaches the harness wrapped in different ways, depending on which call noticed it
    first: the kernel launcher's own check ("RuntimeError: Failed at hicache.cuh:532: CUDA error: ...") or
    the next torch call on the stream ("AcceleratorError: CUDA error: ..."). Which one wins varies with
    timing, so the wrapper, the exception type and the source line are not part of the bug. CUDA and HIP
    name the same code the same way ("invalid argument"), so a bug seen on both platforms has one cause.
    Any other error: ``normalize_error``."""
    first_line = error.strip().splitlines()[0] if error.strip() else ""
    gpu_error = _GPU_RUNTIME_ERROR.search(first_line)
    if gpu_error:
        return "GPU error: " + normalize_error(gpu_error.group("message"))
    return normalize_error(error)


@dataclass(frozen=True)
class Identity:
    bug: str  # "<path>-<outcome>-<hash>": the bug; corpus folders, --known matching, minimizer target
    bug_key: str  # the readable key it hashes
    variant: str  # "<bug>.<hash>": one reproducer per variant inside a bug
    variant_key: str


def identify(result: Result, case: Case | None = None) -> Identity:
    """The identity of a failure. Pass the case whenever it is known (mismatch variants need it)."""
    location = _location(result)
    made_up = _rejected_made_up_indices(result)
    outcome, cause = MADE_UP_INDICES if made_up else (result.outcome.value, _cause(result, case))
    bug_key = "|".join((location, outcome, cause))
    shown = (result.outcome.value,) if made_up else ()  # the variant says how this case showed the bug
    variant_key = "|".join((bug_key, result.backend, *shown, _variant_detail(result, case)))
    bug = f"{_SAFE.sub('_', location)}-{outcome}-{_digest(bug_key)}"
    return Identity(bug, bug_key, f"{bug}.{_digest(variant_key)[:6]}", variant_key)


def signature(result: Result, case: Case | None = None) -> str:
    """The bug identity's name (kept under this name for the corpus layout and older callers)."""
    return identify(result, case).bug


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _rejected_made_up_indices(result: Result) -> bool:
    """A valid input rejected by the reference's index checks: the path computed indices other than the case's
    (a zoo mutant that misreads or remaps them). Where the made-up indices pass those checks the same bug
    writes rows to the wrong place (a misplaced mismatch); which of the two a case shows depends on the values
    of its indices, not on the bug, so both have the misplaced mismatch's identity."""
    return (result.outcome is Outcome.WRONGLY_REJECTED and _input_rule(result.prediction) == "valid"
            and bool(_MADE_UP_INDEX.search(result.error)))


def _location(result: Result) -> str:
    """Where the failure happened: the planned implementation path, and the one that ran where it differs.
    A crash or hang is placed at its backend: the process died before it could say which path ran, and
    whether the parent knows the plan must not change the identity."""
    if result.outcome in (Outcome.CRASH, Outcome.HANG):
        return result.backend
    planned = result.expected_path or result.backend
    ran = result.path
    if ran and ran not in (planned, "none"):  # "none": nothing was launched, so no other path ran
        return f"{planned}->{ran}"
    return planned


def _cause(result: Result, case: Case | None) -> str:
    if result.outcome is Outcome.WRONGLY_ACCEPTED:
        return primary_rule(_reasons(result.prediction))
    input_rule = _input_rule(result.prediction)
    if result.outcome is Outcome.WRONGLY_REJECTED and input_rule == "valid":
        # A valid input rejected: the bug is that this path refuses inputs the contract accepts. Which of
        # its own checks fired depends on the case, as the damage class of a mismatch does (a mutant that
        # remaps indices trips its bounds check or its duplicate check, depending on where the remapped
        # run lands), so the error text is part of the variant, not of the identity.
        return "valid"
    if result.outcome in (Outcome.CRASH, Outcome.HANG) and input_rule != "valid":
        # A crash or hang on input the contract rejects: the path lacks the check of that rule. How the
        # missing check ends depends on the runtime (CUDA says "invalid argument" for a zero-length grid,
        # HIP may name it otherwise), so the error is part of the variant, as for a wrongly accepted input.
        return f"unchecked|{input_rule}"
    if result.outcome in (Outcome.WRONGLY_REJECTED, Outcome.CRASH, Outcome.HANG):
        # The same error text can end different bugs (CUDA's "invalid argument" ends both a zero-length
        # launch and a grid past its limit): what the contract said of the input tells them apart.
        return f"{error_cause(result.error)}|{input_rule}"
    if result.outcome is Outcome.MISMATCH:
        return _damage_cause(result, case)
    return ""  # unexpected path: the location says it all


def contract_cause(result: Result, prediction: str | None = None) -> str:
    """The cause of a failure whose identity the contract decides, or "": an accepted input that breaks a rule
    (the primary rule), a crash or hang on such an input ("unchecked" and the rule). `prediction` replaces
    the result's own (Prediction.describe()), to ask whether another case would show the same cause."""
    said = result.prediction if prediction is None else prediction
    if result.outcome is Outcome.WRONGLY_ACCEPTED:
        return primary_rule(_reasons(said)) if _input_rule(said) != "valid" else ""
    if result.outcome in (Outcome.CRASH, Outcome.HANG) and _input_rule(said) != "valid":
        return f"unchecked|{_input_rule(said)}"
    return ""


def _input_rule(prediction: str) -> str:
    """"valid" for an input the contract accepts, else the primary rule it breaks."""
    if not prediction or prediction.startswith("accept"):
        return "valid"
    return primary_rule(_reasons(prediction))


def _reasons(prediction: str) -> list[str]:
    """The contract's reasons from a Prediction.describe() string ("reject: a; b")."""
    _, _, reasons = prediction.partition(": ")
    return [r for r in reasons.split("; ") if r]


def _damage_cause(result: Result, case: Case | None) -> str:
    damage = result.diff.get("damage") or {}
    if damage:
        return str(damage.get("family", "?"))
    return _family_from_first_byte(result, case)


def _family_from_first_byte(result: Result, case: Case | None) -> str:
    """The damage family of a reproducer saved before damage was recorded, from what its diff kept: the
    first differing byte of each storage. A destination byte that still holds its pre-transfer fill is a
    missing write, as the full classification would say of a row left stale."""
    storages = result.diff.get("storages", [])
    if case is None or not storages:
        return "unknown"
    source = "device" if case.direction is Direction.WRITE_BACK else "host"
    if any(str(s.get("storage", "")).endswith("/" + source) for s in storages):
        return "source-modified"
    if any(s.get("outside_addressed") for s in storages):
        return "misplaced"
    salts = storage_salts(case)
    first = storages[0]
    key, offset = str(first.get("storage", "")), first.get("first_offset")
    if key in salts and isinstance(offset, int):
        fill_byte = int(fill_bytes_at(np.array([offset], dtype=np.int64), salts[key])[0])
        return "missing" if fill_byte == first.get("actual_byte") else "misplaced"
    return "unknown"


def _variant_detail(result: Result, case: Case | None) -> str:
    if result.outcome is Outcome.WRONGLY_ACCEPTED:
        return ",".join(sorted(set(rules_of(_reasons(result.prediction)))))
    if result.outcome in (Outcome.WRONGLY_REJECTED, Outcome.CRASH, Outcome.HANG):
        return error_cause(result.error)
    if result.outcome is not Outcome.MISMATCH:
        return ""
    damage = result.diff.get("damage") or {}
    parts = [",".join(damage.get("classes", [])), ",".join(damage.get("components", [])),
             str(damage.get("component_coverage", ""))]
    storages = result.diff.get("storages", [])
    if storages and case is not None:
        first = storages[0]
        parts.append(_page_role(case, first))
        parts.append(str(first.get("region", "")))
    return "|".join(parts)


def _page_role(case: Case, first: dict[str, object]) -> str:
    """Which page of the transfer the first differing row belongs to: first, last, inner or unaddressed."""
    location = first.get("location")
    if not isinstance(location, dict):
        return ""
    row = location.get("token", location.get("row"))
    if not isinstance(row, int):
        return ""
    side = str(first.get("storage", "?/?")).partition("/")[2]
    indices: Sequence[int] = case.host_indices if side == "host" else case.device_indices
    pages = list(dict.fromkeys(index // case.page_size for index in indices))
    page = row // case.page_size
    if page not in pages:
        return "unaddressed-page"
    return "last-page" if page == pages[-1] else "first-page" if page == pages[0] else "inner-page"


def signature_key(result: Result, case: Case | None = None) -> str:
    """The readable key the bug identity hashes (written into reproducers next to the identity)."""
    return identify(result, case).bug_key
