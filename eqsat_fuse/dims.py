"""Symbolic dims: a size the model leaves open, as an exact expression of named symbols.

A `Dim` is a polynomial with integer coefficients over symbols (`seq`, `past`) and opaque
factors (a floor division, remainder, min or max that does not simplify), kept in one canonical
form, so two dims are equal exactly when their expressions are (`seq + past` and `past + seq`
are one `Dim`). A dim that is a number is a plain `int`: `dim()` and every operation return an
`int` whenever the result is constant, so static shapes stay tuples of ints.

`Dim` behaves like an int where that is sound: `+ - * // %` with ints and dims, `==` (the same
expression), ordering when it holds for every value of the symbols (each symbol is a size >= 0), and `evaluate(binding)`. Anything that would need a number it does
not have (`int(d)`, an undecidable `d < 8`) raises `SymbolicError`, never a guess.

This is the representation TVM's arithmetic and onnxruntime's symbolic shape inference use
(sympy there), cut to what shapes need: exact, hashable, JSON-serializable (`to_json`,
`from_json`: for artifacts, no code evaluated), and evaluated in microseconds at run time.
"""

from __future__ import annotations

import re
from typing import Union

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SymbolicError(ValueError):
    """A symbolic dim was used where a number, or an undecidable comparison, was needed."""


# A factor is a symbol (str) or an opaque operation ("//" | "%" | "min" | "max", Dim|int, Dim|int).
# A monomial is a sorted tuple of (factor, power); a polynomial a sorted tuple of (monomial, coeff).


def _key(factor) -> str:
    return factor if isinstance(factor, str) else f"{factor[0]}({factor[1]},{factor[2]})"


def _mono_key(mono) -> str:
    return "*".join(f"{_key(f)}^{p}" for f, p in mono)


def _canonical(terms: dict) -> Union["Dim", int]:
    items = tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda t: _mono_key(t[0])))
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    return Dim(items)


def _terms(x) -> dict:
    if isinstance(x, Dim):
        return dict(x.terms)
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            x = int(x.__index__())
        except (AttributeError, TypeError):
            raise TypeError(f"not a dim: {x!r}") from None
    return {(): x} if x else {}


def _mono_mul(a: tuple, b: tuple) -> tuple:
    powers: dict = {}
    order: dict = {}
    for f, p in (*a, *b):
        k = _key(f)
        powers[k] = powers.get(k, 0) + p
        order[k] = f
    return tuple((order[k], powers[k]) for k in sorted(powers))


def symbol(name: str) -> "Dim":
    """The dim named `name` (an identifier)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"a symbol's name must be an identifier, not {name!r}")
    return Dim(((((name, 1),), 1),))


def dim(x) -> Union["Dim", int]:
    """`x` (an int, a NumPy integer or a Dim) as a dim: an int when it is a number."""
    if isinstance(x, Dim):
        return x
    return _canonical(_terms(x))


def is_symbolic(x) -> bool:
    return isinstance(x, Dim)


def bare_symbol(d) -> str | None:
    """The symbol's name when `d` is one symbol alone (`seq`, not `seq + 1`), else None."""
    if isinstance(d, Dim) and len(d.terms) == 1:
        mono, coeff = d.terms[0]
        if coeff == 1 and len(mono) == 1 and isinstance(mono[0][0], str) and mono[0][1] == 1:
            return mono[0][0]
    return None


def _opaque(op: str, a, b) -> "Dim":
    return Dim((((((op, a, b), 1),), 1),))


class Dim:
    __slots__ = ("terms", "_hash")

    def __init__(self, terms: tuple):
        self.terms = terms
        self._hash = hash(terms)

    # ---- arithmetic ----
    def __add__(self, other):
        terms = _terms(self)
        for m, c in _terms(other).items():
            terms[m] = terms.get(m, 0) + c
        return _canonical(terms)

    __radd__ = __add__

    def __neg__(self):
        return _canonical({m: -c for m, c in self.terms})

    def __sub__(self, other):
        return self + (-dim(other))

    def __rsub__(self, other):
        return dim(other) + (-self)

    def __mul__(self, other):
        out: dict = {}
        for ma, ca in self.terms:
            for mb, cb in _terms(other).items():
                m = _mono_mul(ma, mb)
                out[m] = out.get(m, 0) + ca * cb
        return _canonical(out)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        return floordiv(self, other)

    def __rfloordiv__(self, other):
        return floordiv(other, self)

    def __mod__(self, other):
        return mod(self, other)

    def __rmod__(self, other):
        return mod(other, self)

    # ---- comparison ----
    def __eq__(self, other):
        return isinstance(other, Dim) and self.terms == other.terms

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return self._hash

    def __lt__(self, other):
        return _sign(self - other, "<") < 0

    def __le__(self, other):
        return _sign(self - other, "<=") <= 0

    def __gt__(self, other):
        return _sign(self - other, ">") > 0

    def __ge__(self, other):
        return _sign(self - other, ">=") >= 0

    def __bool__(self):
        return True           # not known to be 0

    def __int__(self):
        raise SymbolicError(f"the dim {self} is symbolic: it has no number until its symbols "
                            f"are bound")

    __index__ = __int__

    # ---- what it is ----
    @property
    def symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for mono, _ in self.terms:
            for f, _ in mono:
                if isinstance(f, str):
                    out.add(f)
                else:
                    out.update(symbols_of(f[1]) | symbols_of(f[2]))
        return frozenset(out)

    def evaluate(self, binding: dict[str, int]) -> int:
        total = 0
        for mono, coeff in self.terms:
            value = coeff
            for f, p in mono:
                value *= _factor_value(f, binding) ** p
            total += value
        return total

    def substitute(self, mapping: dict[str, Union["Dim", int]]) -> Union["Dim", int]:
        """This dim with each symbol in `mapping` replaced by its dim."""
        total: Union[Dim, int] = 0
        for mono, coeff in self.terms:
            value: Union[Dim, int] = coeff
            for f, p in mono:
                if isinstance(f, str):
                    part = mapping.get(f, symbol(f))
                else:
                    part = _OPS[f[0]](substitute(f[1], mapping), substitute(f[2], mapping))
                for _ in range(p):
                    value = value * part
            total = total + value
        return total

    def __str__(self):
        parts = []
        for mono, coeff in self.terms:
            factors = [(_key(f) if isinstance(f, str) else _show(f)) + (f"^{p}" if p > 1 else "")
                       for f, p in mono]
            body = "*".join(factors)
            if not body:
                parts.append(str(coeff))
            elif coeff == 1:
                parts.append(body)
            elif coeff == -1:
                parts.append(f"-{body}")
            else:
                parts.append(f"{coeff}*{body}")
        text = " + ".join(parts)
        return text.replace("+ -", "- ")

    def __repr__(self):
        return f"Dim({str(self)!r})"

    def to_json(self):
        return [[[_factor_json(f), p] for f, p in mono] + [c] for mono, c in self.terms]


def _show(f) -> str:
    op, a, b = f
    if op in ("//", "%"):
        return f"({_paren(a)} {op} {_paren(b)})"
    return f"{op}({a}, {b})"


def _paren(x) -> str:
    return f"({x})" if isinstance(x, Dim) and len(x.terms) > 1 else str(x)


def symbols_of(x) -> frozenset[str]:
    return x.symbols if isinstance(x, Dim) else frozenset()


def evaluate(x, binding: dict[str, int]) -> int:
    """The number `x` (an int or a Dim) is under `binding` (symbol -> value)."""
    if isinstance(x, Dim):
        return x.evaluate(binding)
    return int(x)


def substitute(x, mapping: dict) -> Union[Dim, int]:
    return x.substitute(mapping) if isinstance(x, Dim) else x


def _factor_value(f, binding: dict[str, int]) -> int:
    if isinstance(f, str):
        try:
            return int(binding[f])
        except KeyError:
            raise SymbolicError(f"no value for the symbol {f!r}") from None
    op, a, b = f
    a, b = evaluate(a, binding), evaluate(b, binding)
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    return min(a, b) if op == "min" else max(a, b)


def _factor_json(f):
    if isinstance(f, str):
        return f
    op, a, b = f
    return [op, to_json(a), to_json(b)]


def to_json(x):
    """`x` (int or Dim) as JSON data: an int, or {"dim": terms}."""
    return {"dim": x.to_json()} if isinstance(x, Dim) else int(x)


def from_json(data) -> Union[Dim, int]:
    """The dim `to_json` wrote; refuses anything else (data from a file, never evaluated)."""
    if isinstance(data, bool):
        raise ValueError(f"not a dim: {data!r}")
    if isinstance(data, int):
        return data
    if not isinstance(data, dict) or set(data) != {"dim"} or not isinstance(data["dim"], list):
        raise ValueError(f"not a dim: {data!r}")
    total: Union[Dim, int] = 0
    for term in data["dim"]:
        if not isinstance(term, list) or not term or not isinstance(term[-1], int):
            raise ValueError(f"not a dim term: {term!r}")
        value: Union[Dim, int] = term[-1]
        for item in term[:-1]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], int)
                    and item[1] >= 1):
                raise ValueError(f"not a dim factor: {item!r}")
            f, p = item
            if isinstance(f, str):
                part = symbol(f)
            elif isinstance(f, list) and len(f) == 3 and f[0] in _OPS:
                part = _OPS[f[0]](from_json(f[1]), from_json(f[2]))
            else:
                raise ValueError(f"not a dim factor: {f!r}")
            for _ in range(p):
                value = value * part
        total = total + value
    return total


# ---- ordering: what holds for every value of the symbols (each >= 0) ----

def _bounds(x) -> tuple[float, float]:
    """Lower and upper bounds of x over all symbol values >= 0."""
    if not isinstance(x, Dim):
        return float(x), float(x)
    lo, hi = 0.0, 0.0
    for mono, coeff in x.terms:
        if mono == ():
            lo += coeff
            hi += coeff
        elif not all(_nonnegative(f) for f, _ in mono):
            return float("-inf"), float("inf")     # a factor of either sign
        elif coeff > 0:                            # a monomial >= 0
            hi = float("inf")
        else:
            lo = float("-inf")
    return lo, hi


def _nonnegative(factor) -> bool:
    """Whether a factor is >= 0 for every value of the symbols."""
    if isinstance(factor, str):
        return True
    op, a, b = factor
    if op == "//":
        return _bounds(a)[0] >= 0 and _bounds(b)[0] > 0
    if op == "%":
        return _bounds(b)[0] > 0
    if op == "min":
        return _bounds(a)[0] >= 0 and _bounds(b)[0] >= 0
    return _bounds(a)[0] >= 0 or _bounds(b)[0] >= 0          # max


def _sign(x, op: str) -> int:
    """-1, 0 or 1: the sign of x for every value of its symbols, or SymbolicError."""
    if not isinstance(x, Dim):
        return (x > 0) - (x < 0)
    lo, hi = _bounds(x)
    if op in ("<", ">="):        # x < 0 decided when hi < 0 (true) or lo >= 0 (false)
        if hi < 0:
            return -1
        if lo >= 0:
            return 1 if lo > 0 else 0
    else:                        # x <= 0 / x > 0: decided when hi <= 0 or lo > 0
        if hi <= 0:
            return -1 if hi < 0 else 0
        if lo > 0:
            return 1
    raise SymbolicError(f"cannot tell whether {x} {op.replace('=', '')}"
                        f"{'=' if '=' in op else ''} 0 for every value of its symbols")


def known_le(a, b) -> bool:
    """Whether a <= b for every value of the symbols (False: not for every value)."""
    return _bounds(dim(b) - dim(a))[0] >= 0


# ---- the operations that do not always simplify ----

def _monomial_divisor(d: Dim) -> tuple[tuple, int] | None:
    return d.terms[0] if len(d.terms) == 1 else None


def _exact_quotient(a, b):
    """a / b when b divides every term of a exactly (b an int or a single-term dim), else None."""
    ta = _terms(a)
    if isinstance(b, Dim):
        single = _monomial_divisor(b)
        if single is None:
            return None
        bm, bc = single
    else:
        bm, bc = (), int(b)
    if bc == 0:
        raise ZeroDivisionError("a dim divided by zero")
    need = {_key(f): p for f, p in bm}
    out: dict = {}
    for mono, coeff in ta.items():
        if coeff % bc:
            return None
        have = {_key(f): (f, p) for f, p in mono}
        if any(have.get(k, (None, 0))[1] < p for k, p in need.items()):
            return None
        rest = tuple((f, p - need.get(k, 0)) for k, (f, p) in sorted(have.items())
                     if p - need.get(k, 0) > 0)
        out[rest] = out.get(rest, 0) + coeff // bc
    return _canonical(out)


def floordiv(a, b):
    a, b = dim(a), dim(b)
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return a // b
    if b == 1:
        return a
    exact = _exact_quotient(a, b)
    if exact is not None:
        return exact
    return _opaque("//", a, b)


def mod(a, b):
    a, b = dim(a), dim(b)
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return a % b
    if b == 1 or _exact_quotient(a, b) is not None:
        return 0
    return _opaque("%", a, b)


def _extremum(op: str, a, b):
    """min(a, b) (op "min") or max(a, b) ("max"): one of them where the order holds for every
    value of the symbols, else an opaque factor."""
    a, b = dim(a), dim(b)
    if a == b:
        return a
    if known_le(a, b):
        return a if op == "min" else b
    if known_le(b, a):
        return b if op == "min" else a
    return _opaque(op, *sorted((a, b), key=str))


def dmin(a, b):
    return _extremum("min", a, b)


def dmax(a, b):
    return _extremum("max", a, b)


_OPS = {"//": floordiv, "%": mod, "min": dmin, "max": dmax}


def shape_str(shape) -> str:
    """A shape as users read it: [batch, seq + 1, 768]."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


# ---- symbolic dims as e-graph integers ----

CODE_BASE = -(1 << 52)


class DimCodes:
    """Symbolic dims as the i64s the e-graph holds: each distinct `Dim` one code <= CODE_BASE.

    Rules compare dims only for equality (and test small numbers such as `(= 1 d)`), so a dim
    stands for itself: two codes are equal exactly when the expressions are, and a code is never
    1. A rule that relied on the size of a dim would see a huge negative number and not fire.
    """

    def __init__(self):
        self.dims: list[Dim] = []
        self.index: dict[Dim, int] = {}

    def code(self, x) -> int:
        if not isinstance(x, Dim):
            return int(x)
        if x not in self.index:
            self.index[x] = CODE_BASE - len(self.dims)
            self.dims.append(x)
        return self.index[x]

    def dim(self, value: int):
        """The dim a code stands for (an int that is no code is itself)."""
        if isinstance(value, int) and value <= CODE_BASE and CODE_BASE - value < len(self.dims):
            return self.dims[CODE_BASE - value]
        return value

    def __len__(self) -> int:
        return len(self.dims)


def evaluate_all(value, binding: dict[str, int]):
    """`value` (a dim, or a list/tuple nesting dims and other values) with every dim evaluated."""
    if isinstance(value, Dim):
        return value.evaluate(binding)
    if isinstance(value, tuple):
        return tuple(evaluate_all(v, binding) for v in value)
    if isinstance(value, list):
        return [evaluate_all(v, binding) for v in value]
    return value


def has_dims(value) -> bool:
    if isinstance(value, Dim):
        return True
    if isinstance(value, (tuple, list)):
        return any(has_dims(v) for v in value)
    return False


def broadcast_shapes(*shapes) -> tuple:
    """NumPy's broadcasting over shapes of ints and dims: equal dims, or 1 against any."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate((1,) * (rank - len(s)) + tuple(s)):
            if d == 1 or d == out[i]:
                continue
            if out[i] == 1:
                out[i] = d
                continue
            raise ValueError(f"shapes {[shape_str(x) for x in shapes]} do not broadcast")
    return tuple(out)
