"""JIT compile bookkeeping: what backends spent building or loading kernel modules, kept apart from run time.

One :class:`CompileBooks` object per family of backends that share a module cache (the sglang backends share
:data:`SGLANG_BOOKS`). A backend declares its books through ``Backend.compile_books()``; the worker, the CLI
and the parallel runner read them through that hook instead of probing modules for attributes. Importing this
module imports nothing else (no sglang, no GPU).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class CompileBooks:
    compile_seconds: float = 0.0  # first calls of JIT module factories (compiles and cache loads), summed
    compiled_keys: dict[str, float] = field(default_factory=dict)  # "factory(args)" -> seconds, in build order
    background_seconds: float = 0.0  # wall time of background (prefetch) compile batches, summed
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, key: str, seconds: float) -> None:
        with self._lock:
            self.compile_seconds += seconds
            self.compiled_keys[key] = round(seconds, 3)

    def add_background(self, seconds: float) -> None:
        with self._lock:
            self.background_seconds += seconds

    def mark(self) -> tuple[float, int]:
        """A point to measure from: (compile seconds, modules known)."""
        return self.compile_seconds, len(self.compiled_keys)

    def since(self, mark: tuple[float, int]) -> tuple[float, dict[str, float]]:
        """Compile seconds and the modules built since `mark` (compiled_keys only grows, in insertion order)."""
        seconds, known = mark
        return self.compile_seconds - seconds, dict(list(self.compiled_keys.items())[known:])


SGLANG_BOOKS = CompileBooks()
