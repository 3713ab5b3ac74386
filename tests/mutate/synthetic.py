"""The synthetic sglang tree the mutate tests generate and run mutants on (no compiling, no network)."""

from __future__ import annotations

from pathlib import Path

from hicache_fuzz.harness.commands.cli import main as cli_main
from hicache_fuzz.harness.mutate import sources
from hicache_fuzz.harness.mutate.mutant import Mutant

CUH = "sglang/kernels/jit/csrc/kvcacheio/hicache.cuh"
PY = "sglang/kernels/ops/kvcache/hicache.py"
CUH_TEXT = """\
#pragma once
#include <cstdint>
// a comment with i < n and k_src, v_src
template <typename T, int kUnroll>
__global__ void copy_rows(const T* __restrict__ k_src, const T* __restrict__ v_src, T* k_dst, T* v_dst,
                          const int64_t* src_idx, const int64_t* dst_idx, uint32_t n, uint32_t page) {
  __shared__ int64_t slots[32];
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    slots[i % 32] = src_idx[i];
    __syncthreads();
    const auto off = static_cast<int64_t>(dst_idx[i]) * page + 1;
    k_dst[off] = k_src[slots[i % 32]];
    v_dst[off] = v_src[slots[i % 32]];
  }
  const char* msg = "i < n";
}
"""
PY_TEXT = """\
import torch

PAGE = 16


def transfer(k_src, v_src, k_dst, v_dst, src_idx, dst_idx):
    n = src_idx.numel()
    for i in range(n):
        if src_idx[i] >= 0:
            k_dst[dst_idx[i]] = k_src[src_idx[i]]
            v_dst[dst_idx[i]] = v_src[src_idx[i]]
    torch.cuda.synchronize()
    return dst_idx.to(torch.int64) % PAGE
"""
CONTROLLER_TEXT = """\
LIMIT = 3


def status_text(x):
    return x + 1


def load_pages(host_indices, device_indices):
    return host_indices[device_indices] + 1
"""
SYNC_PRESENT = f'grep -q "__syncthreads();" "$HICACHE_MUTATE_SGLANG_ROOT/{CUH}"'


def all_mutants(root: Path) -> list[Mutant]:
    return sources.generate_all(root, sources.default_sources(root))


def one_mutant(mutants: list[Mutant], file: str, operator: str, line: int, original: str) -> Mutant:
    found = [m for m in mutants if m.file == file and m.operator == operator and m.line == line
             and m.original == original]
    assert found, f"no {operator} mutant of {original!r} on {file}:{line}"
    return found[0]


def run_mutate(*argv: str | Path) -> int:
    return cli_main(["mutate", *(str(a) for a in argv)])


