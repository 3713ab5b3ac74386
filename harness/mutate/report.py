"""Mutation report: score per target, per source file and per operator; survivors with their diffs;
killers with the failure that caught them; timeouts and build errors apart; a side-by-side table of two
targets. Written as summary.json, summary.md and junit.xml.

Score = (killed + timeout) / (total - build_error - error): a hang caused by a mutant is a detection (as in
mutmut), but it is listed apart because a hang is a weaker signal than a byte-exact mismatch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from hicache_fuzz.harness.model.output_paths import write_json_atomic
from hicache_fuzz.harness.mutate.targets import OUTCOMES

# The implementation paths (as the campaign's path spy names them) through which each source file's code is
# reached: a campaign survivor's "entry-point coverage" is the number of cases that took one of them.
ENTRY_PATHS = {
    "hicache.cuh": ("jit-register", "jit-page-unified", "jit-staged", "jit-tma"),  # included by every kernel
    "hicache_tma.cuh": ("jit-tma",),
    "staged_write_back.cuh": ("jit-staged",),
    "relayout.cuh": ("jit-staged",),
    "page_row.cuh": (),
}
DETECTED = ("killed", "timeout")
EXCLUDED = ("build_error", "error")


def _score(counts: dict[str, int]) -> float | None:
    valid = sum(counts.values()) - sum(counts.get(o, 0) for o in EXCLUDED)
    return None if valid == 0 else sum(counts.get(o, 0) for o in DETECTED) / valid


def _tally(records: list[dict[str, Any]], target: str, key: str) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, int]] = {}
    for record in records:
        group = str(record["mutant"][key])
        outcome = record["targets"][target]["outcome"]
        table.setdefault(group, dict.fromkeys(OUTCOMES, 0))[outcome] += 1
    return {group: {**counts, "total": sum(counts.values()), "score": _score(counts)}
            for group, counts in sorted(table.items())}


def summarize(records: dict[str, Any], target_names: list[str], meta: dict[str, Any]) -> dict[str, Any]:
    ordered = [records[k] for k in sorted(records, key=lambda k: (records[k]["mutant"]["file"],
                                                                  records[k]["mutant"]["line"], k))]
    summary: dict[str, Any] = {"meta": meta, "mutants": len(ordered), "targets": {}}
    for name in target_names:
        counts = dict.fromkeys(OUTCOMES, 0)
        for record in ordered:
            counts[record["targets"][name]["outcome"]] += 1
        lists: dict[str, list[dict[str, Any]]] = {o: [] for o in OUTCOMES}
        for record in ordered:
            result = record["targets"][name]
            mutant = record["mutant"]
            entry = {"id": mutant["id"], "file": mutant["file"], "line": mutant["line"],
                     "operator": mutant["operator"], "description": mutant["description"],
                     "detail": result["detail"], "seconds": round(result["seconds"], 1), "log": result["log"]}
            if result["outcome"] == "survived":
                entry["diff"] = mutant["diff"]
                if result.get("paths"):
                    entry["entry_cases"] = entry_cases(mutant["file"], result["paths"])
            if result["failures"]:
                entry["failures"] = result["failures"]
            lists[result["outcome"]].append(entry)
        summary["targets"][name] = {"counts": counts, "score": _score(counts),
                                    "per_file": _tally(ordered, name, "file"),
                                    "per_operator": _tally(ordered, name, "operator"),
                                    "survivors": lists["survived"], "killers": lists["killed"],
                                    "timeouts": lists["timeout"], "build_errors": lists["build_error"],
                                    "errors": lists["error"]}
    if len(target_names) >= 2:
        summary["side_by_side"] = side_by_side(ordered, target_names[0], target_names[1])
    return summary


def entry_cases(file: str, paths: dict[str, int]) -> dict[str, int]:
    """Cases of the campaign that went through the mutated file's kernels, per path. Python files (dispatch,
    host pools) sit in front of every path, so all count. 0 everywhere = the campaign never reached the code."""
    wanted = ENTRY_PATHS.get(file.rsplit("/", 1)[-1])
    if wanted is None:
        return {p: n for p, n in paths.items() if p != "none"}
    return {p: n for p, n in paths.items() if any(part in wanted for part in p.split("+"))} or dict.fromkeys(
        wanted, 0)


def side_by_side(records: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    """Mutants valid for both targets, split by who detected them."""
    cells: dict[str, list[str]] = {"a_only": [], "b_only": [], "both": [], "neither": []}
    excluded: list[str] = []
    for record in records:
        oa, ob = record["targets"][a]["outcome"], record["targets"][b]["outcome"]
        if oa in EXCLUDED or ob in EXCLUDED:
            excluded.append(record["mutant"]["id"])
            continue
        da, db = oa in DETECTED, ob in DETECTED
        key = "both" if da and db else "a_only" if da else "b_only" if db else "neither"
        cells[key].append(record["mutant"]["id"])
    return {"a": a, "b": b, **{k: {"count": len(v), "ids": v} for k, v in cells.items()},
            "excluded": {"count": len(excluded), "ids": excluded}}


def pct(score: float | None) -> str:
    return "n/a" if score is None else f"{100 * score:.1f}%"


def markdown(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    out = [f"# Mutation report: {summary['mutants']} mutants of {meta.get('sglang_root', '?')}", ""]
    sampled = f"a sample of {meta['sample']} (seed {meta.get('seed')})" if meta.get("sample") else "all selected"
    out.append(f"Mutants: {sampled}; targets: "
               + ", ".join(f"`{n}` ({d})" for n, d in meta.get("targets", {}).items()))
    if meta.get("unfinished"):
        out.append(f"Unfinished (not in this report; rerun to resume): {len(meta['unfinished'])} mutants.")
    for name, entry in (meta.get("baseline_accepted") or {}).items():
        out.append(f"The unmutated `{name}` raised {len(entry.get('failures', []))} new failure class(es), made "
                   "known for every mutant (`--baseline-failures known`): "
                   + ", ".join(f"`{f.get('signature')}`" for f in entry.get("failures", [])) + ".")
    out.append("")
    out.append("Score = (killed + timeout) / (total - build_error - error).")
    for name, target in summary["targets"].items():
        c = target["counts"]
        out += ["", f"## Target `{name}`: score {pct(target['score'])}", "",
                "| killed | timeout | survived | build_error | error |", "|---|---|---|---|---|",
                f"| {c['killed']} | {c['timeout']} | {c['survived']} | {c['build_error']} | {c['error']} |"]
        for title, key in (("source file", "per_file"), ("operator", "per_operator")):
            out += ["", f"### Per {title}", "", f"| {title} | total | killed | timeout | survived | build_error "
                    "| error | score |", "|---|---|---|---|---|---|---|---|"]
            for group, row in target[key].items():
                out.append(f"| `{group}` | {row['total']} | {row['killed']} | {row['timeout']} | {row['survived']} "
                           f"| {row['build_error']} | {row['error']} | {pct(row['score'])} |")
        out += ["", "### Killers", ""]
        for k in target["killers"]:
            first = (k.get("failures") or [{}])[0]
            extra = (f"; signature `{first.get('signature')}`, case `{first.get('first_case_id')}`, reproducer "
                     f"`{first.get('file')}`") if first else ""
            out.append(f"- `{k['id']}` {k['file']}:{k['line']} {k['operator']}: {k['detail']}{extra}")
        for title, key in (("Timeouts (counted as killed)", "timeouts"), ("Build errors (not scored)",
                                                                         "build_errors"),
                           ("Target errors (not scored)", "errors")):
            if target[key]:
                out += ["", f"### {title}", ""]
                out += [f"- `{e['id']}` {e['file']}:{e['line']} {e['operator']}: {e['detail']}" for e in target[key]]
        out += ["", "### Survivors", ""]
        for s in target["survivors"]:
            reached = ""
            if "entry_cases" in s:
                total = sum(s["entry_cases"].values())
                reached = (f" (campaign cases through this file's kernels: {total}"
                           + (f", {', '.join(f'{p} {n}' for p, n in s['entry_cases'].items())}" if total else
                              ": never reached") + ")")
            out += [f"- `{s['id']}` {s['file']}:{s['line']} {s['operator']}: {s['description']}{reached}", "",
                    "```diff", s["diff"].rstrip("\n"), "```", ""]
    if "side_by_side" in summary:
        sbs = summary["side_by_side"]
        out += ["", f"## Side by side: `{sbs['a']}` (A) vs `{sbs['b']}` (B)", "",
                "| killed by A only | B only | both | neither | excluded (build/target error in either) |",
                "|---|---|---|---|---|",
                f"| {sbs['a_only']['count']} | {sbs['b_only']['count']} | {sbs['both']['count']} | "
                f"{sbs['neither']['count']} | {sbs['excluded']['count']} |", ""]
        for key, title in (("a_only", "A only"), ("b_only", "B only"), ("neither", "neither")):
            if sbs[key]["ids"]:
                out.append(f"- {title}: " + ", ".join(f"`{i}`" for i in sbs[key]["ids"]))
    return "\n".join(out) + "\n"


def junit(summary: dict[str, Any]) -> str:
    """One testsuite per target, one testcase per mutant: a survivor is a failure, excluded ones skipped."""
    suites = ElementTree.Element("testsuites", name="hicache-fuzz mutate")
    for name, target in summary["targets"].items():
        c = target["counts"]
        suite = ElementTree.SubElement(suites, "testsuite", name=f"mutate.{name}", tests=str(sum(c.values())),
                                       failures=str(c["survived"]), skipped=str(c["build_error"] + c["error"]))
        for key in ("killers", "timeouts", "survivors", "build_errors", "errors"):
            for entry in target[key]:
                case = ElementTree.SubElement(suite, "testcase", classname=f"mutate.{name}.{entry['operator']}",
                                              name=f"{entry['id']} {entry['file']}:{entry['line']}",
                                              time=str(entry["seconds"]))
                if key == "survivors":
                    failure = ElementTree.SubElement(case, "failure", message=f"survived: {entry['description']}")
                    failure.text = entry["diff"]
                elif key in ("build_errors", "errors"):
                    ElementTree.SubElement(case, "skipped", message=entry["detail"])
    ElementTree.indent(suites)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    write_json_atomic(out / "summary.json", summary)
    (out / "summary.md").write_text(markdown(summary), encoding="utf-8")
    (out / "junit.xml").write_text(junit(summary), encoding="utf-8")
