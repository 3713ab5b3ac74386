"""The engine's command-line options (fuzz --batch/--mix/--scale/--scale-share), kept free of torch imports so
that ``fuzz --help`` stays fast; the options are checked and resolved by harness/engine/feed.py."""

from __future__ import annotations

from typing import Any

from hicache_fuzz.harness.engine.defaults import DEFAULT_MIX_TEXT, DEFAULT_SCALE_SHARE


def add_engine_arguments(parser: Any) -> None:
    """`fuzz` options of the engine (to be wired into the fuzz command's parser)."""
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
    parser.add_argument("--scale-share", type=float, default=DEFAULT_SCALE_SHARE, metavar="F",
                        help="share of the campaign's time for the scale tier (default: %(default)s)")


def engine_options(args: Any) -> Any:
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
                         batches_ahead=ahead, feed=getattr(args, "feed", "auto"))
