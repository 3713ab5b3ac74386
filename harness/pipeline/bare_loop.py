"""The bare-loop baseline: the least a byte-checked kernel test can do per case, measured on the same machine.

Fixed geometry, allocated once: an MLA-style device pool (``rows`` x ``row_bytes``, one layer) and a pinned host
pool. Each iteration draws random host and device indices on the device (``torch.randperm``: unique
destinations), takes the expected pool (a clone of the device pool with the host rows scattered in, computed
with torch on the device from a device copy of the host pool), runs sglang's real JIT load-back
(``transfer_hicache_one_layer_mla``: the register kernel, or TMA where sglang's gate picks it) and compares the
whole device pool with the expected one as uint8 (``torch.equal``, on the device). No case objects, no
contract, no worker: the harness's campaign rate divided by this rate is the share of kernel speed it keeps.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hicache_fuzz.kernels import sglang_common as common


def measure_bare_loop(seconds: float, device: torch.device, rows: int = 4096, row_bytes: int = 1024,
                      tokens: int = 256, seed: int = 0) -> dict[str, Any]:
    module = common.hicache()
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    element_dim = row_bytes // 2  # bf16 elements
    pool = torch.empty(rows * row_bytes, dtype=torch.uint8, device=device)
    pool.random_(0, 256, generator=generator)
    host = torch.empty(rows * row_bytes, dtype=torch.uint8, pin_memory=True)
    host.copy_(torch.randint(0, 256, (rows * row_bytes,), dtype=torch.uint8, generator=generator,
                             device=device).cpu())
    host_on_device = host.to(device)
    pool_rows = pool.view(rows, row_bytes)
    host_rows = host_on_device.view(rows, row_bytes)
    dst = pool.view(torch.bfloat16).view(rows, 1, element_dim)
    src = host.view(torch.bfloat16).view(rows, 1, element_dim)
    cases = mismatches = 0
    # One warm-up call builds (or loads) the JIT module outside the clock.
    warm = torch.arange(tokens, dtype=torch.int64, device=device)
    module.transfer_hicache_one_layer_mla(dst, warm, src, warm, element_dim=element_dim, page_size=1)
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        host_idx = torch.randperm(rows, generator=generator, device=device)[:tokens]
        dev_idx = torch.randperm(rows, generator=generator, device=device)[:tokens]
        expected = pool_rows.clone()
        expected[dev_idx] = host_rows[host_idx]
        module.transfer_hicache_one_layer_mla(dst, dev_idx, src, host_idx, element_dim=element_dim, page_size=1)
        if not torch.equal(pool_rows, expected):
            mismatches += 1
            pool_rows.copy_(expected)
        cases += 1
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - started
    return {
        "what": "bare loop: randperm indices -> sglang transfer_hicache_one_layer_mla (load-back) -> expected pool "
                "on the device -> torch.equal of the whole pool",
        "rows": rows, "row_bytes": row_bytes, "tokens": tokens,
        "cases": cases, "seconds": round(wall, 3), "cases_per_second": round(cases / wall, 1) if wall else 0.0,
        "verified_gb_per_second": round(cases * rows * row_bytes / wall / 1e9, 3) if wall else 0.0,
        "mismatches": mismatches,
    }


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    result = measure_bare_loop(args.seconds, torch.device("cuda", torch.cuda.current_device()))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
