"""A backend for measuring a real device fault under MPS (session 10, device call 3): sglang-jit, except that one
case of the campaign, chosen the first time a worker meets a case with seed % 50 == 7 (its id is written to
$FAULT_MARK, first writer wins), writes far outside its device pool through sglang's own JIT load-back kernel:
an illegal address, the sticky fault class MPS reports to every client. That case faults wherever and
however often it runs; no other case does. Use: PYTHONPATH=reports/gpu-engine/session10
`fuzz --backend-plugin fault_plugin:backends --backend test-mps-fault ...`."""

from __future__ import annotations

import os

import torch

from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.sglang_jit import SglangJitBackend

MARK = os.environ.get("FAULT_MARK", "/tmp/hicache-fuzz-fault-case")


class MpsFaultBackend(SglangJitBackend):
    name = "test-mps-fault"
    description = "sglang-jit, with one case of the campaign made to write to an illegal address"

    def run(self, buffers):  # type: ignore[no-untyped-def]
        case = buffers.case
        if case.seed % 50 == 7 and not os.path.exists(MARK):
            try:
                with open(MARK, "x") as f:
                    f.write(case.case_id)
            except FileExistsError:
                pass
        try:
            with open(MARK) as f:
                culprit = f.read().strip()
        except OSError:
            culprit = ""
        if case.case_id == culprit:
            device = torch.device("cuda", torch.cuda.current_device())
            rows, element_dim = 64, 256
            dst = torch.zeros(rows, 1, element_dim, dtype=torch.bfloat16, device=device)
            src = torch.zeros(rows, 1, element_dim, dtype=torch.bfloat16, device=device)
            far = torch.tensor([1 << 36], dtype=torch.int64, device=device)
            near = torch.tensor([0], dtype=torch.int64, device=device)
            common.hicache().transfer_hicache_one_layer_mla(dst, far, src, near, element_dim=element_dim, page_size=1)
        return super().run(buffers)


def backends():  # type: ignore[no-untyped-def]
    return [MpsFaultBackend()]
