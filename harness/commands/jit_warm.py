"""``hicache-fuzz jit-warm``: fill sglang's on-disk JIT cache with every module a campaign's backends can draw.

A campaign compiles its backends' menus at worker start-up and each row-menu growth stage in the background one
stage ahead (campaign/loop.py, MenuGrowth); a campaign that runs faster than the prefetch, or a first campaign on
a fresh cache, compiles inside cases (seconds each, with other workers waiting on the same module).
This command builds the menus and every growth stage up front, in parallel, so a CI job that keeps the cache
directory (SGLANG_JIT_CACHE_DIR, keyed on sglang, torch and the GPU architecture) starts every campaign warm.

Each campaign seed draws its own sample of a backend's rotating rows (kernels/sglang_jit.py, gpu_space):
``--seed N`` builds exactly the modules a campaign with seed N can draw (CI warms the seed it will run);
without ``--seed`` every row of every menu is built, which covers any seed.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hicache_fuzz.harness.commands.arg_types import positive_int
from hicache_fuzz.harness.commands.common import add_common
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN

if TYPE_CHECKING:  # the command's module is imported for --help: no torch there
    from hicache_fuzz.harness.model.space import CaseSpace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="the backends whose modules to build (default: those `fuzz` runs here)")
    parser.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                        help="parallel builds (default: up to 16)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="build what a campaign with this seed draws (default: every row of every menu)")


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.engine.campaign_case import backend_space
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.harness.pipeline.setup import (
        Unavailable,
        auto_backends,
        available_backend,
        machine_for,
        registry_for,
    )
    from hicache_fuzz.kernels import compile_books

    machine = machine_for(args.platform)
    registry = registry_for(args.backend_plugin)
    backends = ([available_backend(registry, name, machine) for name in args.backend] if args.backend
                else auto_backends(registry, machine))
    jobs = []
    for backend in backends:
        space = backend_space(backend, CaseSpace(), machine.platform, args.seed)
        jobs += backend.compile_jobs(grown_menus(space), machine.platform)
    if not jobs:
        raise Unavailable(f"nothing to build: no backend here ({', '.join(b.name for b in backends)} on "
                          f"{machine.description}) declares JIT modules")
    drawn = "every seed" if args.seed is None else f"seed {args.seed}"
    print(f"jit-warm: {len(jobs)} module builds for {', '.join(b.name for b in backends)} on {machine.description}"
          f" ({drawn})")
    seconds = compile_books.run_jobs(jobs, args.jobs)
    print(f"jit-warm: done in {seconds:.1f} s")
    return EXIT_CLEAN


def grown_menus(space: CaseSpace) -> CaseSpace:
    """`space` with every row of its growth stages already on its row menu (and no growth left)."""
    rows = tuple(space.row_bytes) + tuple(r for r in space.row_bytes_growth if r not in space.row_bytes)
    return space.narrowed(row_bytes=rows, row_bytes_growth=(), grow_every=0, head_dims=space.head_dims)
