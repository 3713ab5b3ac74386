"""The options of ``hicache-fuzz fuzz``, all in one place: their definitions (``add_arguments``), their checks, and
what they resolve to (``campaign_options``, ``engine_options``). Imports nothing heavy at module level, so that
``fuzz --help`` stays fast and imports no torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from hicache_fuzz.harness.campaign.parallel import AUTO_WORKERS_PER_GPU, WORKERS_PER_GPU_ENV
from hicache_fuzz.harness.commands.arg_types import finite_positive_float, non_negative_int, positive_int
from hicache_fuzz.harness.commands.common import add_common, add_isolation
from hicache_fuzz.harness.engine.defaults import (
    AUTO_FEED_PROCESSES_TEXT,
    DEFAULT_MIX_TEXT,
    DEFAULT_SCALE_SHARE,
    MAX_FEED_PROCESSES,
)
from hicache_fuzz.harness.generation.space_file import add_space_arguments, space_from_args
from hicache_fuzz.harness.model.exit_codes import UsageError

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.engine.feed import EngineOptions
    from hicache_fuzz.harness.model.platform import Machine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of `hicache-fuzz fuzz`."""
    add_common(parser)
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="backend to fuzz (repeatable); default: the best backends present")
    parser.add_argument("--seed", type=int, help="campaign seed (default: random; always printed)")
    parser.add_argument("--runs", type=positive_int, help="stop after this many cases")
    parser.add_argument("--max-total-time", type=finite_positive_float, help="stop after this many seconds")
    parser.add_argument("--corpus", default="fuzz-out/corpus", help="failures are written here (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="write the campaign report as JSON")
    parser.add_argument("--shard", default="0/1", metavar="K/N", help="run shard K of N of the seed's case space")
    parser.add_argument("--start-index", type=non_negative_int, default=0,
                        help="first case index (resume a campaign)")
    parser.add_argument("--byte-budget", type=positive_int, help="largest case in bytes (all storages)")
    add_space_arguments(parser)
    add_isolation(parser)
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failure")
    parser.add_argument("--stop-on-new-failure", action="store_true",
                        help="stop at the first failure that no --known entry accounts for (known failures met "
                             "on the way are counted and the campaign goes on)")
    parser.add_argument("--known", action="append", default=[], type=Path, metavar="PATH",
                        help="corpus files or folders whose expected failures (\"expect\": \"fail\") are known: "
                             "failures with their signatures are counted and marked known, and only new ones "
                             "make the exit status 1 (repeatable; e.g. corpus/sglang)")
    parser.add_argument("--baseline", metavar="PATH",
                        help="a second sglang (a folder holding the sglang package, or the Python of another "
                             "environment with sglang installed): every failure is replayed there; one it shares "
                             "is pre-existing, one it does not is new whatever --known says (docs/gate.md)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")
    parser.add_argument("--workers", default="1", metavar="N|auto",
                        help="worker processes, spread round-robin over the GPUs (CUDA_VISIBLE_DEVICES / "
                             "HIP_VISIBLE_DEVICES per worker); auto: GPUs x "
                             f"${WORKERS_PER_GPU_ENV} (default {AUTO_WORKERS_PER_GPU}), or the CPU count "
                             "on the CPU (default: 1, in this process)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="with --workers: skip compiling the JIT modules before the workers start")
    parser.add_argument("--record-case-ids", action="store_true",
                        help="list every case id in the report (to compare case sets)")
    parser.add_argument("--minimize", action="store_true",
                        help="minimize the first case of each new failure signature before saving it")
    # the engine (docs/engine.md)
    parser.add_argument("--batch", type=int, metavar="N",
                        help="cases per worker round trip (default: 64 with a worker, 1 in process)")
    parser.add_argument("--mix", default="auto", metavar="CLASS=W,...",
                        help="case mix, e.g. transfer=0.6,reject=0.4 (classes: transfer, reject, empty, undefined, "
                             f"unsupported); 'none' for none; default auto: {DEFAULT_MIX_TEXT} on a GPU, none on "
                             "the CPU")
    parser.add_argument("--scale", default="auto", choices=["auto", "off", "production", "simulated"],
                        help="scale tier (auto: production sizes on a GPU, off on the CPU)")
    parser.add_argument("--variants", type=int, metavar="N",
                        help="index variants run after each generated case, on its storages, for every backend "
                             "(default: 7 on a GPU, more for a backend that asks for it, none does today; 0 on "
                             "the CPU)")
    parser.add_argument("--backend-every", default="auto", metavar="auto|none|NAME=K,...",
                        help="which campaign indices each backend runs: auto (on a GPU a backend whose cases cost "
                             "several times a kernel case runs every K-th index, K its measured relative cost: "
                             "sglang-pool 6; every index on the CPU), none (every backend every index), or "
                             "NAME=K,... for those backends")
    parser.add_argument("--batches-ahead", type=int, default=3, metavar="N",
                        help="batches a worker pool is given before the oldest is recorded (default: %(default)s; "
                             "0: one batch at a time, every worker waits for the batch's last group)")
    parser.add_argument("--feed", default="auto", choices=["auto", "process", "thread"],
                        help="where cases are generated: auto (a process of its own for a worker pool on a GPU, "
                             "a thread of the campaign otherwise), process or thread; the cases are the same")
    parser.add_argument("--feed-processes", type=int, metavar="N",
                        help="processes generating cases for the process feed, each every N-th index (default: "
                             f"{AUTO_FEED_PROCESSES_TEXT}; 1 to {MAX_FEED_PROCESSES}); the cases are the same")
    parser.add_argument("--scale-share", type=float, default=DEFAULT_SCALE_SHARE, metavar="F",
                        help="share of the campaign's time for the scale tier (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true",
                        help="generate and predict the campaign's cases for --platform without running any (any "
                             "machine, no sglang or GPU needed; time budgets are modelled; docs/generation.md)")
    parser.add_argument("--save-cases", metavar="DIR",
                        help="with --dry-run: write the cases predicted to run (matching every --where) as case "
                             "files into DIR, for `hicache-fuzz replay` on a GPU")
    parser.add_argument("--where", action="append", metavar="LABEL=VALUE",
                        help="with --save-cases: keep cases whose coverage label LABEL (or `backend`) is VALUE, "
                             "e.g. pool_class=DSAIndexerPoolHost; repeatable (all must match)")


def campaign_options(args: argparse.Namespace, seed: int, machine: Machine) -> CampaignOptions:
    """The campaign the parsed fuzz arguments ask for (budgets checked, shard parsed, known failures that
    apply on `machine` read)."""
    from hicache_fuzz.harness.campaign.options import CampaignOptions, load_known_failures, parse_shard
    from hicache_fuzz.harness.findings.known import detect_environment

    check_budget(args)
    shard = parse_shard(args.shard)
    try:
        engine = engine_options(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return CampaignOptions(seed, args.runs, args.max_total_time, Path(args.corpus), shard, args.start_index,
                           args.byte_budget, args.stop_on_failure,
                           load_known_failures(args.known, detect_environment(machine)),
                           minimize=args.minimize, record_case_ids=args.record_case_ids, engine=engine,
                           space_overrides=space_from_args(args),
                           stop_on_new_failure=getattr(args, "stop_on_new_failure", False))


def check_budget(args: argparse.Namespace) -> None:
    if args.runs is None and args.max_total_time is None:
        raise UsageError("give a budget: --runs N and/or --max-total-time SECONDS")


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """EngineOptions from parsed arguments; ValueError (a usage error, exit 2) names a bad value."""
    from hicache_fuzz.harness.engine.feed import EngineOptions
    from hicache_fuzz.harness.engine.mix import Mix

    mix = getattr(args, "mix", "auto")
    if mix not in ("auto", "none"):
        Mix.parse(mix)  # raises ValueError naming the problem
    batch = getattr(args, "batch", None)
    if batch is not None and batch < 1:
        raise ValueError(f"--batch {batch}: need at least 1")
    share = getattr(args, "scale_share", DEFAULT_SCALE_SHARE)
    if not 0.0 <= share < 1.0:
        raise ValueError(f"--scale-share {share}: need 0 <= F < 1")
    variants = getattr(args, "variants", None)
    if variants is not None and variants < 0:
        raise ValueError(f"--variants {variants}: need 0 or more")
    ahead = getattr(args, "batches_ahead", 3)
    if not 0 <= ahead <= 4:
        raise ValueError(f"--batches-ahead {ahead}: need 0 to 4")
    feed_processes = getattr(args, "feed_processes", None)
    if feed_processes is not None and not 1 <= feed_processes <= MAX_FEED_PROCESSES:
        raise ValueError(f"--feed-processes {feed_processes}: need 1 to {MAX_FEED_PROCESSES}")
    every = getattr(args, "backend_every", "auto")
    if every not in ("auto", "none"):
        from hicache_fuzz.harness.engine.feed import parse_backend_every
        from hicache_fuzz.harness.pipeline.setup import registry_for

        known = registry_for(list(getattr(args, "backend_plugin", []) or [])).names()
        unknown = sorted(set(parse_backend_every(every)) - set(known))  # parse: ValueError naming the problem
        if unknown:  # a misspelt name would otherwise be ignored: that backend would run every index
            raise ValueError(f"--backend-every {every!r}: unknown backend(s) {', '.join(unknown)}; known backends: "
                             f"{', '.join(known)}")
    return EngineOptions(batch=batch, mix=mix, scale=getattr(args, "scale", "auto"), scale_share=share,
                         variants=variants, backend_every=every,
                         batches_ahead=ahead, feed=getattr(args, "feed", "auto"), feed_processes=feed_processes)
