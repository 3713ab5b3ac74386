"""The baseline: a second sglang on which every failure of a campaign is replayed (``fuzz``/``gate``
``--baseline``), so a PR gate compares head with base.

A failure that fails on the baseline with the same bug identity is *pre-existing* (the change under test did
not cause it); one that passes there, or fails with another identity, is *new*, whatever the known corpus says.
The baseline is

* an sglang source path: a folder holding the ``sglang`` package (a checkout's ``python/`` folder), put first on
  ``PYTHONPATH`` of this interpreter; or
* a Python interpreter of another environment with an installed sglang (and torch): this harness is made
  importable there through a folder of links to its own package folders.

The replay runs in its own process (``python -m hicache_fuzz.harness.campaign.baseline IN OUT``), which replays
the reproducers through the same replay loop as ``hicache-fuzz replay`` (campaign/replay.py), real kernels in
their own worker processes; sglang's JIT cache is content-addressed, so both sides share it. Nothing of the
baseline is imported into the campaign's process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.campaign.loop import CampaignReport
from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.findings.known import KnownMap, match_known
from hicache_fuzz.harness.model.exit_codes import Unavailable, UsageError
from hicache_fuzz.harness.model.outcome import Outcome

PRE_EXISTING, NEW, NOT_REPLAYED = "pre-existing", "new", "not replayed"
PRE_EXISTING_NOTE = "pre-existing on the baseline"  # a campaign failure class's `known` note for such a failure
_PROBE = "import sglang, torch; print(getattr(sglang, '__version__', '') or 'unknown', sglang.__file__)"


@dataclass(frozen=True)
class Baseline:
    """How to start a process that imports the baseline sglang."""

    given: str  # as the user named it
    python: str
    pythonpath: tuple[str, ...]  # put first on PYTHONPATH
    version: str = ""  # sglang's, as the baseline process reports it
    location: str = ""  # its sglang/__init__.py

    def describe(self) -> str:
        return f"sglang {self.version} at {self.location} ({self.given})"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, *filter(None, [env.get("PYTHONPATH", "")])])
        return env


def resolve_baseline(text: str, work_dir: Path) -> Baseline:
    """The baseline named by `text`, probed: UsageError (exit 2) for a path that is not a folder holding an
    ``sglang`` package nor an executable file, Unavailable (exit 3) for an interpreter or an sglang that does
    not start (the message says why). `work_dir` holds the harness's links for another interpreter."""
    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"--baseline {text}: no such file or folder")
    if path.is_dir():
        if not (path / "sglang" / "__init__.py").is_file():
            raise UsageError(f"--baseline {text}: no sglang package in it (expected {path / 'sglang' / '__init__.py'}; "
                             "give the folder that holds the sglang package, e.g. a checkout's python/)")
        baseline = Baseline(text, sys.executable, (str(path.resolve()),))
    elif os.access(path, os.X_OK):
        baseline = Baseline(text, str(path), (str(harness_links(work_dir)),))
    else:
        raise UsageError(f"--baseline {text}: neither a folder holding sglang nor an executable Python interpreter")
    try:
        probe = subprocess.run([baseline.python, "-c", _PROBE], env=baseline.env(), capture_output=True, text=True,
                               timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"--baseline {text}: the interpreter {baseline.python} does not run: {exc}") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(f"--baseline {text}: cannot import sglang and torch with {baseline.python}: {last}")
    version, _, location = probe.stdout.strip().splitlines()[-1].partition(" ")
    return Baseline(baseline.given, baseline.python, baseline.pythonpath, version, location)


def harness_links(work_dir: Path) -> Path:
    """A folder that makes this harness importable as ``hicache_fuzz`` by another interpreter: links to its
    package folders, never a copy (the import root maps onto several top-level folders, pyproject.toml)."""
    spec = importlib.util.find_spec("hicache_fuzz")  # the import root's own folder, without importing it here
    assert spec is not None and spec.origin is not None  # this module is part of it
    package = Path(spec.origin).resolve().parent
    links = work_dir / "harness-links"
    target = links / "hicache_fuzz"
    target.mkdir(parents=True, exist_ok=True)
    if package.name == "hicache_fuzz":  # an installed package: one folder
        parts = {p.name: p for p in package.iterdir()}
    else:  # a source tree: harness/_root is the package root, the layers are its siblings' folders
        root = package.parents[1]
        parts = {p.name: p for p in package.iterdir() if p.suffix == ".py"}
        parts.update({name: root / name for name in ("harness", "kernels", "oracles")})
    for name, source in parts.items():
        link = target / name
        if not link.exists():
            link.symlink_to(source)
    return links


@dataclass
class BaselineReplay:
    """What the baseline said of each reproducer file, and what it cost."""

    baseline: Baseline
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> {"outcome", "signature", "skipped"}
    seconds: float = 0.0
    cases: int = 0
    error: str = ""  # the baseline process failed (its last line); every failure then stays as classified

    def verdict(self, file: str, head_signature: str) -> tuple[str, str]:
        """(pre-existing | new | not replayed, what the baseline did)."""
        row = self.results.get(file)
        if row is None or row.get("skipped"):
            return NOT_REPLAYED, (row or {}).get("skipped") or self.error or "not replayed"
        if row["signature"] == head_signature:
            return PRE_EXISTING, f"fails the same way on the baseline ({row['outcome']})"
        if row["signature"]:
            return NEW, f"fails differently on the baseline: {row['outcome']} [{row['signature']}]"
        return NEW, f"{row['outcome']} on the baseline"

    def class_verdict(self, files: list[str], signature: str) -> tuple[str, str]:
        """One failure class from its variants' reproducers: new if the baseline does not share one of them,
        pre-existing if it fails every one the same way, else not replayed."""
        judged = [(file, *self.verdict(file, signature)) for file in files]
        new = [(file, detail) for file, verdict, detail in judged if verdict == NEW]
        if new:
            return NEW, f"{new[0][1]} ({Path(new[0][0]).name})"
        if judged and all(verdict == PRE_EXISTING for _, verdict, _ in judged):
            return PRE_EXISTING, judged[0][2]
        return NOT_REPLAYED, judged[0][2] if judged else "no reproducer"

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.describe(), "python": self.baseline.python, "cases": self.cases,
                "seconds": round(self.seconds, 3), **({"error": self.error} if self.error else {})}


def replay_on_baseline(baseline: Baseline, files: list[str], platform: str, backend_plugins: list[str],
                       case_timeout: float, work_dir: Path) -> BaselineReplay:
    """Replay the reproducer `files` in a process that imports the baseline sglang."""
    replay = BaselineReplay(baseline)
    files = sorted(set(files))
    if not files:
        return replay
    started = time.perf_counter()
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="baseline-") as scratch:
        request, answer = Path(scratch) / "request.json", Path(scratch) / "answer.json"
        request.write_text(json.dumps({"files": files, "platform": platform, "backend_plugins": backend_plugins,
                                       "case_timeout": case_timeout, "journal": str(work_dir / "journal")}))
        done = subprocess.run([baseline.python, "-m", "hicache_fuzz.harness.campaign.baseline", str(request),
                               str(answer)], env=baseline.env(), capture_output=True, text=True, check=False)
        if done.returncode != 0 or not answer.is_file():
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            replay.error = f"the baseline replay failed: {last}"[:400]
        else:
            replay.results = json.loads(answer.read_text())["results"]
    replay.cases = sum(1 for row in replay.results.values() if not row.get("skipped"))
    replay.seconds = time.perf_counter() - started
    return replay


def variant_files(file: str, variants: list[str]) -> list[str]:
    """The reproducers of one failure class: its first `file` and the one saved per further variant (beside
    it, in its signature's folder) in this campaign."""
    if not file:
        return []
    first = Path(file)
    files = [str(first)]
    wanted = set(variants)
    for sibling in sorted(first.parent.glob("*.json")):
        if sibling == first or sibling.name.startswith("."):
            continue
        try:
            variant = json.loads(sibling.read_text()).get("variant")
        except (OSError, ValueError):
            continue
        if variant in wanted:
            files.append(str(sibling))
    return files


def judge_failure(replay: BaselineReplay, files: list[str], signature: str, backend: str,
                  known: KnownMap, outcome: str = "") -> tuple[str, str, str]:
    """(new | known | pre-existing, why, the known entry's file or "") of one failure class of a campaign run
    without its known corpus, from the reproducers of its variants: the baseline decides where it replayed
    them; only a class it could not replay is matched against the known corpus (every variant's case must
    meet a known entry's trigger, known.match_known)."""
    verdict, detail = replay.class_verdict(files, signature)
    cases = [load_entry(Path(file)).case for file in files]
    crash = Outcome.CRASH if outcome == Outcome.CRASH.value else None
    matches = [match_known(known, signature, backend, case, crash) for case in cases]
    known_file = matches[0] if matches and all(matches) else ""
    if verdict in (NEW, PRE_EXISTING):
        return verdict, detail, known_file
    return ("known", f"not replayed on the baseline ({detail})", known_file) if known_file else (NEW, detail, "")


def judge_campaign(report: CampaignReport, baseline: Baseline, known: KnownMap, platform: str,
                   backend_plugins: list[str], case_timeout: float, work_dir: Path) -> None:
    """Re-judge the failures of a campaign run without its known corpus on the baseline (judge_failure): the
    class's ``known`` says "pre-existing on the baseline" or names the known entry; a new one keeps it empty.
    The verdicts and the replay's cost go to ``report.extra["baseline"]``."""
    files = {id(failure): variant_files(failure.file, failure.variants) for failure in report.failures}
    replay = replay_on_baseline(baseline, [file for group in files.values() for file in group], platform,
                                backend_plugins, case_timeout, work_dir)
    verdicts = []
    for failure in report.failures:
        status, detail, known_file = judge_failure(replay, files[id(failure)], failure.signature, failure.backend,
                                                   known, failure.outcome)
        failure.known = {NEW: "", "known": known_file,
                         PRE_EXISTING: f"{PRE_EXISTING_NOTE} ({baseline.describe()})"}[status]
        verdicts.append({"signature": failure.signature, "files": files[id(failure)], "status": status,
                         "detail": detail, "known_entry": known_file})
    report.extra["baseline"] = {**replay.to_dict(), "failures": verdicts}


def _replay_here(request: dict[str, Any]) -> dict[str, Any]:
    """In the baseline process: replay each file through the replay loop; its signature when it fails."""
    from hicache_fuzz.harness.campaign.replay import replay_entries
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions, machine_for, registry_for

    machine = machine_for(request["platform"])
    registry = registry_for(list(request["backend_plugins"]))
    execution = ExecutionOptions(request["platform"], list(request["backend_plugins"]),
                                 isolate="yes" if machine.platform.kind != "cpu" else "auto",
                                 case_timeout=float(request["case_timeout"]))
    entries = [load_entry(Path(file)) for file in request["files"]]
    replays = replay_entries(entries, registry, machine, execution, Path(request["journal"]))
    results = {}
    for file, replayed in zip(request["files"], replays, strict=True):
        outcome = replayed.result.outcome.value if replayed.result is not None else ""
        results[file] = {"outcome": outcome, "signature": replayed.signature, "skipped": replayed.skipped}
    return {"results": results}


def main(argv: list[str]) -> int:
    request_path, answer_path = Path(argv[0]), Path(argv[1])
    answer = _replay_here(json.loads(request_path.read_text()))
    answer_path.write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
