"""The numerics contract: what a compiled program may change about floating-point results.

Two modes (docs/numerics.md has the contract in full):

- ``"exact"`` (the default): the compiled program keeps the IEEE behaviour of the model as the
  reference runs it. No rewrite and no kernel may change which elements are NaN, +-inf or a
  signed zero; other differences stay within the per-op-family bounds of docs/numerics.md
  (rounding of a different but equivalent order of operations). Rules tagged ``:numerics fast``
  are not loaded, and the Numba kernels are compiled with the LLVM flag ``contract`` only
  (fused multiply-add), never with ``arcp`` (reciprocal for division), ``nsz`` (no signed zeros)
  or ``reassoc``.
- ``"fast"`` (``numerics="fast"``, ``--fast-math``): like a C compiler's ``-ffast-math``: the
  rules tagged ``:numerics fast`` run too (division by a constant as multiplication by its
  reciprocal, constants re-associated across a chain, ``x + 0`` dropped, ...) and the kernels
  get ``arcp`` and ``nsz`` as well. The report lists the inexact rules that shaped the program.

A rule is tagged in its rule file by the keyword ``:numerics fast`` among its options, next to
``:ruleset`` and ``:name``::

    (rule ((= e (Div x c)) (const c)) ((union e (Mul x (Reciprocal c))))
          :ruleset canon :name "div-const-as-mul" :numerics fast)

egglog does not know the keyword: `split_tags` blanks it out (column positions kept, so egglog's
error locations stay right) and says which top-level forms carried it. Both readers of rule
files, saturation (`saturation.saturate.RuleProgram`) and the soundness checker
(`checking.patterns`), call it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import EqsatFuseError, RuleFileError

MODES = ("exact", "fast")
DEFAULT = "exact"

# The LLVM fast-math flags of the generated Numba kernels in each mode. Exact mode has none:
# even "contract" (a*b+c as one fused multiply-add) changes special values, since x*3.4e38 + inf
# is NaN where x*3.4e38 overflows to -inf but inf as an FMA (the edge fuzzer found it).
FASTMATH = {"exact": frozenset(), "fast": frozenset({"contract", "arcp", "nsz"})}
# The hand-written runtime (backends/numba/kernels.py: im2col and depthwise convolutions,
# pooling) is compiled once for both modes: its sums of products may use FMAs, as onnxruntime's
# MLAS convolutions do; no arcp, no nsz.
RUNTIME_FASTMATH = frozenset({"contract"})

_TAG = re.compile(r":numerics(\s+)([^\s()]+)")


def resolve(numerics: str | None) -> str:
    """The mode a program is compiled in: `numerics`, or the default ("exact")."""
    if numerics is None:
        return DEFAULT
    if numerics not in MODES:
        raise EqsatFuseError(f"numerics must be one of {', '.join(MODES)}, got {numerics!r}")
    return numerics


def fastmath_source(numerics: str) -> str:
    """The `fastmath=` argument of a generated kernel's `@njit`, as source text."""
    flags = sorted(FASTMATH[numerics])
    return "{" + ", ".join(f'"{flag}"' for flag in flags) + "}" if flags else "False"


@dataclass(frozen=True)
class Tagged:
    """A top-level form of a rule file that carried `:numerics fast`."""

    start: int          # character offsets of the form: its opening parenthesis
    end: int            # and just after its closing one
    line: int           # the tag's line


@dataclass(frozen=True)
class Tags:
    """The tagged forms of one rule file."""

    forms: tuple[Tagged, ...] = ()

    def fast_at(self, data: bytes, offset: int) -> bool:
        """Whether egglog's byte `offset` into the (UTF-8) text lies in a form tagged fast."""
        if not self.forms:
            return False
        chars = len(data[:offset].decode(errors="replace"))
        return any(form.start <= chars < form.end for form in self.forms)


def code_positions(text: str) -> bytearray:
    """1 at each character of `text` that is code, 0 inside strings and `;` comments (the one
    scanner of rule-file text: `saturation.saturate` finds parentheses with it too)."""
    code = bytearray(len(text))
    in_string = escaped = comment = False
    for i, char in enumerate(text):
        if comment:
            comment = char != "\n"
        elif in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == ";":
            comment = True
        else:
            code[i] = 1
    return code


def _top_level_forms(text: str, code: bytearray) -> list[tuple[int, int]]:
    """(start, end) offsets of each top-level parenthesized form."""
    forms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if not code[i] or char not in "()":
            continue
        if char == "(":
            if depth == 0:
                start = i
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                forms.append((start, i + 1))
    return forms


def split_tags(text: str, filename: str) -> tuple[str, Tags]:
    """`text` with every `:numerics MODE` option blanked out (same length, same lines), and the
    forms that carried one. A tag outside a rule's options, or with a mode other than "fast",
    is a `RuleFileError` at its line."""
    tags: list[Tagged] = []
    if ":numerics" not in text:
        return text, Tags()
    code = code_positions(text)
    forms = _top_level_forms(text, code)
    pieces, last = [], 0
    for match in _TAG.finditer(text):
        offset = match.start()
        line = text.count("\n", 0, offset) + 1
        if not code[offset]:
            continue
        mode = match.group(2)
        if mode != "fast":
            raise RuleFileError(f":numerics takes one value, fast (a rule is exact unless "
                                f"tagged), not {mode!r}", file=filename, line=line)
        form = next(((s, e) for s, e in forms if s < offset < e), None)
        if form is None:
            raise RuleFileError(":numerics is an option of a rule, inside its parentheses",
                                file=filename, line=line)
        tags.append(Tagged(form[0], form[1], line))
        pieces += [text[last:offset], " " * (match.end() - offset)]
        last = match.end()
    pieces.append(text[last:])
    return "".join(pieces), Tags(tuple(tags))
