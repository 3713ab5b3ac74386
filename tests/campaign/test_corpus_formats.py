"""Corpus files: a bare case may list several backends ("backends": [...]), standing for one case each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_fuzz.harness.findings.corpus import CorpusError, load_corpus, load_entries, load_entry
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope

CASE = Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST,
            pools=(PoolSpec(),), layers=1, page_size=2, device_rows=6, host_slots=4, host_indices=(0, 1),
            device_indices=(2, 3))


def write(path: Path, data: dict[str, object]) -> Path:
    path.write_text(json.dumps(data))
    return path


def multi(backends: object) -> dict[str, object]:
    data: dict[str, object] = {k: v for k, v in CASE.to_dict().items() if k != "backend"}
    data["backends"] = backends
    return data


def test_a_backends_list_is_one_entry_per_backend(tmp_path: Path) -> None:
    path = write(tmp_path / "seed.json", multi(["reference", "zoo-drop-last-page"]))
    entries = load_entries(path)
    assert [e.case.backend for e in entries] == ["reference", "zoo-drop-last-page"]
    assert all(e.case == CASE.replace(backend=e.case.backend) and e.path == path for e in entries)
    assert [e.case.backend for e in load_corpus([tmp_path])] == ["reference", "zoo-drop-last-page"]
    with pytest.raises(CorpusError, match="lists 2 backends"):
        load_entry(path)


def test_a_single_backend_file_reads_as_before(tmp_path: Path) -> None:
    path = write(tmp_path / "one.json", CASE.to_dict())
    assert load_entry(path).case == CASE and len(load_entries(path)) == 1


@pytest.mark.parametrize("backends", [[], "reference", ["reference", "reference"], ["reference", ""], [3]])
def test_a_bad_backends_list_is_an_error_naming_the_file(tmp_path: Path, backends: object) -> None:
    path = write(tmp_path / "bad.json", multi(backends))
    with pytest.raises(CorpusError, match=r"bad\.json.*backends"):
        load_entries(path)


def test_backend_and_backends_together_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "both.json", {**multi(["reference"]), "backend": "reference"})
    with pytest.raises(CorpusError, match="not both"):
        load_entries(path)
