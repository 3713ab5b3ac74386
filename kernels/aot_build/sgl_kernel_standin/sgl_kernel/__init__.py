"""hicache-fuzz's stand-in for the ``sgl_kernel`` package (sglang-kernel), used only where the real one cannot
load (e.g. built for another torch).

sglang's modules import many names from ``sgl_kernel`` at import time; every name this stand-in does not
provide resolves to a placeholder that raises ``NotImplementedError`` when called, so imports succeed and any
use of an op that is not there fails loudly. ``sgl_kernel.kvcacheio`` is real: its wrappers call the ops
that this project's AOT build registers (see hicache_fuzz.kernels.aot_build).
"""

from sgl_kernel._placeholder import placeholder_getattr

# sglang reads the version of the package it was pinned against; the ops behind this stand-in are built
# from the sources of that version (hicache_fuzz/kernels/aot_build/sources.json).
__version__ = "0.4.10"
HICACHE_FUZZ_STANDIN = True

__getattr__ = placeholder_getattr(__name__)
