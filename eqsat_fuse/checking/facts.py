"""Checking the rules that only assert relations (facts) by what each relation claims.

    result = check_fact(rule, sorts)      # a RuleResult: "fact-checked", "unsound" or "fact"

A fact rule such as ``(rule ((= e (Relu x))) ((elementwise e)))`` states no equality, so the
driver (rulecheck.py) has no two sides to compare; this module checks each asserted relation
against its meaning instead:

- ``(elementwise e)``: e's operator, run with its NumPy reference kernel (`ops.evaluate`),
  commutes with a permutation of the elements (the same random permutation applied to every
  full-shape input; an op's non-fused inputs are parameters: scalars, as Clip's bounds, or one
  value per channel, as BatchNormalization's, whose permutation keeps each element in its
  channel), and its output shape is the broadcast of its inputs' shapes (also tried with
  broadcasting operands). Inputs are drawn with NumPy from a fixed seed, in the op's domain.
- ``(const e)`` / ``(const-list l)``: e depends on no graph input: the term contains no
  ``Input`` and every tensor variable in it is required ``(const v)`` (``(const-list v)`` for a
  tensor list) by the rule's premises; attribute values (literals, strings, Ints) are constant.
- ``(dynamic e)``: e depends on a graph input: some tensor variable of the term is required
  ``(dynamic v)``, or the term contains an ``Input``.
- ``(fusable e)``: e's operator is one the Numba backend computes as a fused producer: its
  kind in the operator table (ops.py) is elementwise, anchor (a contraction taking an
  epilogue) or reduction (a row or window kernel); or the premises require (elementwise e).
- ``(boundary e)``: e is materialized: a ``Mat``, an ``Input``, a ``Const``, or required
  ``(const e)`` (folded to an array at compile time).

A wrong fact is ``unsound`` with the reason, which names the operator or the variable to
blame (a wrong elementwise claim also carries the tensors that show it, as a counterexample); a
relation this module gives no meaning to (a user's own), or an elementwise claim it cannot
evaluate, leaves the rule a ``fact`` with the reason.
"""

from __future__ import annotations

import time

import numpy as np

from ..ops import OPS, evaluate
from .generators import _UNARY_ATTRS, INTEGER_SLOTS
from .patterns import Call, Check, Lit, Pattern, Rule, Var
from .report import Counterexample, RuleResult, _compare

# the relations this module checks, and the sort of term each one is about
CHECKED_RELATIONS = ("elementwise", "fusable", "const", "const-list", "dynamic", "boundary")

# the operator kinds (ops.py) the Numba backend computes as a fused producer
FUSABLE_KINDS = ("elementwise", "anchor", "reduction")

_MATERIALIZED = ("Mat", "Input", "Const")

_SHAPE = (2, 3, 4)          # the full input shape of the elementwise check
_TRIALS = 3                 # permutation trials per elementwise fact
_SEED = 0

# attribute values for ops whose drawer is not in the generators' table (by attribute name)
_ATTRS_BY_NAME = {"epsilon": (1e-5, 1e-3, 0.1), "axis": (-1, 0, 1), "keepdims": (1, 0)}


class _Verdict:
    """What one asserted relation's check found: "ok", "unsound" or "unknown"."""

    def __init__(self, status: str, reason: str, counterexample=None):
        self.status, self.reason, self.counterexample = status, reason, counterexample


def check_fact(rule: Rule, sorts: dict[str, str], started: float | None = None) -> RuleResult:
    """Check every relation the fact rule asserts; `sorts` gives each variable's sort."""
    started = time.perf_counter() if started is None else started
    premises = {(c.expr.op, c.expr.args[0].name) for c in rule.conditions
                if isinstance(c, Check) and isinstance(c.expr, Call) and len(c.expr.args) == 1
                and isinstance(c.expr.args[0], Var)}
    ctx = _Context(rule, dict(rule.matched), premises, sorts)
    verdicts = [ctx.check(a) for a in rule.asserts]
    seconds = time.perf_counter() - started
    bad = next((v for v in verdicts if v.status == "unsound"), None)
    if bad is not None:
        return RuleResult(rule, "unsound", bad.reason, counterexample=bad.counterexample,
                          examples=_TRIALS if bad.counterexample else 0, seconds=seconds)
    unknown = [v.reason for v in verdicts if v.status == "unknown"]
    if unknown or not verdicts:
        return RuleResult(rule, "fact", "; ".join(unknown) or "asserts nothing the checker "
                          "interprets", seconds=seconds)
    return RuleResult(rule, "fact-checked", "; ".join(v.reason for v in verdicts),
                      seconds=seconds)


class _Context:
    """One fact rule: its matched terms, the relations its premises require, variable sorts."""

    def __init__(self, rule, matched, premises, sorts):
        self.rule, self.matched, self.premises, self.sorts = rule, matched, premises, sorts

    def check(self, fact: Pattern) -> _Verdict:
        """One asserted relation: ``(rel v)`` or, matched terms substituted, ``(rel TERM)``."""
        if not (isinstance(fact, Call) and len(fact.args) == 1
                and isinstance(fact.args[0], (Var, Call))):
            return _Verdict("unknown", f"asserts {fact}, which is not a relation over one term: "
                            "nothing to check")
        rel, arg = fact.op, fact.args[0]
        if isinstance(arg, Var):
            v, term = arg.name, self.matched.get(arg.name)
        else:
            v = next((name for name, q in self.matched.items() if q == arg), str(arg))
            term = arg
        if rel not in CHECKED_RELATIONS:
            return _Verdict("unknown", f"asserts ({rel} {v}), a relation whose meaning the "
                            "checker does not know")
        if (rel, v) in self.premises:
            return _Verdict("ok", f"({rel} {v}) is required by the premises")
        check = {"elementwise": self._elementwise, "fusable": self._fusable,
                 "const": self._const, "const-list": self._const, "dynamic": self._dynamic,
                 "boundary": self._boundary}[rel]
        return check(rel, v, term if isinstance(term, Call) else None)

    def _tensor_vars(self, p: Pattern):
        """(variable, sort) of every tensor-sorted variable of `p`, matched ones expanded."""
        if isinstance(p, Var):
            if p.name in self.matched:
                yield from self._tensor_vars(self.matched[p.name])
            elif self.sorts.get(p.name) in ("T", "TList"):
                yield p.name, self.sorts[p.name]
        elif isinstance(p, Call):
            for a in p.args:
                yield from self._tensor_vars(a)

    def _calls(self, p: Pattern):
        if isinstance(p, Var) and p.name in self.matched:
            yield from self._calls(self.matched[p.name])
        elif isinstance(p, Call):
            yield p
            for a in p.args:
                yield from self._calls(a)

    def _const(self, rel: str, v: str, p: Call | None) -> _Verdict:
        if p is None:
            return _Verdict("unsound", f"({rel} {v}) is concluded, but the rule neither matches "
                            f"a term for {v} nor requires ({rel} {v})")
        if any(c.op == "Input" for c in self._calls(p)):
            return _Verdict("unsound", f"({rel} {v}) is concluded, but {p} contains an Input: "
                            "it depends on a graph input")
        for w, sort in self._tensor_vars(p):
            need = "const-list" if sort == "TList" else "const"
            if (need, w) not in self.premises:
                return _Verdict("unsound", f"({rel} {v}) is concluded, but {w} in {p} is not "
                                f"required ({need} {w}): {v} may depend on a graph input "
                                f"through {w}")
        return _Verdict("ok", f"every tensor operand of {p} is required const")

    def _dynamic(self, rel: str, v: str, p: Call | None) -> _Verdict:
        if p is not None and any(c.op == "Input" for c in self._calls(p)):
            return _Verdict("ok", f"{p} contains an Input")
        if p is not None and any(("dynamic", w) in self.premises
                                 for w, _ in self._tensor_vars(p)):
            return _Verdict("ok", f"an operand of {p} is required dynamic")
        return _Verdict("unsound", f"(dynamic {v}) is concluded, but no operand of "
                        f"{p if p is not None else v} is required (dynamic ...) nor an Input: "
                        f"{v} may be a constant")

    def _fusable(self, rel: str, v: str, p: Call | None) -> _Verdict:
        if ("elementwise", v) in self.premises:
            return _Verdict("ok", "(elementwise e) is a fusable producer's kind")
        if p is None or p.op not in OPS:
            return _Verdict("unknown", f"(fusable {v}) is concluded of a term whose operator "
                            "the checker cannot look up")
        kind = OPS[p.op].kind
        if kind in FUSABLE_KINDS:
            return _Verdict("ok", f"{p.op} is of kind {kind}, which the Numba backend fuses")
        return _Verdict("unsound", f"(fusable {v}) is concluded of {p.op}, an op of kind {kind} "
                        f"(ops.py): the Numba backend fuses only {', '.join(FUSABLE_KINDS)} "
                        "ops as producers")

    def _boundary(self, rel: str, v: str, p: Call | None) -> _Verdict:
        if ("const", v) in self.premises:
            return _Verdict("ok", "a const term is folded to an array: materialized")
        if p is not None and p.op in _MATERIALIZED:
            return _Verdict("ok", f"{p.op} is materialized")
        what = p.op if p is not None else f"{v}, neither matched nor required const,"
        return _Verdict("unsound", f"(boundary {v}) is concluded of {what}: a boundary is a "
                        "materialized value (a Mat, an Input, a Const or a folded const term)")

    def _elementwise(self, rel: str, v: str, p: Call | None) -> _Verdict:
        if p is None or p.op not in OPS or OPS[p.op].kind in ("leaf", "structure", "opaque"):
            return _Verdict("unknown", f"(elementwise {v}) is concluded of a term the checker "
                            "cannot evaluate on its own")
        try:
            return _check_elementwise(p)
        except _CannotEvaluate as exc:
            return _Verdict("unknown", f"(elementwise {v}): {exc}")


class _CannotEvaluate(Exception):
    pass


def _check_elementwise(p: Call) -> _Verdict:
    spec = OPS[p.op]
    rng = np.random.default_rng(_SEED)
    fused = spec.fused_inputs if spec.kind == "elementwise" and spec.fused_inputs else spec.inputs
    channel = p.op == "BatchNormalization"
    for trial in range(_TRIALS + 1):
        attrs = _draw_attrs(p, spec, rng)
        broadcast = trial == _TRIALS and len(fused) > 1
        ins, shapes = [], []
        for i, slot in enumerate(spec.inputs):
            arg = p.args[i] if i < len(p.args) else None
            if isinstance(arg, Call) and arg.op == "Absent":
                ins.append(None)
                continue
            if slot in fused:
                shape = (3, 1) if broadcast and len(shapes) else _SHAPE
                shapes.append(shape)
            else:
                shape = (_SHAPE[1],) if channel else ()
            ins.append(_draw(rng, p.op, i, slot, shape))
        if p.op == "Clip" and ins[1] is not None and ins[2] is not None:
            ins[1], ins[2] = -abs(ins[1]), abs(ins[2])
        out = _run(p.op, ins, attrs)
        want = np.broadcast_shapes(*shapes)
        if out.shape != want:
            return _Verdict("unsound", f"(elementwise) {p.op}'s output shape {list(out.shape)} "
                            f"is not the broadcast {list(want)} of its inputs' shapes",
                            _elementwise_cx(p, spec, ins, attrs, out, None, None))
        if trial == _TRIALS:
            break
        perm = _permutation(rng, _SHAPE, channel)
        moved = [x if x is None or spec.inputs[i] not in fused else _permute(x, perm)
                 for i, x in enumerate(ins)]
        lv, rv = _run(p.op, moved, attrs), _permute(out, perm)
        bad = _compare(lv, rv, exact=True, zero_signs=True)
        if bad is not None:
            why = bad[0] or f"they differ by up to {bad[1]:.4g}"
            return _Verdict("unsound", f"(elementwise) {p.op} does not commute with a "
                            f"permutation of its elements: {why}",
                            _elementwise_cx(p, spec, ins, attrs, lv, rv, bad))
    keep = " within each channel" if channel else ""
    return _Verdict("ok", f"{p.op} commutes with permutations of the elements{keep} on "
                    f"{_TRIALS} samples; its output shape is the broadcast of its inputs'")


def _draw_attrs(p: Call, spec, rng) -> dict:
    n = len(spec.inputs)
    drawers = _UNARY_ATTRS.get(p.op, [])
    picker = _Picker(rng)
    attrs = {}
    for j, name in enumerate(spec.attrs):
        arg = p.args[n + j] if n + j < len(p.args) else None
        if isinstance(arg, Lit):
            attrs[name] = arg.value
        elif j < len(drawers):
            attrs[name] = drawers[j](picker)
        elif name in _ATTRS_BY_NAME:
            attrs[name] = picker.pick(_ATTRS_BY_NAME[name])
        else:
            raise _CannotEvaluate(f"no way to draw {p.op}'s attribute {name}")
    return attrs


class _Picker:
    """What the generators' attribute drawers call (`s.pick`), on a NumPy generator."""

    def __init__(self, rng):
        self.rng = rng

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]


def _draw(rng, op: str, i: int, slot: str, shape) -> np.ndarray:
    domain = OPS[op].domain
    if slot == "cond" or domain == "bool":
        return rng.random(shape) < 0.5
    if slot in INTEGER_SLOTS.get(op, ()):
        return rng.integers(0, 256, shape).astype(np.uint8)
    if (op == "Div" and i == 1) or domain == "nonzero":
        return (rng.uniform(0.5, 2.0, shape) * rng.choice((-1, 1), shape)).astype(np.float32)
    if (op == "Pow" and i == 0) or domain == "positive" or slot == "var":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    return (rng.standard_normal(shape) * 2).astype(np.float32)


def _run(op: str, ins, attrs) -> np.ndarray:
    try:
        with np.errstate(all="ignore"):
            return np.asarray(evaluate(op, list(ins), attrs))
    except Exception as exc:
        raise _CannotEvaluate(f"{op} does not evaluate on the drawn inputs "
                              f"({type(exc).__name__}: {str(exc)[:120]})") from None


def _permutation(rng, shape, channel: bool) -> np.ndarray:
    """A permutation of the flat positions of `shape` (keeping axis 1 if `channel`)."""
    size = int(np.prod(shape))
    if not channel:
        return rng.permutation(size)
    perm = np.arange(size)
    index = perm.reshape(shape)
    for c in range(shape[1]):
        positions = np.take(index, c, axis=1).ravel()
        perm[positions] = rng.permutation(positions)
    return perm


def _permute(x: np.ndarray, perm: np.ndarray) -> np.ndarray:
    return x.reshape(-1)[perm].reshape(x.shape)


def _elementwise_cx(p, spec, ins, attrs, lv, rv, bad) -> Counterexample:
    error, diff, tol, index = bad if bad else (None, None, None, None)
    if bad is None:
        error = "the output shape is not the broadcast of the inputs' shapes"
    return Counterexample(direction="permuted inputs", lhs=f"{p.op} of the permuted inputs",
                          rhs=f"the permuted {p.op} of the inputs",
                          inputs={s: x for s, x in zip(spec.inputs, ins)}, attributes=attrs,
                          lhs_value=lv, rhs_value=rv, max_abs_diff=diff, tolerance=tol,
                          index=index, error=error)
