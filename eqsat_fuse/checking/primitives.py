"""What egglog's primitives and the rule files' fact functions compute on sampled values.

The checker evaluates a rule's conditions and sides on concrete values (arrays, ints, floats,
strings, tuples for vectors, None for unit and Absent). This module says what every call that
is not a constructor of the term language means there: egglog's primitives (``+``, ``vec-of``,
``<``...: `_PRIMS`) and the fact functions (``shape``, ``dtype``, ``scalar-value``:
`FACT_FUNCTIONS`). It also holds the signals an evaluation stops with (`_NoFact`, `_Unbound`,
`_Unsupported`), how a value is written in egglog syntax (`_render_value`) and when two values
are the same (`_values_equal`).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np


def _render_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "()"
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, tuple):
        return "(vec-of " + " ".join(_render_value(x) for x in v) + ")" if v else "(vec-empty)"
    if isinstance(v, float):
        return repr(v)
    return str(v)


class _NoFact(Exception):
    """A condition does not hold / a fact does not exist (the rule would not match)."""


class _Unbound(Exception):
    """An expression needs a variable that is not bound yet."""


class _Unsupported(Exception):
    """The checker does not know what this construct means."""


def _int_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise _NoFact("division by zero")
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _int_rem(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise _NoFact("remainder by zero")
        r = abs(a) % abs(b)
        return r if a >= 0 else -r
    return math.fmod(a, b)


def _check(test: Callable[..., bool], name: str):
    def prim(*args):
        if not test(*args):
            raise _NoFact(f"({name} {' '.join(_render_value(a) for a in args)}) is false")
        return None
    return prim


def _structural(*values) -> bool:
    """Tensors compared by `!=` are e-classes: "distinct terms" is structural, not numeric."""
    return any(isinstance(v, (np.ndarray, list)) or v is None for v in values)


def _vec_get(v, i):
    if not 0 <= i < len(v):
        raise _NoFact(f"vec-get index {i} out of range for {_render_value(tuple(v))}")
    return v[i]


def _vec_set(v, i, x):
    if not 0 <= i < len(v):
        raise _NoFact(f"vec-set index {i} out of range")
    return tuple(v[:i]) + (x,) + tuple(v[i + 1:])


_PRIMS: dict[str, Callable] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b=None: -a if b is None else a - b,
    "*": lambda a, b: a * b,
    "/": _int_div,
    "%": _int_rem,
    "min": min, "max": max, "abs": abs, "neg": lambda a: -a,
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
    "not-i64": lambda a: ~a,
    "<": _check(lambda a, b: a < b, "<"), ">": _check(lambda a, b: a > b, ">"),
    "<=": _check(lambda a, b: a <= b, "<="), ">=": _check(lambda a, b: a >= b, ">="),
    "!=": _check(lambda a, b: _structural(a, b) or a != b, "!="),
    "bool-<": lambda a, b: a < b, "bool->": lambda a, b: a > b,
    "bool-<=": lambda a, b: a <= b, "bool->=": lambda a, b: a >= b,
    "bool-=": lambda a, b: a == b,
    "and": lambda a, b: a and b, "or": lambda a, b: a or b, "xor": lambda a, b: a != b,
    "not": lambda a: not a,
    "to-f64": float, "to-i64": lambda a: int(a), "to-string": str,
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log,
    "vec-of": lambda *a: tuple(a), "vec-empty": lambda: (),
    "vec-push": lambda v, x: tuple(v) + (x,), "vec-pop": lambda v: tuple(v)[:-1],
    "vec-append": lambda *vs: tuple(x for v in vs for x in v),
    "vec-get": _vec_get, "vec-set": _vec_set, "vec-length": len,
    "vec-contains": _check(lambda v, x: x in v, "vec-contains"),
    "vec-not-contains": _check(lambda v, x: x not in v, "vec-not-contains"),
    "vec-remove": lambda v, i: tuple(v)[:i] + tuple(v)[i + 1:],
}


def _fact_shape(x):
    if not isinstance(x, np.ndarray):
        raise _NoFact("no shape fact (an absent input has none)")
    return tuple(int(d) for d in x.shape)


def _fact_dtype(x):
    if not isinstance(x, np.ndarray):
        raise _NoFact("no dtype fact (an absent input has none)")
    return str(x.dtype)


# Fact functions (declared with `function` in the rule files) whose meaning the checker knows:
# name -> function of the argument values. The encoder states shape and dtype for every tensor
# (never for Absent); scalar-value holds for a tensor whose elements are all equal (the encoder
# states it for such constants). A new fact function must be added here to be checkable.
def _fact_scalar_value(x):
    if not isinstance(x, np.ndarray) or x.size == 0 or x.dtype.kind not in "fiub":
        raise _NoFact("no scalar-value fact (not a numeric tensor)")
    first = x.reshape(-1)[0]
    if not np.all(x == first):
        raise _NoFact("no scalar-value fact (the elements differ)")
    return float(first)


FACT_FUNCTIONS: dict[str, Callable] = {"shape": _fact_shape, "dtype": _fact_dtype,
                                       "scalar-value": _fact_scalar_value}

# Relations are structural: they say how a term is built (e.g. `fusable`: its operator may take
# an elementwise consumer), not what it computes, so they put no constraint on sampled values.
# The exceptions are the value relations below: what the encoder states about a model constant's
# values (`frontend.encode._value_facts`), which the checker evaluates on the sample the same way
# (a condition (fraction c) holds where the encoder would state it) and draws values for.
VALUE_RELATIONS: dict[str, str] = {
    "exact-reciprocal": "every element is +-2^k with 1/x representable",
    "fraction": "every element is finite with 1e-6 <= |v| <= 1",
    "plus-zero": "every element is +0.0",
    "quant-scale": "every element is finite with 2^-30 <= |v| <= 2^30",
}


def value_relation_holds(name: str, x) -> bool:
    """Whether the encoder would state the value relation `name` about the tensor `x`."""
    from ..frontend.encode import _value_facts

    if not isinstance(x, np.ndarray):
        return False
    return f"({name} v)" in _value_facts("v", x)


def _values_equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b
