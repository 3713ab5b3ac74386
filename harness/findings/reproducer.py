"""Reproducers: a failing case as a JSON file plus a standalone ``repro_<id>.py`` script, and how a replay of
a corpus entry is judged against what the entry expects.

Files, side by side in ``<corpus>/<signature>/``:

* ``<case_id>.json``: the reproducer (format in :mod:`hicache_fuzz.harness.findings.corpus`), plus optional fields
  ``"expect"`` (``"pass"`` by default; ``"fail"`` marks a known, unfixed bug), ``"signature_key"`` (the
  readable key the signature hashes) and ``"minimized"`` (original vs minimized size);
* ``<case_id>.standalone.py`` (sglang backends): the same failure as a script that needs only torch and
  sglang (:mod:`hicache_fuzz.harness.findings.standalone`);
* ``repro_<case_id>.py``: the case embedded as a JSON literal; it needs torch, hicache_fuzz's core (case,
  materialize, oracle, compare: :func:`hicache_fuzz.harness.pipeline.runner.run_case`) and the backend's own class,
  imported directly (not through the registry, so no other backend family is imported). It prints PASS or
  FAIL with the diff summary and exits 0 (pass) or 1 (fail); 3 if the backend cannot run here.

Corpus files are plain JSON: never pickled, never evaluated. The script embeds the JSON as a raw string
literal and parses it with ``json.loads``.
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.corpus import reproducer_dict
from hicache_fuzz.harness.findings.identity import signature, signature_key
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.json_input import child_path, read_json_file
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.output_paths import write_json_atomic, write_text_atomic

# ---- judging a replay against the entry's expectation -----------------------------------------------------

@dataclass(frozen=True)
class ReplayVerdict:
    ok: bool  # the replay matches what the entry expects
    label: str  # PASS, FAIL, XFAIL (known bug reproduced), XPASS (known bug no longer fails), FAIL-OTHER
    detail: str


def judge_replay(expect: str, recorded_bug: str, result: Result, case: Case, any_crash: bool = False) -> ReplayVerdict:
    """Compare a replay's result with the entry's expectation.

    ``expect == "fail"`` (a known, unfixed bug) is satisfied only by a failure with the recorded bug identity
    (when one is recorded): a different failure is a new finding (FAIL-OTHER). A pass is XPASS: the bug is
    fixed or no longer reproduces here, which the gate reports as fixed so the corpus can be updated.
    `any_crash` (CorpusEntry.any_crash_is_its_bug): a crash with another symptom is the recorded bug too.
    """
    failed = result.outcome.is_failure
    observed = signature(result, case) if failed else ""
    if expect != "fail":
        if failed:
            return ReplayVerdict(False, "FAIL", f"{result.outcome.value} [{observed}]")
        return ReplayVerdict(True, "PASS", result.outcome.value)
    if not failed:
        return ReplayVerdict(False, "XPASS", f"expected to fail but {result.outcome.value}: fixed? then set "
                                             f'"expect": "pass"')
    if recorded_bug and observed != recorded_bug and any_crash and result.outcome is Outcome.CRASH:
        return ReplayVerdict(True, "XFAIL", f"known crash reproduced with another symptom [{observed}, recorded "
                                            f"{recorded_bug}]")
    if recorded_bug and observed != recorded_bug:
        return ReplayVerdict(False, "FAIL-OTHER", f"expected failure {recorded_bug}, got {observed} "
                                                  f"({result.outcome.value})")
    return ReplayVerdict(True, "XFAIL", f"known bug reproduced [{observed}]")


# ---- writing reproducers ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _default_backend_classes() -> dict[str, str]:
    """name -> "module:Class" for every backend the default registry knows (built-ins, zoo, sglang, entry
    points); loaded once per process."""
    from hicache_fuzz.kernels.registry import BrokenBackend, load_registry

    registry = load_registry()
    return {name: f"{type(b).__module__}:{type(b).__qualname__}" for name, b in registry.backends.items()
            if not isinstance(b, BrokenBackend)}


def backend_class_spec(backend_name: str) -> str | None:
    """The importable "module:Class" of a backend, or None if only a plugin provides it."""
    return _default_backend_classes().get(backend_name)


def reproducer_paths(corpus_dir: Path, case: Case, result: Result) -> tuple[Path, Path]:
    folder = child_path(corpus_dir, signature(result, case), where="reproducer folder")
    return folder / f"{case.case_id}.json", folder / f"repro_{case.case_id}.py"


def save_reproducer(corpus_dir: Path, case: Case, result: Result, extra: dict[str, Any] | None = None,
                    backend_class: str | None = None) -> Path:
    """Write ``<corpus>/<signature>/<case_id>.json`` and ``repro_<case_id>.py`` next to it; returns the JSON's
    path. `extra` adds top-level fields (e.g. "expect", "minimized"); `backend_class` is the backend's
    "module:Class" when it is not in the default registry (a --backend-plugin backend)."""
    json_path, script_path = reproducer_paths(corpus_dir, case, result)
    data = _reproducer_fields(case, result, extra)
    write_json_atomic(json_path, data)
    spec = backend_class or backend_class_spec(case.backend)
    write_script(script_path, case, data["signature"], str(data.get("expect", "pass")), spec,
                 result.summary.splitlines()[0] if result.summary else result.error[:200])
    _write_standalone(json_path, case)
    return json_path


# What a reproducer written over an existing file replaces; every other field there (expect, scope, ...) stays.
REPLACED_FIELDS = ("case", "observed", "signature", "signature_key", "variant", "minimized", "trigger")


def save_reproducer_over(path: Path, case: Case, result: Result, extra: dict[str, Any] | None = None) -> Path:
    """Write the reproducer over the file `path` (a known corpus entry re-minimized: its name and its fields but
    REPLACED_FIELDS kept) and its standalone script beside it; returns `path`."""
    kept = {name: value for name, value in read_json_file(path).items() if name not in REPLACED_FIELDS}
    write_json_atomic(path, kept | _reproducer_fields(case, result, extra))
    _write_standalone(path, case)
    return path


def _reproducer_fields(case: Case, result: Result, extra: dict[str, Any] | None) -> dict[str, Any]:
    return reproducer_dict(case, result) | {"signature_key": signature_key(result, case)} | (extra or {})


def _write_standalone(json_path: Path, case: Case) -> None:
    """``<case_id>.standalone.py`` (torch + sglang only) beside the reproducer, for sglang backends. A case the
    generator cannot express (e.g. one the contract leaves undefined) keeps only the harness script."""
    from hicache_fuzz.harness.findings.standalone import (
        DEFAULT_PLATFORM,
        StandaloneUnsupported,
        supports,
        write_standalone,
    )
    from hicache_fuzz.harness.model.platform import detect

    if supports(case.backend):
        here = detect().platform  # the contract's verdict depends on the platform the failure was seen on
        with contextlib.suppress(StandaloneUnsupported):
            write_standalone(json_path, here if here.kind != "cpu" else DEFAULT_PLATFORM)


def readable_case_json(case: Case) -> str:
    """The case's JSON with one top-level field per line and compact values (index lists on one line)."""
    fields = sorted(case.to_dict().items())
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in fields) + "\n}"


def write_script(path: Path, case: Case, recorded_signature: str, expect: str, backend_class: str | None,
                 summary: str) -> None:
    case_json = readable_case_json(case)
    # A raw triple-quoted literal is readable and safe for JSON text: valid JSON never contains three
    # unescaped double quotes in a row. Checked anyway; repr() is the (unreadable) fallback.
    literal = f'r"""\n{case_json}\n"""' if '"""' not in case_json else repr(case_json)
    text = SCRIPT_TEMPLATE.format(
        case_id=case.case_id,
        signature=recorded_signature,
        summary=summary.replace('"""', "'''").replace("\\", "/"),
        case_literal=literal,
        backend_class=repr(backend_class),
        expect=repr(expect),
        recorded_signature=repr(recorded_signature),
    )
    write_text_atomic(path, text)  # onto a regular file or a new path only (harness/model/output_paths.py)
    path.chmod(0o755)  # a script to run


SCRIPT_TEMPLATE = '''#!/usr/bin/env python3
"""hicache-fuzz reproducer {case_id} ({signature}).

Observed: {summary}

Run: python repro_{case_id}.py [--backend-plugin MODULE:CALLABLE]
Prints PASS or FAIL with the diff summary; exit 0 = pass, 1 = fail, 3 = the backend cannot run here.
Needs torch, hicache_fuzz's core (case, materialize, oracle, compare) and the backend's own module; without
one of them it prints one SKIP line naming it and exits 3.
"""

import json
import sys

CASE_JSON = {case_literal}

# The backend's class, imported directly; None: only a --backend-plugin provides it.
BACKEND_CLASS = {backend_class}
# "fail" marks a known, unfixed bug: this script then still exits 1, as the failure reproduces.
EXPECT = {expect}
RECORDED_SIGNATURE = {recorded_signature}


def load_backend(name, plugins):
    import importlib

    if BACKEND_CLASS is not None and not plugins:
        module_name, _, class_name = BACKEND_CLASS.partition(":")
        return getattr(importlib.import_module(module_name), class_name)()
    from hicache_fuzz.kernels.registry import load_registry

    return load_registry(plugins).get(name)


def cannot_run(what, exc):
    """Exit 3 ("cannot run here") with one line naming what is missing; never a traceback."""
    print(f"SKIP {case_id}: cannot run here: {{what}} ({{type(exc).__name__}}: {{exc}})")
    return 3


def main(argv):
    try:
        import torch
    except ImportError as exc:
        return cannot_run("torch is not importable", exc)
    try:
        from hicache_fuzz.harness.model.case import Case
        from hicache_fuzz.kernels.buffers import HostMemory
        from hicache_fuzz.harness.model.platform import detect
        from hicache_fuzz.harness.pipeline.runner import run_case
        from hicache_fuzz.harness.findings.identity import signature
    except ImportError as exc:
        missing = (exc.name or "hicache_fuzz").split(".")[0]  # hicache_fuzz itself, or one of its dependencies
        return cannot_run(f"{{missing}} is not importable (pip install -e . in the hicache-fuzz checkout)", exc)

    plugins = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--backend-plugin"]
    case = Case.from_dict(json.loads(CASE_JSON))
    machine = detect()
    if BACKEND_CLASS is None and not plugins:
        print(f"SKIP {{case.case_id}}: backend {{case.backend}} comes from a plugin; "
              "run with --backend-plugin MODULE:CALLABLE")
        return 3
    try:
        backend = load_backend(case.backend, plugins)
    except ImportError as exc:
        return cannot_run(f"the backend's module {{exc.name or BACKEND_CLASS}} is not importable", exc)
    availability = backend.probe(machine.platform)
    if not availability.available:
        print(f"SKIP {{case.case_id}}: backend {{case.backend}} cannot run on {{machine.description}}: "
              f"{{availability.reason}}")
        return 3
    if machine.device.type == "cpu":
        torch.set_num_threads(1)  # small tensors: threads only add overhead
    result = run_case(case, backend, machine.platform, machine.device,
                      HostMemory(simulate=machine.device.type == "cpu"))
    failed = result.outcome.is_failure
    print(f"{{'FAIL' if failed else 'PASS'}} {{case.case_id}} [{{case.backend}}] {{result.outcome.value}}")
    if result.summary or result.error:
        print(result.summary or result.error)
    if failed:
        observed = signature(result, case)
        same = "same as recorded" if observed == RECORDED_SIGNATURE else f"recorded {{RECORDED_SIGNATURE}}"
        print(f"signature {{observed}} ({{same}})")
        if EXPECT == "fail":
            print("(a known, unfixed bug: the corpus marks this reproducer expect=fail)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

