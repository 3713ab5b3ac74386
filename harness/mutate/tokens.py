"""A small tokenizer for C/C++/CUDA and Python sources, enough to place mutations.

It is not a parser. For C-like sources it yields identifiers, numbers and operators with their character
offsets and lines, and skips what a mutation must never touch: comments, string and character literals
(inline ``asm`` text included) and preprocessor lines (``#include``, ``#pragma unroll``, macro bodies with
their ``\\`` continuations). Python sources go through the standard library's :mod:`tokenize`, whose
comments, strings and f-string bodies are skipped the same way.
"""

from __future__ import annotations

import io
import re
import tokenize
from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "number", "op" or "string" (strings are kept only so operators can see them)
    text: str
    start: int  # character offset in the file
    end: int
    line: int  # 1-based


# Longest first, so `<<=` wins over `<<` and `<`.
_C_OPERATORS = sorted(
    ["<<<", ">>>", "<<=", ">>=", "...", "->*", "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&",
     "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".*", *list("+-*/%&|^~!=<>?:;,.()[]{}")],
    key=len, reverse=True)
_C_NUMBER = re.compile(r"0[xX][0-9a-fA-F']+[uUlL]*|\d[\d']*(?:\.\d*)?(?:[eE][+-]?\d+)?[fFuUlL]*|\.\d+[fF]?")
_IDENT = re.compile(r"[A-Za-z_]\w*")


class _LineIndex:
    """Offset -> 1-based line number."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line(self, offset: int) -> int:
        return bisect_right(self.starts, offset)

    def offset(self, line: int, column: int) -> int:
        return self.starts[line - 1] + column


def tokenize_c(text: str) -> list[Token]:
    """Tokens of a C/C++/CUDA source, without comments, literals' contents and preprocessor lines."""
    lines = _LineIndex(text)
    tokens: list[Token] = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        ch = text[i]
        if ch == "\n":
            at_line_start = True
            i += 1
            continue
        if ch in " \t\r\f\v":
            i += 1
            continue
        if ch == "#" and at_line_start:  # preprocessor line, with backslash continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    i += 2
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            tokens.append(Token("string", text[i:j + 1], i, j + 1, lines.line(i)))
            i = j + 1
            continue
        match = _IDENT.match(text, i)
        if match:
            # raw string literal R"delim( ... )delim"
            if match.group() in ("R", "u8R", "LR", "uR", "UR") and text.startswith('"', match.end()):
                open_paren = text.find("(", match.end())
                delimiter = text[match.end() + 1:open_paren]
                close = text.find(")" + delimiter + '"', open_paren)
                end = n if close < 0 else close + len(delimiter) + 2
                tokens.append(Token("string", text[i:end], i, end, lines.line(i)))
                i = end
                continue
            tokens.append(Token("ident", match.group(), i, match.end(), lines.line(i)))
            i = match.end()
            continue
        match = _C_NUMBER.match(text, i)
        if match:
            tokens.append(Token("number", match.group(), i, match.end(), lines.line(i)))
            i = match.end()
            continue
        for op in _C_OPERATORS:
            if text.startswith(op, i):
                tokens.append(Token("op", op, i, i + len(op), lines.line(i)))
                i += len(op)
                break
        else:
            i += 1  # a character no operator uses (`@`, `$`, a backslash): skip it
    return tokens


_FSTRING_START = getattr(tokenize, "FSTRING_START", -1)
_FSTRING_END = getattr(tokenize, "FSTRING_END", -1)


def tokenize_python(text: str) -> list[Token]:
    """Tokens of a Python source (names, numbers, operators, strings); comments and f-string bodies skipped."""
    lines = _LineIndex(text)
    tokens: list[Token] = []
    fstring_depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == _FSTRING_START:
            fstring_depth += 1
            continue
        if tok.type == _FSTRING_END:
            fstring_depth -= 1
            continue
        if fstring_depth:
            continue
        kind = {tokenize.NAME: "ident", tokenize.NUMBER: "number", tokenize.OP: "op",
                tokenize.STRING: "string"}.get(tok.type)
        if kind is None:
            continue
        start = lines.offset(*tok.start)
        end = lines.offset(*tok.end)
        tokens.append(Token(kind, tok.string, start, end, tok.start[0]))
    return tokens


def line_offsets(text: str) -> _LineIndex:
    return _LineIndex(text)
