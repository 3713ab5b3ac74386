"""``hicache-fuzz bench``: how fast the harness checks transfers, and how fast the checked kernels move bytes.

CPU (``--cpu``): the per-case pipeline on small cases on one core with its stage split, verified bytes/s on
large cases, and time-to-kill of every bug-zoo mutant (through ``selftest``). GPU (``--gpu``): cases/s of the
pipeline against the sglang JIT backends and kernel bandwidth next to the pinned copy ceiling. The
measurements are :mod:`hicache_fuzz.harness.commands.bench_measure` and
:mod:`hicache_fuzz.harness.commands.bench_bandwidth` (imported when the command runs); this
module is the command: options, the report, the targets and the tables. ``--campaign-report`` adds the
compile share of a GPU campaign (a ``fuzz --json`` report) to the targets.
"""

from __future__ import annotations

import argparse
import platform as host_platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.commands.arg_types import finite_non_negative_float, finite_positive_float, positive_int
from hicache_fuzz.harness.commands.common import add_common, write_json_report
from hicache_fuzz.harness.commands.output import write_text_report
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_UNAVAILABLE, UsageError, final_exit_code

if TYPE_CHECKING:
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.kernels.registry import Registry

BANDWIDTH_LAYERS = (8, 64)
TARGET_SMALL_CPU_CASES_PER_S = 1000.0
TARGET_SMALL_GPU_CASES_PER_S = 2000.0
TARGET_SHARE_OF_BARE_LOOP = 0.25  # of harness/pipeline/bare_loop.py's rate, measured in the same run
TARGET_MEDIAN_KILL_SECONDS = 10.0
TARGET_COMPILE_SHARE = 0.20
# Keys of a `fuzz --isolate yes --json` report that say how much of a GPU campaign went to JIT compiles.
CAMPAIGN_COMPILE_KEYS = ("wall_seconds", "seconds", "compile_seconds", "worker_startup_seconds", "worker_restarts",
                         "compile_share_of_wall")


def campaign_compile_share(path: Path) -> dict[str, Any]:
    """The compile share of a GPU campaign, from its report (``fuzz --json``; --campaign-report)."""
    from hicache_fuzz.harness.model.json_input import MAX_REPORT_FILE_BYTES, InputError, read_json_file

    try:
        data = read_json_file(path, MAX_REPORT_FILE_BYTES)
    except InputError as exc:
        raise UsageError(f"--campaign-report {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--campaign-report {path}: not a campaign report (a JSON object)")
    return {"source": str(path), **{k: data[k] for k in CAMPAIGN_COMPILE_KEYS if k in data}}

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file", "markdown": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--cpu", action="store_true", help="CPU pipeline throughput and zoo time-to-kill")
    parser.add_argument("--gpu", action="store_true", help="GPU pipeline throughput and kernel bandwidth")
    parser.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables as Markdown")
    parser.add_argument("--seconds", type=finite_positive_float, default=10.0,
                        help="seconds per throughput measurement (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=5, help="case seed (default: %(default)s)")
    parser.add_argument("--zoo-seconds", type=finite_non_negative_float, default=60.0,
                        help="time-to-kill budget per mutant; 0 skips the zoo (default: %(default)s)")
    parser.add_argument("--zoo-max-cases", type=positive_int, default=20000, help="case budget per mutant")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed runs per bandwidth point")
    parser.add_argument("--bandwidth-layers", default=",".join(map(str, BANDWIDTH_LAYERS)),
                        help="layer counts of the bandwidth cases (default: %(default)s)")
    parser.add_argument("--campaign-report", type=Path, metavar="PATH",
                        help="a GPU campaign's report (fuzz --json): its compile share joins the targets")


def run(args: argparse.Namespace) -> int:
    import torch

    from hicache_fuzz.harness.commands.bench_measure import LARGE_SPACE, SMALL_SPACE
    from hicache_fuzz.harness.pipeline.setup import machine_for, registry_for

    machine = machine_for(args.platform)
    registry = registry_for(args.backend_plugin)
    do_cpu = args.cpu or not args.gpu
    do_gpu = args.gpu or (not args.cpu and machine.device.type != "cpu")
    report: dict[str, Any] = {
        "command": "hicache-fuzz " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "",
        "machine": {"platform": machine.description, "python": sys.version.split()[0], "torch": torch.__version__,
                    "cpu": host_platform.processor() or host_platform.machine(),
                    "logical_cpus": _cpu_count()},
        "seed": args.seed,
        "spaces": {"small": _space_dict(SMALL_SPACE), "large": _space_dict(LARGE_SPACE)},
        "targets": [],
    }
    print(f"hicache-fuzz bench: {machine.description}; seed {args.seed}", flush=True)
    # Read, not measured: a GPU campaign's report, when one is given.
    report["gpu_campaign_compile_share"] = (campaign_compile_share(args.campaign_report)
                                            if args.campaign_report else None)
    if do_cpu:
        report["cpu"] = _run_cpu(args, machine, registry)
        _checkpoint(report, args)
    if do_gpu:
        report["gpu"] = {}
        _run_gpu(args, machine, registry, report)
    report["targets"] = _targets(report)
    print_tables(report)
    written = write_json_report(report, args.json)  # elsewhere if it must (the message says where)
    written = write_text_report(args.markdown, markdown_tables(report), "bench tables", ".md") and written
    gpu = report.get("gpu", {})
    if args.gpu and not gpu.get("available"):
        print(f"hicache-fuzz bench: --gpu unavailable: {gpu.get('reason', 'unknown')}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return final_exit_code(EXIT_CLEAN, written)


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 0


def _space_dict(space: CaseSpace) -> dict[str, Any]:
    return {"byte_budget": space.byte_budget, "layer_counts": list(space.layer_counts),
            "page_counts": list(space.page_counts), "max_pages": space.max_pages, "invalid_rate": space.invalid_rate}


def _run_cpu(args: argparse.Namespace, machine: Machine, registry: Registry) -> dict[str, Any]:
    import torch

    from hicache_fuzz.harness.commands.bench_measure import (
        LARGE_SPACE,
        SMALL_SPACE,
        measure_pipeline,
        measure_zoo,
        torch_threads,
    )
    from hicache_fuzz.harness.model.platform import Machine

    cpu = Machine(machine.platform if machine.device.type == "cpu" else _cpu_platform(), torch.device("cpu"),
                  "CPU")
    reference = registry.get("reference")
    out: dict[str, Any] = {}
    with torch_threads(1):
        for name, space in (("small", SMALL_SPACE), ("large", LARGE_SPACE)):
            print(f"cpu {name}: {args.seconds:g} s on one thread ...", flush=True)
            out[name] = asdict(measure_pipeline(name, reference, space, cpu, args.seconds, args.seed))
        if args.zoo_seconds > 0:
            print(f"zoo time-to-kill: up to {args.zoo_seconds:g} s per mutant ...", flush=True)
            out["zoo"] = measure_zoo("cpu", args.backend_plugin, args.zoo_seconds, args.zoo_max_cases, args.seed)
    return out


def _cpu_platform() -> Any:
    from hicache_fuzz.oracles.contract import Platform

    return Platform("cpu")


def _checkpoint(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Write what is measured so far, so a run cut short by a device time limit still leaves its numbers."""
    report["targets"] = _targets(report)
    write_json_report(report, args.json)


def _run_gpu(args: argparse.Namespace, machine: Machine, registry: Registry, report: dict[str, Any]) -> None:
    from hicache_fuzz.harness.commands.bench_bandwidth import (
        BANDWIDTH_BACKENDS,
        measure_bandwidth,
        measure_copy_ceiling,
    )
    from hicache_fuzz.harness.commands.bench_measure import (
        GPU_PIPELINE_BACKENDS,
        GPU_SMALL_SPACE,
        SMALL_SPACE,
        measure_pipeline,
    )

    out: dict[str, Any] = report["gpu"]
    if machine.device.type == "cpu":
        out.update(available=False, reason=f"no GPU: {machine.description}")
        return
    try:
        from hicache_fuzz.kernels.sglang_backends import warm_up_backends
    except ImportError as exc:
        out.update(available=False, reason=f"sglang backends failed to import: {exc}")
        return
    pipeline_backends = [registry.get(n) for n in GPU_PIPELINE_BACKENDS
                         if n in registry.backends and registry.get(n).probe(machine.platform).available]
    bandwidth_backends = [registry.get(n) for n in BANDWIDTH_BACKENDS
                          if n in registry.backends and registry.get(n).probe(machine.platform).available]
    if not pipeline_backends and not bandwidth_backends:
        out.update(available=False, reason="no sglang backend is available")
        return
    out["available"] = True
    print("gpu: compiling the backends' menus ...", flush=True)
    warm = list({b.name: b for b in pipeline_backends + bandwidth_backends}.values())
    out["compile_seconds"] = round(warm_up_backends(warm, machine.platform, SMALL_SPACE), 2)
    _checkpoint(report, args)
    # The kernel-speed baseline, measured in this same run, so the pipeline's share of it is honest.
    print(f"gpu: bare loop for {args.seconds:g} s ...", flush=True)
    try:
        from hicache_fuzz.harness.pipeline.bare_loop import measure_bare_loop

        out["bare_loop"] = measure_bare_loop(args.seconds, machine.device, seed=args.seed)
    except Exception as exc:
        out["bare_loop"] = {"error": f"{type(exc).__name__}: {exc}"}
    _checkpoint(report, args)
    pipelines: list[dict[str, Any]] = []
    out["pipelines"] = pipelines
    for backend in pipeline_backends:
        print(f"gpu small: {backend.name} for {args.seconds:g} s ...", flush=True)
        try:
            pipelines.append(asdict(measure_pipeline("small", backend, GPU_SMALL_SPACE, machine, args.seconds,
                                                     args.seed, skip_empty=True)))
        except Exception as exc:
            pipelines.append({"name": "small", "backend": backend.name, "errors": [f"{type(exc).__name__}: {exc}"]})
        _checkpoint(report, args)
    print("gpu: kernel bandwidth ...", flush=True)
    layer_counts = tuple(int(x) for x in args.bandwidth_layers.split(",") if x)
    sizes: set[int] = set()
    ceilings: list[dict[str, Any]] = []
    out["copy_ceiling"] = ceilings
    for layers in layer_counts:
        rows, notes = measure_bandwidth(machine, registry, args.repeats, args.seed, (layers,),
                                        tuple(b.name for b in bandwidth_backends))
        out.setdefault("bandwidth", []).extend(asdict(r) for r in rows)
        out.setdefault("bandwidth_notes", []).extend(notes)
        for size in sorted({r.moved_bytes for r in rows} - sizes):
            sizes.add(size)
            try:
                ceilings.append(measure_copy_ceiling(machine, size, args.repeats))
            except Exception as exc:
                out["bandwidth_notes"].append(f"copy ceiling of {size} bytes: {type(exc).__name__}: {exc}")
        _checkpoint(report, args)


def _targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    cpu = report.get("cpu", {})
    if "small" in cpu:
        value = cpu["small"]["cases_per_cpu_second"]
        targets.append({"target": "CPU small cases/s on one core (per CPU second)",
                        "goal": TARGET_SMALL_CPU_CASES_PER_S, "measured": round(value, 1),
                        "met": value >= TARGET_SMALL_CPU_CASES_PER_S})
    if cpu.get("zoo", {}).get("median_seconds_to_kill") is not None:
        value = cpu["zoo"]["median_seconds_to_kill"]
        targets.append({"target": "median zoo time-to-kill on CPU (s)", "goal": TARGET_MEDIAN_KILL_SECONDS,
                        "measured": value, "met": value < TARGET_MEDIAN_KILL_SECONDS})
    gpu = report.get("gpu", {})
    for pipeline in gpu.get("pipelines", []):
        value = pipeline.get("cases_per_second", 0.0)
        targets.append({"target": f"GPU small cases/s ({pipeline['backend']})", "goal": TARGET_SMALL_GPU_CASES_PER_S,
                        "measured": round(value, 1), "met": value >= TARGET_SMALL_GPU_CASES_PER_S})
        bare = gpu.get("bare_loop", {}).get("cases_per_second")
        if bare:
            targets.append({"target": f"GPU small pipeline / bare loop, same run ({pipeline['backend']})",
                            "goal": TARGET_SHARE_OF_BARE_LOOP, "measured": round(value / bare, 4),
                            "met": value / bare >= TARGET_SHARE_OF_BARE_LOOP})
    share = (report.get("gpu_campaign_compile_share") or {}).get("compile_share_of_wall")
    if share is not None:
        targets.append({"target": "compile share of the 5-minute GPU campaign (read from its report)",
                        "goal": TARGET_COMPILE_SHARE,
                        "measured": share, "met": share < TARGET_COMPILE_SHARE})
    return targets


# ---- output -----------------------------------------------------------------------------------------------

def _pipeline_lines(rows: list[dict[str, Any]]) -> list[list[str]]:
    from hicache_fuzz.harness.commands.bench_measure import STAGES

    lines = [["where", "backend", "space", "cases", "cases/s (wall)", "distinct/s", "cases/CPU-s", "verified MB/s",
              *[f"{s} µs" for s in STAGES]]]
    for r in rows:
        if "cases" not in r:
            continue
        stages = r["stage_us_per_case"]
        lines.append([r["device"], r["backend"], r["name"], str(r["cases"]), f"{r['cases_per_second']:,.0f}",
                      f"{r.get('distinct_cases_per_second', 0.0):,.0f}", f"{r['cases_per_cpu_second']:,.0f}",
                      f"{r['verified_bytes_per_second'] / 1e6:,.1f}",
                      *[f"{stages.get(s, 0.0):,.0f}" for s in STAGES]])
    return lines


def _tables(report: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    tables: list[tuple[str, list[list[str]]]] = []
    cpu, gpu = report.get("cpu", {}), report.get("gpu", {})
    pipelines = [cpu[k] for k in ("small", "large") if k in cpu] + list(gpu.get("pipelines", []))
    if pipelines:
        tables.append(("Pipeline throughput (per-stage µs are per case, averaged over all cases)",
                       _pipeline_lines(pipelines)))
    zoo = cpu.get("zoo")
    if zoo:
        lines = [["mutant", "class", "killed", "cases", "seconds", "outcome"]]
        lines += [[r["mutant"], r["bug_class"], "yes" if r["killed"] else "NO", str(r["cases"]),
                   f"{r['seconds']:.2f}", r["outcome"]] for r in zoo["rows"]]
        tables.append((f"Zoo time-to-kill (CPU; killed {zoo['killed']}/{zoo['mutants']}, median "
                       f"{zoo.get('median_seconds_to_kill', '-')} s, {zoo.get('median_cases_to_kill', '-')} cases)",
                       lines))
    if gpu.get("bandwidth"):
        lines = [["backend", "path", "geometry", "layers", "direction", "layout", "MiB moved", "median µs", "GB/s",
                  "checked"]]
        lines += [[r["backend"], r["path"], r["geometry"], str(r["layers"]), r["direction"], r["layout"],
                   f"{r['moved_bytes'] / 2**20:,.0f}", f"{r['median_us']:,.0f}", f"{r['gb_per_s']:,.1f}",
                   r["checked"]] for r in gpu["bandwidth"]]
        tables.append(("Kernel bandwidth (all layers, 64 pages x 64 tokens, random page order)", lines))
    if gpu.get("copy_ceiling"):
        lines = [["MiB", "H2D GB/s", "D2H GB/s", "checked"]]
        lines += [[f"{c['bytes'] / 2**20:,.0f}", f"{c['h2d']['gb_per_s']:,.1f}", f"{c['d2h']['gb_per_s']:,.1f}",
                   f"{c['h2d']['checked']}/{c['d2h']['checked']}"] for c in gpu["copy_ceiling"]]
        tables.append(("Pinned copy_ ceiling on the same machine", lines))
    if report.get("targets"):
        lines = [["target", "goal", "measured", "met"]]
        lines += [[t["target"], f"{t['goal']:g}", f"{t['measured']:g}", "yes" if t["met"] else "NO"]
                  for t in report["targets"]]
        tables.append(("Targets", lines))
    return tables


def print_tables(report: dict[str, Any]) -> None:
    for title, lines in _tables(report):
        widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
        print(f"\n{title}")
        for line in lines:
            print("  " + "  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))


def markdown_tables(report: dict[str, Any]) -> str:
    parts = [f"Machine: {report['machine']['platform']}; Python {report['machine']['python']}, "
             f"torch {report['machine']['torch']}. Command: `{report.get('command') or 'hicache-fuzz bench'}`.\n"]
    for title, lines in _tables(report):
        parts.append(f"### {title}\n")
        parts.append("| " + " | ".join(lines[0]) + " |")
        parts.append("|" + "---|" * len(lines[0]))
        parts += ["| " + " | ".join(line) + " |" for line in lines[1:]]
        parts.append("")
    return "\n".join(parts) + "\n"
