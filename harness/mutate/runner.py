"""Run mutants against targets: baseline first, then one mutant per slot at a time, resumable.

A slot is a device id (``--gpus``), repeated ``--jobs-per-gpu`` times: each slot has its own private sglang copy
(``<out>/work/slot-<k>``), so K mutants run on one GPU at once without seeing each other's files.

Each finished mutant is written atomically to ``<out>/mutants/<id>.json`` (all targets' results in one
file), so a rerun with the same ``--out`` skips it. sglang's JIT cache is content-addressed (its build key
hashes the source files and the leaf hashes the transitive includes), so one cache shared by the baseline
and all mutants never serves a stale build; ``per-mutant`` gives each mutant its own empty cache anyway.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.output_paths import write_json_atomic
from hicache_fuzz.harness.mutate.mutant import Mutant
from hicache_fuzz.harness.mutate.targets import (
    CampaignTarget,
    Stopped,
    Target,
    TargetResult,
    baseline_failure_variants,
    read_report,
)
from hicache_fuzz.harness.mutate.workspace import Workspace, child_environment


class BaselineFailed(Exception):
    """The unmutated copy does not pass a target (exit 3)."""


@dataclass
class RunConfig:
    root: Path  # the folder holding the original sglang package (read only)
    mutants: list[Mutant]
    targets: list[Target]
    out: Path
    slots: list[str | None]  # device ids, one mutant at a time per slot; [None] = no device pinning
    device_env: str  # CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES
    timeout: Callable[[Target], float]
    jit_cache: str = "shared"  # or "per-mutant"
    keep_workspace: bool = False
    reuse_baseline: bool = False  # a passed <out>/baseline.json for the same targets stands (resumed runs)
    parallel_targets: bool = False  # a mutant's targets run at the same time (each its own process)
    # "known": new failures of the unmutated campaign become known failures of every mutant's campaign (the
    # baseline passes with them listed) instead of aborting the run; a test command's baseline must still pass
    baseline_failures: str = "abort"
    # time.monotonic() after which no mutant is started (those running finish): a time-boxed device call then
    # ends with its slots' work recorded instead of killing the mutants in flight (which would record nothing)
    start_deadline: float | None = None


def result_path(out: Path, mutant_id: str) -> Path:
    return out / "mutants" / f"{mutant_id}.json"


def finished(out: Path, mutant_id: str, targets: dict[str, Any]) -> dict[str, Any] | None:
    """The stored result of a mutant if it covers every target now asked for, configured the same way."""
    try:
        data = json.loads(result_path(out, mutant_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    stored = data.get("target_config", {})
    same = all(name in data.get("targets", {}) and stored.get(name) == config for name, config in targets.items())
    return data if same else None


def _environment(config: RunConfig, workspace: Workspace, slot: str | None, mutant_id: str) -> dict[str, str]:
    env = child_environment(workspace.root)
    if slot is not None:
        env[config.device_env] = slot
    # Shared: the cache the environment already names (a warm one saves every unmutated module's nvcc run;
    # safe because sglang's cache is content-addressed), else one under --out.
    cache = Path(os.environ.get("SGLANG_JIT_CACHE_DIR") or config.out / "jit-cache")
    if config.jit_cache == "per-mutant":
        cache = workspace.root / "jit-cache" / mutant_id
    env["SGLANG_JIT_CACHE_DIR"] = str(cache)
    env["HICACHE_MUTANT_ID"] = mutant_id
    env["HICACHE_MUTATE_SGLANG_ROOT"] = str(workspace.root)
    return env


def check_resolution(env: dict[str, str], workspace: Workspace) -> None:
    """A child with this environment must import sglang from the private copy, not from the install."""
    probe = ("import importlib.util; s = importlib.util.find_spec('sglang'); "
             "print(list(s.submodule_search_locations)[0] if s else '')")
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    location = found.stdout.strip()
    if not location or Path(location).resolve() != (workspace.root / "sglang").resolve():
        raise BaselineFailed(f"a target process would import sglang from {location or 'nowhere'}, not from the "
                             f"private copy {workspace.root / 'sglang'} (an import hook ahead of PYTHONPATH?)")


def run_baseline(config: RunConfig, workspaces: list[Workspace]) -> dict[str, Any]:
    """Every target on the unmutated copy, each on its own slot when there are several (they run at once);
    each must survive. Stored in <out>/baseline.json."""
    results: dict[str, Any] = {}
    lock = threading.Lock()

    def one(index: int, target: Target) -> None:
        slot = index % len(workspaces)
        env = _environment(config, workspaces[slot], config.slots[slot], "baseline")
        check_resolution(env, workspaces[slot])
        result = target.run(env, config.out / "runs" / "baseline", config.timeout(target), baseline=True)
        with lock:
            results[target.name] = result.to_dict()

    errors: list[BaseException] = []

    def guarded(index: int, target: Target) -> None:
        try:
            one(index, target)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k, t), daemon=True) for k, t in enumerate(config.targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    accepted: dict[str, Any] = {}
    for target in config.targets:
        result = results[target.name]
        if (result["outcome"] == "killed" and config.baseline_failures == "known"
                and isinstance(target, CampaignTarget)):
            known = accept_baseline_failures(config.out, target.name)
            if known is not None:
                target.extra_known = [known]
                accepted[target.name] = {"known": str(known), "failures": result["failures"]}
                continue
        if result["outcome"] != "survived":
            write_json_atomic(config.out / "baseline.json", {"passed": False, "targets": results})
            raise BaselineFailed(f"baseline (unmutated sglang) of target {target.name!r} is {result['outcome']}: "
                                 f"{result['detail']}; see {result['log']}")
    baseline = {"passed": True, "targets": results, "target_config": _described(config),
                "accepted_failures": accepted}
    write_json_atomic(config.out / "baseline.json", baseline)
    return baseline


def accept_baseline_failures(out: Path, name: str) -> Path | None:
    """Copy the unmutated campaign's reproducers to <out>/baseline-known/<name>/ marked as expected failures
    (`"expect": "fail"`), for `fuzz --known`; None when there is none to copy (then the baseline fails)."""
    corpus = out / "runs" / "baseline" / f"{name}-corpus"
    known = out / "baseline-known" / name
    shutil.rmtree(known, ignore_errors=True)
    copied = 0
    for folder in sorted(p for p in corpus.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if corpus.is_dir() else []:
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            data["expect"] = "fail"  # (no other field: the corpus loader is strict about the reproducer's keys)
            write_json_atomic(known / folder.name / path.name, data)
            copied += 1
    return known if copied else None


def _restore_accepted(config: RunConfig, baseline: dict[str, Any]) -> None:
    """A reused baseline's accepted failures apply to this run's mutants again."""
    for target in config.targets:
        entry = (baseline.get("accepted_failures") or {}).get(target.name)
        if entry and isinstance(target, CampaignTarget) and Path(entry["known"]).is_dir():
            target.extra_known = [Path(entry["known"])]


def _described(config: RunConfig) -> dict[str, Any]:
    return {t.name: t.describe() for t in config.targets}


def stored_baseline(config: RunConfig) -> dict[str, Any] | None:
    """A passed baseline of an earlier run with the same targets, if any."""
    try:
        data = json.loads((config.out / "baseline.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("passed") is True and data.get("target_config") == _described(config):
        return dict(data)
    return None


def _syntax_gate(mutant: Mutant, root: Path) -> str | None:
    """A Python mutant that does not compile is a build error without running anything."""
    if not mutant.file.endswith(".py"):
        return None
    text = mutant.apply((root / mutant.file).read_text(encoding="utf-8"))
    try:
        compile(text, mutant.file, "exec")
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    return None


def run_mutant(config: RunConfig, workspace: Workspace, slot: str | None, mutant: Mutant) -> dict[str, Any]:
    original = (config.root / mutant.file).read_text(encoding="utf-8")
    record: dict[str, Any] = {"mutant": {**mutant.to_dict(), "diff": mutant.diff(original)}, "device": slot,
                              "targets": {}, "target_config": {t.name: t.describe() for t in config.targets}}
    syntax = _syntax_gate(mutant, config.root)
    if syntax is not None:
        for target in config.targets:
            record["targets"][target.name] = TargetResult("build_error", 0.0, None, syntax).to_dict()
        return record
    env = _environment(config, workspace, slot, mutant.id)
    run_dir = config.out / "runs" / mutant.id
    with workspace.applied(mutant):
        if config.parallel_targets and len(config.targets) > 1:
            with ThreadPoolExecutor(max_workers=len(config.targets)) as pool:
                futures = {t.name: pool.submit(t.run, env, run_dir, config.timeout(t)) for t in config.targets}
            # (the pool has joined: every target ended, or was stopped, before the copy is restored)
            failed = [exc for future in futures.values() if (exc := future.exception()) is not None]
            if failed:
                raise next((exc for exc in failed if isinstance(exc, Stopped)), failed[0])
            for target in config.targets:
                record["targets"][target.name] = futures[target.name].result().to_dict()
        else:
            for target in config.targets:
                record["targets"][target.name] = target.run(env, run_dir, config.timeout(target)).to_dict()
    if config.jit_cache == "per-mutant":
        shutil.rmtree(workspace.root / "jit-cache" / mutant.id, ignore_errors=True)
    return record


def run_all(config: RunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Baseline, then every unfinished mutant; returns {mutant id: record} for all mutants of the config."""
    described = {t.name: t.describe() for t in config.targets}
    records: dict[str, Any] = {}
    pending: queue.Queue[Mutant] = queue.Queue()
    for mutant in config.mutants:
        done = finished(config.out, mutant.id, described)
        if done is not None:
            records[mutant.id] = done
        else:
            pending.put(mutant)
    log(f"mutate: {len(config.mutants)} mutants, {len(records)} already finished, {pending.qsize()} to run, "
        f"{len(config.slots)} slot(s)")
    with ThreadPoolExecutor(max_workers=len(config.slots)) as pool:  # ~130 MB each: copy them at once
        workspaces = list(pool.map(lambda k: Workspace(config.root, config.out / "work" / f"slot-{k}"),
                                   range(len(config.slots))))
    lock = threading.Lock()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    try:
        baseline = stored_baseline(config) if config.reuse_baseline else None
        if baseline is not None:
            log("mutate: reusing the passed baseline in " + str(config.out / "baseline.json"))
            _restore_accepted(config, baseline)
        else:
            baseline = run_baseline(config, workspaces)
        for name, entry in (baseline.get("accepted_failures") or {}).items():
            log(f"mutate: the unmutated {name} failed with {len(entry['failures'])} new failure class(es), now "
                f"known for every mutant ({entry['known']}): " + ", ".join(str(f.get("signature"))
                                                                          for f in entry["failures"]))
        for target in config.targets:
            if isinstance(target, CampaignTarget):
                report = Path(str(baseline["targets"][target.name]["log"])).with_suffix(".json")
                target.baseline_backends = _sglang_backends(report)
                unmutated = read_report(report)
                target.baseline_variants = baseline_failure_variants(unmutated) if unmutated else None
                target.baseline_cases = int(unmutated.get("cases", 0)) if unmutated else 0
        if pending.empty():
            return records

        def worker(index: int) -> None:
            while not errors:
                if config.start_deadline is not None and time.monotonic() > config.start_deadline:
                    return  # the rest stay unfinished: a rerun picks them up
                try:
                    mutant = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    record = run_mutant(config, workspaces[index], config.slots[index], mutant)
                except Stopped:
                    return  # SIGTERM/SIGINT: the mutant stays unfinished, a rerun picks it up
                except BaseException as exc:  # a broken workspace must stop the run, not look like a kill
                    with lock:
                        errors.append(exc)
                    return
                write_json_atomic(result_path(config.out, mutant.id), record)
                outcomes = ", ".join(f"{n}={r['outcome']}" for n, r in record["targets"].items())
                with lock:
                    records[mutant.id] = record
                    log(f"  {mutant.id} {mutant.file}:{mutant.line} {mutant.operator}: {outcomes}")

        threads.extend(threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(config.slots)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        if not pending.empty():
            log(f"mutate: {pending.qsize()} mutant(s) not started before --start-deadline (unfinished; rerun to "
                f"resume)")
    finally:
        # A signal ends this thread's wait early; each slot's thread is then restoring its mutated file after its
        # target was killed (stop_all), so removing the copies under it could leave a file and the copy behind.
        for thread in threads:
            thread.join(timeout=30)
        if not config.keep_workspace:
            for workspace in workspaces:
                workspace.remove()
    return records


def _sglang_backends(report: Path) -> set[str]:
    return {b for b in read_report(report).get("backends", []) if str(b).startswith("sglang")}
