"""The numerics contract's rewrite side (issue 21, items 1-5; docs/numerics.md): by default a
compiled program keeps which elements are NaN, +-inf and signed zero, on both backends, for the
minimal cases where a rule used to change them; `numerics="fast"` (`--fast-math`) lets the
rules tagged `:numerics fast` run, and the report says which of them shaped the program.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.errors import EqsatFuseError, RuleFileError
from eqsat_fuse.saturation.saturate import RuleProgram

from conftest import check_ieee, make_model, ort_outputs

F16 = TensorProto.FLOAT16


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("contract-cache")


def _chain(op, const, dtype=TensorProto.FLOAT, then="Relu"):
    """x -> op(x, c) -> then -> o, over 4 elements."""
    nodes = [helper.make_node(op, ["x", "c"], ["t"]), helper.make_node(then, ["t"], ["o"])]
    return make_model(nodes, [("x", [4], dtype)], [("o", [4], dtype)], {"c": const})


# -- item 1: x / c as x * (1/c): 1/c is inf for a subnormal c --

def test_division_by_a_subnormal_constant(kernel_cache):
    model = _chain("Div", np.array(1e-40, np.float32))
    x = np.array([0.0, 1e-5, 3.0, -2.0], np.float32)
    check_ieee(model, {"x": x}, kernel_cache)
    fast = ef.compile(model, numerics="fast")
    assert "div-const-as-mul" in fast.report.inexact_rules
    assert np.isnan(fast.run({"x": x})["o"][0])      # 0 * inf: what exact mode avoids


def test_division_by_a_power_of_two_stays_a_product(kernel_cache):
    """The exact variant: x / 4 is x * 0.25 bit for bit, so exact mode still multiplies."""
    model = _chain("Div", np.array([4.0, 0.5, -2.0, 2.0 ** -100], np.float32))
    x = np.array([1e-45, -0.0, np.inf, 3e38], np.float32)
    numpy_program, _ = check_ieee(model, {"x": x}, kernel_cache)
    assert "div-exact-reciprocal-as-mul" in numpy_program.report.matches_per_rule
    assert "div-const-as-mul" not in numpy_program.report.matches_per_rule


# -- item 2: constants re-associated across a chain --

def _two_constants(op, a, b):
    nodes = [helper.make_node(op, ["x", "a"], ["t"]), helper.make_node(op, ["t", "b"], ["u"]),
             helper.make_node("Neg", ["u"], ["o"])]
    return make_model(nodes, [("x", [4])], [("o", [4])],
                      {"a": np.array(a, np.float32), "b": np.array(b, np.float32)})


def test_product_of_constants_that_underflows(kernel_cache):
    x = np.array([1e30, 3e38, -1e35, 1.0], np.float32)
    check_ieee(_two_constants("Mul", 1e-30, 1e-30), {"x": x}, kernel_cache)


def test_sum_of_constants_that_cancels(kernel_cache):
    x = np.array([1.0, -3.0, 0.5, 1e30], np.float32)
    model = _two_constants("Add", 1e30, -1e30)
    check_ieee(model, {"x": x}, kernel_cache)
    fast = ef.compile(model, numerics="fast")
    assert fast.report.inexact_rules.keys() & {"add-add-const", "add-add-const-mat"}
    assert fast.run({"x": x})["o"][0] == -1.0        # x, where the model computes 0


def test_product_of_fractions_still_merges(kernel_cache):
    """Two weights in [1e-6, 1]: no order overflows, the folded product is normal, so exact
    mode still merges them (one multiplication per element)."""
    x = np.array([3e38, -1e-38, 7.0, -0.0], np.float32)
    numpy_program, _ = check_ieee(_two_constants("Mul", 0.5, 0.25), {"x": x}, kernel_cache)
    matched = numpy_program.report.matches_per_rule
    assert matched.keys() & {"mul-mul-fraction", "mul-mul-fraction-mat"}


# -- item 3: x + 0.0 dropped keeps a -0 that the sum makes +0 --

def test_adding_zero_to_negative_zero(kernel_cache):
    model = _chain("Add", np.array(0.0, np.float32), then="Reciprocal")
    x = np.array([-0.0, 0.0, -0.0, 2.0], np.float32)
    check_ieee(model, {"x": x}, kernel_cache)            # 1 / (-0 + 0) = +inf
    fast = ef.compile(model, numerics="fast")
    assert set(fast.report.inexact_rules) == {"add-zero"}
    assert fast.run({"x": x})["o"][0] == -np.inf


def test_subtracting_negative_zero_is_not_removed(kernel_cache):
    """x - (-0) is x + 0, which is not x for x = -0; x - (+0) is x for every x."""
    for zero in (-0.0, 0.0):
        model = _chain("Sub", np.array(zero, np.float32), then="Reciprocal")
        check_ieee(model, {"x": np.array([-0.0, 0.0, 1.0, -1.0], np.float32)}, kernel_cache)


# -- item 4: Pow(x, 0.5) as a square root --

def test_pow_one_half_at_minus_infinity_and_minus_zero(kernel_cache):
    model = _chain("Pow", np.array(0.5, np.float32), then="Neg")
    x = np.array([-np.inf, -0.0, 4.0, -1.0], np.float32)
    check_ieee(model, {"x": x}, kernel_cache)            # +inf, +0 (pow), 2, NaN


# -- item 5: float16 BatchNormalization and the Adds after it merged into one float16 shift --

def test_float16_batchnorm_then_channel_add(kernel_cache):
    shift = np.array([2.2, -1.3], np.float16).reshape(1, 2, 1, 1)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"]),
             helper.make_node("Add", ["y", "c"], ["o"])]
    inits = {"s": np.array([1.1, 0.7], np.float16), "b": np.array([-2.156, 1.25], np.float16),
             "m": np.array([0.1, -0.2], np.float16), "v": np.array([0.9, 1.5], np.float16),
             "c": shift}
    model = make_model(nodes, [("x", [1, 2, 2, 2], F16)], [("o", [1, 2, 2, 2], F16)], inits)
    x = np.array([0.0, 0.05, -0.1, 1.0, 0.3, -0.02, 2.0, 0.2], np.float16).reshape(1, 2, 2, 2)
    want = ort_outputs(model, {"x": x})[0].astype(np.float32)
    for backend in ("numpy", "numba"):
        kw = {"cache_dir": kernel_cache} if backend == "numba" else {}
        got = ef.compile(model, backend=backend, **kw).run({"x": x})["o"].astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=backend)


# -- the mode itself --

def test_exact_is_the_default_and_says_so():
    model = _chain("Add", np.array(0.0, np.float32))
    report = ef.compile(model).report
    assert report.numerics == "exact" and report.inexact_rules == {}
    assert "numerics" not in report.summary()
    fast = ef.compile(model, numerics="fast").report
    assert fast.numerics == "fast"
    assert "numerics      fast (--fast-math): inexact rules fired: add-zero x" in fast.summary()


def test_unknown_mode_is_refused():
    with pytest.raises(EqsatFuseError, match="numerics must be one of exact, fast"):
        ef.compile(_chain("Add", np.array(1.0, np.float32)), numerics="loose")


def test_tagged_rules_are_listed_but_not_loaded_in_exact_mode():
    exact, fast = RuleProgram(), RuleProgram(numerics="fast")
    tagged = {name for name, info in exact.rules.items() if info.numerics == "fast"}
    assert {"div-const-as-mul", "add-zero", "mul-mul-const", "add-add-const"} <= tagged
    assert tagged == {name for name, info in fast.rules.items() if info.numerics == "fast"}


def test_user_rule_tag_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.egg"
    bad.write_text('(ruleset mine)\n(rewrite (Neg (Neg x)) x :ruleset mine :name "nn"\n'
                   '         :numerics loose)\n')
    with pytest.raises(RuleFileError, match=r"bad.egg:3.*takes one value, fast"):
        ef.compile(_chain("Add", np.array(1.0, np.float32)), rules=[bad])


def test_user_rule_tagged_fast_runs_only_with_fast_math(tmp_path):
    rule = tmp_path / "mine.egg"
    rule.write_text('(ruleset mine)\n'
                    '(rewrite (Relu (Mat (Relu x))) (Relu x) :ruleset mine :name "relu-relu"\n'
                    '         :numerics fast)\n')
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["o"])]
    model = make_model(nodes, [("x", [4])], [("o", [4])])
    exact = ef.compile(model, rules=[rule]).report
    fast = ef.compile(model, rules=[rule], numerics="fast").report
    assert "relu-relu" not in exact.matches_per_rule
    assert fast.matches_per_rule.get("relu-relu", 0) >= 1
    assert "relu-relu" in fast.inexact_rules


def test_cli_fast_math(tmp_path, capsys):
    from eqsat_fuse.cli import main

    path = tmp_path / "m.onnx"
    path.write_bytes(_chain("Add", np.array(0.0, np.float32)).SerializeToString())
    assert main(["optimize", str(path), "--fast-math", "--quiet"]) == 0
    assert "numerics      fast (--fast-math): inexact rules fired: add-zero" \
        in capsys.readouterr().out


def test_tags_in_comments_and_strings_are_not_tags():
    from eqsat_fuse.numerics import split_tags

    text = ('; a comment :numerics fast\n'
            '(rule ((= e (Neg x))) ((union e x)) :ruleset r :name "a;(" :numerics fast)\n'
            '(rewrite (Neg x) x :ruleset r :name ":numerics fast")\n')
    clean, tags = split_tags(text, "f.egg")
    assert len(clean) == len(text) and clean.count("\n") == text.count("\n")
    assert clean.count(":numerics fast") == 2          # the comment's and the string's
    (form,) = tags.forms
    assert (form.start, form.line) == (text.index("(rule"), 2)
