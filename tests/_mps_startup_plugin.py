"""Test-only plugin for tests/pipeline/test_gpu_sharing.py: a worker that is an MPS client (CUDA_MPS_PIPE_DIRECTORY
set) fails at start-up, as one whose MPS server is gone would; on a plain context it runs the reference."""

from __future__ import annotations

import os

from hicache_fuzz.api import ReferenceBackend


class MpsStartupBackend(ReferenceBackend):
    name = "test-mps-startup"
    needs_isolation = True


def backends():  # type: ignore[no-untyped-def]
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        raise RuntimeError("cannot connect to the MPS server")
    return [MpsStartupBackend()]
