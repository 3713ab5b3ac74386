"""Run case files one per fresh subprocess, printing the backend's own exception and the state of the CUDA
context after it (CUDA_LAUNCH_BLOCKING=1), plus variants that flip one field each.

    python reports/gpu/investigate.py CASE.json [...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.pipeline.materialize import materialize
from hicache_fuzz.harness.model.platform import detect
from hicache_fuzz.kernels.registry import load_registry
case = Case.from_dict(json.loads(sys.argv[1]))
m = detect()
b = load_registry().get(case.backend)
print("unsupported:", b.unsupported_reason(case, m.platform), "plan:", b.plan(case, m.platform))
buf = materialize(case, m.device)
try:
    print("path:", b.run(buf))
except Exception as exc:
    print("backend raised:", type(exc).__name__, str(exc)[:600])
try:
    torch.cuda.synchronize()
    print("context: ok")
except Exception as exc:
    print("synchronize raised:", type(exc).__name__, str(exc)[:300])
"""


def variants(data: dict) -> list[tuple[str, dict]]:
    out = [("as-is", data)]
    flips = {
        "pinned-host-memory": {"host_allocator": "pin_memory"},
        "device-indices-on-gpu": {"device_index": {"device": "device", "dtype": data["device_index"]["dtype"]}},
        "device-indices-pinned": {"device_index": {"device": "pinned", "dtype": data["device_index"]["dtype"]}},
    }
    for name, change in flips.items():
        out.append((name, {**data, **change}))
    return out


def main() -> None:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for path in sys.argv[1:]:
        data = json.load(open(path))
        data = data.get("case", data)
        for name, variant in variants(data):
            proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(variant)], capture_output=True,
                                  text=True, env=env, timeout=120)
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "host pool" not in ln]
            print(f"== {path} [{name}] rc={proc.returncode}")
            print("\n".join(lines[-8:]))


if __name__ == "__main__":
    main()
