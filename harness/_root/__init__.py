"""hicache-fuzz: differential testing and fuzzing for SGLang's HiCache KV-cache transfer kernels.

Subpackages: ``hicache_fuzz.harness`` (cases, generation, materialize/compare/classify, campaigns, CLI),
``hicache_fuzz.oracles`` (pure-PyTorch semantics and the input contract) and ``hicache_fuzz.kernels``
(backends: the CPU reference, the bug zoo, the real sglang kernels).
"""

__version__ = "0.1.0"
