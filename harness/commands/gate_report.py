"""The gate's report: one row per corpus entry, campaign backend and ISA target; the verdict (deterministic
fields only), JSON, Markdown for a PR comment, and JUnit cases."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE
from hicache_fuzz.harness.reporting.junit import JUnitCase

GATE_FORMAT = "hicache-fuzz-gate"
GATE_FORMAT_VERSION = 1

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
EXPECTED, UNEXPECTED_PASS = "expected", "unexpected_pass"  # replay of an entry marked "expect": "fail"
FIXED = "fixed"  # an expected failure (in scope here) that no longer fails: update the corpus entry
FLAKY = "flaky"  # failed, then passed when re-run alone in a fresh worker: neither a finding nor a pass
BUDGET_EXCEEDED = "budget_exceeded"  # a campaign that did not finish its planned cases within the cap
# judge_replay's labels -> the gate's replay statuses.
REPLAY_STATUS = {"PASS": PASSED, "FAIL": FAILED, "XFAIL": EXPECTED, "XPASS": FIXED, "FAIL-OTHER": FAILED}


# ---- results --------------------------------------------------------------------------------------------

@dataclass
class ReplayRow:
    file: str  # as given (relative to the corpus folder's parent when that is how it was named)
    case_id: str
    backend: str
    status: str  # passed | failed | expected | fixed | flaky | skipped
    outcome: str = ""  # the Outcome value observed ("" when skipped)
    signature: str = ""
    expected: str = ""  # "fail [signature]" for an expected-failing regression ("" for a plain entry)
    reason: str = ""  # why skipped, or what went wrong, in one line
    artifact: str = ""  # reproducer written under --artifacts for a failure
    seconds: float = 0.0


@dataclass
class CampaignRow:
    backend: str
    planned_cases: int
    cases: int
    status: str  # passed | failed | budget_exceeded
    outcomes: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)  # one per unique NEW signature (findings)
    # failures whose bug identity a corpus entry marked "expect": "fail" already records (not findings)
    known_failures: list[dict[str, Any]] = field(default_factory=list)
    case_ids_sha256: str = ""  # digest of the case ids run, in order: equal digests = equal cases
    first_index: int = 0
    seconds: float = 0.0
    # failures that passed when re-run alone in a fresh worker (not findings, not passes: listed apart)
    flaky: list[dict[str, Any]] = field(default_factory=list)
    # failures the --baseline sglang shows the same way (not findings: the change under test did not cause them)
    pre_existing: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class IsaRow:
    name: str  # e.g. "rocm gfx942 strict"
    platform: str
    arch: str
    strict: bool
    status: str  # passed | failed | skipped
    kernels: int = 0
    failing: int = 0
    reason: str = ""  # why skipped, or the first failures
    sglang_version: str = ""  # of the kernel sources checked
    report_json: str = ""
    seconds: float = 0.0


@dataclass
class GateReport:
    platform: str
    machine: str
    seed: int
    budget_seconds: float
    cases_per_backend: int
    command: str
    allow_skip_isa: bool
    corpus_dirs: list[str]
    replay: list[ReplayRow] = field(default_factory=list)
    campaign: list[CampaignRow] = field(default_factory=list)
    isa: list[IsaRow] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall seconds (never in the verdict)
    # How the campaign's workers shared the GPU (pipeline/gpu_sharing.py): MPS or contexts, a fall-back and the
    # cases a fault of another MPS client took down (they ran clean alone: not findings, but listed). None
    # where the campaign had no worker pool.
    gpu_sharing: dict[str, Any] | None = None
    # --baseline: which sglang, how many reproducers were replayed there and in how long (campaign/baseline.py)
    baseline: dict[str, Any] | None = None

    # A finding is anything a human must look at; a skipped ISA check is not a finding but is not green.
    def findings(self) -> list[str]:
        lines = [f"corpus {r.file}: {r.status} ({r.reason})" for r in self.replay
                 if r.status in (FAILED, UNEXPECTED_PASS)]
        for row in self.campaign:
            if row.status == BUDGET_EXCEEDED:
                lines.append(f"campaign {row.backend}: budget exceeded after {row.cases} of "
                             f"{row.planned_cases} planned cases")
            lines.extend(f"campaign {row.backend}: [{f['signature']}] x{f['count']}"
                         + "".join(f" (outside its trigger: {', '.join(f'{k}={v}' for k, v in unmet.items())}; "
                                   f"identity known from {file})"
                                   for file, unmet in f.get("known_identity_outside_trigger", {}).items())
                         + (f" (baseline: {f['baseline_detail']})" if f.get("baseline_detail") else "")
                         + f" {f['summary']}" for f in row.failures)
        lines.extend(f"isa {r.name}: {r.reason}" for r in self.isa if r.status == FAILED)
        return lines

    def isa_skipped_unallowed(self) -> list[IsaRow]:
        return [] if self.allow_skip_isa else [r for r in self.isa if r.status == SKIPPED]

    @property
    def exit_code(self) -> int:
        if self.findings():
            return EXIT_FAILURES
        if self.isa_skipped_unallowed():
            return EXIT_UNAVAILABLE
        return EXIT_CLEAN

    @property
    def status(self) -> str:
        return {EXIT_CLEAN: "pass", EXIT_FAILURES: "fail", EXIT_UNAVAILABLE: "incomplete"}[self.exit_code]

    def verdict(self) -> dict[str, Any]:
        """Everything the pass/fail decision rests on, and nothing that depends on speed or paths run."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "platform": self.platform,
            "seed": self.seed,
            "budget_seconds": self.budget_seconds,
            "cases_per_backend": self.cases_per_backend,
            "replay": [{"file": r.file, "case_id": r.case_id, "backend": r.backend, "status": r.status,
                        "outcome": r.outcome, "signature": r.signature} for r in self.replay],
            "campaign": [{"backend": r.backend, "planned_cases": r.planned_cases, "cases": r.cases,
                          "status": r.status, "outcomes": dict(sorted(r.outcomes.items())),
                          "failure_signatures": sorted(f["signature"] for f in r.failures),
                          "known_failure_signatures": sorted(f["signature"] for f in r.known_failures),
                          "flaky_signatures": sorted(f["signature"] for f in r.flaky),
                          "pre_existing_signatures": sorted(f["signature"] for f in r.pre_existing),
                          "case_ids_sha256": r.case_ids_sha256} for r in self.campaign],
            "isa": [{"name": r.name, "status": r.status, "kernels": r.kernels, "failing": r.failing,
                     "sglang": r.sglang_version} for r in self.isa],
            "findings": self.findings(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": GATE_FORMAT,
            "version": GATE_FORMAT_VERSION,
            "command": self.command,
            "machine": self.machine,
            "corpus_dirs": self.corpus_dirs,
            "allow_skip_isa": self.allow_skip_isa,
            "verdict": self.verdict(),
            "replay": [asdict(r) for r in self.replay],
            "campaign": [asdict(r) for r in self.campaign],
            "isa": [asdict(r) for r in self.isa],
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "gpu_sharing": self.gpu_sharing,
            "baseline": self.baseline,
        }


# ---- 4. reports -----------------------------------------------------------------------------------------

def _sharing_lines(sharing: dict[str, Any] | None) -> list[str]:
    """How the campaign's workers shared the GPU; a fall-back from MPS and its collateral cases spelt out."""
    if not sharing:
        return []
    lines = ["", f"GPU sharing: {sharing['mode']} ({one_line(sharing['reason'], 160)})."]
    if sharing.get("fell_back"):
        lines.append(f"MPS ended during the campaign: {one_line(sharing['fell_back'], 200)}.")
    if sharing.get("collateral_count"):
        lines.append(f"{sharing['collateral_count']} case(s) died in a batch with another MPS client's fault and ran "
                     "clean alone (not findings): " + ", ".join(f"`{c['case_id']}` ({c['backend']})"
                                                                 for c in sharing["collateral"][:10]) + ".")
    return lines


def render_markdown(report: GateReport) -> str:
    """A summary for a PR comment: verdict, one table row per check, then findings and skips."""
    lines = _heading_lines(report) + _check_table_lines(report) + _run_lines(report)
    lines += _findings_lines(report) + _skipped_lines(report) + _known_lines(report)
    lines += _pre_existing_lines(report) + _flaky_lines(report) + _fixed_lines(report) + _expected_lines(report)
    return "\n".join(lines) + "\n"


def _heading_lines(report: GateReport) -> list[str]:
    """The verdict, the command that reproduces it, and what the budget became."""
    verdict_word = {"pass": "PASS", "fail": "FAIL", "incomplete": "INCOMPLETE"}[report.status]
    return [f"## HiCache fuzz gate ({report.platform}): **{verdict_word}**", "",
            f"`{report.command}`", "",
            f"seed {report.seed}, budget {report.budget_seconds:g} s -> {report.cases_per_backend} cases "
            f"per backend, exit code {report.exit_code}; {report.machine}", ""]


def _check_table_lines(report: GateReport) -> list[str]:
    """One row for the corpus replay, one per campaign backend, one per ISA target."""
    lines = ["| check | result | passed | failed | known | flaky | fixed | skipped | details |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines.append(_replay_table_row(report))
    lines += [_campaign_table_row(row) for row in report.campaign]
    lines += [_isa_table_row(isa_row) for isa_row in report.isa]
    return lines


def _replay_table_row(report: GateReport) -> str:
    counts = Counter(r.status for r in report.replay)
    replay_failed = counts[FAILED] + counts[UNEXPECTED_PASS]
    replay_result = "FAIL" if replay_failed else ("PASS" if report.replay else "EMPTY")
    return (f"| corpus replay | {replay_result} | {counts[PASSED]} | {replay_failed} "
            f"| {counts[EXPECTED]} | {counts[FLAKY]} | {counts[FIXED]} | {counts[SKIPPED]} "
            f"| {len(report.replay)} entries from {', '.join(report.corpus_dirs)} |")


def _campaign_table_row(row: CampaignRow) -> str:
    # passed = every case run that is neither a new failure, a known one nor a flaky one
    result = {PASSED: "PASS", FAILED: "FAIL", BUDGET_EXCEEDED: "FAIL (budget exceeded)"}[row.status]
    failing_cases = sum(f["count"] for f in row.failures)
    known_cases = sum(f["count"] for f in row.known_failures)
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row.outcomes.items())) or "no cases"
    flaky_cases = sum(f["count"] for f in row.flaky)
    return (f"| campaign `{row.backend}` | {result} "
            f"| {row.cases - failing_cases - known_cases - flaky_cases} "
            f"| {failing_cases} | {known_cases} | {flaky_cases} | 0 | {row.planned_cases - row.cases} "
            f"| {row.cases}/{row.planned_cases} cases: {outcomes}; {len(row.failures)} new bugs, "
            f"{len(row.known_failures)} known, {len(row.flaky)} flaky |")


def _isa_table_row(isa_row: IsaRow) -> str:
    result = {PASSED: "PASS", FAILED: "FAIL", SKIPPED: "SKIPPED"}[isa_row.status]
    detail = (one_line(isa_row.reason, 160) if isa_row.status == SKIPPED
              else f"sglang {isa_row.sglang_version}: {isa_row.kernels} kernel instantiations, "
                   f"{isa_row.failing} failing")
    return (f"| ISA {isa_row.name} | {result} | {int(isa_row.status == PASSED)} "
            f"| {int(isa_row.status == FAILED)} | 0 | 0 | 0 | {int(isa_row.status == SKIPPED)} | {detail} |")


def _run_lines(report: GateReport) -> list[str]:
    """How the run went: phase times, GPU sharing, the baseline replay."""
    timing = ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in report.seconds.items())
    lines = ["", f"Wall time: {timing}."]
    lines += _sharing_lines(report.gpu_sharing)
    if report.baseline is not None:
        lines += ["", f"Baseline: {report.baseline['baseline']}: {report.baseline['cases']} reproducers replayed in "
                      f"{report.baseline['seconds']:.0f} s" + (f" ({one_line(report.baseline['error'], 200)})"
                                                               if report.baseline.get("error") else "") + "."]
    return lines


def _findings_lines(report: GateReport) -> list[str]:
    """The findings, then the reproducer files to rerun them from."""
    findings = report.findings()
    if not findings:
        return []
    lines = ["", "### Findings", ""]
    lines += [f"- {one_line(line, 300)}" for line in findings]
    reproducers = [r.artifact for r in report.replay if r.artifact]
    reproducers += [f["file"] for row in report.campaign for f in row.failures if f.get("file")]
    if reproducers:
        lines += ["", "Reproducers (uploaded as artifacts; rerun with `hicache-fuzz replay FILE`):", ""]
        lines += [f"- `{path}`" for path in reproducers]
    return lines


def _skipped_lines(report: GateReport) -> list[str]:
    """Skipped corpus entries and ISA targets, and whether the skips keep the gate from being green."""
    skipped = [r for r in report.replay if r.status == SKIPPED]
    if not skipped and not any(r.status == SKIPPED for r in report.isa):
        return []
    lines = ["", "### Skipped", ""]
    # Grouped by reason: a GPU-only seed corpus on a CPU runner is ~150 entries with one reason.
    by_reason = Counter(r.reason for r in skipped)
    lines += [f"- {count} corpus entr{'y' if count == 1 else 'ies'}: {one_line(reason, 200)}"
              for reason, count in sorted(by_reason.items())]
    lines += [f"- ISA {r.name}: {one_line(r.reason, 200)}" for r in report.isa if r.status == SKIPPED]
    unallowed = report.isa_skipped_unallowed()
    if unallowed:
        lines += ["", f"{len(unallowed)} ISA check(s) skipped without `--allow-skip-isa`: "
                      "the gate is not green."]
    return lines


def _known_lines(report: GateReport) -> list[str]:
    from hicache_fuzz.harness.findings.trigger import describe as describe_trigger

    known = [(row.backend, f) for row in report.campaign for f in row.known_failures]
    if not known:
        return []
    return ["", f"### Known failures met by the campaign ({len(known)})", "",
            *[f"- [{backend}] `{f['signature']}` x{f['count']}: known from `{f['known']}`, trigger "
              f"{describe_trigger(f.get('trigger', {}))}" for backend, f in known]]


def _pre_existing_lines(report: GateReport) -> list[str]:
    pre_existing = [(row.backend, f) for row in report.campaign for f in row.pre_existing]
    if not pre_existing:
        return []
    return ["", f"### Pre-existing: fail the same way on the baseline ({len(pre_existing)})", "",
            *[f"- [{backend}] `{f['signature']}` x{f['count']}: {one_line(f['summary'], 160)}"
              for backend, f in pre_existing]]


def _flaky_lines(report: GateReport) -> list[str]:
    flaky = [(f"campaign {row.backend}", f"`{f['signature']}` x{f['count']}: {one_line(f['summary'], 160)}")
             for row in report.campaign for f in row.flaky]
    flaky += [(f"corpus {r.file}", one_line(r.reason, 160)) for r in report.replay if r.status == FLAKY]
    if not flaky:
        return []
    return ["", f"### Flaky: failed, then passed when re-run alone ({len(flaky)})", "",
            *[f"- {where}: {what}" for where, what in flaky]]


def _fixed_lines(report: GateReport) -> list[str]:
    fixed = [r for r in report.replay if r.status == FIXED]
    if not fixed:
        return []
    return ["", f"### Fixed: expected failures that no longer fail ({len(fixed)})", "",
            "Set their `\"expect\"` to `\"pass\"` (or narrow their `\"scope\"`) in the corpus.", "",
            *[f"- `{r.file}` [{r.backend}]: {r.expected}" for r in fixed]]


def _expected_lines(report: GateReport) -> list[str]:
    expected = [r for r in report.replay if r.status == EXPECTED]
    if not expected:
        return []
    return ["", f"<details><summary>Expected failures reproduced ({len(expected)})</summary>", "",
            *[f"- `{r.file}` [{r.backend}]: {r.signature}" for r in expected],
            "", "</details>"]


def one_line(text: str, limit: int) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.replace("|", "\\|")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def junit_cases(report: GateReport) -> list[JUnitCase]:
    """One JUnit case per corpus entry, per campaign backend and per ISA target."""
    from hicache_fuzz.harness.findings.trigger import describe as describe_trigger

    cases: list[JUnitCase] = []
    for row in report.replay:
        failed = row.status in (FAILED, UNEXPECTED_PASS)
        cases.append(JUnitCase(
            # a seed file lists several backends: the backend makes each corpus test case name unique
            name=f"{row.file} [{row.backend}]", classname="gate.corpus", seconds=row.seconds,
            failure_message=f"{row.status}: {row.reason}" if failed else None,
            failure_text=f"reproducer: {row.artifact}\nrerun: hicache-fuzz replay {row.artifact}" if failed
            else "",
            skipped_message=row.reason if row.status == SKIPPED else None,
            system_out=f"{row.status.upper()}: {row.reason}" if row.status in (EXPECTED, FIXED, FLAKY) else "",
            properties={"backend": row.backend, "status": row.status, "outcome": row.outcome}))
    for campaign_row in report.campaign:
        message: str | None = None
        if campaign_row.status == BUDGET_EXCEEDED:
            message = (f"budget exceeded: {campaign_row.cases} of {campaign_row.planned_cases} planned cases "
                       f"ran within --budget-seconds {report.budget_seconds:g}")
        elif campaign_row.failures:
            message = f"{len(campaign_row.failures)} unique failures in {campaign_row.cases} cases"
        text = "\n".join(f"NEW [{f['signature']}] x{f['count']} {f['summary']}\n    reproducer: {f['file']}"
                         + (f"\n    baseline: {f['baseline_detail']}" if f.get("baseline_detail") else "")
                         for f in campaign_row.failures)
        cases.append(JUnitCase(
            name=f"{campaign_row.backend} seed {report.seed}", classname="gate.campaign",
            seconds=campaign_row.seconds, failure_message=message, failure_text=text,
            system_out="\n".join([f"KNOWN [{f['signature']}] x{f['count']}: {f['known']} (trigger "
                                   f"{describe_trigger(f.get('trigger', {}))})" for f in campaign_row.known_failures]
                                  + [f"PRE-EXISTING [{f['signature']}] x{f['count']}: {f.get('baseline_detail', '')}"
                                     for f in campaign_row.pre_existing]
                                  + [f"FLAKY [{f['signature']}] x{f['count']}: {f['file']}"
                                     for f in campaign_row.flaky]),
            properties={"cases": str(campaign_row.cases), "planned_cases": str(campaign_row.planned_cases),
                        "case_ids_sha256": campaign_row.case_ids_sha256,
                        "known": str(len(campaign_row.known_failures)), "flaky": str(len(campaign_row.flaky)),
                        "pre_existing": str(len(campaign_row.pre_existing))}))
    for isa_row in report.isa:
        cases.append(JUnitCase(
            name=isa_row.name, classname="gate.isa", seconds=isa_row.seconds,
            failure_message=isa_row.reason if isa_row.status == FAILED else None,
            failure_text=f"report: {isa_row.report_json}" if isa_row.status == FAILED else "",
            skipped_message=isa_row.reason if isa_row.status == SKIPPED else None,
            system_out=f"{isa_row.kernels} kernel instantiations, {isa_row.failing} failing"
            if isa_row.status != SKIPPED else ""))
    return cases
