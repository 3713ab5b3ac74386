"""The HTML report (harness/reporting/html_report.py, harness/commands/report.py): rendered from a real 2-second CPU
campaign and from two recorded reports (tests/data: a CPU gate, a GPU campaign with five findings), parsed back
with html.parser; sections, heat-map cells, failure rows and links must match the report they came from."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from hicache_fuzz.harness.commands.cli import main as report_main
from hicache_fuzz.harness.reporting.html_report import write_html

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


class Page(HTMLParser):
    """Collects section ids, elements by class, links and whether any script or remote resource appears."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.classes: dict[str, int] = {}
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        if tag == "section" and values.get("id"):
            self.sections.append(str(values["id"]))
        for name in (values.get("class") or "").split():
            self.classes[name] = self.classes.get(name, 0) + 1
        if tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))
        for key in ("src", "href"):
            assert not str(values.get(key) or "").startswith(("http:", "https:", "//")), values


@pytest.fixture(scope="module")
def campaign_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
    from hicache_fuzz.harness.model.platform import require
    from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
    from hicache_fuzz.kernels.registry import load_registry

    registry, machine = load_registry(), require("cpu")
    names = ["reference", "zoo-last-page-dropped"]
    corpus = tmp_path_factory.mktemp("campaign") / "corpus"
    config = CampaignConfig(names, seed=11, max_seconds=2.5, corpus_dir=corpus)
    report = run_campaign(config, [registry.get(n) for n in names], machine.platform,
                          InProcessExecutor(registry, machine))
    return report.to_dict()


def test_campaign_page(campaign_report: dict[str, Any], tmp_path: Path) -> None:
    out = write_html(campaign_report, tmp_path / "html" / "campaign.html")
    page = Page(out.read_text())
    assert page.sections == ["summary", "outcomes", "coverage", "values", "throughput", "failures"]
    values = campaign_report["coverage_values"]
    assert page.classes["value-row"] == sum(len(dims) for dims in values.values()) > 0
    assert "script" not in page.tags and "svg" in page.tags and "polyline" in page.tags
    assert len(campaign_report["timeline"]) >= 2
    assert page.classes["outcome-row"] == len(campaign_report["outcomes"]) == 2
    from hicache_fuzz.harness.reporting.coverage import REQUIRED

    cells = 0
    for dims in campaign_report["coverage"].values():
        names = {d for d in set(dims) | set(REQUIRED) if not d.startswith("pair:")}  # pairs: summarized
        cells += sum(len(set(dims.get(d, {})) | set(REQUIRED.get(d, ()))) for d in names)
    assert page.classes["cov"] == cells
    failures = campaign_report["unique_failures"]
    assert failures and page.classes["failure-row"] == len(failures)
    assert page.classes["bug"] == len({(f["backend"], f["outcome"]) for f in failures})
    for failure in failures:  # every reproducer is linked, relative to the page, and the link resolves
        target = [link for link in page.links if link.endswith(Path(failure["file"]).name)]
        assert target and (out.parent / target[0]).resolve() == Path(failure["file"]).resolve()


def test_gate_page_from_the_committed_gate_report(tmp_path: Path) -> None:
    report = json.loads((DATA / "gate-cpu.json").read_text())
    page = Page(write_html(report, tmp_path / "gate.html").read_text())
    assert page.sections == ["summary", "findings", "replay", "outcomes", "failures", "isa"]
    assert page.classes["replay-row"] == len(report["replay"])
    assert page.classes["isa-row"] == len(report["isa"])
    assert page.classes["pass"] >= 1 and "fail" not in page.classes  # a passing gate: no failure styling


def test_missing_reproducer_links_to_the_corpus_entry_with_its_signature(tmp_path: Path) -> None:
    report = json.loads((DATA / "gpu-campaign.json").read_text())
    out = tmp_path / "gpu.html"
    assert report_main(["report", str(DATA / "gpu-campaign.json"), "--html", str(out),
                        "--corpus", str(ROOT / "corpus" / "sglang")]) == 0
    page = Page(out.read_text())
    scripts = [link for link in page.links if link.endswith(".standalone.py")]
    assert len(scripts) == len({f["signature"] for f in report["unique_failures"]}) == 5
    assert all((out.parent / link).exists() for link in page.links)


@pytest.mark.parametrize("content, message", [("{", "not valid JSON"), ('{"a": 1}', "not a hicache-fuzz"),
                                              ("[1]", "expected a JSON object")])
def test_bad_input_exits_2(tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert report_main(["report", str(bad), "--html", str(tmp_path / "x.html")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_report_is_a_cli_subcommand() -> None:
    from hicache_fuzz.harness.commands.cli import SUBCOMMANDS

    assert ("report", "hicache_fuzz.harness.commands.report") in [(name, module) for name, module, _ in SUBCOMMANDS]
