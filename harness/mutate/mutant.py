"""A mutant: one text replacement in one source file, with a stable id and a unified diff."""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Mutant:
    file: str  # path relative to the folder holding the `sglang` package, posix: "sglang/kernels/..."
    operator: str
    line: int
    start: int  # character offsets of the replaced text in the original file
    end: int
    original: str
    replacement: str
    description: str

    @property
    def id(self) -> str:
        """Stable across runs and machines: file, operator, position and replacement, nothing of the run."""
        key = "\0".join([self.file, self.operator, str(self.start), str(self.end), self.replacement])
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def apply(self, text: str) -> str:
        """The mutated text; refuses a file that is not the one the mutant was made from."""
        if text[self.start:self.end] != self.original:
            raise ValueError(f"mutant {self.id}: {self.file} at offset {self.start} does not hold "
                             f"{self.original!r} (the source changed since the mutants were generated)")
        return text[:self.start] + self.replacement + text[self.end:]

    def diff(self, text: str) -> str:
        """Unified diff (patch -p1 format) from the original text to the mutated one."""
        mutated = self.apply(text)
        return "".join(difflib.unified_diff(
            text.splitlines(keepends=True), mutated.splitlines(keepends=True),
            fromfile=f"a/{self.file}", tofile=f"b/{self.file}", n=3))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mutant:
        fields = {k: data[k] for k in ("file", "operator", "line", "start", "end", "original", "replacement",
                                       "description")}
        return cls(**fields)
