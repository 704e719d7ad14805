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
- ``fact-checked``: it only asserts relations (``(elementwise e)``, ``(const e)``...), and each
  holds by what the relation means (`facts`: a permutation test for elementwise, the premises
  for const, dynamic, fusable and boundary); a wrong one is ``unsound``;
- ``fact``: it only asserts relations the checker gives no meaning to (a user's own relation),
  with the reason.

Instances are built constructively from the matched side: each operator of the term language
has a generator that, given the shape its result must have (or none), derives shapes and
attributes for its operands (Conv channels divisible by the group, MatMul inner dimensions,
broadcast-compatible operands, axes inside the rank...), and honours what conditions fix
(``(= 4 (vec-length (shape w)))`` fixes w's rank, ``(= (shape a) (shape b))`` ties two shapes,
``(= g 1)`` fixes an attribute). Other conditions are evaluated on the sample and a sample that
fails them is rejected (counted, with why, in the report). Values come from the whole float
domain (sample.py): an exact rule's samples avoid nothing and a third of them carry +-0, +-inf,
NaN, denormals and huge values, compared NaN-, inf- and zero-sign-aware (report.py); a fast
rule (`:numerics fast`) gets ordinary values, an operand in a role that needs it gets suitable
data (a divisor stays away from zero), which is listed as the rule's assumption, and a sample
whose matched side is not finite is rejected and counted.

The checker's parts, one job a module: `patterns` (the rule-pattern language and the `.egg`
parser), `primitives` (what egglog's primitives and fact functions compute), `hints` (what the
conditions fix about a sample), `sample` (one attempt at instantiating a rule), `generators`
and `shape_generators` (one sample generator per operator), `report` (comparing the sides,
`RuleResult`, `CheckReport`), `facts` (the fact rules, by what their relations
claim) and this module, the driver: planning each rule, running
hypothesis over it and collecting the report (`check_rules`).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..errors import EqsatFuseError
from .facts import check_fact
from .generators import generator_for
from .hints import _absent_ok, _hints
from .patterns import (Call, Check, Condition, Eq, Lit, Pattern, Rule, Var, _declarations,
                       _Decls, fold_constants, match, parse_rule_files, substitute, variables)
from .primitives import (FACT_FUNCTIONS, _PRIMS, VALUE_RELATIONS, _NoFact, _render_value,
                         _Unbound, _Unsupported, _values_equal, value_relation_holds)
from .report import (_NOT_FINITE, CheckReport, Counterexample, RuleResult, _compare, _finite,
                     _off_tie, _summary)
from .open_dims import describe, open_variant
from .sample import ASSUMPTIONS, _Plan, _Reject, _Sample

# the pattern names stay importable from here, where they were defined before the split
__all__ = ["Var", "Lit", "Call", "Pattern", "Eq", "Check", "Condition", "Rule",
           "parse_rule_files", "variables", "substitute", "match", "fold_constants",
           "check_rules", "CheckReport", "RuleResult", "Counterexample"]


# ---- planning and running one rule -------------------------------------------------------------

# Sorts of plain values; the others (T, TList) are sorts of terms, i.e. of e-classes.
_VALUE_SORTS = {"i64", "f64", "String", "bool", "Unit", "IVec", "BigInt", "BigRat"}


def _var_sorts(rule: Rule, constructors) -> dict[str, str]:
    """The sort of every variable that fills a constructor's slot in the rule's equalities or
    matched patterns."""
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
    for p in [p for pair in rule.unions for p in pair] + [p for _, p in rule.matched]:
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
            if head.op in VALUE_RELATIONS and head.op in decls.relations:
                continue                         # evaluated on the sample (`_satisfy`)
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
    sorts = _var_sorts(rule, decls.constructors)
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
                    if (isinstance(e, Call) and e.op in VALUE_RELATIONS
                            and e.op in s.plan.relations):
                        if not value_relation_holds(e.op, s.eval(e.args[0])):
                            raise _NoFact(f"{e.args[0]} is not {e.op}: "
                                          f"{_summary(s.eval(e.args[0]))}")
                    elif isinstance(e, Call) and (e.op in s.plan.constructors
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
            s.sources[a.name] = b
            return
    lv, rv = s.eval(left), s.eval(right)
    if not _values_equal(lv, rv):
        raise _NoFact(f"{_summary(lv)} != {_summary(rv)}")



def _run_sample(plan: _Plan, draw, assumed: set | None = None, opened: list | None = None):
    """One example: instantiate, check conditions, compare. Returns a Counterexample or None.
    The values the sample avoided (a fast rule's zero divisor...) are added to `assumed`; an
    example compared with open dims (`open_dims`) appends True to `opened`."""
    s = _Sample(plan, draw, generator_for)
    try:
        return _run(s, plan, opened)
    finally:
        if assumed is not None:
            assumed.update(s.assumed)


def _run(s: _Sample, plan: _Plan, opened: list | None = None):
    """The sample compared as drawn, then with its open dims as codes (`open_dims`): either
    instance that meets the conditions is an example; a sample that meets them in neither is
    rejected."""
    for var, pattern in plan.roots:
        want = s.first(plan.hints.shape.get(var)) if var else None
        rank = s.first(plan.hints.rank.get(var)) if var else None
        with _rejecting():
            s.make(pattern, None if want is None else tuple(want), "any",
                   None if rank is None else {rank})
    drawn = dict(s.env)
    rejected = None
    try:
        _instantiate(s, plan)
    except _Reject as exc:
        rejected = exc
    if rejected is None:
        found = _obligations(s, plan)
        if found is not None:
            return found
    variant = open_variant(s, drawn, plan.constants, plan.sizes)
    if variant is not None:
        try:
            _instantiate(variant, plan)
        except (_Reject, _Unsupported):
            variant = None                # the rule does not fire with the dim open
    if variant is not None and not _evaluates_grown(variant.shadow, plan):
        variant = None                    # the matched terms tie the dim to its size
    if variant is None:
        if rejected is not None:
            raise rejected
        return None
    if opened is not None:
        opened.append(True)
    for sample in (variant, variant.shadow):     # at the drawn size, then at a larger one
        found = _obligations(sample, plan)
        if found is not None:
            detail = found.error or (f"the sides differ by {found.max_abs_diff:.4g} (allowed "
                                     f"{found.tolerance:.3g})")
            found.error = f"{describe(sample)}: {detail}"
            found.attributes = {k: sample.decoded(v) for k, v in found.attributes.items()}
            return found
    return None


def _evaluates_grown(shadow: _Sample, plan: _Plan) -> bool:
    """Does every term the rule matched evaluate with the open dim grown? (A Reshape to a
    static target, or a Gather's indices, can tie the dim to its drawn size.)"""
    terms = [p for _, p in plan.roots] + list(plan.matched.values())
    terms += [x for kind, a, _ in plan.obligations if kind == "set" for x in a.args]
    try:
        with np.errstate(all="ignore"):
            for term in terms:
                shadow.eval(term)
        _matched_side(shadow, plan)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _rejecting():
    """A failure to build or evaluate the matched side rejects the sample."""
    try:
        yield
    except (_Reject, _Unsupported):
        raise
    except (_NoFact, _Unbound) as exc:
        raise _Reject(f"the matched side does not instantiate ({exc})") from None
    except Exception as exc:
        raise _Reject(f"the matched side does not evaluate ({type(exc).__name__}: "
                      f"{str(exc)[:80]})") from None


def _instantiate(s: _Sample, plan: _Plan) -> None:
    """The matched terms evaluated and the conditions met (or `_Reject`)."""
    with _rejecting():
        for var, pattern in plan.matched.items():
            s.env[var] = s.eval(pattern)
            s.sources[var] = pattern
        _satisfy(s, plan.conditions)
    _matched_side(s, plan)


def _matched_side(s: _Sample, plan: _Plan) -> None:
    """The matched terms the rule equates evaluate (and are finite for a fast rule), or
    `_Reject`."""
    for kind, a, b in plan.obligations:
        if kind != "union" or not _on_matched_side(a, plan):
            continue
        with _rejecting():
            lv = s.eval(a)
        if not plan.exact and not _finite(lv):     # a fast rule: ordinary values only
            raise _Reject(_NOT_FINITE + " (NaN/inf) on this sample")


def _obligations(s: _Sample, plan: _Plan):
    """The rule's unions and sets compared on the instantiated sample: a Counterexample or
    None."""
    for kind, a, b in plan.obligations:
        error = lv = rv = None
        try:
            with np.errstate(all="ignore"):
                lv = s.eval(a)
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
                slack = s.contraction_slack(a) if kind == "union" else None
                if slack is None and kind == "union":
                    slack = s.contraction_slack(b)
                bad = _compare(lv, rv, plan.exact, s.edges, slack)
                if bad is not None and bad[0] is None and kind == "union":
                    quantized = s.quantization_slack(a) or s.quantization_slack(b)
                    if quantized is not None and not _off_tie(lv, rv, quantized):
                        bad = None
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




class _Found(Exception):
    """Raised inside the hypothesis test when the two sides differ."""


def _check_plan(plan: _Plan, examples: int, seed: int, shrink: bool):
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    state = {"valid": 0, "failure": None, "unsupported": None, "crash": None,
             "assumed": set(), "opened": []}
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
            found = _run_sample(plan, data.draw, state["assumed"], state["opened"])
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
    assumed: set = set()
    result = _check_rule_plans(rule, decls, absent_ok, examples, seed, shrink, assumed)
    result.assumptions = _assumptions(rule, decls, assumed)
    return result


def _assumptions(rule: Rule, decls: _Decls, assumed) -> list[str]:
    """What the rule was checked under: the values the checker avoided on its samples (a fast
    rule's zero divisors...), then what its own conditions restrict (value relations)."""
    out = sorted({ASSUMPTIONS[role].format(label) for label, role in assumed})
    for cond in rule.conditions:
        if (isinstance(cond, Check) and isinstance(cond.expr, Call)
                and cond.expr.op in VALUE_RELATIONS and cond.expr.op in decls.relations):
            out.append(f"{cond} by its condition: {VALUE_RELATIONS[cond.expr.op]}")
    return out


def _check_rule_plans(rule: Rule, decls: _Decls, absent_ok: dict[str, bool], examples: int,
                      seed: int, shrink: bool, assumed: set) -> RuleResult:
    started = time.perf_counter()
    sorts = _var_sorts(rule, decls.constructors)
    problem, relies = _static_problems(rule, decls, sorts)
    if problem is None and rule.kind == "fact" and not rule.sets:
        return check_fact(rule, sorts, started)      # checked by what its relations claim
    if problem is not None:
        return RuleResult(rule, "unchecked", problem, relies_on=relies,
                          seconds=time.perf_counter() - started)
    total_valid, total_rejected, rejections, opened = 0, 0, Counter(), 0
    for plan in _plans(rule, decls, absent_ok):
        state, rej = _check_plan(plan, examples, seed, shrink)
        rejections.update(rej)
        assumed |= state["assumed"]
        total_valid += state["valid"]
        opened += len(state["opened"])
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
                              time.perf_counter() - started, open_examples=opened)
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
    reason = f"{total_valid} examples agreed ({opened} with open dims)"
    if total_rejected:
        reason += f"; {total_rejected} samples rejected"
    return RuleResult(rule, "passed", reason, total_valid, total_rejected,
                      dict(rejections.most_common()), relies,
                      seconds=time.perf_counter() - started, open_examples=opened)


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
