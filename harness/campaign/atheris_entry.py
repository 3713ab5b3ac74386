"""Coverage-guided fuzzing with atheris (libFuzzer): bytes -> case -> backend -> raise on failure.

The bytes libFuzzer mutates drive the same decision procedure as every other generator
(:func:`hicache_fuzz.harness.generation.generate.draw_case`) through a :class:`FuzzedDataChooser`; when the data runs
out, every choice falls to its lowest value, i.e. the first (simplest) menu entry. A failing case is written
as a JSON reproducer *before* the exception is raised: ``<artifact_prefix>case-<case_id>.json`` (next to
libFuzzer's own ``crash-<sha1>``), and with ``--corpus`` also ``<corpus>/<signature>/<case_id>.json`` plus
its ``repro_<case_id>.py``.

Run either form (our options take two dashes, libFuzzer's one):

    python -m hicache_fuzz.harness.campaign.atheris_entry --backend reference -runs=1000 -seed=1 \
        -artifact_prefix=out/ corpus_dir
    hicache-fuzz atheris --backend reference -- -max_total_time=60 -minimize_crash=1 crash-file

libFuzzer flags (-runs, -max_total_time, -seed, -artifact_prefix, -minimize_crash, corpus directories, ...)
are passed to ``atheris.Setup`` untouched. The module form instruments hicache_fuzz's own modules for
coverage (the harness' plan/contract/reference code paths; GPU kernels are not visible to it). The
subcommand runs the module form in a child process. Where atheris cannot be imported (e.g. a Python
without atheris wheels), both say so and exit 3.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from hicache_fuzz.harness.model.exit_codes import EXIT_UNAVAILABLE

T = TypeVar("T")



class FuzzFailure(AssertionError):
    """Raised inside the fuzz target for a failing case, so libFuzzer records a crash artifact."""


class FuzzedDataChooser:
    """A generate.Chooser over atheris' FuzzedDataProvider: exhausted data gives the lowest choice."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def choice(self, options: Sequence[T]) -> T:
        return options[self.provider.ConsumeIntInRange(0, len(options) - 1)]

    def integer(self, low: int, high: int) -> int:
        return int(self.provider.ConsumeIntInRange(low, high))

    def chance(self, probability: float) -> bool:
        # One byte per decision (ConsumeProbability would take eight); exhausted data reads 0, which this
        # maps to False: the plain case.
        return self.provider.ConsumeIntInRange(0, 255) >= 256 - round(probability * 256)


def atheris_unavailable_reason() -> str | None:
    try:
        import atheris  # noqa: F401
    except ImportError as exc:
        return (f"atheris is not importable on Python {sys.version.split()[0]} ({exc}); install it with "
                f"`pip install atheris` (wheels lag new Python versions; see docs/reproducers.md)")
    return None


def add_our_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="reference", help="backend to fuzz (default: %(default)s)")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE:CALLABLE")
    parser.add_argument("--platform", default="auto", choices=["auto", "cpu", "cuda", "rocm"])
    parser.add_argument("--byte-budget", type=int, default=1 << 20,
                        help="largest case in bytes, all storages (default: %(default)s)")
    parser.add_argument("--corpus", type=Path, help="also save failures here as reproducers (JSON + script)")


def _artifact_prefix(libfuzzer_args: Sequence[str]) -> str:
    for arg in libfuzzer_args:
        if arg.startswith("-artifact_prefix="):
            return arg.split("=", 1)[1]
    return ""


def make_target(ours: argparse.Namespace, libfuzzer_args: Sequence[str]) -> Any:
    """The TestOneInput callable (imports the harness: call it inside atheris.instrument_imports)."""
    import atheris
    import torch

    from hicache_fuzz.harness.findings.corpus import reproducer_dict
    from hicache_fuzz.harness.findings.identity import signature, signature_key
    from hicache_fuzz.harness.findings.reproducer import save_reproducer
    from hicache_fuzz.harness.generation.generate import draw_case
    from hicache_fuzz.harness.model.output_paths import write_json_atomic
    from hicache_fuzz.harness.model.platform import detect, require
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.harness.pipeline.runner import run_case
    from hicache_fuzz.kernels.buffers import HostMemory
    from hicache_fuzz.kernels.registry import load_registry

    machine = detect() if ours.platform == "auto" else require(ours.platform)
    backend = load_registry(ours.backend_plugin).get(ours.backend)
    availability = backend.probe(machine.platform)
    if not availability.available:
        raise RuntimeError(f"backend {backend.name} unavailable on {machine.description}: {availability.reason}")
    space = backend.case_space(CaseSpace(byte_budget=ours.byte_budget, backend=backend.name), machine.platform)
    prefix = _artifact_prefix(libfuzzer_args)
    backend_class = f"{type(backend).__module__}:{type(backend).__qualname__}"
    if machine.device.type == "cpu":
        torch.set_num_threads(1)  # small cases: threads cost more than they give

    def test_one_input(data: bytes) -> None:
        case = draw_case(FuzzedDataChooser(atheris.FuzzedDataProvider(data)), space)
        result = run_case(case, backend, machine.platform, machine.device,
                          HostMemory(simulate=machine.device.type == "cpu"))
        if not result.outcome.is_failure:
            return
        # Write-ahead of the raise: libFuzzer's crash-<sha1> holds bytes only meaningful to this mapping.
        data_out = reproducer_dict(case, result)
        data_out["signature_key"] = signature_key(result, case)
        artifact = Path(f"{prefix}case-{case.case_id}.json")
        write_json_atomic(artifact, data_out)
        where = str(artifact)
        if ours.corpus is not None:
            where += f", {save_reproducer(ours.corpus, case, result, backend_class=backend_class)}"
        detail = (result.summary or result.error or "").splitlines()
        raise FuzzFailure(f"{signature(result, case)} {result.outcome.value}: {detail[0] if detail else ''} "
                          f"(reproducer: {where})")

    return test_one_input


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m hicache_fuzz.harness.campaign.atheris_entry",
                                     description="atheris fuzz target over hicache-fuzz cases")
    add_our_arguments(parser)
    ours, libfuzzer_args = parser.parse_known_args(argv)
    libfuzzer_args = [a for a in libfuzzer_args if a != "--"]
    reason = atheris_unavailable_reason()
    if reason:
        print(f"hicache-fuzz atheris: unavailable: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    import atheris

    with atheris.instrument_imports(include=["hicache_fuzz"]):
        target = make_target(ours, libfuzzer_args)
    atheris.Setup([sys.argv[0], *libfuzzer_args], target)
    atheris.Fuzz()  # never returns: libFuzzer exits (0 when -runs/-max_total_time end, 1 on a failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
