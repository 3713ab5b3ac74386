"""Stand-in for `sgl_kernel.scalar_type` (see sgl_kernel/_standin.py)."""

from sgl_kernel._standin import StandInOp, attribute_of


def __getattr__(name: str) -> StandInOp:
    return attribute_of(__name__, name)
