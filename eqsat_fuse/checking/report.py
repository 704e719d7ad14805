"""Comparing a rule's two sides, and what the checker reports: the counterexample, the result
of one rule (`RuleResult`) and of a whole check (`CheckReport`, its text and JSON forms).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .patterns import Rule
from .primitives import _render_value

# the reason a sample is rejected when its matched side is not finite (counted apart)
_NOT_FINITE = "the matched side is not finite"


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
        finite = v[~np.isnan(v)]
        if finite.size == 0:
            return f"{head} all NaN"
        nan = " and NaN" if finite.size < v.size else ""
        return f"{head} in [{float(finite.min()):.4g}, {float(finite.max()):.4g}]{nan}"
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
        if self.rhs_value is not None or not self.error:
            lines.append(f"      = {_summary(self.rhs_value)}")
        if self.error:
            lines.append(f"      {self.error}")
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


def _compare(lv, rv, exact: bool = True, zero_signs: bool = True, slack=None):
    """None if equal, else (error, max_diff, tolerance, index). NaN on one side only is a
    mismatch; for an `exact` rule (the numerics contract, docs/numerics.md) so are +inf and
    -inf on one side only, and with `zero_signs` a zero's sign (the checker compares it on the
    samples that carry edge values: on ordinary values a zero comes from cancellation, and
    x - x is +0 in any order, so its sign is rounding); finite values agree within
    `TOLERANCES`, plus `slack` per element where given (a contraction's bound)."""
    if lv is None or rv is None:
        return None if lv is None and rv is None else (
            f"one side is absent: lhs {_summary(lv)}, rhs {_summary(rv)}", None, None, None)
    if isinstance(lv, list) or isinstance(rv, list):
        if not (isinstance(lv, list) and isinstance(rv, list)) or len(lv) != len(rv):
            return ("the sides are different lists", None, None, None)
        for a, b in zip(lv, rv):
            bad = _compare(a, b, exact, zero_signs)
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
    if lv.size == 0:
        return None
    atol, rtol = TOLERANCES.get(lv.dtype.name, TOLERANCES["float32"])
    l64, r64 = lv.astype(np.float64), rv.astype(np.float64)
    classes = [("NaN", np.isnan)]
    if exact:
        classes += [("+inf", np.isposinf), ("-inf", np.isneginf)]
    if exact and zero_signs:
        classes += [("-0.0", lambda v: (v == 0) & np.signbit(v)),
                    ("+0.0", lambda v: (v == 0) & ~np.signbit(v))]
    for what, test in classes:
        if what.endswith("0.0"):
            zeros = (l64 == 0) & (r64 == 0)        # a zero against a tiny value is rounding
            odd = zeros & (test(l64) != test(r64))
        else:
            odd = test(l64) != test(r64)
        if odd.any():
            index = np.unravel_index(int(np.argmax(odd)), odd.shape)
            side = "lhs" if test(l64)[index] else "rhs"
            return (f"{what} on one side only ({side}) at {[int(i) for i in index]}: lhs "
                    f"{_scalar(lv[index])}, rhs {_scalar(rv[index])}", None, None, index)
    both = np.isfinite(l64) & np.isfinite(r64)
    finite_l = np.where(np.isfinite(l64), np.abs(l64), 0.0)
    finite_r = np.where(np.isfinite(r64), np.abs(r64), 0.0)
    scale = max(1.0, float(np.max(finite_l)), float(np.max(finite_r)))
    allowed = atol * scale + rtol * finite_r
    if slack is not None:
        allowed = allowed + np.where(np.isfinite(slack), slack, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(l64 - r64)
    same = (l64 == r64) | (np.isnan(l64) & np.isnan(r64))
    diff = np.where(same, 0.0, np.where(both, diff, np.inf))
    excess = diff - allowed
    k = int(np.argmax(excess))
    if excess.reshape(-1)[k] <= 0:
        return None
    index = np.unravel_index(k, diff.shape)
    return (None, float(diff.reshape(-1)[k]), float(allowed.reshape(-1)[k]), index)


def _off_tie(lv, rv, quantized) -> bool:
    """Whether integer results lv and rv differ other than by one step where the quantized
    value's exact argument may lie on either side of a rounding tie: `quantized` is (the
    argument's value, how far it may be from the exact one, the scale), from
    `_Sample.quantization_slack`."""
    value, slack, scale = quantized
    diff = np.abs(np.asarray(lv, np.int64) - np.asarray(rv, np.int64))
    with np.errstate(all="ignore"):
        a = (value.astype(np.float64) - slack) / scale.astype(np.float64)
        b = (value.astype(np.float64) + slack) / scale.astype(np.float64)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    tie = np.floor(hi - 0.5) >= np.ceil(lo - 0.5)        # some k + 1/2 in [lo, hi]
    return bool(np.any((diff > 1) | ((diff == 1) & ~np.broadcast_to(tie, diff.shape))))


def _scalar(x) -> str:
    return f"{float(x):.6g}" if np.asarray(x).dtype.kind == "f" else str(x)


@dataclass
class RuleResult:
    """What the checker found for one rule."""

    rule: Rule
    # "passed" | "unsound" | "unchecked" | "fact-checked" (a fact that holds by what its
    # relations mean, facts.py) | "fact" (asserts relations the checker gives no meaning to)
    status: str
    reason: str = ""
    examples: int = 0                        # instances compared (all directions)
    rejected: int = 0                        # samples that did not instantiate the rule
    rejections: dict[str, int] = field(default_factory=dict)
    relies_on: list[str] = field(default_factory=list)   # structural conditions (relations)
    counterexample: Counterexample | None = None
    seconds: float = 0.0
    assumptions: list[str] = field(default_factory=list)   # what it was checked under
    open_examples: int = 0        # of `examples`, those compared with open dims (open_dims.py)

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def numerics(self) -> str:
        """The contract it was checked under: "exact" (the whole float domain) or "fast"."""
        return self.rule.numerics

    def rejection_note(self, limit: int = 3) -> str:
        """The most frequent reasons samples were rejected, with their counts."""
        top = sorted(self.rejections.items(), key=lambda kv: -kv[1])
        text = "; ".join(f"{why} ({n}x)" for why, n in top[:limit])
        return text + (f"; {len(top) - limit} more reasons" if len(top) > limit else "")

    @property
    def location(self) -> str:
        return self.rule.location

    def as_dict(self) -> dict:
        r = self.rule
        return {"name": r.name, "ruleset": r.ruleset, "file": r.file, "line": r.line,
                "kind": r.kind, "numerics": r.numerics, "assumptions": list(self.assumptions),
                "status": self.status, "reason": self.reason,
                "examples": self.examples, "open_examples": self.open_examples,
                "rejected": self.rejected,
                "rejections": dict(self.rejections), "relies_on": list(self.relies_on),
                "lhs": None if r.lhs is None else str(r.lhs),
                "rhs": None if r.rhs is None else str(r.rhs),
                "counterexample": self.counterexample.as_dict() if self.counterexample else None,
                "seconds": round(self.seconds, 4)}


def _notes(r: RuleResult, indent: str = "        ") -> list[str]:
    """A result's assumptions and rejected-sample reasons, one line each."""
    lines = [f"{indent}assumes {a}" for a in r.assumptions]
    if r.rejected:
        lines.append(f"{indent}rejected {r.rejected}: {r.rejection_note()}")
    return lines


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
        """The fact rules left unchecked (relations the checker gives no meaning to)."""
        return self.with_status("fact")

    @property
    def facts_checked(self) -> list[RuleResult]:
        """The fact rules checked by what their relations mean, and found to hold."""
        return self.with_status("fact-checked")

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
            lines.append(f"UNSOUND    {r.name}  ({r.location}, ruleset {r.rule.ruleset}, "
                         f"numerics {r.numerics})")
            lines.append(f"    {r.reason}")
            lines.extend(_notes(r, "    "))
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
                fast = "  (fast)" if r.numerics == "fast" else ""
                opened = f" ({r.open_examples} with open dims)" if r.open_examples else ""
                lines.append(f"  ok  {r.name:32} {r.location}  {r.examples} examples{opened}{rej}"
                             f"{note}{fast}")
                lines.extend(_notes(r))
        closed = [r.name for r in self.passed if not r.open_examples]
        if self.passed:
            lines.append(f"open dims  {len(self.passed) - len(closed)} of the {len(self.passed)} "
                         "passed rule(s) were also compared with a dim open"
                         + (f"; never: {', '.join(closed)}" if closed else ""))
        if self.facts_checked:
            lines.append("")
            lines.append(f"facts checked  {len(self.facts_checked)} rule(s) assert facts that "
                         "hold by what they mean:")
            lines.extend(textwrap.wrap(", ".join(r.name for r in self.facts_checked), 98,
                                       initial_indent="  ", subsequent_indent="  ",
                                       break_on_hyphens=False))
        if self.facts:
            lines.append("")
            lines.append(f"facts (not an equality): {len(self.facts)} rule(s) only assert facts "
                         "the checker cannot check:")
            for r in self.facts:
                lines.append(f"  {r.name}  ({r.location}): {r.reason}")
        lines.append("")
        verdict = (f"{len(self.unsound)} UNSOUND" if self.unsound else "no unsound rule")
        checked = (f"{len(self.facts_checked)} facts checked, " if self.facts_checked else "")
        lines.append(f"{verdict}; {len(self.passed)} passed, {checked}{len(self.unchecked)} "
                     f"unchecked, {len(self.facts)} facts")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "files": list(self.files),
                "contract": "exact rules on the whole float domain (NaN, +-inf and signed "
                            "zeros must match); fast rules on ordinary values", "examples": self.examples,
                "seed": self.seed, "seconds": round(self.seconds, 3),
                "counts": {s: len(self.with_status(s))
                           for s in ("passed", "unsound", "unchecked", "fact-checked",
                                     "fact")},
                "rules": [r.as_dict() for r in self.results]}
