"""Open dims in the checker: a drawn sample read again with one of its dims open, as the
e-graph of a shape-generic model holds it, and compared at two sizes of that dim.

A model that leaves a dim open (`seq`, `batch`) gives the e-graph a code where a static model
gives a number (`dims.DimCodes`: each dim expression one large negative i64, never 1): its
shape facts hold codes, and so do the attributes that carry sizes (a Reshape or Expand target,
Slice bounds, Split sizes, Pad amounts). A rule's conditions and right-hand side compute on
those codes. It is sound on open dims when it fires on codes only where it holds for every size
of the dim (two dims compared equal are one expression), and builds nothing from a code but the
code itself: `(* d 2)` or `(+ d 1)` of a code names no dim, and `(<= d 64)` holds for every
code, since codes are negative.

`open_variant` takes a sample whose leaves are drawn and opens one of its sizes: one of at least
2 that appears in the shape of a tensor that may come from the model's inputs (an `Input` leaf,
or a pattern variable the rule does not require to be constant) and in no constant's shape or
other integer attribute. The variant is the sample as drawn, its `shadow` the same sample with
that dim grown (the dynamic tensors extended along it, their values repeated). A shape fact
gives, dim by dim, the same number where both samples agree, the open dim's code where they
have its two sizes, and a code of its own for any other pair (a dim computed from the open one,
a Concat's sum, a Flatten's product), as the e-graph holds another expression there. Whether
the rule fires is decided on those codes; both sides are then compared in the variant and in
the shadow, each reading the codes as its own sizes.
"""

from __future__ import annotations

import copy

import numpy as np

from ..dims import CODE_BASE
from .patterns import Call, Check, Eq, Var
from .primitives import VALUE_RELATIONS

# (constructor, argument position) of the attributes that carry sizes; the others (axes,
# permutations, kernel sizes, groups) are numbers in every model
SIZE_SLOTS = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2), "Split": (1,), "Pad": (1,)}
GROWTH = 2               # the shadow's open dim is this much larger than the variant's


def size_variables(rule) -> set[str]:
    """The rule's variables that fill a size slot of a constructor."""
    found: set[str] = set()

    def walk(p):
        if isinstance(p, Call):
            for i, a in enumerate(p.args):
                if isinstance(a, Var) and i in SIZE_SLOTS.get(p.op, ()):
                    found.add(a.name)
                walk(a)
    for pattern in _patterns(rule):
        walk(pattern)
    return found


def constant_variables(rule) -> set[str]:
    """The rule's variables its conditions make model constants: `(const x)`, a value relation
    (`(fraction x)`...), `(= x (Const n))`."""
    found: set[str] = set()
    for cond in rule.conditions:
        if isinstance(cond, Check) and isinstance(cond.expr, Call):
            e = cond.expr
            if ((e.op == "const" or e.op in VALUE_RELATIONS) and e.args
                    and isinstance(e.args[0], Var)):
                found.add(e.args[0].name)
        elif isinstance(cond, Eq):
            for a, b in ((cond.left, cond.right), (cond.right, cond.left)):
                if isinstance(a, Var) and isinstance(b, Call) and b.op == "Const":
                    found.add(a.name)
    return found


def _patterns(rule):
    yield from (p for pair in rule.unions for p in pair)
    yield from (p for _, p in rule.matched)
    for cond in rule.conditions:
        yield from ((cond.left, cond.right) if isinstance(cond, Eq) else (cond.expr,))


def _ints(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, np.integer)):
        yield int(value)
    elif isinstance(value, tuple):
        for v in value:
            yield from _ints(v)


def open_sizes(s, drawn: dict, constants: set[str], sizes: set[str]) -> list[int]:
    """The sizes of the sample (`drawn`: its variables as drawn) that can be an open dim."""
    dynamic, fixed = set(), set()
    for (op, _), leaf in s.leaves.items():
        if isinstance(leaf, np.ndarray):
            (dynamic if op == "Input" else fixed).update(leaf.shape)
    for name, value in drawn.items():
        if isinstance(value, np.ndarray):
            (fixed if name in constants else dynamic).update(value.shape)
        elif name not in sizes:
            fixed.update(_ints(value))
    return sorted(d for d in dynamic - fixed if d >= 2)


def mapped(value, table: dict[int, int]):
    """`value` (an int, or vectors of them) with each int in `table` replaced by its entry:
    sizes by their codes, or codes by the sizes a sample reads them as."""
    if isinstance(value, tuple):
        return tuple(mapped(v, table) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return table.get(value, value)
    return value


def _grown(array: np.ndarray, size: int, to: int) -> np.ndarray:
    """`array` with every axis of length `size` extended to `to`, its values repeated."""
    for axis, n in enumerate(array.shape):
        if n == size:
            array = np.take(array, np.arange(to) % size, axis=axis)
    return array


def open_variant(s, drawn: dict, constants: set[str], sizes: set[str]):
    """A copy of the sample `s` with one open size (or None when it has none), its shadow
    attached. `drawn` is the sample's environment before any condition bound a variable."""
    candidates = open_sizes(s, drawn, constants, sizes)
    if not candidates:
        return None
    size = candidates[int(s.rng.integers(0, len(candidates)))]
    grown = size + GROWTH
    variant = copy.copy(s)
    variant.pairs = {(size, grown): CODE_BASE}
    variant.decodes = {CODE_BASE: size}
    variant.sources = {}
    variant.env = {name: mapped(value, {size: CODE_BASE}) if name in sizes else value
                   for name, value in drawn.items()}
    shadow = copy.copy(variant)
    shadow.decodes = {CODE_BASE: grown}
    shadow.sources = {}
    shadow.primary = variant
    shadow.env = {name: _grown(value, size, grown)
                  if isinstance(value, np.ndarray) and name not in constants else value
                  for name, value in variant.env.items()}
    shadow.leaves = {key: _grown(leaf, size, grown)
                     if key[0] == "Input" and isinstance(leaf, np.ndarray) else leaf
                     for key, leaf in s.leaves.items()}
    variant.shadow = shadow
    return variant


def paired_shape(variant, main: tuple, other: tuple) -> tuple:
    """A shape fact of the variant: `main` its dims, `other` the shadow's (see the module)."""
    if len(main) != len(other):
        raise ValueError(f"the rank follows the open dim ({list(main)} and {list(other)})")
    out = []
    for d, e in zip(main, other):
        if d == e:
            out.append(d)
            continue
        code = variant.pairs.get((d, e))
        if code is None:
            code = CODE_BASE - len(variant.pairs)
            variant.pairs[(d, e)] = code
            variant.decodes[code] = d
            variant.shadow.decodes[code] = e
        out.append(code)
    return tuple(out)


def describe(s) -> str:
    """How the open dim of a variant (or of its shadow) was sized, for a counterexample."""
    (size, grown), = [pair for pair, code in s.pairs.items() if code == CODE_BASE]
    at = grown if s.primary is not None else size
    return (f"with a dim of size {size} open (held as the e-graph's code), at size {at}")
