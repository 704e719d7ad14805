"""What a rule's conditions fix about a sample, read before any value is drawn.

`_hints` turns the conditions into `_Hints`: expressions for a tensor's rank, shape or single
dims, for an attribute's value or a vector's length, a splat value, the dtype, the variables
that cannot be Absent, and the conditions that guard each variable's draws. `_absent_ok` says
for each relation whether it can hold for an absent input. Nothing here draws: the sample
(sample.py) evaluates these expressions once it has bound what they need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .patterns import Call, Check, Eq, Lit, Pattern, Rule, Var, substitute, variables
from .primitives import _PRIMS, VALUE_RELATIONS, _Unbound


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
    values: dict[str, str] = field(default_factory=dict)      # var -> value relation it meets

    def has(self, name: str) -> bool:
        return (name in self.rank or name in self.shape or name in self.dims
                or name in self.fixed or name in self.splat or name in self.present
                or name in self.values)


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
        if (isinstance(c, Check) and isinstance(c.expr, Call) and c.expr.op in VALUE_RELATIONS
                and len(c.expr.args) == 1 and isinstance(c.expr.args[0], Var)):
            h.values.setdefault(c.expr.args[0].name, c.expr.op)
            h.present.add(c.expr.args[0].name)
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
