"""The AOT kvcacheio build recipe (hicache_fuzz.kernels.aot_build) on a CPU machine: the pinned source list, the
registered schemas against the ops sglang's Python calls, the stand-in's wrappers against those schemas, and
the reasons the loader and the backends give when nothing is built."""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import re
from pathlib import Path

import pytest

from hicache_fuzz.kernels.aot_build import fetch_sources, loader
from hicache_fuzz.kernels.aot_build.fetch_sources import PinnedFile, SourceError, git_blob_id, load_manifest, verify

AOT_BUILD = Path(fetch_sources.__file__).parent
REGISTRATION = AOT_BUILD / "csrc" / "register.cc"
STANDIN_KVCACHEIO = AOT_BUILD / "sgl_kernel_standin" / "sgl_kernel" / "kvcacheio.py"
WHEEL_FACTS = AOT_BUILD / "wheel_0_4_10.json"
FETCHED = Path(__file__).resolve().parents[2] / fetch_sources.DEFAULT_DEST
NOT_BUILT_HERE = {"copy_all_layer_kv_cache_cpu"}  # a CPU-backend op of sglang-kernel, not a kvcacheio transfer


def registered_schemas() -> dict[str, list[str]]:
    """op name -> argument names, from the m.def(...) strings of register.cc (string pieces joined)."""
    text = REGISTRATION.read_text(encoding="utf-8")
    schemas: dict[str, list[str]] = {}
    for call in re.findall(r"m\.def\(((?:\s*\"[^\"]*\")+)", text):
        schema = "".join(re.findall(r"\"([^\"]*)\"", call))
        name, args = re.match(r"(\w+)\((.*)\)\s*->", schema).groups()  # type: ignore[union-attr]
        schemas[name] = [a.split()[-1] for a in args.split(",")]
    return schemas


def ops_called(source: str) -> set[str]:
    """Names X of every torch.ops.sgl_kernel.X reached in a Python file."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner = node.value
            if inner.attr == "sgl_kernel" and isinstance(inner.value, ast.Attribute) and inner.value.attr == "ops":
                names.add(node.attr)
    return names


# ---- the pinned source list ---------------------------------------------------------------------------------


def test_manifest_is_well_formed_and_pins_the_build_source() -> None:
    repository, commit, files = load_manifest()
    assert repository == "sgl-project/sglang"
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    build = [f for f in files if f.role == "build"]
    assert [f.path for f in build] == ["python/sglang/kernels/aot/csrc/kvcacheio/transfer.cu"]
    assert build[0].commit == commit  # the compiled file is downloaded at the pinned commit
    for pinned in files:
        assert re.fullmatch(r"[0-9a-f]{64}", pinned.sha256) and re.fullmatch(r"[0-9a-f]{40}", pinned.git_blob)
        assert pinned.size > 0 and not Path(pinned.path).is_absolute()


@pytest.mark.parametrize("field,value,message", [
    ("commit", "main", "commit"),
    ("repository", "sglang", "owner/name"),
])
def test_manifest_rejects_malformed_pins(tmp_path: Path, field: str, value: str, message: str) -> None:
    data = json.loads(fetch_sources.MANIFEST.read_text())
    data[field] = value
    bad = tmp_path / "sources.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(SourceError, match=message):
        load_manifest(bad)


def test_manifest_rejects_paths_escaping_the_destination(tmp_path: Path) -> None:
    data = json.loads(fetch_sources.MANIFEST.read_text())
    data["files"][0]["path"] = "../../etc/passwd"
    bad = tmp_path / "sources.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(SourceError, match="relative"):
        load_manifest(bad)


def test_verify_accepts_only_the_pinned_bytes() -> None:
    content = b"__global__ void k() {}\n"
    pinned = PinnedFile("x.cu", "build", hashlib.sha256(content).hexdigest(), git_blob_id(content), len(content),
                        None, None)
    verify(pinned, content)
    with pytest.raises(SourceError, match=r"x\.cu: content differs"):
        verify(pinned, content.replace(b"\n", b"\r\n"))


def test_git_blob_id_matches_git() -> None:
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git hash-object /dev/null


def test_fetch_from_a_folder_verifies_and_refuses_other_content(tmp_path: Path) -> None:
    content = b"int transfer;\n"
    manifest = tmp_path / "sources.json"
    manifest.write_text(json.dumps({
        "repository": "sgl-project/sglang", "commit": "0" * 40,
        "files": [{"path": "a/transfer.cu", "role": "build", "commit": None, "bytes": len(content),
                   "sha256": hashlib.sha256(content).hexdigest(), "git_blob": git_blob_id(content)}],
    }))
    source = tmp_path / "carried" / "a"
    source.mkdir(parents=True)
    (source / "transfer.cu").write_bytes(content)
    dest = tmp_path / "dest"
    written = fetch_sources.fetch(dest, from_dir=tmp_path / "carried", manifest=manifest)
    assert written == [dest / "a" / "transfer.cu"] and written[0].read_bytes() == content
    (dest / "a" / "transfer.cu").write_bytes(b"tampered\n")
    with pytest.raises(SourceError, match="content differs"):
        fetch_sources.fetch(dest, check_only=True, manifest=manifest)


# ---- the registration against what sglang's Python calls ----------------------------------------------------


def test_registered_schemas_are_the_wheels() -> None:
    """register.cc declares exactly the kvcacheio schemas of the sglang-kernel 0.4.10 wheel (read from it);
    spacing aside, which torch's schema parser ignores (upstream writes some as ``)->()``)."""
    wheel = json.loads(WHEEL_FACTS.read_text())["schemas"]
    text = REGISTRATION.read_text(encoding="utf-8")
    declared = {
        re.sub(r"\s+", "", "".join(re.findall(r"\"([^\"]*)\"", call)))
        for call in re.findall(r"m\.def\(((?:\s*\"[^\"]*\")+)", text)
    }
    assert declared == {re.sub(r"\s+", "", s) for s in wheel}
    assert len(declared) == 15


def test_every_registered_op_has_a_cuda_impl_or_a_catch_all_kernel() -> None:
    text = REGISTRATION.read_text(encoding="utf-8")
    implemented = set(re.findall(r"m\.impl\(\"(\w+)\"", text))
    catch_all = set(re.findall(r"m\.def\(\"(\w+)\([^;]*?,\s*&\w+\);", text, flags=re.S))
    assert implemented | catch_all == set(registered_schemas())
    assert catch_all == {"get_device_accessible_ptr"}


@pytest.mark.skipif(
    not (FETCHED / "python/sglang/kernels/aot/python/sgl_kernel/kvcacheio.py").is_file(),
    reason="sglang-kernel's kvcacheio.py is not fetched here (python -m hicache_fuzz.kernels.aot_build.fetch_sources)",
)
def test_registration_covers_every_op_sglang_kernels_python_calls() -> None:
    source = (FETCHED / "python/sglang/kernels/aot/python/sgl_kernel/kvcacheio.py").read_text(encoding="utf-8")
    called = ops_called(source)
    assert "transfer_kv_per_layer" in called  # the parser sees the calls at all
    assert called - NOT_BUILT_HERE == set(registered_schemas())


def test_standin_wrappers_match_the_schemas_and_call_the_op_they_are_named_after() -> None:
    """Each stand-in wrapper takes the schema's arguments in the schema's order (sglang calls them by
    keyword) and calls torch.ops.sgl_kernel.<its own name>."""
    source = STANDIN_KVCACHEIO.read_text(encoding="utf-8")
    tree = ast.parse(source)
    schemas = registered_schemas()
    wrappers = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)
                and not node.name.startswith("_")}
    assert set(schemas) <= set(wrappers)
    for name, arguments in schemas.items():
        node = wrappers[name]
        assert [a.arg for a in node.args.args] == arguments, name
        called = {c.args[0].value for c in ast.walk(node) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Name) and c.func.id == "_op" and isinstance(c.args[0], ast.Constant)}
        assert called == {name}, name


def test_standin_wrapper_without_the_library_says_how_to_load_it() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("standin_kvcacheio_probe", STANDIN_KVCACHEIO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch

    if hasattr(torch.ops.sgl_kernel, "transfer_kv_per_layer"):
        pytest.skip("an sgl_kernel library is loaded in this process")
    with pytest.raises(NotImplementedError, match="load the AOT build"):
        module.transfer_kv_per_layer(*([None] * 6), item_size=8)
    assert inspect.signature(module.transfer_kv_per_layer_mla).parameters["block_quota"].default is None


# ---- loader and backend reasons -----------------------------------------------------------------------------


def test_loader_reports_not_built_with_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loader.BUILD_ENV, str(tmp_path))
    state = loader.read_build()
    assert not state.available and state.source == "none"
    assert "not built" in state.reason and str(tmp_path) in state.reason


def test_loader_refuses_a_build_for_another_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hicache_fuzz_kvcacheio.so").write_bytes(b"")
    (tmp_path / "build_info.json").write_text(json.dumps({"torch": "0.0.1", "library": "hicache_fuzz_kvcacheio.so"}))
    monkeypatch.setenv(loader.BUILD_ENV, str(tmp_path))
    state = loader.read_build()
    assert not state.available and "built for torch 0.0.1" in state.reason and "rebuild" in state.reason


def test_loader_describes_a_build_with_path_commit_and_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    (tmp_path / "hicache_fuzz_kvcacheio.so").write_bytes(b"")
    info = {"torch": torch.__version__, "cuda": "13.0", "arch": "9.0", "built_at": "2026-12-01T00:00:00Z",
            "library": "hicache_fuzz_kvcacheio.so",
            "upstream": {"repository": "sgl-project/sglang", "commit": "01068614cf2615fb5680354ba9fefdfc9e22a56d"}}
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    monkeypatch.setenv(loader.BUILD_ENV, str(tmp_path))
    state = loader.read_build()
    assert state.available and state.source == "aot-build"
    for expected in (str(tmp_path / "hicache_fuzz_kvcacheio.so"), "sgl-project/sglang@01068614cf26",
                     f"torch {torch.__version__}", "CUDA 13.0"):
        assert expected in state.reason


def test_aot_backend_probe_names_the_build_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.kernels.sglang_aot import SglangAotBackend
    from hicache_fuzz.oracles.contract import Platform

    monkeypatch.setenv(loader.BUILD_ENV, str(tmp_path))
    availability = SglangAotBackend().probe(Platform(kind="cpu"))
    assert not availability.available
    assert "AOT ops: no AOT build in" in availability.reason and "not built" in availability.reason


def test_routing_replaces_the_kvcacheio_of_the_gpu_bundles_stand_in() -> None:
    """The GPU bundle's import-only ``sgl_kernel`` (docs/gpu/sgl_kernel_stub) also declares itself a hicache-fuzz
    stand-in; its ``kvcacheio`` placeholders raise. Once the built ops are routed, sglang's late imports
    (``from sgl_kernel.kvcacheio import get_device_accessible_ptr`` while a host pool builds its pointer tables)
    must get the forwarding wrappers, not the placeholders."""
    import os
    import subprocess
    import sys

    stub = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "sgl_kernel_stub"
    code = (
        "import sgl_kernel\n"
        "from hicache_fuzz.kernels.aot_build import loader\n"
        "assert loader._is_standin(sgl_kernel) and not loader._is_ours(sgl_kernel)\n"
        "loader._route_kvcacheio(sgl_kernel)\n"
        "from sgl_kernel.kvcacheio import get_device_accessible_ptr, transfer_kv_per_layer\n"
        "print(get_device_accessible_ptr.__module__, get_device_accessible_ptr.__code__.co_filename)\n"
        "print(type(transfer_kv_per_layer).__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(stub), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    module_line, kind = done.stdout.splitlines()
    assert module_line.split()[1] == str(STANDIN_KVCACHEIO.resolve())
    assert kind == "function"
