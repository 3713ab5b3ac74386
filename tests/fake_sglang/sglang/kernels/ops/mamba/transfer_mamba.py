"""Fake: sglang's cached builder of the transfer_mamba JIT module (counts its builds)."""

from __future__ import annotations

BUILDS: list[str] = []


def _jit_transfer_mamba_module() -> str:
    BUILDS.append("transfer_mamba")
    return "transfer_mamba"
