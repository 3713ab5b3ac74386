"""``hicache-fuzz backends``: every registered backend, whether it can run here, and why not."""

from __future__ import annotations

import argparse

from hicache_fuzz.harness.commands.common import add_common, write_json_report
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, final_exit_code

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.pipeline.setup import machine_for, registry_for
    from hicache_fuzz.kernels.base import Availability

    machine = machine_for(args.platform)
    registry = registry_for(args.backend_plugin)
    rows = []
    for name in registry.names():
        backend = registry.get(name)
        try:
            availability = backend.probe(machine.platform)
        except Exception as exc:  # listed with the reason; commands that need the backend exit 3
            availability = Availability(False, f"its probe raised {type(exc).__name__}: {exc}")
        rows.append({"name": name, "available": availability.available, "reason": availability.reason,
                     "models_bug": backend.models_bug, "description": backend.description})
    print(f"platform: {machine.description}")
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        state = "available  " if row["available"] else "unavailable"
        detail = row["reason"] if not row["models_bug"] else f"zoo mutant: {row['models_bug']}"
        print(f"  {row['name']:<{width}}  {state}  {detail}")
    written = write_json_report({"platform": machine.description, "backends": rows}, args.json)
    return final_exit_code(EXIT_CLEAN, written)
