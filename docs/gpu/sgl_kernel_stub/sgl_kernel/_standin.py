"""An import-only stand-in for sglang-kernel (``sgl_kernel``), written for hicache-fuzz's GPU bundle.

sglang's host-pool modules import names from ``sgl_kernel`` when they load, but its JIT HiCache kernels never
call them. Where the real sglang-kernel cannot load (it is built against one exact torch), this package lets
those modules import: every name resolves to a :class:`StandInOp` that raises ``NotImplementedError`` naming
itself when called. Nothing silently succeeds, and hicache-fuzz reports its ``sglang-aot`` backend (and the
AOT fallbacks of ``sglang-pool``) as unavailable because the package folder is named ``sgl_kernel_stub``.
"""

from __future__ import annotations

from typing import Any


class StandInOp:
    """A missing sgl_kernel attribute: attribute access goes deeper, calling raises."""

    def __init__(self, qualified_name: str) -> None:
        self.qualified_name = qualified_name

    def __getattr__(self, name: str) -> StandInOp:
        if name.startswith("__"):
            raise AttributeError(name)
        return StandInOp(f"{self.qualified_name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{self.qualified_name} is not available: only hicache-fuzz's import-only sgl_kernel stand-in is "
            "installed (install the real sglang-kernel built for this torch to run AOT ops)"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self.qualified_name}>"


def attribute_of(module_name: str, name: str) -> StandInOp:
    """The module-level ``__getattr__`` body of every stand-in module."""
    if name.startswith("__"):
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    return StandInOp(f"{module_name}.{name}")
