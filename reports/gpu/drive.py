"""GPU driver for the sglang backends: warm-up compile, hand-picked smoke cases, then a timed campaign.

Usage (on the GPU machine, after `source .gpu-bundle/device-setup.sh`):
    python reports/gpu/drive.py --out $OUT/run --smoke --seconds 120 [--backend NAME ...] [--seed N]

Everything runs through WorkerExecutor (one persistent worker; crashes/hangs become results). Writes
<out>/report.json (campaign report + smoke results + compile/run split) and <out>/summary.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)
from hicache_fuzz.harness.campaign.generate import CaseSpace
from hicache_fuzz.harness.model.platform import detect
from hicache_fuzz.harness.pipeline.worker import WorkerExecutor
from hicache_fuzz.kernels.registry import load_registry

SGLANG = ["sglang-jit", "sglang-jit-register", "sglang-jit-tma", "sglang-staged", "sglang-page-unified",
          "sglang-pool", "sglang-aot"]


def mk(backend: str, *, direction: Direction, scope: Scope, layout: HostLayout, attention: Attention = Attention.MHA,
       dtype: KVDtype = KVDtype.BF16, row: int = 256, heads: int = 2, ps: int = 16, pages: int = 3, layers: int = 2,
       hidx: IndexSpec = IndexSpec(), didx: IndexSpec = IndexSpec(), groups: int = 1, tuning: dict | None = None,
       pools: tuple[PoolSpec, ...] | None = None, reverse: bool = True, allocator=HostAllocator.PIN_MEMORY,
       extra_host_pages: int = 1, seed: int = 1) -> Case:
    elems = row // dtype.itemsize
    if pools is None:
        if attention is Attention.MLA:
            pools = (PoolSpec("kv", attention, dtype, 1, elems),)
        else:
            pools = (PoolSpec("kv", attention, dtype, heads, elems // heads, head_groups=groups),)
    host_pages = pages + extra_host_pages
    dev_pages = pages + 2
    hp = list(range(host_pages))[-pages:]
    dp = list(range(1, pages + 1))
    if reverse:
        hp = hp[::-1]
    h = tuple(p * ps + t for p in hp for t in range(ps))
    d = tuple(p * ps + t for p in dp for t in range(ps))
    return Case(direction=direction, scope=scope, layout=layout, pools=pools, layers=layers, page_size=ps,
                device_rows=dev_pages * ps, host_slots=host_pages * ps, layer=layers - 1, host_indices=h,
                device_indices=d, host_index=hidx, device_index=didx, host_allocator=allocator, backend=backend,
                tuning=make_tuning(tuning or {}), seed=seed)


W, L = Direction.WRITE_BACK, Direction.LOAD_BACK
ONE, ALL = Scope.ONE_LAYER, Scope.ALL_LAYERS
LF, PF, PU = HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_UNIFIED
CPU64 = IndexSpec(IndexDtype.INT64, IndexDevice.CPU)
DEV32 = IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE)


def smoke_cases() -> list[Case]:
    cases: list[Case] = []
    for b in ("sglang-jit", "sglang-jit-register", "sglang-jit-tma"):
        for lay in (LF, PF):
            cases += [
                mk(b, direction=L, scope=ONE, layout=lay, row=256, ps=16),
                mk(b, direction=W, scope=ALL, layout=lay, row=512, ps=1, pages=65),
                mk(b, direction=L, scope=ALL, layout=lay, attention=Attention.MLA, dtype=KVDtype.FP8, row=576, ps=32),
                mk(b, direction=W, scope=ONE, layout=lay, attention=Attention.MLA, row=1152, ps=16,
                   hidx=DEV32, didx=DEV32),
            ]
        cases.append(mk(b, direction=L, scope=ONE, layout=LF, row=256, hidx=CPU64))  # rejected (CPU indices)
        cases.append(mk(b, direction=L, scope=ONE, layout=PF, row=96, ps=4))  # no JIT kernel takes 96 B
        cases.append(mk(b, direction=W, scope=ALL, layout=PF, row=1024, ps=16, allocator=HostAllocator.HOST_REGISTER))
    cases.append(mk("sglang-jit-tma", direction=L, scope=ONE, layout=PF, row=1024, ps=16,
                    tuning={"tma_page_size": False}))
    for ps, pages in ((1, 64), (1, 65), (16, 1), (16, 65), (4, 129)):
        cases.append(mk("sglang-staged", direction=W, scope=ALL, layout=PF, row=256, ps=ps, pages=pages,
                        hidx=CPU64))
    cases += [
        mk("sglang-staged", direction=W, scope=ALL, layout=PF, attention=Attention.MLA, dtype=KVDtype.FP8, row=576,
           ps=16, pages=5, hidx=CPU64, tuning={"staging_pages": 2}),
        mk("sglang-staged", direction=W, scope=ALL, layout=PF, row=128, ps=16, pages=3),  # CUDA host idx: reject
        mk("sglang-staged", direction=W, scope=ALL, layout=PF, row=256, ps=16, pages=3, hidx=CPU64,
           allocator=HostAllocator.PAGEABLE),
        mk("sglang-staged", direction=W, scope=ALL, layout=PF, row=48, ps=2, pages=3, hidx=CPU64),  # 48 % 16 == 0
    ]
    for att, row in ((Attention.MHA, 256), (Attention.MLA, 576)):
        dt = KVDtype.FP8 if row == 576 else KVDtype.BF16
        cases += [
            mk("sglang-page-unified", direction=L, scope=ONE, layout=PU, attention=att, dtype=dt, row=row, ps=16,
               groups=2 if att is Attention.MHA else 1),
            mk("sglang-page-unified", direction=W, scope=ALL, layout=PU, attention=att, dtype=dt, row=row, ps=16,
               pages=5, hidx=CPU64, tuning={"staging_pages": 2}, groups=2 if att is Attention.MHA else 1),
        ]
    for lay in (LF, PF):
        for att, row, dt in ((Attention.MHA, 256, KVDtype.BF16), (Attention.MLA, 576, KVDtype.FP8),
                             (Attention.MLA, 1152, KVDtype.BF16)):
            for direction, scope in ((W, ALL), (L, ONE), (L, ALL)):
                cases.append(mk("sglang-pool", direction=direction, scope=scope, layout=lay, attention=att,
                                dtype=dt, row=row, ps=16 if row != 576 else 32, pages=3, hidx=CPU64, reverse=False))
    group = (PoolSpec("kv", Attention.MHA, KVDtype.BF16, 2, 64),
             PoolSpec("side1", Attention.MLA, KVDtype.BF16, 1, 576),
             PoolSpec("side2", Attention.MHA, KVDtype.BF16, 1, 128, write_back_jit=False))
    for controller in ("hybrid", "base"):
        cases.append(mk("sglang-pool", direction=W, scope=ALL, layout=PF, pools=group[:2], ps=16, pages=3,
                        hidx=CPU64, reverse=False, tuning={"controller": controller}))
        cases.append(mk("sglang-pool", direction=W, scope=ALL, layout=PF, pools=group, ps=16, pages=3, hidx=CPU64,
                        reverse=False, tuning={"controller": controller}))
    cases.append(mk("sglang-aot", direction=L, scope=ONE, layout=LF, row=256, ps=16))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", action="append", default=[])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-warm-up", action="store_true")
    parser.add_argument("--case-timeout", type=float, default=90)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wall0 = time.perf_counter()
    machine = detect()
    registry = load_registry()
    names = args.backend or SGLANG
    probes = {n: registry.get(n).probe(machine.platform) for n in names}
    usable = [n for n in names if probes[n].available]
    executor = WorkerExecutor(usable, [], machine.platform.kind, timeout_s=args.case_timeout,
                              journal_dir=out / "journal", warm_up=not args.no_warm_up, startup_timeout_s=400)
    t0 = time.perf_counter()
    executor._ensure_started()
    startup = time.perf_counter() - t0
    warm_up_s = float(executor.hello.get("warm_up_s", 0.0))
    data: dict = {"machine": machine.description, "probes": {n: [p.available, p.reason] for n, p in probes.items()},
                  "worker_startup_s": round(startup, 2), "warm_up_compile_s": round(warm_up_s, 2)}
    print(json.dumps(data, indent=1), flush=True)
    smoke = []
    if args.smoke:
        for case in smoke_cases():
            if case.backend not in usable:
                continue
            result = executor.run(case)
            smoke.append({"case_id": case.case_id, **result.to_dict()})
            print(f"smoke {case.backend:22s} {case.direction.value:10s} {case.scope.value:10s} "
                  f"{case.layout.value:12s} {case.pools[0].attention.value}/{case.pools[0].row_bytes(case.pools[0].components[0])}B "
                  f"ps={case.page_size} n={case.n} -> {result.outcome.value} path={result.path or '-'} "
                  f"exp={result.expected_path} {result.seconds:.2f}s {result.summary[:160]!r} {result.error[:200]!r}",
                  flush=True)
            if result.outcome.is_failure:
                (out / "smoke-failures").mkdir(exist_ok=True)
                (out / "smoke-failures" / f"{case.case_id}.json").write_text(
                    json.dumps({"case": case.to_dict(), "result": result.to_dict()}, indent=1))
    data["smoke"] = smoke
    compile_before_campaign = executor.compile_seconds
    report = None
    if args.seconds > 0:
        config = CampaignConfig(usable, args.seed, max_seconds=args.seconds, corpus_dir=out / "corpus",
                                space=CaseSpace())
        report = run_campaign(config, [registry.get(n) for n in usable], machine.platform, executor)
        data["campaign"] = report.to_dict()
        data["campaign"].pop("case_ids", None)
    executor.close()
    wall = time.perf_counter() - wall0
    data["compile_s_total"] = round(executor.compile_seconds, 2)
    data["compile_s_in_campaign"] = round(executor.compile_seconds - compile_before_campaign, 2)
    data["worker_restarts"] = executor.restarts
    data["worker_startup_s_total"] = round(executor.startup_seconds, 2)
    data["wall_s"] = round(wall, 2)
    data["compile_share_of_wall"] = round(executor.compile_seconds / wall, 3) if wall else 0
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    lines = [f"# {machine.description}", "", f"wall {wall:.1f}s, worker startup {executor.startup_seconds:.1f}s, "
             f"compile {executor.compile_seconds:.1f}s (warm-up {warm_up_s:.1f}s), restarts {executor.restarts}", ""]
    if report is not None:
        lines.append(f"campaign: {report.cases} cases in {report.seconds:.1f}s = {report.cases_per_second:.2f}/s")
        per = defaultdict(Counter)
        for b, c in report.outcomes.items():
            per[b].update(c)
        for b in sorted(per):
            lines.append(f"- {b}: {dict(per[b])} paths {report.paths.get(b, {})}")
        for f in report.failures:
            lines.append(f"  * FAIL {f.backend} {f.outcome} x{f.count}: {f.summary}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
