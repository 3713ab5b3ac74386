"""JUnit XML from results the harness computed itself, not from pytest's per-test bookkeeping.

Under pytest-xdist, Hypothesis adds nothing to the JUnit report and each worker only knows its own tests, so
a campaign's findings would be invisible to CI dashboards. Tools build :class:`JUnitCase` rows from merged
results (see :func:`hicache_fuzz.harness.reporting.merge.junit_cases`) and call :func:`write_junit`; one row per
backend x failure signature (or per shard) keeps the report meaningful however the work was spread.
"""

from __future__ import annotations

import io
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hicache_fuzz.harness.model.output_paths import write_bytes_atomic

# XML 1.0 forbids most control characters; kernel error text occasionally carries them.
_XML_INVALID = {c: None for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)}


@dataclass(frozen=True)
class JUnitCase:
    name: str
    classname: str
    seconds: float = 0.0
    failure_message: str | None = None  # set: the case failed (one line, shown by CI dashboards)
    failure_text: str = ""  # details: counts, reproducer paths, the replay command
    skipped_message: str | None = None
    system_out: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)


def _clean(text: str) -> str:
    return text.translate(_XML_INVALID)


def junit_element(suite_name: str, cases: Sequence[JUnitCase]) -> ET.Element:
    failures = sum(1 for c in cases if c.failure_message is not None)
    skipped = sum(1 for c in cases if c.failure_message is None and c.skipped_message is not None)
    total_seconds = sum(c.seconds for c in cases)
    suites = ET.Element("testsuites", name=_clean(suite_name), tests=str(len(cases)), failures=str(failures),
                        errors="0", skipped=str(skipped), time=f"{total_seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=_clean(suite_name), tests=str(len(cases)),
                          failures=str(failures), errors="0", skipped=str(skipped),
                          time=f"{total_seconds:.3f}")
    for case in cases:
        element = ET.SubElement(suite, "testcase", classname=_clean(case.classname), name=_clean(case.name),
                                time=f"{case.seconds:.3f}")
        if case.properties:
            properties = ET.SubElement(element, "properties")
            for key, value in sorted(case.properties.items()):
                ET.SubElement(properties, "property", name=_clean(key), value=_clean(str(value)))
        if case.failure_message is not None:
            failure = ET.SubElement(element, "failure", message=_clean(case.failure_message),
                                    type="fuzz-finding")
            failure.text = _clean(case.failure_text)
        elif case.skipped_message is not None:
            ET.SubElement(element, "skipped", message=_clean(case.skipped_message))
        if case.system_out:
            ET.SubElement(element, "system-out").text = _clean(case.system_out)
    return suites


def write_junit(path: str | os.PathLike[str], suite_name: str, cases: Sequence[JUnitCase]) -> None:
    """Write one <testsuite> with a <testcase> per row; written to a temporary file and renamed, so a CI
    collector never reads half a file."""
    write_bytes_atomic(Path(path), junit_bytes(suite_name, cases))  # onto a regular file or a new path only


def junit_bytes(suite_name: str, cases: Sequence[JUnitCase]) -> bytes:
    """The JUnit XML document of one <testsuite>, indented, with its XML declaration."""
    tree = ET.ElementTree(junit_element(suite_name, cases))
    ET.indent(tree)
    buffer = io.BytesIO()
    tree.write(buffer, encoding="utf-8", xml_declaration=True)
    return buffer.getvalue()
