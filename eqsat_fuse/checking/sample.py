"""One attempt at instantiating a rule: the plan it follows and the sample that draws it.

A `_Plan` says what to instantiate for one direction of a rule (its matched roots, conditions,
obligations and hints). A `_Sample` draws every number through hypothesis (so failures
shrink), binds variables and leaf arrays, and evaluates patterns on what it has bound
(`_Sample.eval`). `_Sample.make` instantiates a pattern so that it evaluates, delegating each
operator to its generator; the generators (generators.py) are handed to the sample rather than
imported here, because they are written in terms of the sample's methods.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..ops import OPS
from ..ops import evaluate as _evaluate_op
from .hints import _Hints
from .open_dims import constant_variables, mapped, paired_shape, size_variables
from .patterns import Call, Eq, Lit, Rule, Var, variables
from .primitives import (FACT_FUNCTIONS, _PRIMS, VALUE_RELATIONS, _NoFact, _render_value,
                         _Unbound, _Unsupported, _values_equal)


@dataclass
class _Plan:
    """What to instantiate for one direction of a rule, and what to compare then."""

    rule: Rule
    direction: str
    roots: list                      # (matched variable or None, pattern) to instantiate
    matched: dict
    conditions: list
    obligations: list                # ("union", a, b) | ("set", (f args), value)
    hints: _Hints
    constructors: dict
    relations: frozenset = frozenset()
    names: dict = field(default_factory=dict)   # matched pattern -> its variable (for hints)

    @functools.cached_property
    def contraction(self) -> bool:
        """Does the rule involve a contraction (its summation order may differ per side)?"""
        terms = [p for pair in self.rule.unions for p in pair]
        return any(op in str(p) for p in terms for op in _CONTRACTIONS)

    @functools.cached_property
    def constants(self) -> set[str]:
        """The variables the rule's conditions make model constants (no open dim)."""
        return constant_variables(self.rule)

    @functools.cached_property
    def sizes(self) -> set[str]:
        """The variables in a size slot (a Reshape target...: codes where a dim is open)."""
        return size_variables(self.rule)

    @property
    def exact(self) -> bool:
        """Checked under the exact contract (the whole float domain), not the fast one."""
        return self.rule.numerics != "fast"


# ---- sampling ----------------------------------------------------------------------------------

class _Reject(Exception):
    """This sample does not instantiate the rule (counted; hypothesis tries another)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_FLOAT_TYPES = ("float16", "float32", "float64")
_CONTRACTIONS = ("(MatMul ", "(Gemm ", "(Conv ", "(ConvTranspose ")
# ops whose result has the shape of their first input: these, and every elementwise op of one
# input in the operator table (`unary_elementwise`)
_SHAPE_PRESERVING = {"Mat", "Clip", "Softmax", "LRN", "LayerNormalization", "BatchNormalization"}


def unary_elementwise(op: str) -> bool:
    """Whether the operator table has `op` as an elementwise op of one tensor input."""
    spec = OPS.get(op)
    return spec is not None and spec.kind == "elementwise" and len(spec.inputs) == 1


@functools.lru_cache(maxsize=None)
def _st_int(lo: int, hi: int):
    from hypothesis import strategies as st
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=None)
def _st_pick(options: tuple):
    from hypothesis import strategies as st
    return st.sampled_from(options)


@functools.lru_cache(maxsize=None)
def _st_float(lo: float, hi: float):
    from hypothesis import strategies as st
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


# ---- the float domain --------------------------------------------------------------------------

# the values a data role avoids on a fast rule's ordinary samples, as the assumption it states
ASSUMPTIONS = {"positive": "{} > 0", "nonzero": "{} \u2260 0", "exponent": "{} in [-2, 2]",
               "low": "{} \u2264 0 (a Clip lower bound)", "high": "{} \u2265 0 (a Clip upper bound)"}

# families of edge values; an edge sample gives each float tensor one family (or all of them).
# A rule over a contraction (MatMul, Gemm, Conv, ConvTranspose) gets no huge finite values: a
# sum of huge terms overflows in some summation orders and not in others (inf, -inf or NaN), and
# the contract bounds a contraction by K * eps * sum |a*b| (docs/numerics.md), which is infinite
# then; NaN and +-inf inputs propagate through a sum the same way in any order, and are drawn.
_EDGE_FAMILIES = ("zeros", "infinities", "nan", "denormal", "huge", "all")
_EDGE_FAMILIES_BOUNDED = ("zeros", "infinities", "nan", "denormal", "bounded")


@functools.lru_cache(maxsize=None)
def _edge_values(dtype: str, family: str) -> np.ndarray:
    """The edge values of a float dtype in one family: signed zeros, infinities, NaN,
    denormals and the smallest normals, huge values (the largest, and ones whose square or
    sum overflows)."""
    fi = np.finfo(dtype)
    families = {
        "zeros": [0.0, -0.0],
        "infinities": [np.inf, -np.inf],
        "nan": [np.nan],
        "denormal": [float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
                     float(fi.tiny) * 0.37, -float(fi.tiny) * 0.1, float(fi.tiny) * 0.01,
                     float(fi.tiny), -float(fi.tiny), float(np.sqrt(fi.tiny)) * 0.5],
        "huge": [float(fi.max), -float(fi.max), float(fi.max) * 0.6, -float(fi.max) * 0.3,
                 float(np.sqrt(fi.max)) * 2.0, -float(np.sqrt(fi.max)) * 3.0],
    }
    if family in ("all", "bounded"):
        names = ("zeros", "infinities", "nan", "denormal") + (("huge",) if family == "all" else ())
        values = [v for name in names for v in families[name]]
    else:
        values = families[family]
    return np.asarray(values, dtype=dtype)


def _with_edges(rng, v: np.ndarray, huge: bool = True) -> np.ndarray:
    """`v` with some of its elements (none, a few, half or all) replaced by edge values (not
    the huge finite ones unless `huge`)."""
    if v.dtype.kind != "f":
        return v
    density = rng.choice((0.0, 0.25, 0.5, 1.0))
    if density == 0.0 or v.size == 0:
        return v
    families = _EDGE_FAMILIES if huge else _EDGE_FAMILIES_BOUNDED
    edges = _edge_values(v.dtype.name, families[rng.integers(0, len(families))])
    mask = rng.random(v.shape) < density
    if not mask.any():
        mask.reshape(-1)[rng.integers(0, v.size)] = True
    out = v.copy()
    out[mask] = edges[rng.integers(0, len(edges), int(mask.sum()))]
    return out


def _value_relation_array(rng, shape, relation: str, dtype) -> np.ndarray:
    """Values for which the encoder states the value relation (plus-zero, fraction,
    quant-scale, exact-reciprocal: `primitives.VALUE_RELATIONS`)."""
    dtype = np.dtype(dtype)
    sign = rng.choice((-1.0, 1.0), shape)
    if relation == "plus-zero":
        return np.zeros(shape, dtype=dtype)
    if relation == "quant-scale":
        magnitude = np.ldexp(1.0, rng.integers(-30, 31, shape)) * rng.uniform(1.0, 2.0, shape)
        return np.asarray(sign * np.clip(magnitude, 2.0 ** -30, 2.0 ** 30), dtype=dtype)
    if relation == "fraction":
        magnitude = 10.0 ** rng.uniform(-6.0, 0.0, shape)
        ends = rng.random(shape)
        magnitude = np.where(ends < 0.1, 1e-6, np.where(ends > 0.9, 1.0, magnitude))
        return np.asarray(np.clip(sign * magnitude, -1.0, 1.0), dtype=dtype)
    fi = np.finfo(dtype)
    lo, hi = int(np.log2(fi.tiny)) - 1, int(np.log2(fi.max))
    k = np.where(rng.random(shape) < 0.2, rng.choice((lo, hi, -1, 1), shape),
                 rng.integers(-4, 5, shape))
    with np.errstate(all="ignore"):
        return np.asarray(sign * np.ldexp(1.0, k), dtype=dtype)


class _Sample:
    """One attempt at instantiating a rule: variable values, leaf arrays, drawn numbers."""

    # open dims (`open_dims`): (size, shadow's size) -> code, code -> this sample's size; the
    # variant's shadow, or the shadow's variant
    pairs: dict[tuple[int, int], int] = {}
    decodes: dict[int, int] = {}
    shadow: "_Sample | None" = None
    primary: "_Sample | None" = None

    def __init__(self, plan: _Plan, draw, generator_for: Callable[[str], Callable]):
        self.plan = plan
        self.generator_for = generator_for   # operator -> its generator (generators.py)
        self.hints = plan.hints
        self.draw = draw
        self.env: dict[str, Any] = {}
        self.leaves: dict[tuple[str, str], np.ndarray] = {}
        self.rng = np.random.default_rng(self.i(0, 2**32 - 1))
        self.integral = self.i(0, 3) == 3            # small integer-valued data, now and then
        # float32 mostly, float64 now and then (a rule must not hard-code its dtype); a dtype
        # fixed by a condition is used for every float tensor of the sample
        self.dtype = np.dtype(self.hints.dtype if self.hints.dtype in _FLOAT_TYPES
                              else ("float32", "float64")[self.i(0, 3) == 3])
        self.names = 0
        # exact rules (the default contract) are drawn from the whole float domain: a third of
        # their samples carry the edges (+-0, +-inf, NaN, denormals, huge values; `_edge_values`)
        # and no value is avoided; fast rules get ordinary values only, and the values their
        # operands' roles avoid (a zero divisor...) are recorded as the rule's assumptions
        self.exact = plan.rule.numerics != "fast"
        self.edges = self.exact and self.i(0, 2) == 2   # shrinks to ordinary
        self.assumed: set[tuple[str, str]] = set()
        self.sources: dict[str, Any] = {}     # variable -> the expression a condition bound it to

    # draws (through hypothesis, so failures shrink)
    def i(self, lo: int, hi: int) -> int:
        return lo if hi <= lo else self.draw(_st_int(lo, hi))

    def pick(self, options):
        options = tuple(options)
        if not options:
            raise _Reject("no valid choice")
        return options[0] if len(options) == 1 else self.draw(_st_pick(options))

    def f(self, lo: float, hi: float) -> float:
        return self.draw(_st_float(lo, hi))

    def coin(self) -> bool:
        return self.i(0, 1) == 1

    def subset(self, items, min_size=1) -> tuple:
        items = list(items)
        if not items:
            raise _Reject("nothing to choose from")
        chosen = [x for x in items if self.coin()]
        if len(chosen) < min_size:
            chosen = sorted(set(chosen) | {items[self.i(0, len(items) - 1)]})
        return tuple(chosen)

    # arrays
    def array(self, shape, role="any", label: str | None = None) -> np.ndarray:
        shape = tuple(int(d) for d in shape)
        rng = self.rng
        if role == "bool":
            return np.asarray(rng.random(shape) < 0.5)
        if isinstance(role, tuple) and role[0] == "index":
            return rng.integers(0, max(int(role[1]), 1), shape).astype(np.int64)
        if isinstance(role, tuple) and role[0] == "int":      # a quantized tensor's integers
            info = np.iinfo(role[1])
            return rng.integers(info.min, int(info.max) + 1, shape).astype(role[1])
        if role in VALUE_RELATIONS:
            return _value_relation_array(rng, shape, role, self.dtype)
        if self.exact:
            role = "any"                     # the whole domain: nothing avoided
        elif role in ASSUMPTIONS and label is not None:
            self.assumed.add((label, role))
        if self.integral:
            lo, hi = {"positive": (1, 3), "nonzero": (1, 3), "low": (-3, 0), "high": (0, 3),
                      "exponent": (-2, 2)}.get(role, (-3, 3))
            v = rng.integers(lo, hi + 1, shape).astype(np.float64)
        else:
            lo, hi = {"positive": (0.05, 2.0), "nonzero": (0.5, 2.0), "low": (-2.0, 0.0),
                      "high": (0.0, 2.0), "exponent": (-2.0, 2.0)}.get(role, (-2.0, 2.0))
            v = rng.uniform(lo, hi, shape)
        if role == "nonzero":
            v = v * rng.choice((-1.0, 1.0), shape)
        v = np.asarray(v, dtype=self.dtype)
        if self.edges:
            v = _with_edges(rng, v, not self.plan.contraction)
        return v

    def random_shape(self, ranks=None, rank=None) -> tuple:
        if rank is None:
            rank = self.pick(sorted(ranks)) if ranks else self.pick((2, 1, 3, 4))
        return tuple(self.i(1, 4) for _ in range(rank))

    def sub_shape(self, base, rank=None) -> tuple:
        """A shape that broadcasts against `base` (to `base`, unless `rank` is larger)."""
        base = tuple(base)
        if rank is None:
            mode = self.pick(("same", "suffix", "ones", "same"))
            if mode == "same":
                return base
            if mode == "suffix":
                return base[self.i(0, len(base)):]
            return tuple(1 if self.coin() else d for d in base)
        if rank <= len(base):
            return tuple(1 if self.coin() else d for d in base[len(base) - rank:])
        return tuple(self.i(1, 3) for _ in range(rank - len(base))) + base

    # variables and attributes
    def determined(self, p) -> bool:
        if isinstance(p, Var):
            return p.name in self.env
        if isinstance(p, Lit):
            return True
        if p.op in ("Input", "Const"):
            name = p.args[0]
            if isinstance(name, Var):
                if name.name not in self.env:
                    return False
                name = self.env[name.name]
            else:
                name = name.value
            return (p.op, name) in self.leaves
        return all(self.determined(a) for a in p.args)

    def value_if_determined(self, p):
        return self.eval(p) if self.determined(p) else None

    def try_eval(self, expr):
        """The value of an expression if the sample binds what it needs, else None."""
        try:
            with np.errstate(all="ignore"):
                return self.eval(expr)
        except Exception:
            return None

    def first(self, exprs):
        for e in exprs or ():
            v = self.try_eval(e)
            if v is not None:
                return v
        return None

    def known(self, p):
        """An attribute's value if it is already fixed (literal, bound, or by a condition)."""
        if isinstance(p, Lit):
            return p.value
        if isinstance(p, Var):
            if p.name in self.env:
                return self.env[p.name]
            return self.first(self.hints.fixed.get(p.name))
        return self.try_eval(p)

    def guards_hold(self, name: str) -> bool:
        """Do the conditions mentioning `name` that can be evaluated now hold?"""
        for c in self.hints.guards.get(name, ()):
            if not all(v in self.env for v in variables(c.left if isinstance(c, Eq) else c.expr)
                       + (variables(c.right) if isinstance(c, Eq) else [])):
                continue
            try:
                with np.errstate(all="ignore"):
                    if isinstance(c, Eq):
                        if not _values_equal(self.eval(c.left), self.eval(c.right)):
                            return False
                    elif not (isinstance(c.expr, Call) and (c.expr.op in self.plan.constructors
                                                            or c.expr.op in self.plan.relations
                                                            or c.expr.op == "!=")):
                        self.eval(c.expr)
            except _NoFact:
                return False
            except Exception:
                continue
        return True

    def attr(self, p, drawer: Callable[[], Any]):
        """An attribute's value: the fixed one, or a fresh draw bound to its variable (redrawn a
        few times while a condition that mentions it fails)."""
        value = self.known(p)
        if value is not None:
            if isinstance(p, Var):
                self.env[p.name] = value
            return value
        if isinstance(p, Var):
            tries = 6 if p.name in self.hints.guards else 1
            for _ in range(tries):
                self.env[p.name] = value = drawer()
                if tries == 1 or self.guards_hold(p.name):
                    break
            return value
        raise _Reject(f"cannot instantiate the attribute {p}")

    def rank_of(self, p):
        """The rank a pattern's value must have, if something already fixes it."""
        if isinstance(p, Var):
            v = self.env.get(p.name)
            if isinstance(v, np.ndarray):
                return v.ndim
            shape = self.first(self.hints.shape.get(p.name))
            if shape is not None:
                return len(shape)
            return self.first(self.hints.rank.get(p.name))
        if not isinstance(p, Call):
            return None
        name = self.var_for(p)
        if name is not None and not self.determined(p):
            shape = self.first(self.hints.shape.get(name))
            if shape is not None:
                return len(shape)
            rank = self.first(self.hints.rank.get(name))
            if rank is not None:
                return rank
        if p.op == "Pad":
            n = self.length_of(p.args[1])
            return self.rank_of(p.args[0]) or (n // 2 if n else None)
        if p.op == "Transpose":
            return self.rank_of(p.args[0]) or self.length_of(p.args[1])
        if p.op in ("Reshape", "Expand"):
            return self.length_of(p.args[1])
        if p.op == "Scalar":
            return 0
        if p.op == "Ints":
            return 1
        if p.op in _SHAPE_PRESERVING or unary_elementwise(p.op):
            return self.rank_of(p.args[0])
        if p.op in ("Conv", "ConvTranspose"):
            return self.rank_of(p.args[0]) or self.rank_of(p.args[1])
        if p.op in ("MaxPool", "AveragePool", "GlobalAveragePool"):
            return self.rank_of(p.args[0])
        if p.op in ("Add", "Sub", "Mul", "Div", "Pow", "Where"):
            ranks = [self.rank_of(a) for a in p.args]
            return None if None in ranks else max(ranks)
        return None

    def var_for(self, p) -> str | None:
        """The variable whose hints apply to `p`: p itself, or the matched variable bound to it."""
        if isinstance(p, Var):
            return p.name
        return self.plan.names.get(p)

    def length_of(self, p):
        """The length of a vector attribute, if it is fixed (by its value or a condition)."""
        value = self.known(p)
        if value is not None:
            return len(value)
        return self.first(self.hints.length.get(p.name)) if isinstance(p, Var) else None

    def dim_hint(self, name: str, axis: int):
        return self.first(self.hints.dims.get(name, {}).get(axis))

    def fresh_shape(self, name: str, want, ranks) -> tuple:
        h = self.hints
        fixed = self.first(h.shape.get(name))
        rank = self.first(h.rank.get(name))
        dims = {i: self.dim_hint(name, i) for i in h.dims.get(name, {})}
        dims = {i: d for i, d in dims.items() if d is not None}
        if want is not None:
            want = tuple(want)
            if fixed is not None and tuple(fixed) != want:
                raise _Reject(f"shape of {name} is fixed by a condition")
            if rank is not None and rank != len(want):
                raise _Reject(f"rank of {name} is fixed by a condition")
            if any(i >= len(want) or want[i] != d for i, d in dims.items()):
                raise _Reject(f"a dim of {name} is fixed by a condition")
            return want
        if fixed is not None:
            return tuple(fixed)
        if rank is None:
            rank = self.pick(sorted(ranks)) if ranks else self.pick((2, 1, 3, 4))
        elif ranks and rank not in ranks:
            raise _Reject(f"rank of {name} is fixed by a condition")
        if not isinstance(rank, int) or not 0 <= rank <= 6:
            raise _Reject(f"rank {rank} of {name} cannot be sampled")
        return tuple(dims.get(i) or self.i(1, 4) for i in range(rank))

    def hinted_shape(self, p):
        """The shape conditions give a not-yet-instantiated term, if they give one now."""
        name = self.var_for(p)
        if name is not None and not self.determined(p):
            shape = self.first(self.hints.shape.get(name))
            return None if shape is None else tuple(shape)
        return None

    def tensor(self, name: str, shape, role):
        role = self.hints.values.get(name, role)
        if name in self.hints.splat:
            value = self.hints.splat[name]
            if value is None:
                value = float(self.array((), role, name))
            return np.full(tuple(shape), value, dtype=self.dtype)
        return self.array(shape, role, name)

    def make(self, p, want=None, role="any", ranks=None):
        """Instantiate the variables of `p` so that it evaluates (to shape `want`, if given);
        return its value."""
        if isinstance(p, Var):
            if p.name in self.env:
                value = self.env[p.name]
            else:
                value = self.tensor(p.name, self.fresh_shape(p.name, want, ranks), role)
                self.env[p.name] = value
        elif isinstance(p, Lit):
            return p.value
        elif self.determined(p):
            value = self.eval(p)
        else:
            name = self.plan.names.get(p)
            if name is not None and want is None:
                shape = self.first(self.hints.shape.get(name))
                want = None if shape is None else tuple(shape)
                rank = self.first(self.hints.rank.get(name))
                if want is None and rank is not None:
                    if ranks and rank not in ranks:
                        raise _Reject(f"rank of {name} is fixed by a condition")
                    ranks = {rank}
            gen = self.generator_for(p.op)
            value = gen(self, p, None if want is None else tuple(want), role, ranks)
        if want is not None:
            if not isinstance(value, np.ndarray) or value.shape != tuple(want):
                got = "absent" if value is None else getattr(value, "shape", type(value).__name__)
                raise _Reject(f"{_head(p)} gives shape {got} where {tuple(want)} is needed")
        elif ranks and isinstance(value, np.ndarray) and value.ndim not in ranks:
            raise _Reject(f"{_head(p)} gives rank {value.ndim}, not one of {sorted(ranks)}")
        return value

    def optional(self, p, shape, role="any"):
        """An optional input slot: now and then absent when it is a free variable."""
        if isinstance(p, Call) and p.op == "Absent":
            return None
        if (isinstance(p, Var) and p.name not in self.env and not self.hints.has(p.name)
                and self.i(0, 3) == 3):
            self.env[p.name] = None
            return None
        return self.make(p, shape, role)

    def apply(self, op: str, tensors: list, attrs: dict):
        try:
            with np.errstate(all="ignore"):
                return _evaluate_op(op, tensors, attrs)
        except Exception as exc:
            raise _Reject(f"{op} does not evaluate on the sampled operands "
                          f"({type(exc).__name__}: {str(exc)[:80]})") from None

    def fresh_name(self, kind: str) -> str:
        self.names += 1
        return f"{kind.lower()}{self.names}"

    # evaluation
    def decoded(self, value):
        """`value` with every code read as the size it stands for (what evaluation needs)."""
        return mapped(value, self.decodes)

    def _attrs(self, spec, values) -> dict:
        n = len(spec.inputs)
        attrs = dict(zip(spec.attrs, values[n:]))
        return {k: self.decoded(v) for k, v in attrs.items()} if self.decodes else attrs

    def eval(self, p):
        if isinstance(p, Var):
            if p.name in self.env:
                return self.env[p.name]
            if p.name in self.plan.matched:          # a matched term, instantiated already?
                return self.eval(self.plan.matched[p.name])
            if self.primary is not None and p.name in self.primary.sources:
                self.env[p.name] = value = self.eval(self.primary.sources[p.name])
                return value                         # a shadow: bound as its variant was
            raise _Unbound(p.name)
        if isinstance(p, Lit):
            return p.value
        op = p.op
        if op in self.plan.constructors:
            return self._eval_constructor(p)
        if op in FACT_FUNCTIONS:
            if op == "shape" and self.primary is not None:
                return self.primary.eval(p)          # one code table, the variant's
            value = FACT_FUNCTIONS[op](*(self.eval(a) for a in p.args))
            if op == "shape" and self.shadow is not None:
                other = FACT_FUNCTIONS[op](*(self.shadow.eval(a) for a in p.args))
                return paired_shape(self, value, other)
            return value
        if op in _PRIMS:
            return _PRIMS[op](*(self.eval(a) for a in p.args))
        raise _Unsupported(f"({op} ...) has no meaning known to the checker")

    def contraction_slack(self, p):
        """The contraction bound of docs/numerics.md for a side whose root is a float MatMul,
        Gemm or Conv: (K + 2) * eps * (the same contraction of |operands|) per element, by which
        any summation order may differ from the exact sum; None for any other side."""
        while isinstance(p, Call) and p.op == "Mat":
            p = p.args[0]
        if not isinstance(p, Call) or p.op not in ("MatMul", "Gemm", "Conv"):
            return None
        spec = OPS[p.op]
        n = len(spec.inputs)
        values = [self.eval(a) for a in p.args]
        tensors, attrs = values[:n], self._attrs(spec, values)
        if any(t is not None and np.asarray(t).dtype.kind != "f" for t in tensors):
            return None
        if p.op == "Gemm":
            attrs = {**attrs, "alpha": abs(attrs["alpha"]), "beta": abs(attrs["beta"])}
            k = np.shape(tensors[0])[-2 if attrs["trans_a"] else -1]
        elif p.op == "Conv":
            k = int(np.prod(np.shape(tensors[1])[1:]))
        else:
            k = np.shape(tensors[0])[-1]
        magnitudes = [None if t is None else np.abs(np.asarray(t, np.float64)) for t in tensors]
        with np.errstate(all="ignore"):
            total = np.asarray(_evaluate_op(p.op, magnitudes, attrs), np.float64)
        eps = np.finfo(np.asarray(tensors[0]).dtype).eps
        return (int(k) + 2) * eps * total

    def quantization_slack(self, p):
        """For a side whose root is a QuantizeLinear of a float contraction or of a Cast to a
        narrower float: (its argument's value, how far that value may lie from the exact one
        (the contraction bound; the Cast's rounding), the scale); None for any other side. A
        quantized element whose exact value is that close to a rounding tie may round either
        way (docs/numerics.md)."""
        while isinstance(p, Call) and p.op == "Mat":
            p = p.args[0]
        if not isinstance(p, Call) or p.op != "QuantizeLinear":
            return None
        x = p.args[0]
        while isinstance(x, Call) and x.op == "Mat":
            x = x.args[0]
        if not isinstance(x, Call):
            return None
        value = np.asarray(self.eval(x))
        if value.dtype.kind != "f":
            return None
        if x.op == "Cast":
            wide = np.asarray(self.eval(x.args[0]))
            if wide.dtype.kind != "f" or wide.dtype.itemsize <= value.dtype.itemsize:
                return None
            with np.errstate(all="ignore"):
                slack = np.abs(value.astype(np.float64) - wide.astype(np.float64))
        else:
            slack = self.contraction_slack(x)
            if slack is None:
                return None
        return value, slack, np.asarray(self.eval(p.args[1]))

    def _eval_constructor(self, p):
        op = p.op
        if op == "Mat":
            return self.eval(p.args[0])
        if op in ("Input", "Const"):
            name = self.eval(p.args[0])
            if (op, name) not in self.leaves:
                raise _NoFact(f"({op} {_render_value(name)}) is not a leaf of the matched term")
            return self.leaves[(op, name)]
        if op == "Absent":
            return None
        if op == "TNil":
            return []
        if op == "TCons":
            return [self.eval(p.args[0]), *self.eval(p.args[1])]
        spec = OPS.get(op)
        if spec is None or spec.kind == "opaque":
            raise _Unsupported(f"{op} has no NumPy evaluation")
        values = [self.eval(a) for a in p.args]
        with np.errstate(all="ignore"):
            return _evaluate_op(op, values[:len(spec.inputs)], self._attrs(spec, values))


def _head(p) -> str:
    return p.name if isinstance(p, Var) else (f"({p.op} ...)" if isinstance(p, Call) else str(p))
