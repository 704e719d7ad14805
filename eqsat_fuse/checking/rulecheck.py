"""The soundness checker: every rule's two sides must compute the same tensor.

    report = check_rules()                    # every shipped rule (rules/*.egg)
    report = check_rules(["my_rules.egg"])    # a user's file, loaded after the shipped ones
    print(report.summary()); report.ok       # False if any rule is unsound

For each rule, hypothesis draws shapes, attribute values and array data that satisfy the rule's
conditions; both sides are evaluated with the NumPy backend (`ops.evaluate`; `Mat` is the
identity, `Input`/`Const` leaves are the sampled arrays, `Absent` is None, `Scalar` and `Ints`
are literals) and compared (float32: |lhs - rhs| <= 1e-5 * max(1, max|lhs|, max|rhs|) +
1e-4 * |rhs|). A rule is

- ``passed``: every sampled instance agreed;
- ``unsound``: some instance disagreed, or the right-hand side failed to evaluate where the
  left-hand side did; the result carries the (shrunk) counterexample;
- ``unchecked``: the checker could not instantiate it (its conditions were never met in the
  tries hypothesis made, or it uses a construct the checker does not interpret), with the reason;
- ``fact``: it only asserts relations (``(fusable e)``): not an equality, nothing to compare.

Instances are built constructively from the matched side: each operator of the term language
has a generator that, given the shape its result must have (or none), derives shapes and
attributes for its operands (Conv channels divisible by the group, MatMul inner dimensions,
broadcast-compatible operands, axes inside the rank...), and honours what conditions fix
(``(= 4 (vec-length (shape w)))`` fixes w's rank, ``(= (shape a) (shape b))`` ties two shapes,
``(= g 1)`` fixes an attribute). Other conditions are evaluated on the sample and a sample that
fails them is rejected (counted, and reported when nothing is left). Operands in a role that
needs it get suitable data: a variance fed to Sqrt is positive, a divisor stays away from zero.
A sample whose matched side is not finite (NaN/inf) is rejected and counted.

Rule patterns
-------------
`parse_rule_files` turns rule files into `Rule` objects over three plain pattern classes, which
other code may reuse (e.g. to find which rules' right-hand sides appear in a program):

- ``Var(name)``: a pattern variable;
- ``Lit(value)``: a literal: int (i64), float (f64), str (String), bool, None (unit);
  `fold_constants` also produces tuple values for closed vector expressions;
- ``Call(op, args)``: a constructor of the term language (``Conv``), a fact function
  (``shape``, ``dtype``) or an egglog primitive (``vec-of``, ``+``, ``vec-length``...).

A ``rule`` form ``(rule ((= e LHS) conds...) ((let k ...) (union e RHS)))`` becomes lhs=LHS,
rhs=RHS with the ``let`` bindings and the matched variables substituted, so ``rhs`` is a full
term over the left-hand side's variables. Conditions stay as written (`Eq`, `Check`); a matched
variable like ``e`` is bound to the value of its pattern when conditions are evaluated. A
right-hand side may also mention variables that only conditions bind (``dt`` in
``(= dt (dtype b))``, ``mo`` in ``(= mo (vec-get (shape w) 0))``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Union

import numpy as np
from egglog import bindings

from ..errors import EqsatFuseError, RuleFileError
from ..ops import OPS
from ..ops import evaluate as _evaluate_op

__all__ = ["Var", "Lit", "Call", "Pattern", "Eq", "Check", "Condition", "Rule",
           "parse_rule_files", "variables", "substitute", "match", "fold_constants",
           "check_rules", "CheckReport", "RuleResult", "Counterexample"]


# ---- patterns ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Var:
    """A pattern variable."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    """A literal: int (i64), float (f64), str (String), bool, None (unit), tuple (a folded vec)."""

    value: Any

    def __str__(self) -> str:
        return _render_value(self.value)


@dataclass(frozen=True)
class Call:
    """An application: a constructor, a fact function (shape, dtype) or an egglog primitive."""

    op: str
    args: tuple = ()

    def __str__(self) -> str:
        return "(" + " ".join([self.op, *(str(a) for a in self.args)]) + ")"


Pattern = Union[Var, Lit, Call]


@dataclass(frozen=True)
class Eq:
    """A condition ``(= left right)``: both sides evaluate to the same value (or it binds a new
    variable on one side, as in ``(= dt (dtype b))``)."""

    left: Pattern
    right: Pattern

    def __str__(self) -> str:
        return f"(= {self.left} {self.right})"


@dataclass(frozen=True)
class Check:
    """A condition that must hold: a relation ``(fusable x)`` or a primitive check ``(< a b)``."""

    expr: Pattern

    def __str__(self) -> str:
        return str(self.expr)


Condition = Union[Eq, Check]


@dataclass(frozen=True)
class Rule:
    """One rule of a rule file.

    kind: "rewrite", "birewrite", "rule" (a `rule` form with a union) or "fact" (a `rule` form
    that only asserts facts, e.g. the `analysis` ruleset). `lhs`/`rhs` are the first equality the
    rule states (`rhs` is None for a fact); `unions` lists every equality, `sets` every
    ``(set (f args) value)`` action, `asserts` every asserted fact or created term; `matched`
    the body's ``(= v PATTERN)`` bindings (nested ones substituted). `unsupported` says why the
    checker cannot interpret the rule, if it cannot.
    """

    name: str
    ruleset: str
    file: str
    line: int
    kind: str
    lhs: Pattern | None
    rhs: Pattern | None
    conditions: tuple = ()
    matched: tuple = ()
    unions: tuple = ()
    sets: tuple = ()
    asserts: tuple = ()
    unsupported: str | None = None
    source: str = ""

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"


def variables(p: Pattern) -> list[str]:
    """The variable names of a pattern, in order of first appearance."""
    out: list[str] = []

    def walk(q):
        if isinstance(q, Var):
            if q.name not in out:
                out.append(q.name)
        elif isinstance(q, Call):
            for a in q.args:
                walk(a)
    walk(p)
    return out


def substitute(p: Pattern, mapping: dict[str, Pattern]) -> Pattern:
    """The pattern with variables replaced by patterns (repeatedly, for chained lets)."""
    if isinstance(p, Var):
        if p.name in mapping:
            target = mapping[p.name]
            if isinstance(target, Var) and target.name == p.name:
                return target
            return substitute(target, {k: v for k, v in mapping.items() if k != p.name})
        return p
    if isinstance(p, Call):
        return Call(p.op, tuple(substitute(a, mapping) for a in p.args))
    return p


def match(pattern: Pattern, term: Pattern, binding: dict | None = None) -> dict | None:
    """Match a pattern against a ground term (same classes); the variable binding, or None."""
    binding = dict(binding or {})
    if isinstance(pattern, Var):
        if pattern.name in binding:
            return binding if binding[pattern.name] == term else None
        binding[pattern.name] = term
        return binding
    if isinstance(pattern, Lit):
        return binding if (isinstance(term, Lit) and type(term.value) is type(pattern.value)
                           and term.value == pattern.value) else None
    if not (isinstance(term, Call) and term.op == pattern.op
            and len(term.args) == len(pattern.args)):
        return None
    for p, t in zip(pattern.args, term.args):
        binding = match(p, t, binding)
        if binding is None:
            return None
    return binding


def fold_constants(p: Pattern) -> Pattern:
    """Closed primitive calls replaced by their value: ``(vec-of 1 2 3)`` -> ``Lit((1, 2, 3))``."""
    if not isinstance(p, Call):
        return p
    args = tuple(fold_constants(a) for a in p.args)
    if p.op in _PRIMS and all(isinstance(a, Lit) for a in args):
        try:
            return Lit(_PRIMS[p.op](*(a.value for a in args)))
        except Exception:   # a failing primitive stays a call
            pass
    return Call(p.op, args)


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


# ---- parsing rule files ------------------------------------------------------------------------

@dataclass
class _Decls:
    """What the loaded files declare: constructors, functions and relations with their sorts."""

    constructors: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    functions: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    relations: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise RuleFileError(f"cannot read the rule file: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError:
        raise RuleFileError("not a text file", file=str(path)) from None


def _parse_commands(text: str, path: Path):
    from ..saturation.saturate import _rule_file_error

    try:
        return bindings.EGraph().parse_program(text, filename=str(path))
    except Exception as exc:
        raise _rule_file_error(exc, str(path), text) from None


def _declarations(paths: Iterable[str | Path]) -> _Decls:
    decls = _Decls()
    for path in paths:
        path = Path(path)
        for c in _parse_commands(_read(path), path):
            kind = type(c).__name__
            if kind == "Constructor":
                decls.constructors[c.name] = (tuple(c.schema.input), c.schema.output)
            elif kind == "FunctionCommand":
                decls.functions[c.name] = (tuple(c.schema.input), c.schema.output)
            elif kind == "Relation":
                decls.relations[c.name] = tuple(c.inputs)
    return decls


def _lang_constructors() -> set[str]:
    from ..frontend.encode import constructor_sorts

    return set(constructor_sorts())


def _expr(e) -> Pattern:
    kind = type(e).__name__
    if kind == "Var":
        return Var(e.name)
    if kind == "Call":
        return Call(e.name, tuple(_expr(a) for a in e.args))
    if kind == "Lit":
        v = e.value
        vk = type(v).__name__
        if vk == "Int":
            return Lit(int(v.value))
        if vk == "Float":
            return Lit(float(v.value))
        if vk == "String":
            return Lit(str(v.value))
        if vk == "Bool":
            return Lit(bool(v.value))
        if vk == "Unit":
            return Lit(None)
        raise ValueError(f"unknown literal {v!r}")
    raise ValueError(f"unknown expression {kind}")


def _fact(f) -> Condition:
    kind = type(f).__name__
    if kind == "Eq":
        return Eq(_expr(f.left), _expr(f.right))
    return Check(_expr(f.expr))


def _split_matches(facts: list[Condition], constructors: set[str]):
    """Separate ``(= v (Ctor ...))`` bindings from the other conditions; nested bindings are
    substituted into the patterns that use them. Returns (matched, roots, conditions)."""
    raw: dict[str, Pattern] = {}
    conditions: list[Condition] = []
    for f in facts:
        if isinstance(f, Eq):
            for v, p in ((f.left, f.right), (f.right, f.left)):
                if (isinstance(v, Var) and isinstance(p, Call) and p.op in constructors
                        and v.name not in raw):
                    raw[v.name] = p
                    break
            else:
                conditions.append(f)
        else:
            conditions.append(f)
    used_inside = {name for p in raw.values() for name in variables(p)}
    matched = {v: substitute(p, raw) for v, p in raw.items()}
    roots = [v for v in raw if v not in used_inside]
    return matched, roots, conditions


def parse_rule_files(paths: Iterable[str | Path], constructors: set[str] | None = None
                     ) -> list[Rule]:
    """Every rewrite, birewrite and rule of the files, in file order, as `Rule` objects.

    `constructors` names the term language's constructors (default: those of the shipped
    lang.egg plus any declared in the files); a body fact ``(= v (Ctor ...))`` is a match.
    """
    paths = [Path(p) for p in paths]
    if constructors is None:
        constructors = _lang_constructors() | set(_declarations(paths).constructors)
    rules: list[Rule] = []
    for path in paths:
        text = _read(path)
        data = text.encode()
        for c in _parse_commands(text, path):
            kind = type(c).__name__
            if kind in ("RewriteCommand", "BiRewriteCommand"):
                rules.append(_from_rewrite(c, kind, path, data, constructors))
            elif kind == "RuleCommand":
                rules.append(_from_rule(c, path, data, constructors))
    return rules


def _where(span, data: bytes) -> tuple[int, str]:
    return data.count(b"\n", 0, span.i) + 1, data[span.i:span.j].decode(errors="replace")


def _from_rewrite(c, kind: str, path: Path, data: bytes, constructors: set[str]) -> Rule:
    rw = c.rewrite
    line, source = _where(rw.span, data)
    matched, _, conditions = _split_matches([_fact(f) for f in rw.conditions], constructors)
    lhs = substitute(_expr(rw.lhs), matched)
    rhs = substitute(_expr(rw.rhs), matched)
    return Rule(name=rw.name, ruleset=c.name, file=str(path), line=line,
                kind="birewrite" if kind == "BiRewriteCommand" else "rewrite", lhs=lhs, rhs=rhs,
                conditions=tuple(conditions), matched=tuple(matched.items()),
                unions=((lhs, rhs),), source=source)


def _from_rule(c, path: Path, data: bytes, constructors: set[str]) -> Rule:
    r = c.rule
    line, source = _where(r.span, data)
    matched, roots, conditions = _split_matches([_fact(f) for f in r.body], constructors)
    env: dict[str, Pattern] = dict(matched)
    unions, sets, asserts = [], [], []
    unsupported = None
    for action in r.head:
        kind = type(action).__name__
        if kind == "Let":
            env[action.lhs] = substitute(_expr(action.rhs), env)
        elif kind == "Union":
            a, b = _expr(action.lhs), _expr(action.rhs)
            if isinstance(b, Var) and b.name in matched and not (
                    isinstance(a, Var) and a.name in matched):
                a, b = b, a
            unions.append((substitute(a, env), substitute(b, env)))
        elif kind == "Set":
            sets.append((Call(action.lhs, tuple(substitute(_expr(x), env) for x in action.args)),
                         substitute(_expr(action.rhs), env)))
        elif kind == "Expr_":
            asserts.append(substitute(_expr(action.expr), env))
        else:
            what = {"Change": "delete/subsume", "Panic": "panic"}.get(kind, kind)
            unsupported = f"the rule's actions include {what}, which the checker does not interpret"
    if unions:
        lhs, rhs = unions[0]
    else:
        lhs, rhs = (matched[roots[0]] if roots else None), None
    return Rule(name=r.name, ruleset=r.ruleset, file=str(path), line=line,
                kind="rule" if unions else "fact", lhs=lhs, rhs=rhs,
                conditions=tuple(conditions), matched=tuple(matched.items()),
                unions=tuple(unions), sets=tuple(sets), asserts=tuple(asserts),
                unsupported=unsupported, source=source)


# ---- egglog primitives and fact functions ------------------------------------------------------

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


def _eval_closed(p: Pattern):
    """Value of a pattern without variables (literals and primitives only)."""
    if isinstance(p, Lit):
        return p.value
    if isinstance(p, Var):
        raise _Unbound(p.name)
    if p.op in _PRIMS:
        return _PRIMS[p.op](*(_eval_closed(a) for a in p.args))
    raise _Unbound(p.op)


# ---- hints: what the conditions fix about the sample -------------------------------------------
# Conditions are first rewritten through their aliases: `(= sw (shape w)) (= 4 (vec-length sw))`
# reads as `(= 4 (vec-length (shape w)))`. Each hint is an expression, evaluated when the sample
# has bound what it needs (closed ones at once): `(= (shape c) (vec-of mo 1 1))` fixes c's shape
# as soon as w (behind mo) is instantiated. Conditions that no hint captures are still checked
# on every sample, and guide the draws of the attributes they mention.

@dataclass
class _Hints:
    rank: dict[str, list] = field(default_factory=dict)       # tensor var -> [expr of its rank]
    shape: dict[str, list] = field(default_factory=dict)      # tensor var -> [expr of its shape]
    dims: dict[str, dict] = field(default_factory=dict)       # tensor var -> {axis: [expr]}
    fixed: dict[str, list] = field(default_factory=dict)      # attribute var -> [expr of value]
    length: dict[str, list] = field(default_factory=dict)     # vector var -> [expr of length]
    splat: dict[str, Any] = field(default_factory=dict)       # var -> scalar-value (None: any)
    present: set = field(default_factory=set)                 # vars that cannot be Absent
    guards: dict[str, list] = field(default_factory=dict)     # var -> conditions mentioning it
    dtype: str | None = None

    def has(self, name: str) -> bool:
        return (name in self.rank or name in self.shape or name in self.dims
                or name in self.fixed or name in self.splat or name in self.present)


def _shape_of_var(p) -> str | None:
    if isinstance(p, Call) and p.op == "shape" and len(p.args) == 1 and isinstance(p.args[0], Var):
        return p.args[0].name
    return None


def _closed(p):
    try:
        return True, _eval_closed(p)
    except Exception:
        return False, None


def _aliases(conditions, constructors) -> tuple[dict[str, Pattern], list]:
    """Condition-bound variables as expressions (`(= sw (shape w))`: sw -> (shape w)), and the
    conditions with them substituted (alias definitions left out)."""
    aliases: dict[str, Pattern] = {}
    rest = []
    for c in conditions:
        if isinstance(c, Eq):
            for v, e in ((c.left, c.right), (c.right, c.left)):
                if (isinstance(v, Var) and v.name not in aliases and v.name not in variables(e)
                        and not isinstance(e, Var)
                        and not (isinstance(e, Call) and e.op in constructors)):
                    aliases[v.name] = e
                    break
            else:
                rest.append(c)
        else:
            rest.append(c)
    resolved = {v: substitute(e, aliases) for v, e in aliases.items()}
    derived = []
    for c in rest:
        if isinstance(c, Eq):
            derived.append(Eq(substitute(c.left, resolved), substitute(c.right, resolved)))
        else:
            derived.append(Check(substitute(c.expr, resolved)))
    return resolved, derived


def _scalar_value_target(c) -> tuple[str, Any] | None:
    """(var, value) when `c` pins a scalar-value: (= 1.0 (scalar-value v)), or
    (< (abs (- (scalar-value v) C)) tol); (var, None) for (= x (scalar-value v))."""
    def sv(p):
        if (isinstance(p, Call) and p.op == "scalar-value" and len(p.args) == 1
                and isinstance(p.args[0], Var)):
            return p.args[0].name
        return None
    if isinstance(c, Eq):
        for a, b in ((c.left, c.right), (c.right, c.left)):
            if sv(a):
                ok, value = _closed(b)
                return sv(a), (float(value) if ok and isinstance(value, (int, float)) else None)
    elif isinstance(c, Check) and isinstance(c.expr, Call) and c.expr.op in ("<", "<="):
        a = c.expr.args[0]
        if isinstance(a, Call) and a.op == "abs" and isinstance(a.args[0], Call) \
                and a.args[0].op == "-" and len(a.args[0].args) == 2:
            x, y = a.args[0].args
            for u, w in ((x, y), (y, x)):
                ok, value = _closed(w)
                if sv(u) and ok:
                    return sv(u), float(value)
    return None


def _hints(conditions, slot_vars: set[str], tensor_vars: set[str],
           absent_ok: dict[str, bool], constructors) -> _Hints:
    h = _Hints()
    aliases, derived = _aliases(conditions, constructors)
    for c in list(conditions) + derived:
        target = _scalar_value_target(c)
        if target and (target[0] not in h.splat or h.splat[target[0]] is None):
            h.splat[target[0]] = target[1]
    for c in conditions:
        if isinstance(c, Check) and isinstance(c.expr, Call) and c.expr.op in absent_ok:
            if not absent_ok[c.expr.op]:
                h.present.update(a.name for a in c.expr.args if isinstance(a, Var))
    for c in derived:
        for name in variables(c.left if isinstance(c, Eq) else c.expr) + (
                variables(c.right) if isinstance(c, Eq) else []):
            h.guards.setdefault(name, []).append(c)
        if not isinstance(c, Eq):
            continue
        for a, b in ((c.left, c.right), (c.right, c.left)):
            if (isinstance(a, Call) and a.op == "vec-length" and len(a.args) == 1
                    and _shape_of_var(a.args[0])):
                h.rank.setdefault(_shape_of_var(a.args[0]), []).append(b)
            elif (isinstance(a, Call) and a.op == "vec-length" and len(a.args) == 1
                  and isinstance(a.args[0], Var)):
                h.length.setdefault(a.args[0].name, []).append(b)
            elif _shape_of_var(a):
                h.shape.setdefault(_shape_of_var(a), []).append(b)
            elif (isinstance(a, Call) and a.op == "vec-get" and len(a.args) == 2
                  and _shape_of_var(a.args[0]) and isinstance(a.args[1], Lit)):
                h.dims.setdefault(_shape_of_var(a.args[0]), {}).setdefault(
                    a.args[1].value, []).append(b)
            elif (isinstance(a, Call) and a.op == "dtype" and len(a.args) == 1
                  and isinstance(a.args[0], Var)):
                ok, value = _closed(b)
                if ok and isinstance(value, str):
                    h.dtype = value
            elif isinstance(a, Var) and a.name in slot_vars and a.name not in tensor_vars:
                h.fixed.setdefault(a.name, []).append(b)
    for v, e in aliases.items():
        if v in slot_vars and v not in tensor_vars:
            h.fixed.setdefault(v, []).insert(0, e)
    return h


def _absent_ok(rules: list[Rule], relations: Iterable[str]) -> dict[str, bool]:
    """For each relation: can it hold for an absent input `(Absent)`? Derived from the rules
    that assert it (least fixpoint): a relation holds only where some rule asserts it."""
    ok = {r: False for r in relations}
    changed = True
    while changed:
        changed = False
        for rule in rules:
            matched = dict(rule.matched)
            for fact in rule.asserts:
                if not (isinstance(fact, Call) and fact.op in ok and not ok[fact.op]):
                    continue
                for arg in fact.args:
                    if isinstance(arg, Call):
                        admits = arg.op == "Absent"
                    elif isinstance(arg, Var) and arg.name in matched:
                        admits = isinstance(matched[arg.name], Call) and \
                            matched[arg.name].op == "Absent"
                    elif isinstance(arg, Var):
                        needs = [c.expr.op for c in rule.conditions if isinstance(c, Check)
                                 and isinstance(c.expr, Call) and c.expr.op in ok
                                 and Var(arg.name) in c.expr.args]
                        admits = all(ok[r] for r in needs)
                    else:
                        admits = False
                    if admits:
                        ok[fact.op] = changed = True
                        break
    return ok


# ---- sampling ----------------------------------------------------------------------------------

class _Reject(Exception):
    """This sample does not instantiate the rule (counted; hypothesis tries another)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_FLOAT_TYPES = ("float16", "float32", "float64")
_SHAPE_PRESERVING = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf",
                     "Gelu", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Cast", "Mat",
                     "Identity", "Dropout", "Clip", "Softmax", "LRN", "LayerNormalization",
                     "BatchNormalization"}
_LEAVES = {"Input", "Const", "Absent", "Scalar", "Ints"}


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


class _Sample:
    """One attempt at instantiating a rule: variable values, leaf arrays, drawn numbers."""

    def __init__(self, plan: "_Plan", draw):
        self.plan = plan
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
    def array(self, shape, role="any") -> np.ndarray:
        shape = tuple(int(d) for d in shape)
        rng = self.rng
        if role == "bool":
            return np.asarray(rng.random(shape) < 0.5)
        if isinstance(role, tuple) and role[0] == "index":
            return rng.integers(0, max(int(role[1]), 1), shape).astype(np.int64)
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
        return np.asarray(v, dtype=self.dtype)

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
        if p.op in _SHAPE_PRESERVING:
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
        if name in self.hints.splat:
            value = self.hints.splat[name]
            if value is None:
                value = float(self.array((), role))
            return np.full(tuple(shape), value, dtype=self.dtype)
        return self.array(shape, role)

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
            gen = _GENERATORS.get(p.op)
            if gen is None:
                gen = _gen_generic
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
    def eval(self, p):
        if isinstance(p, Var):
            if p.name in self.env:
                return self.env[p.name]
            if p.name in self.plan.matched:          # a matched term, instantiated already?
                return self.eval(self.plan.matched[p.name])
            raise _Unbound(p.name)
        if isinstance(p, Lit):
            return p.value
        op = p.op
        if op in self.plan.constructors:
            return self._eval_constructor(p)
        if op in FACT_FUNCTIONS:
            return FACT_FUNCTIONS[op](*(self.eval(a) for a in p.args))
        if op in _PRIMS:
            return _PRIMS[op](*(self.eval(a) for a in p.args))
        raise _Unsupported(f"({op} ...) has no meaning known to the checker")

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
        n = len(spec.inputs)
        attrs = dict(zip(spec.attrs, values[n:]))
        with np.errstate(all="ignore"):
            return _evaluate_op(op, values[:n], attrs)


def _head(p) -> str:
    return p.name if isinstance(p, Var) else (f"({p.op} ...)" if isinstance(p, Call) else str(p))


# ---- generators: one per operator ---------------------------------------------------------------
# gen(sample, pattern, want, role, ranks) -> value. `want` is the shape the result must have (or
# None), `role` what the data is for ("positive" feeds a Sqrt...), `ranks` the allowed ranks.

def _eps(s: _Sample) -> float:
    return s.pick((1e-5, 1e-3, 0.1, 0.5, 1.0)) if s.coin() else s.f(1e-3, 1.0)


_ROLE_OF_UNARY = {"Sqrt": "positive", "Log": "positive", "Reciprocal": "nonzero"}
_ROLE_PASSING = {"Mat", "Identity", "Dropout", "Relu", "Clip"}

# attribute drawers of the elementwise operators, one per attribute slot
_UNARY_ATTRS: dict[str, list[Callable[[_Sample], Any]]] = {
    "LeakyRelu": [lambda s: s.pick((0.01, 0.1, 0.2, 1.5))],
    "HardSigmoid": [lambda s: s.pick((0.2, 1 / 6, 0.5)), lambda s: s.pick((0.5, 0.0, 0.25))],
    "Gelu": [lambda s: s.pick(("none", "tanh"))],
    "Cast": [lambda s: s.pick(("float32", "float64", "float16", "int64", "int32", "float32"))],
}


def _gen_unary(s, p, want, role, ranks):
    op = p.op
    child_role = _ROLE_OF_UNARY.get(op, role if op in _ROLE_PASSING else "any")
    x = s.make(p.args[0], want, child_role, ranks)
    if op == "Mat":
        return x
    spec = OPS[op]
    drawers = _UNARY_ATTRS.get(op, [])
    values = [s.attr(slot, (lambda d=drawers[i]: d(s)) if i < len(drawers) else (lambda: 0.5))
              for i, slot in enumerate(p.args[1:])]
    return s.apply(op, [x], dict(zip(spec.attrs, values)))


def _gen_clip(s, p, want, role, ranks):
    x = s.make(p.args[0], want, "any", ranks)
    lo = s.optional(p.args[1], (), "low")
    hi = s.optional(p.args[2], (), "high")
    return s.apply("Clip", [x, lo, hi], {})


def _operand_priority(s, a):
    if s.determined(a):
        return 0
    if isinstance(a, Call) and a.op not in _LEAVES:
        return 1
    return 2


def _cover(s, want, n: int, covered) -> list[tuple]:
    """n shapes that broadcast together to exactly `want` (with `covered[j]`: axis j already
    has its full size from a known operand): each a random broadcastable shape, then every
    axis of size > 1 nobody has yet given to one of them (mutual broadcasting included)."""
    r = len(want)
    shapes = [list(s.sub_shape(want)) for _ in range(n)]
    for j in range(r):
        if want[j] == 1 or covered[j]:
            continue
        if any(len(sh) >= r - j and sh[j - (r - len(sh))] == want[j] for sh in shapes):
            continue
        sh = shapes[s.i(0, n - 1)]
        while len(sh) < r - j:
            sh.insert(0, 1)
        sh[j - (r - len(sh))] = want[j]
    return [tuple(sh) for sh in shapes]


def _gen_broadcast(s, p, want, role, ranks):
    op, args = p.op, p.args
    pr = "positive" if role == "positive" else "any"
    roles = {"Add": (pr, pr), "Mul": (pr, pr), "Sub": ("any", "any"),
             "Div": (pr, "positive" if role == "positive" else "nonzero"),
             "Pow": ("positive", "exponent"), "Where": ("bool", pr, pr)}[op]
    if op == "Pow" and isinstance(args[1], Var):
        exponent = s.hints.splat.get(args[1].name)
        if exponent is not None and float(exponent).is_integer():
            roles = ("any", "exponent")
    order = sorted(range(len(args)), key=lambda i: _operand_priority(s, args[i]))
    values: list = [None] * len(args)
    free = [i for i in order if not s.determined(args[i])]
    leaves_only = all(_operand_priority(s, args[i]) == 2 and s.hinted_shape(args[i]) is None
                      and s.rank_of(args[i]) is None for i in free)
    if want is None and free and leaves_only and len(free) == len(args):
        want = s.random_shape(ranks)                 # free operands: choose the result first
    if want is None:
        base = None
        for i in order:
            a = args[i]
            if base is None:
                values[i] = s.make(a, None, roles[i], ranks)
                if not isinstance(values[i], np.ndarray):
                    raise _Reject(f"{op} operand is absent")
                base = values[i].shape
            elif s.determined(a):
                values[i] = s.eval(a)
            else:
                shape = s.hinted_shape(a)
                values[i] = s.make(a, shape if shape is not None
                                   else s.sub_shape(base, s.rank_of(a)), roles[i])
        return s.apply(op, values, {})
    want = tuple(want)
    for i in order:
        if s.determined(args[i]):
            values[i] = s.eval(args[i])
    known = [v.shape for v in values if isinstance(v, np.ndarray)]
    covered = [any(len(k) >= len(want) - j and k[j - (len(want) - len(k))] == want[j]
                   for k in known) for j in range(len(want))]
    full = next((i for i in free if _operand_priority(s, args[i]) == 1
                 and s.rank_of(args[i]) in (None, len(want))
                 and s.hinted_shape(args[i]) in (None, want)), None)
    rest = [i for i in free if i != full]
    if full is not None:
        values[full] = s.make(args[full], want, roles[full])
        covered = [True] * len(want)
    shapes = _cover(s, want, len(rest), covered) if rest else []
    for i, shape in zip(rest, shapes):
        a = args[i]
        r = s.rank_of(a)
        if r is not None and r > len(want):
            raise _Reject(f"{op} operand of rank {r} cannot give rank {len(want)}")
        hinted = s.hinted_shape(a)
        if hinted is not None:
            shape = hinted
        elif r is not None and r != len(shape):
            shape = s.sub_shape(want, r)
        values[i] = s.make(a, shape, roles[i])
    return s.apply(op, values, {})


def _gen_batchnorm(s, p, want, role, ranks):
    x, scale, bias, mean, var, eps = p.args
    rs = {r for r in (ranks or (2, 3, 4, 5)) if 2 <= r <= 5} or {2, 3, 4, 5}
    xv = s.make(x, want, "any", rs if want is None else None)
    if not isinstance(xv, np.ndarray) or xv.ndim < 2:
        raise _Reject("BatchNormalization needs rank >= 2")
    c = (xv.shape[1],)
    values = [xv, s.make(scale, c), s.make(bias, c), s.make(mean, c), s.make(var, c, "positive")]
    return s.apply("BatchNormalization", values, {"epsilon": s.attr(eps, lambda: _eps(s))})


def _spatial_rank(s, want, tensors, attr_lengths, ranks, default=(2, 1, 3)):
    if want is not None:
        return len(want) - 2
    for t in tensors:
        r = s.rank_of(t)
        if r is not None:
            return r - 2
    for n, per in attr_lengths:
        if n is not None:
            return n // per
    if ranks:
        options = [r - 2 for r in sorted(ranks) if 3 <= r <= 5]
        return s.pick(options) if options else 0
    return s.pick(default)


def _gen_conv(s, p, want, role, ranks):
    x, w, b, pads, strides, dil, g = p.args
    xv, wv = s.value_if_determined(x), s.value_if_determined(w)
    nd = _spatial_rank(s, want, [x, w], [(s.length_of(pads), 2), (s.length_of(strides), 1),
                                         (s.length_of(dil), 1)], ranks)
    if not 1 <= nd <= 3:
        raise _Reject("Conv: spatial rank outside 1..3")
    wname = s.var_for(w)

    def wd(axis):
        return s.dim_hint(wname, axis) if wname is not None else None
    if wv is not None:
        M, Cg, ks = wv.shape[0], wv.shape[1], tuple(wv.shape[2:])
    else:
        M, Cg = wd(0), wd(1)
        ks = tuple(wd(2 + i) or s.i(1, 3) for i in range(nd))
    if want is not None:
        if M is not None and M != want[1]:
            raise _Reject("Conv: output channels fixed elsewhere")
        M = want[1]
    C = xv.shape[1] if isinstance(xv, np.ndarray) and xv.ndim >= 2 else None
    G = s.known(g)
    if G is None:
        style = s.pick(("dense", "grouped", "depthwise", "dense"))
        if C is not None and Cg is not None:
            G = C // Cg if Cg and C % Cg == 0 else 0
        elif style == "dense":
            G = 1
        elif style == "grouped":
            G = 2
        else:
            G = C if C is not None else (M if M is not None else s.i(2, 4))
            Cg = 1 if Cg is None else Cg
    if not G or G < 1:
        raise _Reject("Conv: no valid group")
    if Cg is None:
        Cg = C // G if C is not None else s.i(1, 3)
    if M is None:
        M = G * s.i(1, 3)
    if M % G or Cg < 1 or (C is not None and C != G * Cg):
        raise _Reject("Conv: channels do not divide into groups")
    G = s.attr(g, lambda: G)
    st = s.attr(strides, lambda: tuple(s.pick((1, 2, 1)) for _ in range(nd)))
    dl = s.attr(dil, lambda: tuple(s.pick((1, 1, 2)) for _ in range(nd)))
    if len(st) != nd or len(dl) != nd:
        raise _Reject("Conv: attribute lengths do not match the spatial rank")
    outs = None
    if not isinstance(xv, np.ndarray):
        outs = want[2:] if want is not None else tuple(s.i(1, 3) for _ in range(nd))

    def draw_pads():
        if outs is None:
            return tuple(s.i(0, 1) for _ in range(2 * nd))
        room = [(outs[i] - 1) * st[i] + (ks[i] - 1) * dl[i] for i in range(nd)]
        begins = [s.i(0, min(1, room[i])) for i in range(nd)]
        return tuple(begins + [s.i(0, min(1, room[i] - begins[i])) for i in range(nd)])
    pd = s.attr(pads, draw_pads)
    if len(pd) != 2 * nd:
        raise _Reject("Conv: attribute lengths do not match the spatial rank")
    if isinstance(xv, np.ndarray):
        N, insp = xv.shape[0], xv.shape[2:]
    else:
        N = want[0] if want is not None else s.i(1, 2)
        insp = []
        for i in range(nd):
            eff = (ks[i] - 1) * dl[i] + 1
            n = (outs[i] - 1) * st[i] + eff - pd[i] - pd[nd + i] + s.i(0, st[i] - 1)
            if n < 1:
                raise _Reject("Conv: padding larger than the input")
            insp.append(n)
    xv = s.make(x, (N, G * Cg, *insp))
    wv = s.make(w, (M, Cg, *ks))
    bv = s.optional(b, (M,))
    return s.apply("Conv", [xv, wv, bv], dict(pads=pd, strides=st, dilations=dl, group=G))


def _gen_conv_transpose(s, p, want, role, ranks):
    x, w, b, pads, strides, dil, g, opad = p.args
    xv, wv = s.value_if_determined(x), s.value_if_determined(w)
    nd = _spatial_rank(s, want, [x, w], [(s.length_of(pads), 2), (s.length_of(strides), 1),
                                         (s.length_of(dil), 1), (s.length_of(opad), 1)], ranks)
    if not 1 <= nd <= 3:
        raise _Reject("ConvTranspose: spatial rank outside 1..3")
    G = s.attr(g, lambda: s.pick((1, 1, 2)))
    if wv is not None:
        C, Mg, ks = wv.shape[0], wv.shape[1], tuple(wv.shape[2:])
    else:
        C = xv.shape[1] if isinstance(xv, np.ndarray) else G * s.i(1, 3)
        Mg = want[1] // G if want is not None else s.i(1, 3)
        ks = tuple(s.i(1, 3) for _ in range(nd))
    if want is not None and want[1] != G * Mg:
        raise _Reject("ConvTranspose: output channels do not match the group")
    if C % G:
        raise _Reject("ConvTranspose: channels do not divide into groups")
    st = s.attr(strides, lambda: tuple(s.pick((1, 2)) for _ in range(nd)))
    dl = s.attr(dil, lambda: tuple(s.pick((1, 1, 2)) for _ in range(nd)))
    op = s.attr(opad, lambda: tuple(s.i(0, max(a, d) - 1) for a, d in zip(st, dl)))
    if isinstance(xv, np.ndarray):
        N, insp = xv.shape[0], tuple(xv.shape[2:])
    else:
        N = want[0] if want is not None else s.i(1, 2)
        insp = None
    known_pads = s.known(pads)
    if known_pads is None and want is not None and insp is None:
        insp, begins, ends = [], [], []
        for i in range(nd):
            o, k = want[2 + i], ks[i]
            n = max(1, -(-(o - op[i] - (k - 1) * dl[i] - 1) // st[i]) + 1) + s.i(0, 1)
            total = st[i] * (n - 1) + op[i] + (k - 1) * dl[i] + 1 - o
            if total < 0:
                raise _Reject("ConvTranspose: cannot reach the wanted size")
            begin = s.i(0, total)
            insp.append(n)
            begins.append(begin)
            ends.append(total - begin)
        pd = s.attr(pads, lambda: tuple(begins + ends))
    else:
        pd = s.attr(pads, lambda: tuple(s.i(0, 1) for _ in range(2 * nd)))
        if insp is None:
            insp = tuple(s.i(1, 3) for _ in range(nd))
    xv = s.make(x, (N, C, *insp))
    wv = s.make(w, (C, Mg, *ks))
    bv = s.optional(b, (G * Mg,))
    return s.apply("ConvTranspose", [xv, wv, bv], dict(pads=pd, strides=st, dilations=dl,
                                                      group=G, output_padding=op))


def _gen_matmul(s, p, want, role, ranks):
    a, b = p.args
    av, bv = s.value_if_determined(a), s.value_if_determined(b)
    av = av if isinstance(av, np.ndarray) and av.ndim >= 1 else None
    bv = bv if isinstance(bv, np.ndarray) and bv.ndim >= 1 else None
    ra = av.ndim if av is not None else s.rank_of(a)
    rb = bv.ndim if bv is not None else s.rank_of(b)
    # ranks of the operands
    if want is not None:
        r = len(want)
        if r == 0:
            ra, rb = ra or 1, rb or 1
        elif r == 1:
            if ra is None and rb is None:
                ra, rb = s.pick(((1, 2), (2, 1)))
            elif ra is None:
                ra = 2 if rb == 1 else 1
            elif rb is None:
                rb = 2 if ra == 1 else 1
        else:
            if ra is None:
                ra = r if (rb or 0) < r else s.pick(tuple(range(2, r + 1)))
            if rb is None:
                rb = r if ra < r else s.pick(tuple(range(2, r + 1)))
    else:
        ra = ra or s.pick((2, 3, 1, 4, 2))
        rb = rb or s.pick((2, 1, 3, 2))
    # inner, outer and batch dims: from the known operands, the wanted shape, or drawn
    K = (av.shape[-1] if av is not None else
         bv.shape[-2] if bv is not None and bv.ndim >= 2 else
         bv.shape[0] if bv is not None else s.i(1, 4))
    if want is not None and ra >= 2 and rb >= 2:
        M, N, batch = want[-2], want[-1], tuple(want[:-2])
    elif want is not None and ra >= 2:
        M, N, batch = want[-1], None, tuple(want[:-1])
    elif want is not None and rb >= 2:
        M, N, batch = None, want[-1], tuple(want[:-1])
    else:
        M = av.shape[-2] if av is not None and av.ndim >= 2 else s.i(1, 4)
        N = bv.shape[-1] if bv is not None and bv.ndim >= 2 else s.i(1, 4)
        known = [v.shape[:-2] for v in (av, bv) if v is not None and v.ndim > 2]
        batch = (tuple(np.broadcast_shapes(*known)) if known else
                 tuple(s.i(1, 3) for _ in range(max(ra, rb) - 2)))
    if av is not None:
        a_shape = av.shape
    elif ra == 1:
        a_shape = (K,)
    else:
        full = ra - 2 >= len(batch) or bv is not None and bv.ndim - 2 < len(batch)
        a_batch = batch[len(batch) - (ra - 2):] if full else s.sub_shape(batch, ra - 2)
        a_shape = (*a_batch, M or s.i(1, 4), K)
    if bv is not None:
        b_shape = bv.shape
    elif rb == 1:
        b_shape = (K,)
    else:
        a_full = len(a_shape) - 2 >= len(batch) and tuple(a_shape[:-2][-len(batch):] if batch
                                                            else ()) == batch
        b_batch = s.sub_shape(batch, rb - 2) if a_full else batch[len(batch) - (rb - 2):]
        b_shape = (*b_batch, K, N or s.i(1, 4))
    return s.apply("MatMul", [s.make(a, tuple(a_shape)), s.make(b, tuple(b_shape))], {})


def _gen_gemm(s, p, want, role, ranks):
    a, b, c, alpha, beta, ta, tb = p.args
    TA = s.attr(ta, lambda: s.pick((0, 1)))
    TB = s.attr(tb, lambda: s.pick((0, 1)))
    av, bv = s.value_if_determined(a), s.value_if_determined(b)
    M, N = want if want is not None and len(want) == 2 else (s.i(1, 4), s.i(1, 4))
    K = s.i(1, 4)
    if isinstance(av, np.ndarray) and av.ndim == 2:
        M, K = (av.shape[1], av.shape[0]) if TA else av.shape
    if isinstance(bv, np.ndarray) and bv.ndim == 2:
        K, N = (bv.shape[1], bv.shape[0]) if TB else bv.shape
    av = s.make(a, (K, M) if TA else (M, K))
    bv = s.make(b, (N, K) if TB else (K, N))
    cv = s.optional(c, s.sub_shape((M, N)))
    attrs = dict(alpha=s.attr(alpha, lambda: s.pick((1.0, 0.5, -1.5, 2.0))),
                 beta=s.attr(beta, lambda: s.pick((1.0, 0.5, -1.5, 2.0))), trans_a=TA, trans_b=TB)
    return s.apply("Gemm", [av, bv, cv], attrs)


def _gen_softmax(s, p, want, role, ranks):
    x, axis = p.args
    ax = s.known(axis)
    need = (ax + 1) if isinstance(ax, int) else 1
    rs = {r for r in (ranks or range(1, 5)) if r >= need} if want is None else None
    xv = s.make(x, want, "any", rs)
    if not isinstance(xv, np.ndarray) or xv.ndim < 1:
        raise _Reject("Softmax needs rank >= 1")
    return s.apply("Softmax", [xv], {"axis": s.attr(axis, lambda: s.i(0, xv.ndim - 1))})


def _gen_layernorm(s, p, want, role, ranks):
    x, scale, bias, axis, eps = p.args
    ax = s.known(axis)
    need = (ax + 1) if isinstance(ax, int) else 1
    rs = {r for r in (ranks or range(1, 5)) if r >= need} if want is None else None
    xv = s.make(x, want, "any", rs)
    if not isinstance(xv, np.ndarray) or xv.ndim < 1:
        raise _Reject("LayerNormalization needs rank >= 1")
    ax = s.attr(axis, lambda: s.i(0, xv.ndim - 1))
    norm = tuple(xv.shape[ax:])
    values = [xv, s.make(scale, norm), s.optional(bias, norm)]
    return s.apply("LayerNormalization", values,
                   {"axis": ax, "epsilon": s.attr(eps, lambda: _eps(s))})


def _gen_reduce(s, p, want, role, ranks):
    x, axes, keep = p.args
    xv = s.value_if_determined(x)
    if xv is not None or want is None:
        if xv is None:
            ax = s.known(axes)
            need = max(ax) + 1 if ax else 1
            xv = s.make(x, None, "any", {r for r in range(1, 5) if r >= need})
        if not isinstance(xv, np.ndarray) or xv.ndim < 1:
            raise _Reject(f"{p.op} needs rank >= 1")
        ax = s.attr(axes, lambda: s.subset(range(xv.ndim)))
        kd = s.attr(keep, lambda: s.pick((1, 0)))
    else:
        kd = s.attr(keep, lambda: s.pick((1, 0)))
        if kd:
            ax = s.attr(axes, lambda: s.subset([i for i, d in enumerate(want) if d == 1]))
            if any(not 0 <= a < len(want) or want[a] != 1 for a in ax):
                raise _Reject(f"{p.op}: kept axes must have size 1")
            shape = tuple(s.i(1, 4) if i in ax else d for i, d in enumerate(want))
        else:
            def draw_axes():
                count = s.i(1, 2)
                return s.subset(range(len(want) + count), min_size=1)
            ax = s.attr(axes, draw_axes)
            if any(not 0 <= a < len(want) + len(ax) for a in ax):
                raise _Reject(f"{p.op}: axes do not fit the wanted rank")
            rest = iter(want)
            shape = tuple(s.i(1, 4) if i in ax else next(rest)
                          for i in range(len(want) + len(ax)))
        xv = s.make(x, shape)
    return s.apply(p.op, [xv], {"axes": tuple(ax), "keepdims": kd})


def _gen_pool(s, p, want, role, ranks):
    x = p.args[0]
    slots = dict(zip(OPS[p.op].attrs, p.args[1:]))
    xv = s.value_if_determined(x)
    nd = _spatial_rank(s, want, [x], [(s.length_of(slots["kernel_shape"]), 1),
                                      (s.length_of(slots["strides"]), 1)], ranks, default=(2, 1))
    if isinstance(xv, np.ndarray):
        nd = xv.ndim - 2
    if not 1 <= nd <= 3:
        raise _Reject(f"{p.op}: spatial rank outside 1..3")
    ks = s.attr(slots["kernel_shape"], lambda: tuple(s.i(1, 3) for _ in range(nd)))
    st = s.attr(slots["strides"], lambda: tuple(s.pick((1, 2)) for _ in range(nd)))
    dl = s.attr(slots["dilations"], lambda: tuple(s.pick((1, 1, 2)) for _ in range(nd)))
    pd = s.attr(slots["pads"], lambda: tuple(s.i(0, min(1, ks[i % nd] - 1))
                                             for i in range(2 * nd)))
    ceil = s.attr(slots["ceil_mode"], lambda: s.pick((0, 1)))
    attrs = dict(kernel_shape=ks, pads=pd, strides=st, dilations=dl, ceil_mode=ceil)
    if "count_include_pad" in slots:
        attrs["count_include_pad"] = s.attr(slots["count_include_pad"], lambda: s.pick((0, 1)))
    if len(ks) != nd or len(st) != nd or len(dl) != nd or len(pd) != 2 * nd:
        raise _Reject(f"{p.op}: attribute lengths do not match the spatial rank")
    if not isinstance(xv, np.ndarray):
        N, C = (want[0], want[1]) if want is not None else (s.i(1, 2), s.i(1, 3))
        outs = want[2:] if want is not None else tuple(s.i(1, 3) for _ in range(nd))
        insp = []
        for i in range(nd):
            eff = (ks[i] - 1) * dl[i] + 1
            n = (outs[i] - 1) * st[i] + eff - pd[i] - pd[nd + i]
            n += 0 if ceil else s.i(0, st[i] - 1)
            if n < 1:
                raise _Reject(f"{p.op}: padding larger than the input")
            insp.append(n)
        xv = s.make(x, (N, C, *insp))
    return s.apply(p.op, [xv], attrs)


def _gen_gap(s, p, want, role, ranks):
    x = p.args[0]
    if want is not None:
        if len(want) < 3 or any(d != 1 for d in want[2:]):
            raise _Reject("GlobalAveragePool gives size-1 spatial dims")
        xv = s.make(x, (want[0], want[1], *(s.i(1, 3) for _ in want[2:])))
    else:
        xv = s.make(x, None, "any", {r for r in (ranks or (3, 4, 5)) if 3 <= r <= 5} or {3, 4})
    return s.apply("GlobalAveragePool", [xv], {})


def _gen_lrn(s, p, want, role, ranks):
    x, size, alpha, beta, bias = p.args
    xv = s.make(x, want, "any", None if want is not None else {3, 4})
    attrs = dict(size=s.attr(size, lambda: s.pick((1, 3, 5))),
                 alpha=s.attr(alpha, lambda: s.pick((1e-4, 0.1, 1.0))),
                 beta=s.attr(beta, lambda: s.pick((0.75, 0.5, 1.0))),
                 bias=s.attr(bias, lambda: s.pick((1.0, 2.0))))
    return s.apply("LRN", [xv], attrs)


def _list_items(p):
    items = []
    while isinstance(p, Call) and p.op == "TCons":
        items.append(p.args[0])
        p = p.args[1]
    return items, p


def _gen_concat(s, p, want, role, ranks):
    xs, axis = p.args
    items, tail = _list_items(xs)
    if isinstance(tail, Var):
        fresh_tail = tail.name not in s.env
        known_tail = [] if fresh_tail else list(s.env[tail.name] or [])
        extra = s.i(1, 3) if fresh_tail else 0
    elif isinstance(tail, Call) and tail.op == "TNil":
        fresh_tail, known_tail, extra = False, [], 0
    else:
        raise _Reject("Concat: unsupported list pattern")
    free = len(items) + extra               # parts still to instantiate
    if free + len(known_tail) == 0:
        raise _Reject("Concat of nothing")
    # the shape of every part: `want` split along the axis, or a first part's shape varied
    if want is not None:
        if not want:
            raise _Reject("Concat gives rank >= 1")
        ax = s.attr(axis, lambda: s.i(0, len(want) - 1))
        if not 0 <= ax < len(want):
            raise _Reject("Concat: axis outside the rank")
        left = want[ax] - sum(int(t.shape[ax]) for t in known_tail)
        if left < free or (free == 0 and left != 0):
            raise _Reject("Concat: wanted size does not split into the parts")
        cuts = sorted(s.i(1, left - 1) for _ in range(free - 1)) if free > 1 else []
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, left])]
        if any(z < 1 for z in sizes):
            raise _Reject("Concat: empty part")
        shapes = [tuple(z if i == ax else d for i, d in enumerate(want)) for z in sizes]
        values = [s.make(item, shape) for item, shape in zip(items, shapes)]
        tensors = [s.array(shape) for shape in shapes[len(items):]]
    else:
        ax = s.known(axis)
        need = (ax + 1) if isinstance(ax, int) else 1
        if items:
            first = s.make(items[0], None, "any", {r for r in range(1, 5) if r >= need})
        elif known_tail:
            first = known_tail[0]
        else:
            first = s.array(s.random_shape({r for r in range(1, 5) if r >= need}))
        if not isinstance(first, np.ndarray) or first.ndim < 1:
            raise _Reject("Concat needs rank >= 1")
        ax = s.attr(axis, lambda: s.i(0, first.ndim - 1))

        def varied():
            return tuple(s.i(1, 3) if i == ax else d for i, d in enumerate(first.shape))
        values = ([first] if items else []) + [s.make(item, varied()) for item in items[1:]]
        tensors = [first] if not items and not known_tail else []
        tensors += [s.array(varied()) for _ in range(extra - len(tensors))]
    if fresh_tail:
        s.env[tail.name] = tensors
    return s.apply("Concat", [values + known_tail + tensors], {"axis": ax})


def _gen_gather(s, p, want, role, ranks):
    data, indices, axis = p.args
    if want is not None:
        q = s.i(0, min(2, len(want)))
        r = len(want) - q + 1
        ax = s.attr(axis, lambda: s.i(0, r - 1))
        if not 0 <= ax < r:
            raise _Reject("Gather: axis outside the rank")
        n = s.i(1, 4)
        dv = s.make(data, (*want[:ax], n, *want[ax + q:]))
        iv = s.make(indices, tuple(want[ax:ax + q]), ("index", n))
    else:
        dv = s.make(data, None, "any", {1, 2, 3})
        ax = s.attr(axis, lambda: s.i(0, dv.ndim - 1))
        if not 0 <= ax < dv.ndim:
            raise _Reject("Gather: axis outside the rank")
        iv = s.make(indices, tuple(s.i(1, 3) for _ in range(s.i(0, 2))), ("index", dv.shape[ax]))
    return s.apply("Gather", [dv, iv], {"axis": ax})


def _gen_pad(s, p, want, role, ranks):
    x, pads, mode, value = p.args
    md = s.attr(mode, lambda: s.pick(("constant", "reflect", "edge")))
    val = s.attr(value, lambda: s.pick((0.0, 1.5, -1.0)))
    if want is not None:
        r = len(want)
        pd = s.attr(pads, lambda: tuple(s.i(0, min(2, (want[i % r] - 1) // 3))
                                        for i in range(2 * r)))
        if len(pd) != 2 * r:
            raise _Reject("Pad: pads do not match the rank")
        xv = s.make(x, tuple(want[i] - pd[i] - pd[r + i] for i in range(r)))
    else:
        n = s.length_of(pads)
        xv = s.make(x, None, "any", {n // 2} if n else ranks)
        r = xv.ndim
        limit = [(d - 1) if md == "reflect" else 2 for d in xv.shape]
        pd = s.attr(pads, lambda: tuple(s.i(0, min(2, limit[i % r])) for i in range(2 * r)))
    return s.apply("Pad", [xv], {"pads": pd, "mode": md, "value": val})


def _permutation(s, n):
    from hypothesis import strategies as st
    return tuple(s.draw(st.permutations(list(range(n)))))


def _gen_transpose(s, p, want, role, ranks):
    x, perm = p.args
    if want is not None:
        pm = s.attr(perm, lambda: _permutation(s, len(want)))
        if sorted(pm) != list(range(len(want))):
            raise _Reject("Transpose: perm does not match the rank")
        inv = [0] * len(pm)
        for i, q in enumerate(pm):
            inv[q] = want[i]
        xv = s.make(x, tuple(inv))
    else:
        n = s.length_of(perm)
        xv = s.make(x, None, "any", {n} if n is not None else ranks)
        pm = s.attr(perm, lambda: _permutation(s, xv.ndim))
    return s.apply("Transpose", [xv], {"perm": pm})


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _random_reshape(s, total: int) -> tuple:
    rank = s.pick((1, 2, 3, 4))
    dims = []
    left = total
    for _ in range(rank - 1):
        d = s.pick(_divisors(left))
        dims.append(d)
        left //= d
    dims.append(left)
    return tuple(dims)


def _gen_reshape(s, p, want, role, ranks):
    x, shape = p.args
    target = s.known(shape)
    if want is not None and target is not None and tuple(target) != tuple(want):
        raise _Reject("Reshape: shape attribute differs from the wanted shape")
    target = tuple(want) if want is not None else target
    if target is not None:
        xv = s.make(x, _random_reshape(s, int(np.prod(target))))
        s.attr(shape, lambda: target)
    else:
        xv = s.make(x, None, "any", None)
        target = s.attr(shape, lambda: _random_reshape(s, int(xv.size)))
    return s.apply("Reshape", [xv], {"shape": tuple(target)})


def _factor(s, n: int, parts: int) -> list[int]:
    if parts == 0:
        if n != 1:
            raise _Reject("Flatten: a leading size other than 1 needs axis > 0")
        return []
    dims, left = [], n
    for _ in range(parts - 1):
        d = s.pick(_divisors(left))
        dims.append(d)
        left //= d
    return dims + [left]


def _gen_flatten(s, p, want, role, ranks):
    x, axis = p.args
    if want is not None:
        if len(want) != 2:
            raise _Reject("Flatten gives rank 2")
        ax = s.attr(axis, lambda: s.i(0 if want[0] == 1 else 1, 2))
        xv = s.make(x, tuple(_factor(s, want[0], ax) + _factor(s, want[1], s.i(1, 2))))
    else:
        xv = s.make(x, None, "any", None)
        ax = s.attr(axis, lambda: s.i(0, xv.ndim))
    return s.apply("Flatten", [xv], {"axis": ax})


def _gen_squeeze(s, p, want, role, ranks):
    x, axes = p.args
    xv = s.value_if_determined(x)
    if isinstance(xv, np.ndarray):
        ax = s.attr(axes, lambda: s.subset([i for i, d in enumerate(xv.shape) if d == 1]))
    else:
        out = tuple(want) if want is not None else s.random_shape((0, 1, 2, 3))
        ax = s.known(axes)
        if ax is None:
            count = s.i(1, 2)
            ax = s.attr(axes, lambda: tuple(sorted(s.subset(range(len(out) + count))[:count])))
        if any(not 0 <= a < len(out) + len(ax) for a in ax):
            raise _Reject("Squeeze: axes do not fit")
        rest = iter(out)
        shape = tuple(1 if i in ax else next(rest) for i in range(len(out) + len(ax)))
        xv = s.make(x, shape)
    return s.apply("Squeeze", [xv], {"axes": tuple(ax)})


def _gen_unsqueeze(s, p, want, role, ranks):
    x, axes = p.args
    if want is not None:
        ax = s.attr(axes, lambda: s.subset([i for i, d in enumerate(want) if d == 1]))
        if any(not 0 <= a < len(want) or want[a] != 1 for a in ax):
            raise _Reject("Unsqueeze: inserted axes must have size 1 in the result")
        xv = s.make(x, tuple(d for i, d in enumerate(want) if i not in ax))
    else:
        ax = s.known(axes)
        if ax is not None:
            need = max(max(ax) + 1 - len(ax), 0) if ax else 0
            xv = s.make(x, None, "any", {r for r in range(0, 5) if r >= need})
        else:
            xv = s.make(x, None, "any", ranks)
            count = s.i(1, 2)
            ax = s.attr(axes, lambda: tuple(sorted(
                s.subset(range(xv.ndim + count), min_size=count)[:count])))
            if len(ax) != count:
                raise _Reject("Unsqueeze: could not place the axes")
    return s.apply("Unsqueeze", [xv], {"axes": tuple(ax)})


def _gen_slice(s, p, want, role, ranks):
    x, starts, ends, axes, steps = p.args
    if want is not None:
        r = len(want)
        ax = s.attr(axes, lambda: s.subset(range(r))) if r else ()
        stp = s.attr(steps, lambda: tuple(s.pick((1, 2)) for _ in ax))
        shape, sts, ens = list(want), [], []
        for a, step in zip(ax, stp):
            if step < 1:
                raise _Reject("Slice: negative steps are sampled without a wanted shape")
            extra = s.i(0, 2)
            shape[a] = (want[a] - 1) * step + 1 + extra
            start = s.i(0, extra)
            sts.append(start)
            ens.append(start + (want[a] - 1) * step + 1)
        sts = s.attr(starts, lambda: tuple(sts))
        ens = s.attr(ends, lambda: tuple(ens))
        xv = s.make(x, tuple(shape))
    else:
        xv = s.make(x, None, "any", {r for r in (ranks or (1, 2, 3, 4)) if r >= 1} or {1, 2})
        ax = s.attr(axes, lambda: s.subset(range(xv.ndim)))
        stp = s.attr(steps, lambda: tuple(s.pick((1, 1, 2, -1)) for _ in ax))
        sts, ens = [], []
        for a, step in zip(ax, stp):
            n = xv.shape[a]
            start = s.i(0, n - 1)
            if step > 0:
                end = s.pick((s.i(start + 1, n), 2**63 - 1))
            else:
                end = s.pick((s.i(-1, start - 1) if start > 0 else -n - 1, -n - 1))
                if end == -1:
                    end = -n - 1
            sts.append(start)
            ens.append(end)
        sts = s.attr(starts, lambda: tuple(sts))
        ens = s.attr(ends, lambda: tuple(ens))
    return s.apply("Slice", [xv], dict(starts=sts, ends=ens, axes=ax, steps=stp))


def _gen_split(s, p, want, role, ranks):
    x, sizes, axis, index = p.args
    if want is not None:
        if not want:
            raise _Reject("Split gives rank >= 1")
        ax = s.attr(axis, lambda: s.i(0, len(want) - 1))
        parts = s.known(sizes)
        if parts is None:
            count = s.i(1, 3)
            idx = s.attr(index, lambda: s.i(0, count - 1))
            parts = s.attr(sizes, lambda: tuple(want[ax] if k == idx else s.i(1, 3)
                                                for k in range(count)))
        else:
            idx = s.attr(index, lambda: s.i(0, len(parts) - 1))
        shape = tuple(sum(parts) if i == ax else d for i, d in enumerate(want))
        xv = s.make(x, shape)
    else:
        xv = s.make(x, None, "any", {1, 2, 3})
        ax = s.attr(axis, lambda: s.i(0, xv.ndim - 1))
        n = xv.shape[ax]

        def draw_sizes():
            count = s.i(1, min(3, n))
            cuts = sorted(set(s.i(1, n - 1) for _ in range(count - 1))) if n > 1 else []
            return tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))
        parts = s.attr(sizes, draw_sizes)
        idx = s.attr(index, lambda: s.i(0, len(parts) - 1))
    return s.apply("Split", [xv], {"split": tuple(parts), "axis": ax, "index": idx})


def _gen_expand(s, p, want, role, ranks):
    x, shape = p.args
    target = s.known(shape)
    if want is not None:
        if target is not None and tuple(target) != tuple(want):
            raise _Reject("Expand: shape attribute differs from the wanted shape")
        xv = s.make(x, s.sub_shape(want))
        target = s.attr(shape, lambda: tuple(want))
    elif target is not None:
        xv = s.make(x, s.sub_shape(target))
    else:
        xv = s.make(x, None, "any", {0, 1, 2, 3})
        extra = tuple(s.i(1, 3) for _ in range(s.i(0, 1)))
        target = s.attr(shape, lambda: extra + tuple(s.i(1, 3) if d == 1 else d
                                                     for d in xv.shape))
    return s.apply("Expand", [xv], {"shape": tuple(target)})


def _gen_leaf(s, p, want, role, ranks):
    name = s.attr(p.args[0], lambda: s.fresh_name(p.op))
    key = (p.op, name)
    if key not in s.leaves:
        var = s.plan.names.get(p)
        if var is not None:
            s.leaves[key] = s.tensor(var, s.fresh_shape(var, want, ranks), role)
        else:
            shape = want if want is not None else s.random_shape(ranks)
            s.leaves[key] = s.array(shape, role)
    return s.leaves[key]


def _gen_scalar(s, p, want, role, ranks):
    def value():
        if role == "positive":
            return s.pick((1.0, 0.5, 2.0)) if s.coin() else s.f(0.05, 2.0)
        if role == "nonzero":
            return s.pick((1.0, -1.0, 0.5, 2.0))
        return s.pick((0.0, 1.0, -1.0, 0.5, 2.0)) if s.coin() else s.f(-2.0, 2.0)
    v = s.attr(p.args[0], value)
    dt = s.attr(p.args[1], lambda: s.dtype.name)
    return s.apply("Scalar", [], {"value": v, "dtype": dt})


def _gen_ints(s, p, want, role, ranks):
    n = want[0] if want is not None and len(want) == 1 else s.i(1, 3)
    values = s.attr(p.args[0], lambda: tuple(s.i(0, 3) for _ in range(n)))
    return s.apply("Ints", [], {"values": values})


def _gen_absent(s, p, want, role, ranks):
    return None


def _default_attr(s, sort: str):
    if sort == "i64":
        return s.i(0, 2)
    if sort == "f64":
        return s.pick((1.0, 0.5, -1.0))
    if sort == "String":
        return s.dtype.name
    if sort == "IVec":
        return tuple(s.i(0, 2) for _ in range(s.i(1, 3)))
    raise _Reject(f"no values for sort {sort}")


def _gen_generic(s, p, want, role, ranks):
    """Operators without their own generator: operands drawn freely, then evaluated."""
    spec = OPS.get(p.op)
    if spec is None or spec.kind == "opaque":
        raise _Unsupported(f"{p.op} has no NumPy evaluation")
    sorts = s.plan.constructors.get(p.op, ((), ""))[0]
    n = len(spec.inputs)
    tensors = [s.make(a, None) for a in p.args[:n]]
    attrs = {name: s.attr(a, lambda srt=srt: _default_attr(s, srt))
             for name, a, srt in zip(spec.attrs, p.args[n:], sorts[n:])}
    return s.apply(p.op, tensors, attrs)


_GENERATORS: dict[str, Callable] = {
    **{op: _gen_unary for op in ("Mat", "Identity", "Dropout", "Relu", "LeakyRelu", "Sigmoid",
                                 "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu", "Sqrt", "Exp",
                                 "Log", "Neg", "Abs", "Reciprocal", "Cast")},
    **{op: _gen_broadcast for op in ("Add", "Sub", "Mul", "Div", "Pow", "Where")},
    "Clip": _gen_clip, "BatchNormalization": _gen_batchnorm, "Conv": _gen_conv,
    "ConvTranspose": _gen_conv_transpose, "MatMul": _gen_matmul, "Gemm": _gen_gemm,
    "Softmax": _gen_softmax, "LayerNormalization": _gen_layernorm,
    "ReduceMean": _gen_reduce, "ReduceSum": _gen_reduce, "MaxPool": _gen_pool,
    "AveragePool": _gen_pool, "GlobalAveragePool": _gen_gap, "LRN": _gen_lrn,
    "Concat": _gen_concat, "Gather": _gen_gather, "Pad": _gen_pad, "Transpose": _gen_transpose,
    "Reshape": _gen_reshape, "Flatten": _gen_flatten, "Squeeze": _gen_squeeze,
    "Unsqueeze": _gen_unsqueeze, "Slice": _gen_slice, "Split": _gen_split,
    "Expand": _gen_expand, "Input": _gen_leaf, "Const": _gen_leaf, "Scalar": _gen_scalar,
    "Ints": _gen_ints, "Absent": _gen_absent,
}


# ---- comparing and reporting -------------------------------------------------------------------

# (atol, rtol) per dtype: |lhs - rhs| <= atol * max(1, max|lhs|, max|rhs|) + rtol * |rhs|
TOLERANCES = {"float16": (1e-3, 1e-2), "float32": (1e-5, 1e-4), "float64": (1e-10, 1e-9)}


def _summary(v, limit: int = 8) -> str:
    if v is None:
        return "(Absent)"
    if isinstance(v, list):
        return "[" + ", ".join(_summary(x, limit) for x in v) + "]"
    if not isinstance(v, np.ndarray):
        return _render_value(v)
    head = f"{v.dtype}[{', '.join(str(d) for d in v.shape)}]"
    if v.size == 0:
        return head + " (empty)"
    if v.size <= limit:
        flat = ", ".join(f"{x:.6g}" if v.dtype.kind == "f" else str(x) for x in v.reshape(-1))
        return f"{head} = [{flat}]"
    if v.dtype.kind == "f":
        return f"{head} in [{float(np.nanmin(v)):.4g}, {float(np.nanmax(v)):.4g}]"
    return f"{head} in [{v.min()}, {v.max()}]"


@dataclass
class Counterexample:
    """An instance on which a rule's two sides differ (or its right-hand side fails)."""

    direction: str                       # "lhs => rhs" (or "rhs => lhs" for a birewrite)
    lhs: str                             # the two sides compared, as written
    rhs: str
    inputs: dict[str, Any]               # tensor variables and leaves -> arrays (None: Absent)
    attributes: dict[str, Any]           # attribute variables -> values
    lhs_value: Any = None
    rhs_value: Any = None
    max_abs_diff: float | None = None    # largest |lhs - rhs|
    tolerance: float | None = None       # what was allowed there
    index: tuple | None = None           # where the largest difference is
    error: str | None = None             # rhs failed / shapes or dtypes differ

    def describe(self, indent: str = "    ") -> str:
        lines = [f"counterexample ({self.direction}):"]
        for name, value in self.inputs.items():
            lines.append(f"  {name} = {_summary(value)}")
        for name, value in self.attributes.items():
            lines.append(f"  {name} = {_summary(value)}")
        lines.append(f"  lhs {self.lhs}")
        lines.append(f"      = {_summary(self.lhs_value)}")
        lines.append(f"  rhs {self.rhs}")
        if self.error:
            lines.append(f"      {self.error}")
        else:
            lines.append(f"      = {_summary(self.rhs_value)}")
        if self.max_abs_diff is not None:
            at = ""
            if self.index is not None and isinstance(self.lhs_value, np.ndarray):
                idx = tuple(int(i) for i in self.index)
                at = (f" at {list(idx)}: lhs {float(self.lhs_value[idx]):.6g}, "
                      f"rhs {float(self.rhs_value[idx]):.6g}")
            lines.append(f"  largest difference {self.max_abs_diff:.6g}{at} "
                         f"(allowed {self.tolerance:.3g})")
        return "\n".join(indent + line for line in lines)

    def as_dict(self) -> dict:
        return {"direction": self.direction, "lhs": self.lhs, "rhs": self.rhs,
                "inputs": {k: _summary(v) for k, v in self.inputs.items()},
                "attributes": {k: _json_value(v) for k, v in self.attributes.items()},
                "lhs_value": _summary(self.lhs_value), "rhs_value": _summary(self.rhs_value),
                "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
                "index": None if self.index is None else [int(i) for i in self.index],
                "error": self.error}


def _json_value(v):
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def _finite(v) -> bool:
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    if isinstance(v, np.ndarray) and v.dtype.kind in "fc":
        return bool(np.all(np.isfinite(v)))
    return True


def _compare(lv, rv):
    """None if equal within tolerance, else (error, max_diff, tolerance, index)."""
    if lv is None or rv is None:
        return None if lv is None and rv is None else (
            f"one side is absent: lhs {_summary(lv)}, rhs {_summary(rv)}", None, None, None)
    if isinstance(lv, list) or isinstance(rv, list):
        if not (isinstance(lv, list) and isinstance(rv, list)) or len(lv) != len(rv):
            return ("the sides are different lists", None, None, None)
        for a, b in zip(lv, rv):
            bad = _compare(a, b)
            if bad:
                return bad
        return None
    lv, rv = np.asarray(lv), np.asarray(rv)
    if lv.shape != rv.shape:
        return (f"shapes differ: lhs {list(lv.shape)}, rhs {list(rv.shape)}", None, None, None)
    if lv.dtype != rv.dtype:
        return (f"dtypes differ: lhs {lv.dtype}, rhs {rv.dtype}", None, None, None)
    if lv.dtype.kind not in "fc":
        if np.array_equal(lv, rv):
            return None
        diff = np.abs(lv.astype(np.float64) - rv.astype(np.float64))
        index = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else None
        return (None, float(diff.max()), 0.0, index)
    atol, rtol = TOLERANCES.get(lv.dtype.name, TOLERANCES["float32"])
    l64, r64 = lv.astype(np.float64), rv.astype(np.float64)
    if lv.size == 0:
        return None
    finite_r = np.where(np.isfinite(r64), np.abs(r64), 0.0)
    scale = max(1.0, float(np.max(np.abs(l64))), float(np.max(finite_r)))
    allowed = atol * scale + rtol * finite_r
    with np.errstate(invalid="ignore"):
        diff = np.abs(l64 - r64)
    diff = np.where(np.isnan(diff), np.inf, diff)
    excess = diff - allowed
    k = int(np.argmax(excess))
    if excess.reshape(-1)[k] <= 0:
        return None
    index = np.unravel_index(k, diff.shape)
    return (None, float(diff.reshape(-1)[k]), float(allowed.reshape(-1)[k]), index)


@dataclass
class RuleResult:
    """What the checker found for one rule."""

    rule: Rule
    status: str                              # "passed" | "unsound" | "unchecked" | "fact"
    reason: str = ""
    examples: int = 0                        # instances compared (all directions)
    rejected: int = 0                        # samples that did not instantiate the rule
    rejections: dict[str, int] = field(default_factory=dict)
    relies_on: list[str] = field(default_factory=list)   # structural conditions (relations)
    counterexample: Counterexample | None = None
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def location(self) -> str:
        return self.rule.location

    def as_dict(self) -> dict:
        r = self.rule
        return {"name": r.name, "ruleset": r.ruleset, "file": r.file, "line": r.line,
                "kind": r.kind, "status": self.status, "reason": self.reason,
                "examples": self.examples, "rejected": self.rejected,
                "rejections": dict(self.rejections), "relies_on": list(self.relies_on),
                "lhs": None if r.lhs is None else str(r.lhs),
                "rhs": None if r.rhs is None else str(r.rhs),
                "counterexample": self.counterexample.as_dict() if self.counterexample else None,
                "seconds": round(self.seconds, 4)}


@dataclass
class CheckReport:
    """The checker's verdict on every rule of the checked files."""

    results: list[RuleResult]
    files: list[str]
    examples: int
    seed: int
    seconds: float = 0.0

    def with_status(self, status: str) -> list[RuleResult]:
        return [r for r in self.results if r.status == status]

    @property
    def passed(self) -> list[RuleResult]:
        return self.with_status("passed")

    @property
    def unsound(self) -> list[RuleResult]:
        return self.with_status("unsound")

    @property
    def unchecked(self) -> list[RuleResult]:
        return self.with_status("unchecked")

    @property
    def facts(self) -> list[RuleResult]:
        return self.with_status("fact")

    @property
    def ok(self) -> bool:
        """No rule was found unsound (unchecked rules are listed, not failures)."""
        return not self.unsound

    def result(self, name: str) -> RuleResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def summary(self) -> str:
        lines = [f"eqsat-fuse rules check: {len(self.results)} rules in {len(self.files)} "
                 f"file(s), up to {self.examples} examples each (seed {self.seed}), "
                 f"{self.seconds:.1f} s"]
        for r in self.unsound:
            lines.append("")
            lines.append(f"UNSOUND    {r.name}  ({r.location}, ruleset {r.rule.ruleset})")
            lines.append(f"    {r.reason}")
            if r.counterexample:
                lines.append(r.counterexample.describe())
        if self.unchecked:
            lines.append("")
            lines.append(f"UNCHECKED  {len(self.unchecked)} rule(s) could not be checked "
                         "(they are NOT known to be sound):")
            for r in self.unchecked:
                lines.append(f"  {r.name}  ({r.location}): {r.reason}")
        if self.passed:
            lines.append("")
            lines.append(f"passed     {len(self.passed)} rule(s):")
            for r in self.passed:
                note = f"  [relies on {', '.join(r.relies_on)}]" if r.relies_on else ""
                rej = f", {r.rejected} samples rejected" if r.rejected else ""
                nan = sum(n for why, n in r.rejections.items() if why.startswith(_NOT_FINITE))
                rej += f" ({nan} with a non-finite left-hand side)" if nan else ""
                lines.append(f"  ok  {r.name:32} {r.location}  {r.examples} examples{rej}{note}")
        if self.facts:
            lines.append("")
            lines.append(f"facts (not an equality): {len(self.facts)} rule(s) only assert facts:")
            lines.extend(textwrap.wrap(", ".join(r.name for r in self.facts), 98,
                                       initial_indent="  ", subsequent_indent="  ",
                                       break_on_hyphens=False))
        lines.append("")
        verdict = (f"{len(self.unsound)} UNSOUND" if self.unsound else "no unsound rule")
        lines.append(f"{verdict}; {len(self.passed)} passed, {len(self.unchecked)} unchecked, "
                     f"{len(self.facts)} facts")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "files": list(self.files), "examples": self.examples,
                "seed": self.seed, "seconds": round(self.seconds, 3),
                "counts": {s: len(self.with_status(s))
                           for s in ("passed", "unsound", "unchecked", "fact")},
                "rules": [r.as_dict() for r in self.results]}


# ---- planning and running one rule -------------------------------------------------------------

@dataclass
class _Plan:
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


# Sorts of plain values; the others (T, TList) are sorts of terms, i.e. of e-classes.
_VALUE_SORTS = {"i64", "f64", "String", "bool", "Unit", "IVec", "BigInt", "BigRat"}


def _var_sorts(patterns, constructors) -> dict[str, str]:
    sorts: dict[str, str] = {}

    def walk(p):
        if isinstance(p, Call) and p.op in constructors:
            for a, sort in zip(p.args, constructors[p.op][0]):
                if isinstance(a, Var):
                    sorts.setdefault(a.name, sort)
                walk(a)
        elif isinstance(p, Call):
            for a in p.args:
                walk(a)
    for p in patterns:
        walk(p)
    return sorts


def _static_problems(rule: Rule, decls: _Decls, sorts: dict[str, str]) -> tuple[str | None, list]:
    """(why the rule cannot be checked or None, structural conditions it relies on)."""
    if rule.unsupported:
        return rule.unsupported, []
    relies: list[str] = []
    known = set(decls.constructors) | set(FACT_FUNCTIONS) | set(_PRIMS)

    def calls(p):
        if isinstance(p, Call):
            yield p
            for a in p.args:
                yield from calls(a)

    terms = [p for pair in rule.unions for p in pair] + [p for _, p in rule.matched]
    terms += [x for f, v in rule.sets for x in (f, v)]
    for p in terms:
        for c in calls(p):
            if c.op == "Opaque":
                return "it involves Opaque, an arbitrary ONNX node the checker cannot evaluate", []
            if c.op not in known:
                what = "function" if c.op in decls.functions else "operation"
                return f"it uses the {what} `{c.op}`, whose meaning the checker does not know", []
    for cond in rule.conditions:
        if isinstance(cond, Check) and isinstance(cond.expr, Call):
            head = cond.expr
            if head.op in decls.relations:
                arg_sorts = decls.relations[head.op]
                if any(s in _VALUE_SORTS for s in arg_sorts):
                    return (f"its condition {cond} is a relation over non-tensor values, which "
                            "the checker cannot interpret", [])
                relies.append(str(cond))
                continue
            if head.op in decls.constructors:
                relies.append(str(cond))
                continue
            if head.op == "!=" and any(isinstance(a, Var) and (a.name in dict(rule.matched)
                                                               or sorts.get(a.name) == "T")
                                       for a in head.args):
                relies.append(str(cond))
        parts = [cond.left, cond.right] if isinstance(cond, Eq) else [cond.expr]
        for part in parts:
            for c in calls(part):
                if c.op in decls.relations:
                    return f"its condition {cond} uses a relation as a value", []
                if c.op not in known:
                    what = "fact function" if c.op in decls.functions else "operation"
                    return (f"its condition {cond} uses the {what} `{c.op}`, whose meaning the "
                            "checker does not know", [])
    for f, _ in rule.sets:
        if f.op not in FACT_FUNCTIONS:
            return f"it sets ({f.op} ...), a fact the checker cannot check", []
    return None, relies


def _plans(rule: Rule, decls: _Decls, absent_ok: dict[str, bool]) -> list[_Plan]:
    relations = frozenset(decls.relations)
    matched = dict(rule.matched)
    sorts = _var_sorts([p for pair in rule.unions for p in pair] + list(matched.values()),
                       decls.constructors)
    tensor_vars = {v for v, srt in sorts.items() if srt not in _VALUE_SORTS}
    hints = _hints(rule.conditions, set(sorts), tensor_vars, absent_ok, set(decls.constructors))
    conditions = list(rule.conditions)

    def plan(direction, roots, obligations):
        return _Plan(rule, direction, roots, matched, conditions, obligations, hints,
                     decls.constructors, relations, {p: v for v, p in matched.items()})
    if rule.kind in ("rewrite", "birewrite"):
        plans = [plan("lhs => rhs", [(None, rule.lhs)], [("union", rule.lhs, rule.rhs)])]
        if rule.kind == "birewrite":
            plans.append(plan("rhs => lhs", [(None, rule.rhs)], [("union", rule.rhs, rule.lhs)]))
        return plans
    roots = [(v, p) for v, p in matched.items()
             if not any(u != v and _contains(q, p) for u, q in matched.items())]
    obligations = [("union", a, b) for a, b in rule.unions]
    obligations += [("set", f, v) for f, v in rule.sets]
    return [plan("lhs => rhs", roots, obligations)]


def _contains(term: Pattern, part: Pattern) -> bool:
    """Is `part` a proper subterm of `term`?"""
    return isinstance(term, Call) and any(a == part or _contains(a, part) for a in term.args)


def _satisfy(s: _Sample, conditions) -> None:
    """Evaluate the conditions on the sample, binding new variables; reject if one fails."""
    pending = list(conditions)
    while pending:
        progress = False
        for cond in list(pending):
            try:
                if isinstance(cond, Check):
                    e = cond.expr
                    if isinstance(e, Call) and (e.op in s.plan.constructors
                                                or e.op in s.plan.relations):
                        pass                     # structural: a term or relation exists
                    else:
                        s.eval(e)                # a primitive check; `!=` on tensors passes
                else:
                    _satisfy_eq(s, cond)
            except _Unbound:
                continue
            except _NoFact as exc:
                raise _Reject(f"condition {cond} does not hold ({exc})") from None
            pending.remove(cond)
            progress = True
        if not progress:
            raise _Unsupported(f"cannot evaluate the condition {pending[0]} (its variables "
                               "are never bound)")


def _satisfy_eq(s: _Sample, cond: Eq) -> None:
    left, right = cond.left, cond.right
    for a, b in ((left, right), (right, left)):
        if isinstance(a, Var) and a.name not in s.env:
            value = s.eval(b)             # _Unbound propagates: wait for more bindings
            s.env[a.name] = value
            return
    lv, rv = s.eval(left), s.eval(right)
    if not _values_equal(lv, rv):
        raise _NoFact(f"{_summary(lv)} != {_summary(rv)}")


def _values_equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _run_sample(plan: _Plan, draw):
    """One example: instantiate, check conditions, compare. Returns a Counterexample or None."""
    s = _Sample(plan, draw)
    try:
        for var, pattern in plan.roots:
            want = s.first(plan.hints.shape.get(var)) if var else None
            rank = s.first(plan.hints.rank.get(var)) if var else None
            s.make(pattern, None if want is None else tuple(want), "any",
                   None if rank is None else {rank})
        for var, pattern in plan.matched.items():
            s.env[var] = s.eval(pattern)
        _satisfy(s, plan.conditions)
    except (_Reject, _Unsupported):
        raise
    except (_NoFact, _Unbound) as exc:
        raise _Reject(f"the matched side does not instantiate ({exc})") from None
    except Exception as exc:
        raise _Reject(f"the matched side does not evaluate ({type(exc).__name__}: "
                      f"{str(exc)[:80]})") from None
    for kind, a, b in plan.obligations:
        if kind != "union" or not _on_matched_side(a, plan):
            continue
        try:
            lv = s.eval(a)
        except (_Unsupported, _Reject):
            raise
        except Exception as exc:
            raise _Reject(f"the matched side does not evaluate ({type(exc).__name__}: "
                          f"{str(exc)[:80]})") from None
        if not _finite(lv):
            raise _Reject(_NOT_FINITE + " (NaN/inf) on this sample")
    for kind, a, b in plan.obligations:
        error = lv = rv = None
        try:
            with np.errstate(all="ignore"):
                if kind == "union":
                    lv = s.eval(a)
                else:
                    lv = FACT_FUNCTIONS[a.op](*(s.eval(x) for x in a.args))
                rv = s.eval(b)
        except _Unsupported:
            raise
        except Exception as exc:
            side = "right-hand side" if lv is not None or kind == "union" else "term it sets"
            error = (f"the {side} fails to evaluate: {type(exc).__name__}: {str(exc)[:200]}")
        if error is None:
            if kind == "set":
                bad = None if _values_equal(lv, rv) else (
                    f"the rule sets {a} to {_summary(rv)}, but the value has {_summary(lv)}",
                    None, None, None)
            else:
                bad = _compare(lv, rv)
            if bad is None:
                continue
            error, diff, tol, index = bad
        else:
            diff = tol = index = None
        return _counterexample(s, plan, str(a), str(b), lv, rv, error, diff, tol, index)
    return None


def _on_matched_side(p, plan: _Plan) -> bool:
    """Is `p` (the left side of an obligation) a term the rule matched?"""
    return any(p == q for _, q in plan.roots) or any(p == q for q in plan.matched.values())


def _counterexample(s, plan, lhs, rhs, lv, rv, error, diff, tol, index) -> Counterexample:
    inputs, attributes = {}, {}
    for name, value in s.env.items():
        if name in plan.matched:
            continue
        if isinstance(value, (np.ndarray, list)) or value is None:
            inputs[name] = value
        else:
            attributes[name] = value
    for (op, name), value in s.leaves.items():
        inputs[f"({op} {_render_value(name)})"] = value
    return Counterexample(direction=plan.direction, lhs=lhs, rhs=rhs, inputs=inputs,
                          attributes=attributes, lhs_value=lv, rhs_value=rv,
                          max_abs_diff=diff, tolerance=tol,
                          index=None if index is None else tuple(int(i) for i in index),
                          error=error)


_NOT_FINITE = "the matched side is not finite"


class _Found(Exception):
    """Raised inside the hypothesis test when the two sides differ."""


def _check_plan(plan: _Plan, examples: int, seed: int, shrink: bool):
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    state = {"valid": 0, "failure": None, "unsupported": None, "crash": None}
    rejections: Counter = Counter()
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @settings(max_examples=examples, database=None, deadline=None, phases=phases,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              verbosity=Verbosity.quiet, print_blob=False)
    @hseed(seed)
    @given(st.data())
    def run(data):
        from hypothesis import reject
        try:
            found = _run_sample(plan, data.draw)
        except _Reject as exc:
            rejections[exc.reason] += 1
            reject()
        except _Unsupported as exc:
            state["unsupported"] = str(exc)
            rejections["unsupported"] += 1
            reject()
        state["valid"] += 1
        if found is not None:
            state["failure"] = found
            raise _Found()

    try:
        run()
    except _Found:
        pass
    except Unsatisfiable:
        pass
    except Exception as exc:                  # a bug of the checker: never a verdict on the rule
        state["crash"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return state, rejections


def _check_rule(rule: Rule, decls: _Decls, absent_ok: dict[str, bool], examples: int, seed: int,
                shrink: bool) -> RuleResult:
    started = time.perf_counter()
    matched = dict(rule.matched)
    sorts = _var_sorts([p for pair in rule.unions for p in pair] + list(matched.values()),
                       decls.constructors)
    problem, relies = _static_problems(rule, decls, sorts)
    if problem is None and rule.kind == "fact" and not rule.sets:
        return RuleResult(rule, "fact", "asserts " + ", ".join(str(a) for a in rule.asserts),
                          seconds=time.perf_counter() - started)
    if problem is not None:
        return RuleResult(rule, "unchecked", problem, relies_on=relies,
                          seconds=time.perf_counter() - started)
    total_valid, total_rejected, rejections = 0, 0, Counter()
    for plan in _plans(rule, decls, absent_ok):
        state, rej = _check_plan(plan, examples, seed, shrink)
        rejections.update(rej)
        total_valid += state["valid"]
        total_rejected += sum(rej.values())
        if state["crash"] is not None and state["failure"] is None:
            return RuleResult(rule, "unchecked", f"the checker failed on this rule "
                              f"({plan.direction}): {state['crash']}", total_valid,
                              total_rejected, dict(rejections.most_common()), relies,
                              seconds=time.perf_counter() - started)
        if state["failure"] is not None:
            cx = state["failure"]
            reason = (cx.error if cx.error else
                      f"the sides differ by {cx.max_abs_diff:.4g} (allowed {cx.tolerance:.3g})")
            return RuleResult(rule, "unsound", reason, total_valid, total_rejected,
                              dict(rejections.most_common()), relies, cx,
                              time.perf_counter() - started)
        if state["valid"] == 0:
            if state["unsupported"]:
                reason = state["unsupported"]
            else:
                top = "; ".join(f"{why} ({n}x)" for why, n in rej.most_common(3))
                reason = (f"no sample met the rule's conditions ({plan.direction}) in "
                          f"{sum(rej.values())} tries: {top}")
            return RuleResult(rule, "unchecked", reason, total_valid, total_rejected,
                              dict(rejections.most_common()), relies,
                              seconds=time.perf_counter() - started)
    reason = f"{total_valid} examples agreed"
    if total_rejected:
        reason += f"; {total_rejected} samples rejected"
    return RuleResult(rule, "passed", reason, total_valid, total_rejected,
                      dict(rejections.most_common()), relies,
                      seconds=time.perf_counter() - started)


@contextlib.contextmanager
def _private_hypothesis_storage():
    """Hypothesis keeps caches in ./.hypothesis; a check must not litter the user's folder, so
    they go to a temporary directory for its duration (the previous setting is restored)."""
    from hypothesis import configuration

    previous = getattr(configuration, "__hypothesis_home_directory", None)
    with tempfile.TemporaryDirectory(prefix="eqsat-fuse-rulecheck-") as tmp:
        configuration.set_hypothesis_home_dir(tmp)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(previous)


def check_rules(files: Iterable[str | Path] | None = None, examples: int = 50, seed: int = 0, *,
                names: Iterable[str] | None = None, shrink: bool = True,
                progress: Callable[[RuleResult], None] | None = None) -> CheckReport:
    """Check the soundness of every rule in `files` (None: every shipped rule file, targets' own
    files included).

    User files are validated and loaded after the shipped ones exactly as compilation loads
    them (`saturate.RuleProgram`), so they may use the shipped rulesets and relations; only the
    rules of `files` are checked. `names` restricts the check to those rules. A malformed file
    raises `RuleFileError` naming the file and line.
    """
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise EqsatFuseError("the rule checker needs hypothesis, a dependency of eqsat-fuse "
                             "that is missing here: pip install hypothesis") from None
    from ..resources import all_target_rule_files, rule_files
    from ..saturation.saturate import RuleProgram

    if examples < 1:
        raise EqsatFuseError(f"examples must be at least 1, got {examples}")
    started = time.perf_counter()
    shipped = [Path(p) for p in [*rule_files(), *all_target_rule_files()]]
    shipped_ids = {p.resolve() for p in shipped}
    if files is None:
        targets = shipped
        user: list[Path] = []
    else:
        targets, seen = [], set()
        for f in files:
            path = Path(f)
            key = path.resolve()
            if key not in seen:
                seen.add(key)
                targets.append(path)
        user = [p for p in targets if p.resolve() not in shipped_ids]
    RuleProgram(user_rules=user)                 # egglog's own checks, file:line on errors
    decls = _declarations([*shipped, *user])
    constructors = set(decls.constructors)
    rules = parse_rule_files(targets, constructors=constructors)
    checked = {p.resolve() for p in targets}
    every_rule = rules + parse_rule_files(
        [p for p in [*shipped, *user] if p.resolve() not in checked], constructors=constructors)
    absent_ok = _absent_ok(every_rule, decls.relations)
    if names is not None:
        wanted = set(names)
        missing = wanted - {r.name for r in rules}
        if missing:
            raise EqsatFuseError(f"no rule named {', '.join(sorted(missing))} in the checked files")
        rules = [r for r in rules if r.name in wanted]
    results = []
    with _private_hypothesis_storage():
        for rule in rules:
            result = _check_rule(rule, decls, absent_ok, examples, seed, shrink)
            results.append(result)
            if progress is not None:
                progress(result)
    return CheckReport(results, [str(p) for p in targets], examples, seed,
                       time.perf_counter() - started)
