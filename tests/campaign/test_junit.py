"""JUnit XML written from merged results: parseable, counted, one testcase per backend x signature."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hicache_fuzz.harness.reporting.junit import JUnitCase, write_junit
from hicache_fuzz.harness.reporting.merge import junit_cases


def test_write_junit_counts_failures_and_skips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "junit.xml"
    write_junit(path, "hicache-fuzz", [
        JUnitCase("campaign", "hicache_fuzz.reference", 1.25, system_out="pass 10"),
        JUnitCase("sig-1", "hicache_fuzz.reference", failure_message="mismatch x3: \x00bytes differ\x1b",
                  failure_text="reproducer: corpus/sig-1/abc.json", properties={"count": "3"}),
        JUnitCase("campaign", "hicache_fuzz.other", skipped_message="no cases"),
    ])
    root = ET.parse(path).getroot()  # control characters were dropped, so the file parses
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["campaign", "sig-1", "campaign"]
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "mismatch x3: bytes differ"
    assert failure.text == "reproducer: corpus/sig-1/abc.json"
    assert cases[1].find("properties/property[@name='count']") is not None
    assert cases[0].findtext("system-out") == "pass 10"
    assert cases[2].find("skipped") is not None
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_junit_cases_from_a_merged_report() -> None:
    report = {
        "seeds": [3], "shards": ["0/2", "1/2"], "backends": ["jit", "staged"],
        "outcomes": {"jit": {"pass": 90, "mismatch": 5}, "staged": {"pass": 40}},
        "unique_failures": [{"signature": "jit-mismatch-0123456789", "backend": "jit", "outcome": "mismatch",
                             "count": 5, "first_case_id": "c1", "first_index": 17, "summary": "row 3 differs",
                             "file": "out/corpus/jit-mismatch-0123456789/c1.json"}],
    }
    cases = junit_cases(report)
    assert [(c.classname, c.name, c.failure_message is not None) for c in cases] == [
        ("hicache_fuzz.jit", "campaign", False),
        ("hicache_fuzz.jit", "jit-mismatch-0123456789", True),
        ("hicache_fuzz.staged", "campaign", False),
    ]
    finding = cases[1]
    assert finding.failure_message == "mismatch x5: row 3 differs"
    assert "replay: hicache-fuzz replay out/corpus/jit-mismatch-0123456789/c1.json" in finding.failure_text
    assert "seed(s) 3" in finding.failure_text and "index 17" in finding.failure_text
    assert "95 cases" in cases[0].system_out


def test_a_backend_without_cases_is_skipped_not_passed() -> None:
    cases = junit_cases({"seed": 1, "backends": ["idle"], "outcomes": {}, "unique_failures": []})
    assert cases[0].skipped_message
