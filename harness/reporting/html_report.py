"""One self-contained HTML page per campaign report (``fuzz --json``) or gate report (``gate --json``).

Inline CSS and SVG only: no script, no external resource, so the file can be attached to a CI run or a bug
report and opened anywhere. Sections (each a ``<section id=...>``):

* campaign: ``summary``, ``outcomes`` (backend x outcome heat map), ``coverage`` (per backend, dimension x
  bucket heat map; required buckets never hit are marked as gaps), ``values`` (per backend, the distinct values
  drawn per dimension and each numeric dimension's range: ``coverage_values``, ``coverage_ranges``; a dry run's
  report shows them before any GPU time is spent), ``throughput`` (cases/s over time from the
  report's ``timeline``), ``failures`` (grouped by bug class, one row per signature, with links to the
  reproducer JSON and its standalone script);
* gate: ``summary`` (verdict and phase times), ``findings``, ``replay``, ``outcomes``, ``failures``, ``isa``.

Everything taken from the report is HTML-escaped. Links are relative to the HTML file when the target exists
on this machine; otherwise the recorded path is shown, marked as not present here.
"""

from __future__ import annotations

import html
import itertools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.json_input import InputError, read_json_file
from hicache_fuzz.harness.model.output_paths import write_text_atomic

FAILURE_OUTCOMES = ("mismatch", "crash", "hang", "wrongly_accepted", "wrongly_rejected", "unexpected_path")
GATE_FORMAT = "hicache-fuzz-gate"

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1b1f24; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin: 14px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #1a7f37; font-weight: 600; } .fail { color: #cf222e; font-weight: 600; }
.incomplete { color: #9a6700; font-weight: 600; }
.gap { outline: 2px solid #cf222e; } .missing { color: #6e7781; }
.stats span { display: inline-block; margin-right: 18px; } code { font-size: 12px; }
"""


def write_html(report: Mapping[str, Any], path: Path | str, corpora: Iterable[Path] = ()) -> Path:
    """Render `report` (a campaign or gate report dict) to `path`; returns the path. A failure whose recorded
    reproducer is not on this machine links to the reproducer with the same signature in `corpora` (e.g. the
    committed corpus/sglang), if there is one."""
    out = Path(path)
    write_text_atomic(out, render_html(report, out.parent.resolve(), signature_files(corpora)))
    return out


def signature_files(corpora: Iterable[Path]) -> dict[str, str]:
    """signature -> reproducer JSON path, for every reproducer under the given folders."""
    found: dict[str, str] = {}
    for folder in corpora:
        for path in sorted(Path(folder).rglob("*.json")):
            try:
                data = read_json_file(path)
            except InputError:  # not a reproducer (or not a regular file): nothing to link to
                continue
            if isinstance(data, dict) and data.get("signature"):
                found.setdefault(str(data["signature"]), str(path))
    return found


def report_kind(report: Mapping[str, Any]) -> str:
    if report.get("format") == GATE_FORMAT:
        return "gate"
    if isinstance(report.get("outcomes"), dict) and "backends" in report:
        return "campaign"
    raise ValueError("not a hicache-fuzz campaign report (fuzz --json) or gate report (gate --json)")


def render_html(report: Mapping[str, Any], base_dir: Path, by_signature: Mapping[str, str] | None = None) -> str:
    kind = report_kind(report)
    lookup = dict(by_signature or {})
    body = _campaign(report, base_dir, lookup) if kind == "campaign" else _gate(report, base_dir, lookup)
    title = f"hicache-fuzz {kind} report"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{CSS}</style></head><body><h1>{title}</h1>\n{body}\n</body></html>\n")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# ---- campaign ---------------------------------------------------------------------------------------------

def _campaign(report: Mapping[str, Any], base_dir: Path, by_signature: Mapping[str, str]) -> str:
    failures = list(report.get("unique_failures", []))
    new = [f for f in failures if not f.get("known") and not f.get("flaky")]
    status = "fail" if new else "pass"
    stats = [("result", f'<span class="{status}">{len(new)} new failure signature(s)</span>'),
             ("cases", _e(report.get("cases", 0))), ("seconds", _e(report.get("seconds", 0))),
             ("cases/s", _e(report.get("cases_per_second", 0))),
             ("distinct generated cases/s", _e(report.get("distinct_cases_per_second", "not recorded"))),
             ("seed", _e(report.get("seed", ""))),
             ("platform", _e(report.get("platform", ""))), ("backends", _e(", ".join(report.get("backends", [])))),
             ("failures (all)", _e(report.get("failures_total", 0)))]
    if report.get("partial"):
        stats.append(("partial", "yes: a checkpoint of a campaign still running or killed"))
    if report.get("dry_run"):
        stats.append(("dry run", "yes: nothing ran; outcomes are the contract's predictions, seconds modelled at "
                                 f"{_e(report['dry_run'].get('modelled_cases_per_second', ''))} cases/s"))
    parts = [_section("summary", "Summary", _stats(stats)),
             _section("outcomes", "Outcomes per backend", _outcome_map(report.get("outcomes", {}))),
             _section("coverage", "Coverage per dimension", _coverage(report)),
             _section("values", "Values drawn per dimension", _values(report)),
             _section("throughput", "Throughput over time", _throughput(report.get("timeline", []))),
             _section("failures", "Failures grouped by bug", _failures(failures, base_dir, by_signature))]
    return "\n".join(parts)


def _section(anchor: str, title: str, content: str) -> str:
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>\n{content}\n</section>'


def _stats(pairs: Iterable[tuple[str, str]]) -> str:
    return '<p class="stats">' + "".join(f"<span><b>{_e(k)}</b>: {v}</span>" for k, v in pairs) + "</p>"


def _shade(count: int, peak: int, hue: int) -> str:
    """Background for a heat-map cell: lightness falls with log(count); hue 120 green, 0 red, -1 grey."""
    if count <= 0:
        return "background:#ffffff"
    level = math.log1p(count) / math.log1p(max(peak, 1))
    lightness = round(95 - 45 * level)
    return f"background:hsl({hue},60%,{lightness}%)" if hue >= 0 else f"background:hsl(210,10%,{lightness}%)"


def _outcome_hue(outcome: str) -> int:
    if outcome in FAILURE_OUTCOMES:
        return 0
    return 120 if outcome in ("pass", "rejected_as_predicted") else -1


def _outcome_map(outcomes: Mapping[str, Mapping[str, int]]) -> str:
    if not outcomes:
        return '<p class="missing">no cases ran</p>'
    columns = sorted({o for counts in outcomes.values() for o in counts},
                     key=lambda o: (o in FAILURE_OUTCOMES, o))
    peak = max((c for counts in outcomes.values() for c in counts.values()), default=1)
    head = "<tr><th>backend</th>" + "".join(f"<th>{_e(c)}</th>" for c in columns) + "</tr>"
    rows = []
    for backend, counts in sorted(outcomes.items()):
        cells = "".join(f'<td class="n heat" style="{_shade(counts.get(c, 0), peak, _outcome_hue(c))}">'
                        f"{counts.get(c, 0)}</td>" for c in columns)
        rows.append(f'<tr class="outcome-row"><th>{_e(backend)}</th>{cells}</tr>')
    return f"<table>{head}{''.join(rows)}</table>"


def _coverage(report: Mapping[str, Any]) -> str:
    from hicache_fuzz.harness.reporting.coverage import REQUIRED

    coverage: Mapping[str, Mapping[str, Mapping[str, int]]] = report.get("coverage", {})
    if not coverage:
        return '<p class="missing">no coverage recorded</p>'
    gaps = report.get("coverage_gaps", {})
    exemptions = report.get("coverage_exemptions", {})
    blocks = []
    for backend, dims in sorted(coverage.items()):
        peak = max((c for buckets in dims.values() for c in buckets.values()), default=1)
        rows = []
        # bucket pairs are summarized (coverage_summary), not drawn as one row per dimension pair
        for dim in sorted(d for d in set(dims) | set(REQUIRED) if not d.startswith("pair:")):
            buckets = dict(dims.get(dim, {}))
            for required in REQUIRED.get(dim, ()):
                buckets.setdefault(required, 0)
            cells = []
            for bucket, count in sorted(buckets.items()):
                gap = f"{dim}={bucket}" in gaps.get(backend, [])
                style = _shade(count, peak, 210)
                title = f"{dim}={bucket}: {count} case(s)" + (" (required, never hit)" if gap else "")
                cells.append(f'<td class="n cov{" gap" if gap else ""}" style="{style}" title="{_e(title)}">'
                             f"{_e(bucket)}<br>{count}</td>")
            rows.append(f"<tr><th>{_e(dim)}</th>{''.join(cells)}</tr>")
        note = ""
        summary = report.get("coverage_summary", {}).get(backend)
        if summary:
            note += (f'<p>bucket pairs reached: {summary["pairs_reached"]} of {summary["pairs_possible"]}; '
                     f'edges missed: {_e(", ".join(summary["edges_missed"]) or "none")}</p>')
        if gaps.get(backend):
            note += f'<p class="fail">gaps: {_e(", ".join(gaps[backend]))}</p>'
        for bucket, why in exemptions.get(backend, {}).items():
            note += f'<p class="missing">exempt {_e(bucket)}: {_e(why)}</p>'
        blocks.append(f'<h3>{_e(backend)}</h3><table class="coverage">{"".join(rows)}</table>{note}')
    return "\n".join(blocks)


def _values(report: Mapping[str, Any]) -> str:
    values: Mapping[str, Mapping[str, Sequence[Any]]] = report.get("coverage_values", {})
    ranges: Mapping[str, Mapping[str, Sequence[int]]] = report.get("coverage_ranges", {})
    if not values and not ranges:
        return '<p class="missing">no values recorded (reports before coverage_values)</p>'
    blocks = []
    for backend in sorted(set(values) | set(ranges)):
        rows = []
        for dim, found in sorted(values.get(backend, {}).items()):
            shown = ", ".join(str(v) for v in found)
            rows.append(f'<tr class="value-row"><th>{_e(dim)}</th><td class="n">{len(found)}</td>'
                        f"<td><code>{_e(shown)}</code></td></tr>")
        for dim, span in sorted(ranges.get(backend, {}).items()):
            rows.append(f'<tr class="range-row"><th>{_e(dim)}</th><td>range</td>'
                        f"<td><code>{_e(span[0])} .. {_e(span[1])}</code></td></tr>")
        head = "<tr><th>dimension</th><th>distinct</th><th>values</th></tr>"
        blocks.append(f'<h3>{_e(backend)}</h3><table class="values">{head}{"".join(rows)}</table>')
    return "\n".join(blocks)


def _throughput(timeline: list[Mapping[str, float]]) -> str:
    points = [(float(s["t"]), float(s["cases"]), float(s.get("failures", 0))) for s in timeline]
    if len(points) < 2:
        return '<p class="missing">no timeline in this report (campaigns record one sample per second)</p>'
    rates = [(t1, (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0)
             for (t0, c0, _), (t1, c1, _) in itertools.pairwise(points)]
    width, height, pad = 640, 200, 40
    t_max = max(points[-1][0], 1e-9)
    r_max = max(max(r for _, r in rates), 1e-9)
    xy = " ".join(f"{pad + (t / t_max) * (width - 2 * pad):.1f},{height - pad - (r / r_max) * (height - 2 * pad):.1f}"
                  for t, r in rates)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="cases per second over time">'
           f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#57606a"/>'
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#57606a"/>'
           f'<polyline fill="none" stroke="#0969da" stroke-width="2" points="{xy}"/>'
           f'<text x="{pad}" y="{pad - 8}" font-size="11">{r_max:.1f} cases/s</text>'
           f'<text x="{width - pad}" y="{height - pad + 16}" font-size="11" text-anchor="end">{t_max:.0f} s</text>'
           f'<text x="{pad}" y="{height - pad + 16}" font-size="11">0</text></svg>')
    last = points[-1]
    caption = (f"<p>{len(points)} samples; {last[1]:.0f} cases and {last[2]:.0f} failing cases after "
               f"{last[0]:.1f} s; mean {last[1] / t_max:.1f} cases/s</p>")
    return svg + caption


def _link(recorded: str, base_dir: Path, label: str) -> str:
    if not recorded:
        return '<span class="missing">none</span>'
    path = Path(recorded)
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        return f'<code>{_e(recorded)}</code> <span class="missing">(not on this machine)</span>'
    href = os.path.relpath(path.resolve(), base_dir)
    return f'<a href="{_e(href)}">{_e(label)}</a>'


def _standalone(recorded: str, base_dir: Path) -> str:
    if not recorded:
        return '<span class="missing">none</span>'
    script = Path(recorded).with_name(Path(recorded).stem + ".standalone.py")
    if not (script if script.is_absolute() else Path.cwd() / script).exists():
        return '<span class="missing">none (not an sglang backend, or not on this machine)</span>'
    return _link(str(script), base_dir, script.name)


def _here(recorded: str) -> bool:
    path = Path(recorded)
    return bool(recorded) and (path if path.is_absolute() else Path.cwd() / path).exists()


def _failures(failures: Sequence[Mapping[str, Any]], base_dir: Path, by_signature: Mapping[str, str]) -> str:
    if not failures:
        return '<p class="pass">no failures</p>'
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for failure in failures:
        groups.setdefault((str(failure.get("backend", "")), str(failure.get("outcome", ""))), []).append(failure)
    blocks = []
    for (backend, outcome), members in sorted(groups.items()):
        total = sum(int(m.get("count", 1)) for m in members)
        rows = []
        for m in sorted(members, key=lambda m: -int(m.get("count", 1))):
            known = m.get("known", "")
            state = f'known (<code>{_e(known)}</code>)' if known else '<span class="fail">new</span>'
            if m.get("flaky"):
                state = f'flaky (ran {_e(m["flaky"])} in a fresh worker)'
            file = str(m.get("file", "") or m.get("artifact", ""))
            if not _here(file) and str(m.get("signature", "")) in by_signature:
                file = by_signature[str(m["signature"])]  # the committed reproducer of the same bug
            rows.append(f'<tr class="failure-row"><td><code>{_e(m.get("signature", ""))}</code></td>'
                        f'<td class="n">{_e(m.get("count", 1))}</td><td>{state}</td>'
                        f'<td>{_e(m.get("summary", ""))}</td><td>{_link(file, base_dir, Path(file).name)}</td>'
                        f"<td>{_standalone(file, base_dir)}</td></tr>")
        head = ("<tr><th>signature</th><th>count</th><th>status</th><th>first failure</th><th>reproducer</th>"
                "<th>standalone script</th></tr>")
        blocks.append(f'<h3 class="bug">{_e(backend)} — {_e(outcome)}: {len(members)} signature(s), '
                      f"{total} case(s)</h3><table>{head}{''.join(rows)}</table>")
    return "\n".join(blocks)


# ---- gate -------------------------------------------------------------------------------------------------

def _gate(report: Mapping[str, Any], base_dir: Path, by_signature: Mapping[str, str]) -> str:
    verdict = report.get("verdict", {})
    status = str(verdict.get("status", "?"))
    seconds = report.get("seconds", {})
    banner = f'<span class="{_e(status)}">{_e(status.upper())}</span> (exit {_e(verdict.get("exit_code"))})'
    stats = [("verdict", banner),
             ("platform", _e(verdict.get("platform", ""))), ("machine", _e(report.get("machine", ""))),
             ("seed", _e(verdict.get("seed", ""))), ("command", f"<code>{_e(report.get('command', ''))}</code>"),
             ("phases", _e(", ".join(f"{k} {v} s" for k, v in seconds.items())))]
    findings = verdict.get("findings", [])
    finding_html = ("<ul>" + "".join(f'<li class="finding">{_e(f)}</li>' for f in findings) + "</ul>"
                    if findings else '<p class="pass">no findings</p>')
    replay = report.get("replay", [])
    replay_rows = "".join(
        f'<tr class="replay-row {_e(r.get("status", ""))}"><td><code>{_e(r.get("file", ""))}</code></td>'
        f'<td>{_e(r.get("backend", ""))}</td><td>{_e(r.get("status", ""))}</td><td>{_e(r.get("outcome", ""))}</td>'
        f'<td>{_e(r.get("reason", ""))}</td></tr>' for r in replay)
    counts: dict[str, int] = {}
    for r in replay:
        counts[str(r.get("status", ""))] = counts.get(str(r.get("status", "")), 0) + 1
    replay_html = (_stats((k, str(v)) for k, v in sorted(counts.items())) +
                   f"<table><tr><th>file</th><th>backend</th><th>status</th><th>outcome</th><th>reason</th></tr>"
                   f"{replay_rows}</table>") if replay else '<p class="missing">no corpus replayed</p>'
    campaign = report.get("campaign", [])
    outcomes = {row["backend"]: row.get("outcomes", {}) for row in campaign}
    failures = [{**f, "backend": f.get("backend", row["backend"])} for row in campaign for f in row.get("failures", [])]
    failures += [{**f, "backend": f.get("backend", row["backend"]), "known": f.get("known") or "corpus"}
                 for row in campaign for f in row.get("known_failures", [])]
    isa_rows = "".join(
        f'<tr class="isa-row"><td>{_e(r.get("name", ""))}</td><td>{_e(r.get("status", ""))}</td>'
        f'<td class="n">{_e(r.get("kernels", 0))}</td><td class="n">{_e(r.get("failing", 0))}</td>'
        f'<td>{_e(r.get("reason", ""))}</td></tr>' for r in report.get("isa", []))
    isa_html = (f"<table><tr><th>check</th><th>status</th><th>kernels</th><th>failing</th><th>reason</th></tr>"
                f"{isa_rows}</table>") if isa_rows else '<p class="missing">no ISA checks</p>'
    return "\n".join([
        _section("summary", "Verdict", _stats(stats)),
        _section("findings", "Findings", finding_html),
        _section("replay", "Corpus replay", replay_html),
        _section("outcomes", "Fixed-seed campaign: outcomes per backend", _outcome_map(outcomes)),
        _section("failures", "Campaign failures grouped by bug", _failures(failures, base_dir, by_signature)),
        _section("isa", "Static ISA checks", isa_html),
    ])
