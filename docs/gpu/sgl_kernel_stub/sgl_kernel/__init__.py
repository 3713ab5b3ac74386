"""Stand-in for `sgl_kernel` (see sgl_kernel/_standin.py)."""

from sgl_kernel._standin import StandInOp, attribute_of

__version__ = "0.4.10"  # the sglang-kernel version sglang 0.5.23 pins
HICACHE_FUZZ_STANDIN = True


def __getattr__(name: str) -> StandInOp:
    return attribute_of(__name__, name)
