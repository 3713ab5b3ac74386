"""HiCache KV-cache transfers, byte-exact: sglang's real kernels against hicache-fuzz's oracle.

For sglang's test tree (test/registered/kernels/test_hicache_fuzz.py): each case below goes through the real
entry point (JIT register/TMA, staged write-back, page_unified, host pools + controller placement) and every
byte of both storages (guard bytes included) must equal the oracle's. Needs `pip install hicache-fuzz`
(it brings the `hicache_fuzz` pytest plugin). `python3 test_hicache_fuzz.py` runs it as sglang's CI does,
plus a short fuzz campaign; set HICACHE_FUZZ_KNOWN to a corpus of known failures (e.g. hicache-fuzz's
corpus/sglang) so those count as known rather than new.
"""

import os
import sys

import pytest
from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci

register_cuda_ci(est_time=180, stage="base-b-kernel-unit", runner_config="1-gpu-large")
register_amd_ci(est_time=180, suite="jit-kernel-unit-test-amd")


def kv_case(backend, direction, scope, layout, pools, host, device, page_size, host_index="device", **extra):
    """A hicache-fuzz case (docs: README "Case format"); index lists are token indices."""
    return {
        "schema": 1, "backend": backend, "direction": direction, "scope": scope, "layout": layout,
        "pools": pools, "layers": 4, "page_size": page_size, "device_rows": 96, "host_slots": 64,
        "layer": 2, "host_indices": host, "device_indices": device, "seed": 1,
        "host_index": {"dtype": "int64", "device": host_index},
        "device_index": {"dtype": "int64", "device": "device"}, **extra,
    }


LLAMA_8B = {"name": "kv", "attention": "mha", "dtype": "bf16", "heads": 8, "head_dim": 128}
DEEPSEEK_MLA = {"name": "kv", "attention": "mla", "dtype": "bf16", "heads": 1, "head_dim": 576}
PAGES_2_0 = list(range(32, 48)) + list(range(0, 16))  # host pages 2 and 0, reversed order
DEVICE_PAGES = list(range(16, 48))  # device pages 1 and 2 (page 0 is sglang's padding page)

CASES = {
    "jit-one-layer-load": kv_case("sglang-jit", "load_back", "one_layer", "layer_first", [LLAMA_8B],
                                  PAGES_2_0, DEVICE_PAGES, 16),
    "jit-register-all-layer-write-mla": kv_case("sglang-jit-register", "write_back", "all_layers", "page_first",
                                                [DEEPSEEK_MLA], PAGES_2_0, DEVICE_PAGES, 16),
    "staged-write-page-first": kv_case("sglang-staged", "write_back", "all_layers", "page_first", [LLAMA_8B],
                                       PAGES_2_0, DEVICE_PAGES, 16, host_index="cpu"),
    "page-unified-write-mla": kv_case("sglang-page-unified", "write_back", "all_layers", "page_unified",
                                      [DEEPSEEK_MLA], PAGES_2_0, DEVICE_PAGES, 16, host_index="cpu"),
    "pool-group-write": kv_case("sglang-pool", "write_back", "all_layers", "page_first",
                                [LLAMA_8B, {**DEEPSEEK_MLA, "name": "indexer"}], PAGES_2_0, DEVICE_PAGES, 16,
                                host_index="cpu", tuning={"controller": "hybrid"}),
}


@pytest.mark.hicache_fuzz_sglang
@pytest.mark.parametrize("name", sorted(CASES))
def test_transfer_is_byte_exact(hicache_case_runner, name):
    result = hicache_case_runner(CASES[name])  # fails with the first differing K/V, layer, page, token, byte
    assert result.outcome.value == "pass", result.summary


if __name__ == "__main__":
    args = [__file__, "-v", "-p", "hicache_fuzz", "--hicache-fuzz-seconds", "60"]
    if os.environ.get("HICACHE_FUZZ_KNOWN"):
        args += ["--hicache-fuzz-corpus", os.environ["HICACHE_FUZZ_KNOWN"]]
    sys.exit(pytest.main(args))
