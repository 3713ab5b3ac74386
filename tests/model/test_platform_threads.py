"""Every process that runs cases limits torch's intra-op threads (harness/model/platform.limit_torch_threads)."""

from __future__ import annotations

import pytest
import torch

from hicache_fuzz.harness.model.platform import TORCH_THREADS_ENV, limit_torch_threads


def test_one_thread_unless_the_variable_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(TORCH_THREADS_ENV, raising=False)
        assert limit_torch_threads() == 1 == torch.get_num_threads()
        monkeypatch.setenv(TORCH_THREADS_ENV, "2")
        assert limit_torch_threads() == 2 == torch.get_num_threads()
        monkeypatch.setenv(TORCH_THREADS_ENV, "0")
        assert limit_torch_threads() == 1  # at least one
    finally:
        torch.set_num_threads(before)
