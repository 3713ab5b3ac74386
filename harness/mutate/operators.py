"""Mutation operators adapted to transfer kernels and their Python dispatch.

Each operator looks at the token list of one file and proposes single-span replacements. The heuristics
(is this `<` a comparison or a template bracket, is this `*` binary) are deliberately simple: a wrong guess
yields a mutant that does not build, which the run reports as ``build_error`` and leaves out of the score.
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Callable, Iterable

from hicache_fuzz.harness.mutate.mutant import Mutant
from hicache_fuzz.harness.mutate.tokens import Token, line_offsets, tokenize_c, tokenize_python

OPERATORS = ("comparison", "arithmetic", "constant", "narrowing", "mod_and", "swap_pair", "drop_statement",
             "index_reuse")

_C_KEYWORDS = frozenset(
    ["return", "case", "sizeof", "if", "else", "for", "while", "do", "switch", "new", "delete", "throw",
     "co_return", "co_yield", "goto", "default", "const", "constexpr", "static", "auto", "typename", "template",
     "using", "namespace", "struct", "class", "unsigned", "signed"])
_COMPARISON = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_NARROWING_C = {"uint32_t": "uint16_t", "int64_t": "int32_t", "uint64_t": "uint32_t"}
_NARROWING_PY = {"int64": "int32"}
# Identifier parts that come in pairs: swapping one for the other on a line swaps a pointer/table/index pair.
_PAIRS = (("src", "dst"), ("k", "v"), ("key", "value"), ("K", "V"), ("host", "device"))
# Calls whose statement is a synchronisation or a wait (dropping one is a classic race).
_C_SYNC = re.compile(r"^(__syncthreads|__syncwarp|__threadfence\w*|bulk_wait_group\w*|mbar_wait\w*|"
                     r"fence_\w+|cp_async_wait\w*|__builtin_amdgcn_s_barrier)$")
_PY_SYNC_ATTRS = frozenset({"synchronize", "wait_stream", "wait_event", "wait", "record_stream"})
_PY_STORE_ATTRS = frozenset({"copy_", "index_copy_", "index_put_", "scatter_", "fill_", "zero_"})
_PY_LAUNCH = re.compile(r"(launch|transfer|copy)")
_PY_TYPE_CONTAINERS = frozenset(
    ["List", "Dict", "Tuple", "Optional", "Sequence", "Union", "Callable", "Type", "Iterable", "Iterator",
     "Mapping", "Set", "FrozenSet", "list", "dict", "tuple", "set", "frozenset", "type", "Literal", "Annotated",
     "ClassVar"])
_PY_NOT_INDEX = frozenset(
    ["int", "str", "float", "bool", "bytes", "None", "True", "False", "Any", "Tensor", "torch", "object"])

LineFilter = Callable[[int], bool]


def generate(file: str, text: str, language: str, lines: LineFilter | None = None) -> list[Mutant]:
    """All mutants of one file, in source order (then operator order). `lines` keeps only mutants whose
    first line it accepts (the Python transfer/index filter)."""
    if language == "c":
        tokens = tokenize_c(text)
        found = [*_comparison_c(tokens), *_arithmetic(tokens, text, "c"), *_constants(tokens, "c"),
                 *_narrowing(tokens, _NARROWING_C), *_mod_and(tokens, text, "c"), *_swap_pairs(tokens, text),
                 *_drop_c(tokens, text), *_index_reuse(tokens, "c")]
    elif language == "python":
        tokens = tokenize_python(text)
        found = [*_comparison_py(tokens), *_arithmetic(tokens, text, "python"), *_constants(tokens, "python"),
                 *_narrowing(tokens, _NARROWING_PY), *_mod_and(tokens, text, "python"),
                 *_swap_pairs(tokens, text), *_drop_python(text), *_index_reuse(tokens, "python")]
    else:
        raise ValueError(f"unknown language {language!r}")
    index = line_offsets(text)
    mutants: dict[str, Mutant] = {}
    for operator, start, end, replacement, description in found:
        line = index.line(start)
        if lines is not None and not lines(line):
            continue
        mutant = Mutant(file, operator, line, start, end, text[start:end], replacement, description)
        mutants.setdefault(mutant.id, mutant)
    return sorted(mutants.values(), key=lambda m: (m.start, OPERATORS.index(m.operator), m.replacement))


_Found = tuple[str, int, int, str, str]  # operator, start, end, replacement, description


def _is_operand_end(token: Token | None, language: str) -> bool:
    """Can `token` end an operand (so that the operator after it is binary)?"""
    if token is None:
        return False
    if token.kind == "number":
        return True
    if token.kind == "ident":
        return not (keyword.iskeyword(token.text) if language == "python" else token.text in _C_KEYWORDS)
    return token.text in (")", "]")


def _spaced(text: str, token: Token) -> bool:
    """Whitespace on both sides: how formatted C++ writes a binary `*` or `&` (a declaration's is not)."""
    return token.start > 0 and text[token.start - 1].isspace() and token.end < len(text) and text[token.end].isspace()


def _template_brackets(tokens: list[Token]) -> set[int]:
    """Indices of `<`/`>` tokens that look like template brackets: after an identifier, up to the matching `>`
    only names, numbers, `::`, `,`, `*`, `&`, `=` (defaults), arithmetic and balanced `(...)`/`[...]`
    (`static_cast<uint32_t>`, `PackageType<kBytes / kLanes>`, `decay_t<decltype(v.data[0])>`,
    `template <typename T, bool kIsMLA = false>`). `;`, `&&`, `?`, a string or an unbalanced `)` mean a
    comparison (`i < n;`, `a < b && c > d`, `f(a < b, "...")`)."""
    allowed = {"::", ",", "*", "&", "=", "/", "+", "-", "%", ".", "..."}
    brackets: set[int] = set()
    for i, token in enumerate(tokens):
        if token.text != "<" or i == 0 or tokens[i - 1].kind != "ident":
            continue
        depth, parens, inner = 1, 0, [i]
        for j in range(i + 1, min(len(tokens), i + 60)):
            t = tokens[j]
            if t.text in ("(", "["):
                parens += 1
            elif t.text in (")", "]"):
                parens -= 1
                if parens < 0:
                    break
            elif parens > 0 and t.kind in ("ident", "number", "op") and t.text not in (";", "{", "}"):
                continue  # inside decltype(...) / an index: anything but a statement end
            elif t.text == "<":
                depth += 1
                inner.append(j)
            elif t.text in (">", ">>"):
                depth -= 1 if t.text == ">" else 2
                inner.append(j)
                if depth <= 0:
                    brackets.update(inner)
                    break
            elif not (t.kind in ("ident", "number") or t.text in allowed):
                break
    return brackets


def _comparison_c(tokens: list[Token]) -> Iterable[_Found]:
    templates = _template_brackets(tokens)
    for i, token in enumerate(tokens):
        if token.text in _COMPARISON and i not in templates and token.kind == "op":
            if i > 0 and tokens[i - 1].text in ("template", "operator"):
                continue
            yield "comparison", token.start, token.end, _COMPARISON[token.text], \
                f"`{token.text}` -> `{_COMPARISON[token.text]}` (off by one)"


def _comparison_py(tokens: list[Token]) -> Iterable[_Found]:
    for token in tokens:
        if token.kind == "op" and token.text in _COMPARISON:
            yield "comparison", token.start, token.end, _COMPARISON[token.text], \
                f"`{token.text}` -> `{_COMPARISON[token.text]}` (off by one)"


def _arithmetic(tokens: list[Token], text: str, language: str) -> Iterable[_Found]:
    swaps = {"+": "-", "-": "+", "+=": "-=", "-=": "+="}
    swaps.update({"*": "/", "/": "*"} if language == "c" else {"*": "//", "//": "*", "/": "*"})
    for i, token in enumerate(tokens):
        if token.kind != "op" or token.text not in swaps:
            continue
        prev = tokens[i - 1] if i > 0 else None
        if token.text in ("+=", "-="):
            binary = True
        else:
            binary = _is_operand_end(prev, language) and (prev is None or prev.kind != "string")
            if binary and language == "c" and token.text == "*":
                binary = _spaced(text, token)
        if binary:
            yield "arithmetic", token.start, token.end, swaps[token.text], \
                f"`{token.text}` -> `{swaps[token.text]}`"


_C_INT = re.compile(r"^(0[xX][0-9a-fA-F']+|\d[\d']*)([uUlL]*)$")


def _constants(tokens: list[Token], language: str) -> Iterable[_Found]:
    for token in tokens:
        if token.kind != "number":
            continue
        match = _C_INT.match(token.text.replace("_", "") if language == "python" else token.text)
        if not match or (language == "python" and token.text.endswith(("j", "J"))):
            continue
        digits, suffix = match.group(1).replace("'", ""), match.group(2)
        value = int(digits, 16) if digits[:2].lower() == "0x" else int(digits, 10)
        if digits != "0" and digits.startswith("0") and digits[:2].lower() != "0x":
            continue  # an octal literal: leave it
        replacements = [1] if value == 0 else [0, 2] if value == 1 else [value + 1, value - 1]
        for new in replacements:
            yield "constant", token.start, token.end, f"{new}{suffix}", f"constant {token.text} -> {new}{suffix}"


def _narrowing(tokens: list[Token], table: dict[str, str]) -> Iterable[_Found]:
    for token in tokens:
        if token.kind == "ident" and token.text in table:
            yield "narrowing", token.start, token.end, table[token.text], \
                f"integer narrowing `{token.text}` -> `{table[token.text]}`"


def _mod_and(tokens: list[Token], text: str, language: str) -> Iterable[_Found]:
    swaps = {"%": "&", "&": "%"}
    for i, token in enumerate(tokens):
        if token.kind != "op" or token.text not in swaps:
            continue
        prev = tokens[i - 1] if i > 0 else None
        if not _is_operand_end(prev, language) or (prev is not None and prev.kind == "string"):
            continue
        if language == "c" and token.text == "&" and not _spaced(text, token):
            continue
        yield "mod_and", token.start, token.end, swaps[token.text], f"`{token.text}` -> `{swaps[token.text]}`"


def _counterpart(name: str) -> str | None:
    parts = name.split("_")
    for a, b in _PAIRS:
        for index, part in enumerate(parts):
            if part in (a, b):
                swapped = parts.copy()
                swapped[index] = b if part == a else a
                return "_".join(swapped)
    return None


def _swap_pairs(tokens: list[Token], text: str) -> Iterable[_Found]:
    by_line: dict[int, list[Token]] = {}
    for i, token in enumerate(tokens):
        qualifier = i + 1 < len(tokens) and tokens[i + 1].text == "::"  # a namespace (`host::`), not a value
        if token.kind == "ident" and not qualifier:
            by_line.setdefault(token.line, []).append(token)
    for line_tokens in by_line.values():
        seen: set[tuple[str, str]] = set()
        for i, first in enumerate(line_tokens):
            other = _counterpart(first.text)
            if other is None or (first.text, other) in seen or (other, first.text) in seen:
                continue
            second = next((t for t in line_tokens[i + 1:] if t.text == other), None)
            if second is None:
                continue
            seen.add((first.text, other))
            middle = text[first.end:second.start]
            yield "swap_pair", first.start, second.end, second.text + middle + first.text, \
                f"swap `{first.text}` and `{second.text}`"


def _statements_c(tokens: list[Token]) -> Iterable[list[Token]]:
    """Token runs ending in `;` at parenthesis depth 0 (a `for` header's `;` does not end a statement),
    with a leading `if (...)` / `while (...)` / `else` stripped so the body statement remains."""
    current: list[Token] = []
    depth = 0
    for token in tokens:
        if token.text in ("(", "["):
            depth += 1
        elif token.text in (")", "]"):
            depth -= 1
        if depth == 0 and token.text in ("{", "}"):
            current = []
            continue
        current.append(token)
        if depth == 0 and token.text == ";":
            yield _strip_condition(current)
            current = []


def _strip_condition(statement: list[Token]) -> list[Token]:
    while statement and statement[0].text in ("if", "while", "else"):
        if statement[0].text == "else":
            statement = statement[1:]
            continue
        depth = 0
        for j, token in enumerate(statement[1:], start=1):
            depth += token.text == "("
            depth -= token.text == ")"
            if depth == 0 and token.text == ")":
                statement = statement[j + 1:]
                break
        else:
            return []
    return statement


def _drop_c(tokens: list[Token], text: str) -> Iterable[_Found]:
    for statement in _statements_c(tokens):
        if len(statement) < 2 or statement[0].text in _C_KEYWORDS - {"const", "auto", "static"}:
            continue
        idents = [t for t in statement if t.kind == "ident"]
        call = next((j for j, t in enumerate(statement) if t.text == "("), None)
        callee = statement[call - 1] if call else None
        start, end = statement[0].start, statement[-1].end
        if callee is not None and callee.kind == "ident" and _C_SYNC.match(callee.text):
            yield "drop_statement", start, end, ";", f"drop the synchronisation `{callee.text}(...)`"
            continue
        assign = next((j for j, t in enumerate(statement) if t.text == "=" and _depth_before(statement, j) == 0),
                      None)
        if assign is None or not idents:
            continue
        target = statement[:assign]
        if target[0].text in ("const", "auto", "static", "constexpr") or target[0].text in _NARROWING_C:
            continue  # a declaration: dropping it does not build
        if any(t.text in ("[", "->", ".") for t in target) or target[0].text == "*":
            yield "drop_statement", start, end, ";", "drop the store `" + " ".join(t.text for t in target) + " = ...`"


def _depth_before(statement: list[Token], index: int) -> int:
    depth = 0
    for token in statement[:index]:
        depth += token.text in ("(", "[", "{")
        depth -= token.text in (")", "]", "}")
    return depth


def _drop_python(text: str) -> Iterable[_Found]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    index = line_offsets(text)
    for node in ast.walk(tree):
        kind = _python_drop_kind(node)
        if kind is None or not isinstance(node, ast.stmt) or node.end_lineno is None or node.end_col_offset is None:
            continue
        start = index.offset(node.lineno, node.col_offset)
        end = index.offset(node.end_lineno, node.end_col_offset)
        yield "drop_statement", start, end, "pass", f"drop the {kind}"


def _python_drop_kind(node: ast.AST) -> str | None:
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Subscript) for t in targets):
            return "store (subscript assignment)"
        return None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in _PY_SYNC_ATTRS:
            return f"synchronisation `.{name}()`"
        if name in _PY_STORE_ATTRS:
            return f"store `.{name}(...)`"
        if _PY_LAUNCH.search(name):
            return f"call `{name}(...)`"
    return None


def _index_reuse(tokens: list[Token], language: str) -> Iterable[_Found]:
    for i in range(1, len(tokens) - 2):
        bracket, inner, close = tokens[i], tokens[i + 1], tokens[i + 2]
        if bracket.text != "[" or close.text != "]" or inner.kind != "ident":
            continue
        prev = tokens[i - 1]
        if not _is_operand_end(prev, language):
            continue
        if language == "c" and (inner.text in _C_KEYWORDS or inner.text == "this"):
            continue
        if language == "python" and (prev.text in _PY_TYPE_CONTAINERS or inner.text in _PY_NOT_INDEX
                                     or keyword.iskeyword(inner.text)):
            continue
        yield "index_reuse", inner.start, inner.end, f"{inner.text} - 1", \
            f"index reuse `[{inner.text}]` -> `[{inner.text} - 1]`"
