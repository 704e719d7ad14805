"""The rule-pattern language and the `.egg` rule-file parser.

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

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Union

from egglog import bindings

from ..errors import RuleFileError
from .primitives import _PRIMS, _render_value

__all__ = ["Var", "Lit", "Call", "Pattern", "Eq", "Check", "Condition", "Rule",
           "parse_rule_files", "variables", "substitute", "match", "fold_constants"]


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
    numerics: str = "exact"          # "fast": tagged `:numerics fast` (checked on ordinary values)

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



# ---- parsing rule files ------------------------------------------------------------------------

@dataclass
class _Decls:
    """What the loaded files declare: constructors, functions and relations with their sorts."""

    constructors: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    functions: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    relations: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _read(path: Path) -> str:
    """The rule file's text, with its `:numerics fast` tags blanked out (`numerics.split_tags`)."""
    return _read_tagged(path)[0]


def _read_tagged(path: Path):
    """The rule file's text with its tags blanked out, and the tags (`numerics.Tags`)."""
    from ..numerics import split_tags

    try:
        return split_tags(path.read_text(), str(path))
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
        text, tags = _read_tagged(path)
        data = text.encode()
        for c in _parse_commands(text, path):
            kind = type(c).__name__
            if kind in ("RewriteCommand", "BiRewriteCommand"):
                rule = _from_rewrite(c, kind, path, data, constructors)
                span = c.rewrite.span
            elif kind == "RuleCommand":
                rule = _from_rule(c, path, data, constructors)
                span = c.rule.span
            else:
                continue
            if tags.fast_at(data, span.i):
                rule = replace(rule, numerics="fast")
            rules.append(rule)
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
