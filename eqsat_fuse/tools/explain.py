"""Which rules shaped the extracted program.

A rule that fired only added alternatives to the e-graph; it shaped the program where one of
those alternatives was chosen. Rule R is credited at class c of the chosen program when

- the node chosen for c is not one the encoder wrote (a rule added it),
- that node and the nodes chosen below it match R's right-hand side, and
- some node of the same e-class matches R's left-hand side (R could have put it there).

Rules whose right-hand side is a bare variable (Identity removal, x + 0 = x) leave no node to
match: they show among the rules that fired (`matches_per_rule`), not here. Places inside
constants (folded at compile time) are credited to the rule that built the term reading them.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

from ..checking.patterns import Call, Lit, Pattern, Rule, Var, parse_rule_files
from ..frontend.encode import Encoding, constructor_sorts
from ..saturation.serialized import SerializedEGraph

_TERM_SORTS = ("T", "TList")


@cache
def _parsed(paths: tuple[str, ...]) -> tuple[Rule, ...]:
    return tuple(parse_rule_files([Path(p) for p in paths]))


def original_nodes(eg: SerializedEGraph, encoding: Encoding) -> set[int]:
    """The e-nodes the encoder wrote for the model's own operators."""
    out = set()
    for var, (op, args) in encoding.originals.items():
        c = eg.lets.get(var)
        if c is None:
            continue
        children = tuple(eg.lets.get(a) for a in args if a)
        for n in eg.class_nodes[c]:
            node = eg.nodes[n]
            if node.op == op and (op in ("Concat", "Opaque") or
                                  tuple(ch for ch in node.children) == children or
                                  len(children) != len(node.children)):
                out.add(n)
    return out


def shaping_rules(eg: SerializedEGraph, choice: dict[int, int], constant: frozenset[int],
                  encoding: Encoding, rule_files: list[str]) -> dict[str, int]:
    """Rule name -> the number of places of the chosen program that it put there."""
    sorts = constructor_sorts()
    originals = original_nodes(eg, encoding)
    places = [(c, n) for c, n in choice.items() if c not in constant and n not in originals]
    counts: dict[str, int] = {}
    for rule in _parsed(tuple(rule_files)):
        pairs = list(rule.unions) or ([(rule.lhs, rule.rhs)] if rule.rhs is not None else [])
        if rule.kind == "birewrite":
            pairs += [(rhs, lhs) for lhs, rhs in pairs]
        for lhs, rhs in pairs:
            if not isinstance(rhs, Call) or rhs.op not in sorts or lhs is None:
                continue
            for c, n in places:
                if eg.nodes[n].op != rhs.op:
                    continue
                if _match_chosen(rhs, c, {}, eg, choice, sorts) is None:
                    continue
                if not any(True for _ in _ematch(lhs, c, {}, eg, sorts, depth=24)):
                    continue
                counts[rule.name] = counts.get(rule.name, 0) + 1
    return dict(sorted(counts.items()))


def _args(pattern: Call, node, sorts):
    """Pairs (pattern argument, ('class', c) | ('value', v)) in constructor order."""
    children, attrs = iter(node.children), iter(node.attrs)
    for arg, sort in zip(pattern.args, sorts[pattern.op][0]):
        yield arg, (("class", next(children)) if sort in _TERM_SORTS else ("value", next(attrs)))


def _match_chosen(pattern: Pattern, c: int, binding: dict, eg, choice, sorts) -> dict | None:
    """Match `pattern` at class c, following the chosen node of every class."""
    if isinstance(pattern, Var):
        return _bind(pattern.name, ("class", c), binding)
    if not isinstance(pattern, Call) or pattern.op not in sorts:
        return binding                      # a computed term: not checked structurally
    if c not in choice or eg.nodes[choice[c]].op != pattern.op:
        return None
    for arg, (kind, item) in _args(pattern, eg.nodes[choice[c]], sorts):
        binding = (_match_chosen(arg, item, binding, eg, choice, sorts) if kind == "class"
                   else _match_value(arg, item, binding))
        if binding is None:
            return None
    return binding


def _ematch(pattern: Pattern, c: int, binding: dict, eg, sorts, depth: int):
    """Every binding under which some node of class c (and below) matches `pattern`."""
    if isinstance(pattern, Var):
        bound = _bind(pattern.name, ("class", c), binding)
        if bound is not None:
            yield bound
        return
    if not isinstance(pattern, Call) or pattern.op not in sorts:
        yield binding
        return
    if depth == 0:
        return
    for n in eg.class_nodes[c]:
        node = eg.nodes[n]
        if node.op != pattern.op:
            continue
        partial = [binding]
        for arg, (kind, item) in _args(pattern, node, sorts):
            if kind == "class":
                partial = [b for p in partial for b in _ematch(arg, item, p, eg, sorts, depth - 1)]
            else:
                partial = [b for p in partial if (b := _match_value(arg, item, p)) is not None]
            if not partial:
                break
        yield from partial


def _bind(name: str, value, binding: dict) -> dict | None:
    bound = binding.get(name)
    if bound is None:
        return {**binding, name: value}
    return binding if bound[0] == value[0] and _same(bound[1], value[1]) else None


def _match_value(pattern: Pattern, value, binding: dict) -> dict | None:
    if isinstance(pattern, Var):
        return _bind(pattern.name, ("value", value), binding)
    if isinstance(pattern, Lit):
        return binding if _same(pattern.value, value) else None
    if isinstance(pattern, Call) and pattern.op == "vec-of":
        if len(pattern.args) != len(value):
            return None
        for arg, item in zip(pattern.args, value):
            if isinstance(arg, (Lit, Var)):
                binding = _match_value(arg, item, binding)
                if binding is None:
                    return None
        return binding
    return binding                          # computed (vec-get ..., + ...): not checked


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return tuple(a) == tuple(b)
    return a == b
