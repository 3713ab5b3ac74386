"""Placeholders for the parts of sgl_kernel this stand-in does not provide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class MissingOp:
    """Stands for an sgl_kernel attribute that does not exist here; calling it raises."""

    def __init__(self, qualified_name: str) -> None:
        self._qualified_name = qualified_name

    def __getattr__(self, name: str) -> MissingOp:
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingOp(f"{self._qualified_name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{self._qualified_name} is not available: hicache-fuzz's sgl_kernel stand-in only provides "
            "the kvcacheio transfer ops"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in: missing {self._qualified_name}>"


def placeholder_getattr(module_name: str) -> Callable[[str], MissingOp]:
    def module_getattr(name: str) -> MissingOp:
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingOp(f"{module_name}.{name}")

    return module_getattr
