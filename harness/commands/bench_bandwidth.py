"""The kernel-bandwidth measurement of ``hicache-fuzz bench --gpu`` (the command is
:mod:`hicache_fuzz.harness.commands.bench`; the pipeline measurements are
:mod:`hicache_fuzz.harness.commands.bench_measure`).

Per backend and path at realistic sizes (8 and 64 layers, 64 pages of 64 tokens, MHA rows of 2 KiB and MLA rows of
1152 bytes), next to the pinned ``copy_`` ceiling (H2D and D2H) of the same machine. Every transfer is byte-checked
against the oracle before it is timed, and again after.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace
from typing import Any

import torch

from hicache_fuzz.harness.commands.bench_measure import moved_bytes
from hicache_fuzz.harness.model import case as model
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.pipeline.compare import storages_equal
from hicache_fuzz.harness.pipeline.fill import fill_pattern
from hicache_fuzz.harness.pipeline.materialize import index_tensor, materialize
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.buffers import GUARD_BYTES, Materialized
from hicache_fuzz.kernels.registry import Registry
from hicache_fuzz.oracles.contract import Verdict, predict
from hicache_fuzz.oracles.transfer import apply_chunk_copies, chunk_copies

BANDWIDTH_BACKENDS = ("sglang-jit", "sglang-jit-register", "sglang-jit-tma", "sglang-staged", "sglang-page-unified")
BANDWIDTH_PAGES, BANDWIDTH_PAGE_SIZE = 64, 64
BANDWIDTH_GEOMETRIES = (
    ("mha-2KiB", PoolSpec(name="kv", attention=model.Attention.MHA, dtype=model.KVDtype.BF16, heads=8,
                          head_dim=128)),
    ("mla-1152B", PoolSpec(name="kv", attention=model.Attention.MLA, dtype=model.KVDtype.BF16, heads=1,
                           head_dim=576)),
)
# Index placements tried in order until the backend's contract accepts one (host side, device side).
INDEX_PLACEMENTS = (
    (model.IndexDevice.DEVICE, model.IndexDevice.DEVICE),
    (model.IndexDevice.PINNED, model.IndexDevice.DEVICE),
    (model.IndexDevice.CPU, model.IndexDevice.DEVICE),
    (model.IndexDevice.PINNED, model.IndexDevice.PINNED),
    (model.IndexDevice.CPU, model.IndexDevice.CPU),
)

@dataclass
class BandwidthRow:
    backend: str
    path: str
    geometry: str
    layers: int
    direction: str
    layout: str
    moved_bytes: int
    median_us: float
    best_us: float
    gb_per_s: float  # moved_bytes / median time, 1e9 bytes per second
    checked: str  # "ok" when the bytes matched the oracle before and after timing


def bandwidth_case(pool: PoolSpec, layers: int, direction: Direction, layout: HostLayout, backend: str,
                   seed: int) -> Case:
    """64 pages of 64 tokens, pages in a seeded random order on both sides (as an LRU cache leaves them)."""
    ps, pages = BANDWIDTH_PAGE_SIZE, BANDWIDTH_PAGES
    rng = random.Random(seed)
    host_pages = rng.sample(range(pages), pages)
    device_pages = rng.sample(range(1, pages + 1), pages)  # device page 0 is sglang's padding page
    return Case(direction=direction, scope=model.Scope.ALL_LAYERS, layout=layout,
                pools=(replace(pool, head_groups=1),), layers=layers, page_size=ps, device_rows=(pages + 1) * ps,
                host_slots=pages * ps, host_indices=tuple(p * ps + t for p in host_pages for t in range(ps)),
                device_indices=tuple(p * ps + t for p in device_pages for t in range(ps)),
                host_allocator=model.HostAllocator.PIN_MEMORY, backend=backend, seed=seed)


def _accepted_variant(case: Case, backend: Backend, machine: Machine) -> Case | None:
    """`case` with the first index placement the backend supports and its contract accepts, else None."""
    for host_device, device_device in INDEX_PLACEMENTS:
        variant = case.replace(host_index=model.IndexSpec(model.IndexDtype.INT64, host_device),
                               device_index=model.IndexSpec(model.IndexDtype.INT64, device_device),
                               backend=backend.name)
        if backend.unsupported_reason(variant, machine.platform) is not None:
            continue
        if predict(variant, backend.plan(variant, machine.platform).entry, machine.platform).verdict is Verdict.ACCEPT:
            return variant
    return None


def _with_indices(buffers: Materialized, case: Case) -> Materialized:
    """The same storages, handed over with `case`'s index placement."""
    host = index_tensor(case.host_indices, case.host_index.dtype, case.host_index.device, buffers.device, False)
    device = index_tensor(case.device_indices, case.device_index.dtype, case.device_index.device, buffers.device,
                          False)
    pools = [replace(pool, case=case) for pool in buffers.pools]
    return replace(buffers, case=case, pools=pools, host_indices=host, device_indices=device)


def _restore(buffers: Materialized, image: dict[str, torch.Tensor]) -> None:
    for storage in buffers.storages():
        storage.raw.copy_(image[storage.key])


def _check(buffers: Materialized, expected: dict[str, torch.Tensor]) -> bool:
    torch.cuda.synchronize(buffers.device)
    return storages_equal(expected, buffers.current_on(buffers.device))


def _time_runs(backend: Backend, buffers: Materialized, repeats: int) -> list[float]:
    """Seconds per backend.run (Python launch overhead included), timed with device events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backend.run(buffers)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def measure_bandwidth(machine: Machine, registry: Registry, repeats: int, seed: int,
                      layer_counts: tuple[int, ...],
                      backend_names: tuple[str, ...] = BANDWIDTH_BACKENDS) -> tuple[list[BandwidthRow], list[str]]:
    backends = [registry.get(n) for n in backend_names
                if n in registry.backends and registry.get(n).probe(machine.platform).available]
    rows: list[BandwidthRow] = []
    notes: list[str] = []
    for geometry, pool in BANDWIDTH_GEOMETRIES:
        layouts_for = [lay for lay in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT,
                                       HostLayout.PAGE_UNIFIED) if lay in _layouts(pool)]
        for layers in layer_counts:
            for direction in (Direction.LOAD_BACK, Direction.WRITE_BACK):
                for layout in layouts_for:
                    base = bandwidth_case(pool, layers, direction, layout, "reference", seed)
                    variants = [(b, v) for b in backends if (v := _accepted_variant(base, b, machine)) is not None]
                    if not variants:
                        continue
                    try:
                        buffers = materialize(base, machine.device)
                    except Exception as exc:  # e.g. out of memory: note it, measure the rest
                        notes.append(f"{geometry} L{layers} {direction.value} {layout.value}: materialize failed: "
                                     f"{type(exc).__name__}: {exc}"[:300])
                        continue
                    try:
                        # Whole, page-aligned pages: every semantics (per token, page runs, aligned pages)
                        # gives the same expected bytes, so one oracle image serves every backend.
                        image = buffers.snapshot_on(machine.device)
                        expected = {k: v.clone() for k, v in image.items()}
                        payloads = {k: v[GUARD_BYTES : v.numel() - GUARD_BYTES] for k, v in expected.items()}
                        apply_chunk_copies(base, chunk_copies(base, predict(
                            variants[0][1], variants[0][0].plan(variants[0][1], machine.platform).entry,
                            machine.platform).semantics), payloads, payloads)
                        for backend, variant in variants:
                            rows.append(_bandwidth_row(backend, variant, buffers, image, expected, machine, repeats,
                                                       geometry, notes))
                    finally:
                        buffers.release()
                        torch.cuda.empty_cache()
    return rows, notes


def _layouts(pool: PoolSpec) -> frozenset[HostLayout]:
    from hicache_fuzz.harness.model.case import LAYOUTS_BY_ATTENTION

    return LAYOUTS_BY_ATTENTION[pool.attention]


def _bandwidth_row(backend: Backend, variant: Case, buffers: Materialized, image: dict[str, torch.Tensor],
                   expected: dict[str, torch.Tensor], machine: Machine, repeats: int, geometry: str,
                   notes: list[str]) -> BandwidthRow:
    plan = backend.plan(variant, machine.platform)
    row = BandwidthRow(backend.name, plan.path, geometry, variant.layers, variant.direction.value,
                       variant.layout.value, moved_bytes(variant), 0.0, 0.0, 0.0, "not run")
    handed = _with_indices(buffers, variant)
    try:
        _restore(buffers, image)
        row.path = backend.run(handed) or plan.path
        if not _check(buffers, expected):
            row.checked = "MISMATCH before timing"
            return row
        times = _time_runs(backend, handed, repeats)
        row.checked = "ok" if _check(buffers, expected) else "MISMATCH after timing"
    except Exception as exc:
        row.checked = f"error: {type(exc).__name__}: {exc}"[:300]
        notes.append(f"{backend.name} {geometry} L{variant.layers} {variant.direction.value} "
                     f"{variant.layout.value}: {row.checked}")
        return row
    median = statistics.median(times)
    row.median_us, row.best_us = round(median * 1e6, 1), round(min(times) * 1e6, 1)
    row.gb_per_s = round(row.moved_bytes / median / 1e9, 2) if median > 0 else 0.0
    return row


def measure_copy_ceiling(machine: Machine, nbytes: int, repeats: int) -> dict[str, Any]:
    """Pinned host <-> device copy_ of `nbytes` (one contiguous block), median GB/s per direction. The
    destination is zeroed first and compared with the pattern after timing, so every timed copy moved bytes."""
    pattern = torch.empty(nbytes, dtype=torch.uint8, device=machine.device)
    fill_pattern(pattern, 0x5EED)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device=machine.device)
    out: dict[str, Any] = {"bytes": nbytes}
    for name, dst, src in (("h2d", device, host), ("d2h", host, device)):
        src.copy_(pattern)
        dst.zero_()
        torch.cuda.synchronize(machine.device)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        ok = torch.equal(dst.to(machine.device), pattern)
        median = statistics.median(times)
        out[name] = {"gb_per_s": round(nbytes / median / 1e9, 2), "median_us": round(median * 1e6, 1),
                     "checked": "ok" if ok else "MISMATCH"}
    del pattern, host, device
    torch.cuda.empty_cache()
    return out
