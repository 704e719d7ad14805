"""The soundness checker (`eqsat-fuse rules check`, `ef.check_rules`).

It must pass every shipped rule, catch deliberately wrong variants of shipped rules (each in its
own file under tests/rules_wrong/) with name, file, line and a counterexample, report rules it
cannot instantiate as UNCHECKED (never as passed), and exit with the documented statuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eqsat_fuse as ef
from eqsat_fuse.resources import rule_files
from eqsat_fuse.checking.patterns import (Call, Eq, Lit, Var, fold_constants, match,
                                          parse_rule_files, substitute)
from eqsat_fuse.checking.rulecheck import check_rules
from eqsat_fuse.resources import all_target_rule_files
from eqsat_fuse.saturation.saturate import RuleProgram

ROOT = Path(__file__).resolve().parent.parent
WRONG = Path(__file__).resolve().parent / "rules_wrong"

# Shipped rules the checker cannot check yet, with the reason (ideally none). A rule listed here
# must still not be unsound; a rule missing from here must pass.
KNOWN_UNCHECKED: dict[str, str] = {}

# Each deliberately wrong variant: file -> (rule name, what is wrong with it).
WRONG_RULES = {
    "bn_eps_times_ten.egg": ("wrong-bn-fold-eps-times-ten", "epsilon multiplied by 10"),
    "bn_eps_dropped.egg": ("wrong-bn-fold-no-eps", "epsilon dropped"),
    "fuse_sub_swapped.egg": ("wrong-fuse-sub-swapped", "Sub operands swapped"),
    "fuse_div_swapped.egg": ("wrong-fuse-div-swapped", "Div operands swapped"),
    "bn_wrong_axis.egg": ("wrong-bn-fold-axis", "scale unsqueezed along the wrong axes"),
    "channel_scale_wrong_axis.egg": ("wrong-channel-scale-axis",
                                     "per-channel scale reshaped along the wrong axis"),
    "bn_bias_no_mean.egg": ("wrong-bn-fold-bias-no-mean", "folded bias misses -mean*k"),
    "bn_bias_no_beta.egg": ("wrong-bn-fold-bias-no-beta", "folded bias misses +beta"),
    "conv_bias_absent.egg": ("wrong-conv-shift-forgets-absent-bias",
                             "an absent Conv bias is not excluded"),
    # the whole float domain (issue 17 item 1, issue 21 item 2)
    "neg_sqrt_square.egg": ("wrong-neg-sqrt-square", "sqrt(x*x) is |x|: wrong for x < 0"),
    "log_product.egg": ("wrong-log-product", "log(xy) = log x + log y without x, y > 0"),
    "div_self.egg": ("wrong-div-self", "x / x = 1: NaN for x = 0, +-inf, NaN"),
    "mul_zero.egg": ("wrong-mul-zero", "x * 0 = 0: NaN for x = +-inf, NaN"),
    "add_zero_exact.egg": ("wrong-add-zero-exact", "x + 0 = x as exact: -0 + 0 is +0"),
    "div_const_exact.egg": ("wrong-div-const-exact",
                            "x / c = x * (1/c) as exact: 1/c is inf for a denormal c"),
    # facts, checked by what they claim (issue 17 item 2)
    "elementwise_softmax.egg": ("wrong-elementwise-softmax",
                                "Softmax normalizes along an axis: not elementwise"),
    "const_add_one_side.egg": ("wrong-const-add-one-side", "Add of a const and a non-const"),
    "dynamic_neg_no_premise.egg": ("wrong-dynamic-neg-no-premise",
                                   "Neg of an operand not known dynamic"),
    "fusable_reshape.egg": ("wrong-fusable-reshape", "Reshape is a view, not a fused producer"),
    "boundary_relu.egg": ("wrong-boundary-relu", "a Relu is not materialized"),
    # quantization (issue 18): integers sampled, compared bit for bit
    "quantize_dequantize_any_scale.egg": ("wrong-quantize-dequantize-any-scale",
                                          "Q(DQ(q)) = q without a normal scale: s = 0, inf, NaN"),
    "dequantize_quantize.egg": ("wrong-dequantize-quantize",
                                "DQ(Q(x)) = x: the rounding and saturation dropped"),
    "quantize_dequantize_other_scale.egg": ("wrong-quantize-dequantize-other-scale",
                                            "requantized by another scale"),
    "quantize_before_reshape_per_axis.egg": ("wrong-quantize-before-reshape-per-axis",
                                             "a per-axis scale moved through a Reshape"),
    # integer contractions (rules/quant.egg): the contraction bound and the tie allowance
    "conv_integer_other_zero_point.egg": ("wrong-conv-integer-no-weight-zero-point",
                                          "the weights' zero point dropped"),
    "quantize_integer_half_step.egg": ("wrong-quantize-integer-half-step",
                                       "requantized half a step off, not at ties"),
    # open dims (issue 16 item 2): right for every static shape, wrong on the e-graph's codes
    "flatten_product_of_dims.egg": ("wrong-flatten-product-of-dims",
                                    "a Reshape target multiplied out of dims"),
    "slice_past_the_end.egg": ("wrong-slice-past-the-end",
                               "an end compared with a dim by >=, true for every code"),
}

# Of those, the ones wrong only where a dim is open: the reason says so.
WRONG_ONLY_OPEN = ("wrong-flatten-product-of-dims", "wrong-slice-past-the-end")

# Of those, the structural facts (no tensor to show): what their reason must name instead of a
# counterexample (the variable or the operator to blame).
STRUCTURAL_FACTS = {"wrong-const-add-one-side": "b in (Add a b) is not required (const b)",
                    "wrong-dynamic-neg-no-premise": "no operand of (Neg x)",
                    "wrong-fusable-reshape": "Reshape, an op of kind view",
                    "wrong-boundary-relu": "concluded of Relu"}

# Shipped facts the checker leaves unchecked, with the reason (ideally none): every other
# shipped fact is checked by what it claims and holds.
KNOWN_UNCHECKED_FACTS: dict[str, str] = {}

# Of those, the ones that hold on ordinary values: tagged `:numerics fast` they pass (the fast
# contract), with what they assume and why samples were rejected listed.
HOLD_WHEN_FAST = {"div_self.egg": "wrong-div-self", "mul_zero.egg": "wrong-mul-zero",
                  "add_zero_exact.egg": "wrong-add-zero-exact",
                  "div_const_exact.egg": "wrong-div-const-exact"}

NEVER_MATCHES = """\
; no convolution has weights of rank 9: the condition can never be met
(rule ((= e (Relu (Mat (Conv x w b pads strides dil g)))) (= 9 (vec-length (shape w))))
      ((union e (Relu (Conv x w b pads strides dil g))))
      :ruleset fuse :name "never-matches-rank9-conv")
"""

UNKNOWN_CONDITION = """\
(relation small-group (i64))
(rule ((= e (Relu (Mat (Conv x w b pads strides dil g)))) (small-group g))
      ((union e (Relu (Conv x w b pads strides dil g))))
      :ruleset fuse :name "unknown-condition-small-group")
"""

WRONG_FACT = """\
; the shape of a broadcasting Add is not the shape of its first operand
(rule ((= e (Add a b)) (= s (shape a))) ((set (shape e) s))
      :ruleset analysis :name "wrong-shape-add")
"""

HARD_CODED_DTYPE = """\
; 0 - x is -x, but the literal's dtype is hard-coded: for float64 x the result is float32
(rewrite (Neg x) (Sub (Scalar 0.0 "float32") x) :ruleset canon :name "wrong-neg-as-sub-f32")
"""

SOUND = """\
(rewrite (Mat (Mat x)) (Mat x) :ruleset canon :name "test-mat-of-mat")
(rule ((= e (Exp (Mat x))) (fusable x)) ((union e (Exp x))) :ruleset fuse :name "test-fuse-exp")
(rule ((= e (Softmax x a))) ((fusable e)) :ruleset analysis :name "test-fusable-softmax")
"""

BIREWRITES = """\
(birewrite (Mul a b) (Mul b a) :ruleset canon :name "test-mul-commute-both-ways")
(birewrite (Sub a b) (Sub b a) :ruleset canon :name "test-sub-commute-wrong")
"""


def _rule_line(path: Path, name: str) -> int:
    """The line of the `(rule`/`(rewrite` form that declares `name`."""
    lines = path.read_text().splitlines()
    named = next(i for i, text in enumerate(lines) if f'"{name}"' in text)
    return next(i for i in range(named, -1, -1)
                if lines[i].lstrip().startswith(("(rule", "(rewrite", "(birewrite"))) + 1


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "rules", "check", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def shipped_report():
    return check_rules()


@pytest.fixture(scope="module")
def wrong_report():
    return check_rules(sorted(WRONG.glob("*.egg")))


# ---- (1) every shipped rule --------------------------------------------------------------------

def test_no_shipped_rule_is_unsound(shipped_report):
    """No shipped rule is unsound: exact rules on the whole float domain (+-0, +-inf, NaN,
    denormals, huge values), `:numerics fast` rules on ordinary values."""
    assert not shipped_report.unsound, shipped_report.summary()


def test_the_rules_that_break_exactness_are_tagged_fast(shipped_report):
    """The folds into weights, the GELU recognizers and the NPU's pooling swaps change special
    values at the float range's edges (docs/numerics.md): they are checked as fast rules."""
    for name in ("conv2d-bn-fold", "matmul-bn-fold", "conv-channel-scale-fold",
                 "conv-channel-shift-fold", "gelu-erf", "half-out-of-rhs",
                 "npu-relu-before-maxpool"):
        result = shipped_report.result(name)
        assert result.rule.numerics == "fast", name
        assert result.status == "passed", (name, result.status)
    assert shipped_report.result("batchnorm-as-affine-4d").rule.numerics == "exact"


def test_every_shipped_equality_is_checked(shipped_report):
    shipped = set(RuleProgram().rules)
    for target_file in all_target_rule_files():
        shipped |= set(RuleProgram(target_rules=[target_file]).rules)
    assert {r.name for r in shipped_report.results} == shipped
    for result in shipped_report.results:
        if result.status in ("fact", "fact-checked"):
            assert result.rule.kind == "fact" and not result.rule.unions, result.name
            continue
        if result.name in KNOWN_UNCHECKED:
            assert result.status in ("unchecked", "passed"), result.name
            continue
        assert result.status == "passed", f"{result.name}: {result.status}: {result.reason}"
        assert result.examples > 0


def test_fact_rules_are_checked_and_counted_apart_from_passed(shipped_report):
    checked = {r.name for r in shipped_report.facts_checked}
    assert {"fusable-conv", "const-add", "boundary-folded-const", "elementwise-relu"} <= checked
    assert "fusable-conv" not in {r.name for r in shipped_report.passed}
    summary = shipped_report.summary()
    assert "facts checked" in summary
    assert summary.splitlines()[-1] == (
        f"no unsound rule; {len(shipped_report.passed)} passed, {len(checked)} facts checked, "
        f"{len(shipped_report.unchecked)} unchecked, {len(shipped_report.facts)} facts")


def test_every_shipped_fact_holds_by_what_it_claims(shipped_report):
    facts = [r for r in shipped_report.results if r.rule.kind == "fact" and not r.rule.sets]
    assert len(facts) > 50
    for result in facts:
        if result.name in KNOWN_UNCHECKED_FACTS:
            assert result.status == "fact" and result.reason, result.name
            continue
        assert result.status == "fact-checked", f"{result.name}: {result.status}: {result.reason}"
    # what was checked is said: the permutation test for elementwise, the premises for const
    assert "commutes with permutations" in shipped_report.result("elementwise-add").reason
    assert "within each channel" in shipped_report.result("elementwise-batchnorm").reason
    assert "required const" in shipped_report.result("const-add").reason


def test_a_relation_without_known_meaning_stays_a_fact_with_the_reason(tmp_path):
    path = tmp_path / "own.egg"
    path.write_text('(relation my-kind (T))\n'
                    '(rule ((= e (Relu x))) ((my-kind e)) :ruleset analysis :name "test-my-kind")\n')
    report = check_rules([path])
    result = report.result("test-my-kind")
    assert result.status == "fact" and "my-kind" in result.reason
    assert "test-my-kind" in report.summary().split("facts (not an equality)")[1]
    assert report.summary().splitlines()[-1] == "no unsound rule; 0 passed, 0 unchecked, 1 facts"


def test_shipped_report_records_relied_on_relations(shipped_report):
    fuse_relu = shipped_report.result("fuse-relu")
    assert fuse_relu.status == "passed"
    assert "(fusable x)" in fuse_relu.relies_on


def test_rule_locations_match_the_loader():
    program = RuleProgram()
    rules = parse_rule_files(rule_files())
    assert {r.name for r in rules} == set(program.rules)
    for rule in rules:
        info = program.rules[rule.name]
        assert (Path(rule.file), rule.line, rule.ruleset) == (Path(info.file), info.line,
                                                               info.ruleset)


def test_shipped_rules_are_compared_with_open_dims(shipped_report):
    """Every sample is compared again with one of its sizes open, as the e-graph of a model
    with symbolic dims holds it: the rules that read shapes among them."""
    for name in ("flatten-as-reshape", "shape-reshape", "sibling-matmul-bias", "attention",
                 "conv2d-bn-fold"):
        result = shipped_report.result(name)
        assert result.status == "passed" and result.open_examples > 0, (name, result.reason)
        assert f"({result.open_examples} with open dims)" in result.reason
    opened = [r for r in shipped_report.passed if r.open_examples]
    assert len(opened) >= 0.9 * len(shipped_report.passed)
    line = next(x for x in shipped_report.summary().splitlines() if x.startswith("open dims"))
    assert f"{len(opened)} of the {len(shipped_report.passed)} passed" in line
    assert all(r.name in line for r in shipped_report.passed if not r.open_examples)


def test_wrong_only_where_a_dim_is_open(wrong_report, monkeypatch):
    """Rules right for every static shape but wrong on the codes of open dims are caught, and
    the counterexample says which size was open and at which size the sides differ."""
    for name in WRONG_ONLY_OPEN:
        result = wrong_report.result(name)
        assert result.status == "unsound", result.reason
        assert "open (held as the e-graph's code), at size" in result.reason
        cx = result.counterexample
        assert cx is not None and "open" in cx.error
        # the attributes are shown as sizes, never as raw codes
        assert all(not isinstance(v, int) or v > -(1 << 40)
                   for value in cx.attributes.values()
                   for v in (value if isinstance(value, tuple) else (value,)))
    # on static shapes alone they hold: the open dim is what shows them wrong
    import eqsat_fuse.checking.rulecheck as rulecheck
    monkeypatch.setattr(rulecheck, "open_variant", lambda *args: None)
    static = check_rules([WRONG / f for f in ("slice_past_the_end.egg",
                                              "flatten_product_of_dims.egg")])
    assert [r.status for r in static.results] == ["passed", "passed"], static.summary()


# ---- (2) deliberately wrong variants -----------------------------------------------------------

@pytest.mark.parametrize("file_name", sorted(WRONG_RULES))
def test_wrong_variant_is_unsound(wrong_report, file_name):
    name, what = WRONG_RULES[file_name]
    path = WRONG / file_name
    result = wrong_report.result(name)
    assert result.status == "unsound", f"{what}: {result.status} {result.reason}"
    assert Path(result.rule.file).resolve() == path.resolve()
    assert result.rule.line == _rule_line(path, name)
    cx = result.counterexample
    if name in STRUCTURAL_FACTS:
        assert STRUCTURAL_FACTS[name] in result.reason, result.reason
        text = wrong_report.summary()
        assert cx is None and result.reason in text
        assert f"{file_name}:{result.rule.line}" in text
        return
    assert cx is not None
    assert cx.inputs, "the counterexample names the sampled tensors"
    if cx.error is None:
        assert cx.max_abs_diff is not None and cx.max_abs_diff > cx.tolerance
        assert cx.index is not None
    text = wrong_report.summary()
    assert name in text and f"{file_name}:{result.rule.line}" in text


def test_edge_counterexamples_name_the_special_values(wrong_report):
    cx = wrong_report.result("wrong-div-const-exact").counterexample
    assert "NaN on one side only" in cx.error or "inf on one side only" in cx.error
    assert cx.index is not None
    cx = wrong_report.result("wrong-add-zero-exact").counterexample
    assert "-0.0 on one side only" in cx.error
    assert wrong_report.result("wrong-neg-sqrt-square").rule.numerics == "exact"


def _tagged_fast(text: str) -> str:
    """The rule file's text with each rule tagged `:numerics fast`."""
    import re
    return re.sub(r'(:name "[^"]+")', r"\1 :numerics fast", text)


def test_wrong_at_the_edges_only_passes_when_tagged_fast(tmp_path):
    paths = []
    for file_name in HOLD_WHEN_FAST:
        path = tmp_path / file_name
        path.write_text(_tagged_fast((WRONG / file_name).read_text()))
        paths.append(path)
    for file_name in ("neg_sqrt_square.egg", "log_product.egg"):   # wrong on ordinary values
        path = tmp_path / file_name
        path.write_text(_tagged_fast((WRONG / file_name).read_text()))
        paths.append(path)
    report = check_rules(paths)
    for name in HOLD_WHEN_FAST.values():
        result = report.result(name)
        assert result.rule.numerics == "fast"
        assert result.status == "passed", f"{name}: {result.reason}"
    assert report.result("wrong-neg-sqrt-square").status == "unsound"
    assert report.result("wrong-log-product").status == "unsound"
    # what the fast check avoided is said, in the text and the JSON
    div = report.result("wrong-div-const-exact")
    assert "c \u2260 0" in div.assumptions
    text = report.summary()
    assert "assumes c \u2260 0" in text and "(fast)" in text
    data = report.as_dict()
    rule = next(r for r in data["rules"] if r["name"] == "wrong-div-const-exact")
    assert rule["numerics"] == "fast" and rule["assumptions"] == div.assumptions
    # rejected samples are counted with why: x / x with x = 0 is not finite
    self_div = report.result("wrong-div-self")
    assert self_div.rejected > 0 and any("not finite" in why for why in self_div.rejections)
    assert f"rejected {self_div.rejected}: " in text


def test_shipped_fast_rules_are_checked_fast(shipped_report):
    for name in ("div-const-as-mul", "add-zero", "mul-mul-const", "add-add-const"):
        result = shipped_report.result(name)
        assert result.numerics == "fast" and result.status == "passed", name
    assert shipped_report.result("div-const-as-mul").assumptions == ["c \u2260 0"]
    assert shipped_report.result("sub-zero").numerics == "exact"
    assert any("plus-zero" in a for a in shipped_report.result("sub-zero").assumptions)


def test_value_relations_are_evaluated(tmp_path):
    # (fraction c) restricts c's values: 1e-6 <= |c| <= 1, as the encoder states it
    path = tmp_path / "fraction.egg"
    path.write_text('(rule ((= e (Mul x c)) (fraction c) (= (shape e) (shape x)))\n'
                    '      ((union e (Mul x (Reciprocal (Reciprocal c)))))\n'
                    '      :ruleset canon :name "test-fraction-double-reciprocal")\n')
    result = check_rules([path]).result("test-fraction-double-reciprocal")
    assert result.status == "passed", result.reason
    assert any("fraction" in a for a in result.assumptions)


def test_every_wrong_file_is_covered():
    assert sorted(p.name for p in WRONG.glob("*.egg")) == sorted(WRONG_RULES)


def test_wrong_epsilon_counterexample_shows_attributes(wrong_report):
    cx = wrong_report.result("wrong-bn-fold-eps-times-ten").counterexample
    assert "eps" in cx.attributes and "pads" in cx.attributes
    assert "largest difference" in cx.describe()
    assert json.dumps(cx.as_dict())


def test_absent_bias_is_sampled(wrong_report):
    cx = wrong_report.result("wrong-conv-shift-forgets-absent-bias").counterexample
    assert cx.inputs["b"] is None and "fails to evaluate" in cx.error


def test_wrong_shape_fact_is_unsound(tmp_path):
    path = tmp_path / "fact.egg"
    path.write_text(WRONG_FACT)
    result = check_rules([path]).result("wrong-shape-add")
    assert result.status == "unsound" and result.rule.kind == "fact"
    assert "sets (shape (Add a b))" in result.counterexample.error


def test_hard_coded_dtype_is_unsound(tmp_path):
    path = tmp_path / "dtype.egg"
    path.write_text(HARD_CODED_DTYPE)
    result = check_rules([path]).result("wrong-neg-as-sub-f32")
    assert result.status == "unsound"
    assert "dtypes differ" in result.counterexample.error


def test_birewrite_checks_both_directions(tmp_path):
    path = tmp_path / "bi.egg"
    path.write_text(BIREWRITES)
    report = check_rules([path], examples=20)
    assert report.result("test-mul-commute-both-ways").status == "passed"
    assert report.result("test-mul-commute-both-ways").examples >= 2 * 20
    wrong = report.result("test-sub-commute-wrong")
    assert wrong.status == "unsound" and wrong.counterexample.direction == "lhs => rhs"


def test_same_seed_same_counterexample():
    path = WRONG / "fuse_div_swapped.egg"
    a = check_rules([path], seed=3).result("wrong-fuse-div-swapped").counterexample
    b = check_rules([path], seed=3).result("wrong-fuse-div-swapped").counterexample
    assert a.as_dict() == b.as_dict()


# ---- (3) rules that cannot be checked ----------------------------------------------------------

def test_condition_never_met_is_unchecked(tmp_path):
    path = tmp_path / "never.egg"
    path.write_text(NEVER_MATCHES)
    report = check_rules([path], examples=10)
    result = report.result("never-matches-rank9-conv")
    assert result.status == "unchecked" and result.examples == 0
    assert "no sample met" in result.reason
    assert not report.passed and report.ok
    assert "UNCHECKED" in report.summary() and "never-matches-rank9-conv" in report.summary()


def test_unknown_condition_is_unchecked_with_reason(tmp_path):
    path = tmp_path / "unknown.egg"
    path.write_text(UNKNOWN_CONDITION)
    result = check_rules([path]).result("unknown-condition-small-group")
    assert result.status == "unchecked"
    assert "(small-group g)" in result.reason


# ---- (4) the command line ----------------------------------------------------------------------

def test_cli_exit_1_on_an_unsound_rule():
    proc = _cli("--quiet", "tests/rules_wrong/fuse_sub_swapped.egg")
    assert proc.returncode == 1, proc.stderr
    assert "UNSOUND" in proc.stdout and "wrong-fuse-sub-swapped" in proc.stdout
    assert "tests/rules_wrong/fuse_sub_swapped.egg:2" in proc.stdout
    assert "counterexample" in proc.stdout and "largest difference" in proc.stdout


def test_cli_exit_0_on_sound_rules(tmp_path):
    path = tmp_path / "sound.egg"
    path.write_text(SOUND)
    proc = _cli("--quiet", "--examples", "10", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no unsound rule" in proc.stdout and "test-mat-of-mat" in proc.stdout
    assert "test-fusable-softmax" in proc.stdout.split("facts checked")[1]


def test_cli_unchecked_is_listed_and_strict_exits_3(tmp_path):
    path = tmp_path / "never.egg"
    path.write_text(NEVER_MATCHES)
    proc = _cli("--quiet", "--examples", "5", str(path))
    assert proc.returncode == 0 and "UNCHECKED" in proc.stdout
    proc = _cli("--quiet", "--strict", "--examples", "5", str(path))
    assert proc.returncode == 3


def test_cli_json():
    proc = _cli("--json", "--examples", "10", "tests/rules_wrong/bn_eps_dropped.egg")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["counts"]["unsound"] == 1
    (rule,) = data["rules"]
    assert rule["name"] == "wrong-bn-fold-no-eps" and rule["line"] == 2
    assert rule["counterexample"]["max_abs_diff"] > rule["counterexample"]["tolerance"]


def test_cli_malformed_file_exits_2_with_location(tmp_path):
    path = tmp_path / "broken.egg"
    path.write_text("(rule ((= e (Relu x)))\n  ((union e (NoSuchOp x))) :ruleset fuse :name \"b\")\n")
    proc = _cli("--quiet", str(path))
    assert proc.returncode == 2
    assert "eqsat-fuse: error:" in proc.stderr and str(path) in proc.stderr


def test_cli_help_documents_exit_status():
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "rules", "check", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "exit status" in proc.stdout and "--strict" in proc.stdout


# ---- the pattern structure other code reuses ---------------------------------------------------

def test_parsed_rule_patterns(tmp_path):
    path = tmp_path / "sound.egg"
    path.write_text(SOUND)
    rules = {r.name: r for r in parse_rule_files([*rule_files(), path])}
    fold = rules["conv2d-bn-fold"]
    assert fold.kind == "rule" and fold.ruleset == "fold"
    assert isinstance(fold.lhs, Call) and fold.lhs.op == "BatchNormalization"
    assert isinstance(fold.rhs, Call) and fold.rhs.op == "Conv"
    assert "k" not in str(fold.rhs).split()          # the let is substituted
    assert any(isinstance(c, Eq) for c in fold.conditions)
    assert rules["test-mat-of-mat"].kind == "rewrite"
    assert rules["test-mat-of-mat"].file == str(path) and rules["test-mat-of-mat"].line == 1
    assert rules["test-fusable-softmax"].kind == "fact"
    assert rules["test-fusable-softmax"].rhs is None
    assert rules["test-fuse-exp"].lhs == Call("Exp", (Call("Mat", (Var("x"),)),))
    binding = match(rules["test-mat-of-mat"].lhs, Call("Mat", (Call("Mat", (Call("Input", (
        Lit("x"),)),)),)))
    assert binding == {"x": Call("Input", (Lit("x"),))}
    assert substitute(rules["test-mat-of-mat"].rhs, binding) == Call("Mat", (Call(
        "Input", (Lit("x"),)),))
    assert fold_constants(Call("vec-of", (Lit(1), Lit(2)))) == Lit((1, 2))
    assert str(Call("Add", (Var("a"), Lit(1.5)))) == "(Add a 1.5)"


def test_check_rules_is_exported():
    assert ef.check_rules is check_rules
    with pytest.raises(ef.EqsatFuseError):
        check_rules(examples=0)
    np.testing.assert_equal(len(ef.check_rules([WRONG / "fuse_sub_swapped.egg"],
                                               examples=5).unsound), 1)


def test_a_quantized_result_may_differ_by_one_step_only_at_a_tie():
    """The checker's allowance for a quantization of a rounded argument (`report._off_tie`):
    one step where the exact argument may lie on either side of k + 1/2, nothing else."""
    from eqsat_fuse.checking.report import _off_tie

    value = np.array([2.5, 2.5, 3.2, 3.2])               # argument / scale, scale 1
    slack = np.array([1e-6, 1e-6, 1e-6, 1e-6])
    scale = np.array(1.0)
    assert not _off_tie(np.array([2, 3, 3, 3]), np.array([3, 2, 3, 3]), (value, slack, scale))
    assert _off_tie(np.array([2, 2, 4, 3]), np.array([2, 2, 3, 3]), (value, slack, scale))
    assert _off_tie(np.array([1, 2, 3, 3]), np.array([3, 2, 3, 3]), (value, slack, scale))
