"""The ISA check's text and Markdown output (one report per platform/arch/strict target)."""

from __future__ import annotations

from collections.abc import Sequence

from hicache_fuzz.harness.isa.symbols import IsaReport


def _format_counts(counts: dict[str, int]) -> str:
    return " ".join(f"{key}={value}" for key, value in counts.items()) or "(no memory accesses)"


def render_text(report: IsaReport) -> list[str]:
    title = f"{report.platform} {report.arch}{' --strict' if report.strict else ''}"
    if report.mutant:
        title += f" [mutant {report.mutant}]"
    lines = [f"== {title}: sglang {report.sglang_version} ({report.sglang_source})"]
    if report.skipped:
        lines.append(f"  SKIPPED (not checked): {report.skipped}")
        return lines
    lines.append(f"  compiler: {report.compiler}")
    for module in report.modules:
        state = f"{module.kernels_found} kernels" if module.compiled else "COMPILE FAILED"
        timing = "cached listing" if module.cached else f"{module.seconds:.1f} s"
        lines.append(f"  module {module.name}: {state}, {timing}")
    for kernel in report.kernels:
        verdict = "PASS" if kernel.passed else "FAIL"
        lines.append(f"  {verdict} {kernel.kernel}: {_format_counts(kernel.counts)}")
        lines.extend(f"       - {violation}" for violation in kernel.violations)
    lines.extend(f"  ERROR {error}" for error in report.errors)
    checked = sum(1 for kernel in report.kernels if kernel.symbol)
    failed = sum(1 for kernel in report.kernels if not kernel.passed)
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"  {verdict}: {checked} kernel instantiations checked, {failed} failing, {report.seconds:.1f} s"
    )
    return lines


def render_markdown(reports: Sequence[IsaReport], command: str) -> str:
    lines = ["# HiCache ISA check", "", f"Command: `{command}`", ""]
    lines += ["| platform | arch | strict | mutant | sglang | compiler | kernels | failing | result | seconds |"]
    lines += ["|---|---|---|---|---|---|---|---|---|---|"]
    for report in reports:
        checked = sum(1 for kernel in report.kernels if kernel.symbol)
        failed = sum(1 for kernel in report.kernels if not kernel.passed)
        result = "SKIPPED" if report.skipped else ("PASS" if report.passed else "FAIL")
        compiler = report.compiler.split(";")[0] or "-"
        lines.append(
            f"| {report.platform} | {report.arch} | {'yes' if report.strict else 'no'} "
            f"| {report.mutant or '-'} "
            f"| {report.sglang_version} | {compiler} | {checked} | {failed} | {result} "
            f"| {report.seconds:.1f} |"
        )
    for report in reports:
        lines += ["", f"## {report.platform} {report.arch}{' strict' if report.strict else ''}", ""]
        if report.skipped:
            lines += [f"SKIPPED, not checked: {report.skipped}"]
            continue
        lines += ["| kernel | expected | accesses | result |", "|---|---|---|---|"]
        for kernel in report.kernels:
            expected = f"{kernel.expected_width_bits}-bit, {kernel.expected_accesses_per_element}/element"
            result = "PASS" if kernel.passed else "FAIL: " + "; ".join(kernel.violations)
            lines.append(f"| `{kernel.kernel}` | {expected} | {_format_counts(kernel.counts)} | {result} |")
        lines.extend(f"\nERROR: {error}" for error in report.errors)
    return "\n".join(lines) + "\n"
