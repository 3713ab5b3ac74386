"""Run every AOT entry point the harness models once, through the normal per-case pipeline (oracle, byte-exact
whole-storage compare, classification): ``sglang-aot`` for each op (per-layer load-back and all-layer
write-back; MHA and MLA; layer_first, page_first and, for MHA, page_head; page sizes 1 and 16), and
``sglang-pool`` for each AOT fallback its real host pools take (recorded path ``aot:<op>``).

    hicache-fuzz aot-smoke --json aot-smoke.json

Exit 0 when every case passed, 1 when one failed (the table shows it), 3 when the ops are not available here (or
the JSON had to be written elsewhere: exit_codes.final_exit_code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
)

PAGE_SIZES = (1, 16)
LAYERS = 2


def _geometry(page_size: int) -> dict[str, Any]:
    """Two pages moved between aligned, non-overlapping host and device pages (production-shaped)."""
    host_pages, device_pages = (1, 3), (2, 1)
    return {
        "layers": LAYERS,
        "page_size": page_size,
        "device_rows": 4 * page_size,
        "host_slots": 4 * page_size,
        "host_indices": tuple(p * page_size + t for p in host_pages for t in range(page_size)),
        "device_indices": tuple(p * page_size + t for p in device_pages for t in range(page_size)),
        "layer": LAYERS - 1,
    }


def _direction_scope() -> Iterator[tuple[Direction, Scope]]:
    yield Direction.LOAD_BACK, Scope.ONE_LAYER
    yield Direction.WRITE_BACK, Scope.ALL_LAYERS


def aot_cases() -> list[Case]:
    """One case per (op, page size) of sglang-aot."""
    mha = PoolSpec(attention=Attention.MHA, dtype=KVDtype.BF16, heads=2, head_dim=64)
    mla = PoolSpec(attention=Attention.MLA, dtype=KVDtype.BF16, heads=1, head_dim=288)
    cases = []
    for spec in (mha, mla):
        for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_HEAD):
            if layout is HostLayout.PAGE_HEAD and spec.attention is Attention.MLA:
                continue  # sglang has no page_head layout for MLA
            for direction, scope in _direction_scope():
                for page_size in PAGE_SIZES:
                    cases.append(Case(direction=direction, scope=scope, layout=layout, pools=(spec,),
                                      backend="sglang-aot", seed=page_size, **_geometry(page_size)))
    return cases


def pool_cases(platform: Any) -> list[Case]:
    """Cases whose real host pools take an AOT fallback, one per distinct fallback op (and page size)."""
    from hicache_fuzz.kernels.sglang_pool import expected_run

    # 24-byte rows: the JIT register kernel cannot tile them (pool falls back to the per-token AOT op);
    # write_back_jit=False: a pool without the staged write-back (page_first falls back to the AOT op).
    specs = [
        PoolSpec(attention=Attention.MHA, dtype=KVDtype.BF16, heads=1, head_dim=12),
        PoolSpec(attention=Attention.MLA, dtype=KVDtype.BF16, heads=1, head_dim=12),
        PoolSpec(attention=Attention.MHA, dtype=KVDtype.BF16, heads=2, head_dim=64, write_back_jit=False),
        PoolSpec(attention=Attention.MLA, dtype=KVDtype.BF16, heads=1, head_dim=288, write_back_jit=False),
    ]
    chosen: dict[tuple[str, int, int], Case] = {}
    for spec in specs:
        for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST):
            for direction, scope in _direction_scope():
                for page_size in PAGE_SIZES:
                    case = Case(direction=direction, scope=scope, layout=layout, pools=(spec,),
                                backend="sglang-pool", seed=page_size,
                                host_index=IndexSpec(device=IndexDevice.CPU), **_geometry(page_size))
                    paths, _ = expected_run(case, platform)
                    for path in paths:
                        if path.startswith("aot:"):
                            chosen.setdefault((path, page_size, spec.row_bytes(spec.components[0])), case)
    return list(chosen.values())

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the results here")


def run(args: argparse.Namespace) -> int:
    return smoke(args.json)


def smoke(json_path: str | None) -> int:
    import torch

    from hicache_fuzz.harness.commands.common import write_json_report
    from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE, final_exit_code
    from hicache_fuzz.harness.model.platform import detect
    from hicache_fuzz.harness.pipeline.runner import run_case
    from hicache_fuzz.kernels.sglang_aot import SglangAotBackend
    from hicache_fuzz.kernels.sglang_pool import SglangPoolBackend

    platform = detect().platform
    device = torch.device("cuda")
    report: dict[str, Any] = {"platform": platform.kind, "backends": {}, "results": []}
    status, failed = EXIT_CLEAN, False
    for backend, cases in ((SglangAotBackend(), aot_cases()), (SglangPoolBackend(), pool_cases(platform))):
        availability = backend.probe(platform)
        report["backends"][backend.name] = {"available": availability.available, "reason": availability.reason}
        print(f"{backend.name}: {'available' if availability.available else 'UNAVAILABLE'}: {availability.reason}")
        if not availability.available:
            status = EXIT_UNAVAILABLE
            continue
        for case in cases:
            result = run_case(replace(case, backend=backend.name), backend, platform, device)
            row = result.to_dict()
            row["layout"], row["direction"] = case.layout.value, case.direction.value
            row["attention"], row["page_size"] = case.pools[0].attention.value, case.page_size
            report["results"].append(row)
            failed = failed or result.outcome.is_failure
            print(f"  {result.outcome.value:22} {result.path or result.expected_path:40} {case.layout.value:12} "
                  f"{case.direction.value:10} ps={case.page_size:<3} {result.summary[:100]}")
    written = write_json_report(report, json_path)
    return EXIT_FAILURES if failed else final_exit_code(status, written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
