"""The gate's Markdown summary (harness/commands/gate_report.py render_markdown): every section, in its order.

The report is built by hand, so every section shows up without running a gate: findings with their reproducers,
skips, known, pre-existing, flaky, fixed and expected failures, GPU sharing and the baseline line.
"""

from __future__ import annotations

from hicache_fuzz.harness.commands.gate_report import (
    EXPECTED,
    FAILED,
    FIXED,
    FLAKY,
    PASSED,
    SKIPPED,
    CampaignRow,
    GateReport,
    IsaRow,
    ReplayRow,
    render_markdown,
)


def full_report() -> GateReport:
    report = GateReport("cuda", "test GPU", 7, 60.0, 15, "hicache-fuzz gate --platform cuda", False, ["corpus"])
    report.replay = [
        ReplayRow("corpus/pass.json", "p0", "sglang-jit", PASSED, "pass"),
        ReplayRow("corpus/fail.json", "f0", "sglang-jit", FAILED, "mismatch", "sig-f", reason="bytes differ",
                  artifact="gate-artifacts/replay/sig-f/f0.json"),
        ReplayRow("corpus/gpu.json", "s0", "sglang-aot", SKIPPED, reason="no GPU"),
        ReplayRow("corpus/gpu2.json", "s1", "sglang-aot", SKIPPED, reason="no GPU"),
        ReplayRow("corpus/xfail.json", "x0", "sglang-jit", EXPECTED, "crash", "sig-x", "fail [sig-x]"),
        ReplayRow("corpus/xpass.json", "x1", "sglang-jit", FIXED, "pass", "", "fail [sig-y]"),
        ReplayRow("corpus/flaky.json", "l0", "sglang-jit", FLAKY, "pass", reason="passed alone"),
    ]
    new = {"signature": "sig-new", "count": 3, "summary": "new bug", "file": "gate-artifacts/campaign/n.json"}
    known = {"signature": "sig-known", "count": 2, "known": "corpus/k.json", "trigger": {}}
    flaky = {"signature": "sig-flaky", "count": 1, "summary": "flaked", "file": "fl.json"}
    pre = {"signature": "sig-pre", "count": 4, "summary": "on the baseline too"}
    report.campaign = [CampaignRow("sglang-jit", 15, 15, FAILED, {"mismatch": 5, "pass": 10}, [new], [known],
                                   flaky=[flaky], pre_existing=[pre])]
    report.isa = [IsaRow("rocm gfx942 strict", "rocm", "gfx942", True, PASSED, 52, sglang_version="0.5.23"),
                  IsaRow("rocm gfx950 strict", "rocm", "gfx950", True, SKIPPED, reason="no clang >= 20")]
    report.seconds = {"setup": 1.0, "total": 2.0}
    report.gpu_sharing = {"mode": "mps", "reason": "a private MPS server"}
    report.baseline = {"baseline": "/opt/sglang-base", "cases": 3, "seconds": 4.0}
    return report


def test_every_section_in_order() -> None:
    text = render_markdown(full_report())
    order = [
        "## HiCache fuzz gate (cuda): **FAIL**",
        "| check | result |",
        "| corpus replay | FAIL | 1 | 1 | 1 | 1 | 1 | 2 ",
        "| campaign `sglang-jit` | FAIL | 9 | 3 | 2 | 1 | 0 | 0 ",
        "| ISA rocm gfx942 strict | PASS ",
        "| ISA rocm gfx950 strict | SKIPPED ",
        "Wall time: setup 1 s, total 2 s.",
        "GPU sharing: mps",
        "Baseline: /opt/sglang-base: 3 reproducers replayed in 4 s.",
        "### Findings",
        "- `gate-artifacts/replay/sig-f/f0.json`",
        "- `gate-artifacts/campaign/n.json`",
        "### Skipped",
        "- 2 corpus entries: no GPU",
        "- ISA rocm gfx950 strict: no clang >= 20",
        "1 ISA check(s) skipped without `--allow-skip-isa`",
        "### Known failures met by the campaign (1)",
        "### Pre-existing: fail the same way on the baseline (1)",
        "### Flaky: failed, then passed when re-run alone (2)",
        "### Fixed: expected failures that no longer fail (1)",
        "- `corpus/xpass.json` [sglang-jit]: fail [sig-y]",
        "Expected failures reproduced (1)</summary>",
        "- `corpus/xfail.json` [sglang-jit]: sig-x",
        "</details>",
    ]
    missing = [line for line in order if line not in text]
    assert not missing
    positions = [text.find(line) for line in order]
    assert positions == sorted(positions)
    assert text.endswith("</details>\n")


def test_a_clean_report_has_no_sections() -> None:
    report = GateReport("cpu", "CPU", 1, 60.0, 4, "hicache-fuzz gate --platform cpu", False, ["corpus"])
    report.replay = [ReplayRow("corpus/pass.json", "p0", "reference", PASSED, "pass")]
    text = render_markdown(report)
    assert "## HiCache fuzz gate (cpu): **PASS**" in text and "###" not in text and "<details>" not in text
