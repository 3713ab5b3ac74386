"""Write the seed corpus (corpus/seeds/<name>.json): real model geometries and the upstream tests' cases.

Run from the repository root: ``python corpus/make_seeds.py`` (deterministic; rewrites corpus/seeds/).

* Model geometries (KV heads x head dim, dtype): Llama-3-8B MHA 8x128 bf16; Qwen2.5-72B 8x128 bf16 with all
  80 layers but only a few tokens (and a variant with layers scaled down to 8 and more pages), so both fit
  CPU memory; DeepSeek-V3 MLA 576 elements in bf16 (1152 B rows) and fp8 (576 B); GLM-4.5's 656-byte rows
  (MLA bf16, 328 elements); a MiMo-V2-style asymmetric K/V pool (K 192, V 128 dims). Layer counts are scaled
  down (each case's note says so) to keep CPU replay fast; the row geometry is the model's.
* The upstream tests' cases (sglang's test/registered/jit/test_hicache.py and
  test_hicache_page_first_write_back.py, sgl-kernel's tests/test_kvcacheio.py; README, "Upstream tests"):
  2 layers, MHA element dims 128 and 512, MLA 576, bf16, page counts 1/64/65/129, page size 16, plus
  reversed host pages.

Every seed runs on the CPU "reference" backend and on each sglang backend (kernels/sglang_backends.py) whose
plan and contract accept it on an sm90 CUDA GPU (replay skips those on machines without one). Each distinct
case is stored once, as a bare case file whose ``"backends"`` lists every backend it applies to (a backend
that needs the host indices pinned gets its own file, ``<name>-host-pinned.json``; docs/corpus.md). Seeds
are expected to pass.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.oracles.contract import Platform, Verdict, predict

SEEDS = Path(__file__).resolve().parent / "seeds"
GPU = Platform("cuda", (9, 0))  # H100/H200: the platform the sglang copies are checked against


def pages_case(name: str, pool: PoolSpec, layout: HostLayout, direction: Direction, pages: int, page_size: int,
               layers: int, note: str, scope: Scope = Scope.ALL_LAYERS, reversed_host: bool = False,
               layer: int = 0) -> tuple[str, Case]:
    """`pages` whole pages; host pages 0.. (or reversed), device pages from 1 (page 0 is sglang's padding)."""
    host_pages = list(range(pages))
    if reversed_host:
        host_pages.reverse()
    device_pages = list(range(1, pages + 1))
    case = Case(
        direction=direction, scope=scope, layout=layout, pools=(pool,), layers=layers, page_size=page_size,
        device_rows=(pages + 2) * page_size, host_slots=(pages + 1) * page_size, layer=layer,
        host_indices=tuple(p * page_size + t for p in host_pages for t in range(page_size)),
        device_indices=tuple(p * page_size + t for p in device_pages for t in range(page_size)),
        seed=len(name), note=note,
    )
    return name, case


def model_seeds() -> Iterator[tuple[str, Case]]:
    llama = PoolSpec(heads=8, head_dim=128)
    note = "Llama-3-8B MHA 8x128 bf16; 32 layers scaled down to 2"
    for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD):
        yield pages_case(f"llama3-8b-{layout.value}-write-back", llama, layout, Direction.WRITE_BACK, 3, 64, 2, note)
        yield pages_case(f"llama3-8b-{layout.value}-load-back-one-layer", llama, layout, Direction.LOAD_BACK, 3, 64,
                         2, note, scope=Scope.ONE_LAYER, layer=1)
    qwen = PoolSpec(heads=8, head_dim=128)
    yield pages_case("qwen2.5-72b-80-layers", qwen, HostLayout.PAGE_FIRST, Direction.WRITE_BACK, 4, 1, 80,
                     "Qwen2.5-72B MHA 8x128 bf16, all 80 layers; only 4 tokens (page size 1) to fit CPU memory")
    yield pages_case("qwen2.5-72b-layer-first-load-back", qwen, HostLayout.LAYER_FIRST, Direction.LOAD_BACK, 9, 16, 8,
                     "Qwen2.5-72B MHA 8x128 bf16; 80 layers scaled down to 8 to fit CPU memory")
    for dtype, size in ((KVDtype.BF16, 1152), (KVDtype.FP8, 576)):
        mla = PoolSpec(attention=Attention.MLA, dtype=dtype, heads=1, head_dim=576)
        note = f"DeepSeek-V3 MLA 576 elements {dtype.value} ({size} B rows); 61 layers scaled down to 2"
        for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
            yield pages_case(f"deepseek-v3-mla-{dtype.value}-{layout.value}-write-back", mla, layout,
                             Direction.WRITE_BACK, 2, 64, 2, note)
            yield pages_case(f"deepseek-v3-mla-{dtype.value}-{layout.value}-load-back", mla, layout,
                             Direction.LOAD_BACK, 2, 64, 2, note)
    glm = PoolSpec(attention=Attention.MLA, dtype=KVDtype.BF16, heads=1, head_dim=328)
    note = "GLM-4.5-style 656-byte rows (MLA bf16, 328 elements); layers scaled down to 2"
    for direction in Direction:
        yield pages_case(f"glm-656b-page-first-{direction.value}", glm, HostLayout.PAGE_FIRST, direction, 4, 16, 2,
                         note)
    mimo = PoolSpec(attention=Attention.MHA_ASYM, heads=4, head_dim=192, v_head_dim=128)
    note = "MiMo-V2-style asymmetric K/V (K 4x192, V 4x128 bf16); layers scaled down to 2"
    for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        for direction in Direction:
            yield pages_case(f"mimo-v2-asym-{layout.value}-{direction.value}", mimo, layout, direction, 2, 16, 2, note)


def upstream_seeds() -> Iterator[tuple[str, Case]]:
    note = "upstream test_kvcacheio/test_hicache sweep: 2 layers, bf16, page size 16"
    pools = {"mha128": PoolSpec(heads=1, head_dim=128), "mha512": PoolSpec(heads=1, head_dim=512),
             "mla576": PoolSpec(attention=Attention.MLA, heads=1, head_dim=576)}
    for label, pool in pools.items():
        for pages in (1, 64, 65, 129):
            for direction in Direction:
                yield pages_case(f"upstream-{label}-{pages}p-{direction.value}", pool, HostLayout.LAYER_FIRST,
                                 direction, pages, 16, 2, f"{note}; {pages} pages")
        yield pages_case(f"upstream-{label}-65p-reversed-host-load-back", pool, HostLayout.PAGE_FIRST,
                         Direction.LOAD_BACK, 65, 16, 2, f"{note}; 65 pages, host pages reversed", reversed_host=True)


def sglang_variants(case: Case) -> Iterator[Case]:
    """The case as given, then with host indices pinned on the CPU (what the staged write-back takes)."""
    yield case
    yield case.replace(host_index=IndexSpec(device=IndexDevice.PINNED))


def sglang_copies(case: Case) -> Iterator[Case]:
    try:
        from hicache_fuzz.kernels.sglang_backends import BACKENDS
    except ImportError:
        return
    for backend_class in BACKENDS:
        backend = backend_class()
        for variant in sglang_variants(case.replace(backend=backend.name)):
            if backend.unsupported_reason(variant, GPU) is not None:
                continue
            if predict(variant, backend.plan(variant, GPU).entry, GPU).verdict is Verdict.ACCEPT:
                yield variant
                break


def seed_json(case: Case, backends: list[str]) -> str:
    """The case's JSON with ``"backends"`` in place of ``"backend"``, one top-level field per line."""
    data = {k: v for k, v in case.to_dict().items() if k != "backend"}
    data["backends"] = backends
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                               for k, v in sorted(data.items())) + "\n}\n"


def seed_files(name: str, case: Case) -> dict[str, tuple[Case, list[str]]]:
    """file name -> (case, backends): the reference case and its sglang copies, each distinct case once."""
    files: dict[str, tuple[Case, list[str]]] = {}
    for copy in (case, *sglang_copies(case)):
        pinned = copy.host_index.device is IndexDevice.PINNED and case.host_index.device is not IndexDevice.PINNED
        file_name = f"{name}-host-pinned.json" if pinned else f"{name}.json"
        stored, backends = files.setdefault(file_name, (copy.replace(backend="reference"), []))
        assert stored == copy.replace(backend="reference"), file_name  # one file, one case
        backends.append(copy.backend)
    return files


def main() -> None:
    if SEEDS.exists():
        shutil.rmtree(SEEDS)
    SEEDS.mkdir(parents=True)
    files = entries = 0
    for name, case in (*model_seeds(), *upstream_seeds()):
        for file_name, (stored, backends) in seed_files(name, case).items():
            (SEEDS / file_name).write_text(seed_json(stored, backends))
            files += 1
            entries += len(backends)
    print(f"wrote {files} seed files ({entries} case x backend entries) under {SEEDS}")


if __name__ == "__main__":
    main()
