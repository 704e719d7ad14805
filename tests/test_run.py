"""Running a compiled program: feeds are checked, outputs are right, memory is planned."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef

from conftest import conv_bn_relu_model, make_model


@pytest.fixture
def compiled(rng):
    return ef.compile(conv_bn_relu_model(rng))


@pytest.mark.parametrize("feeds, message", [
    ({}, "missing input 'x'"),
    ({"x": np.zeros((1, 4, 8, 8), np.float32), "z": 1}, "unknown input 'z'"),
    ({"x": np.zeros((1, 4, 8, 8), np.float64)}, "dtype float64.*expects float32"),
    ({"x": np.zeros((1, 4, 8, 9), np.float32)}, r"shape \[1, 4, 8, 9\].*\[1, 4, 8, 8\]"),
])
def test_bad_feeds_name_the_input(compiled, feeds, message):
    with pytest.raises(ef.FeedError, match=message):
        compiled.run(feeds)


def test_conv_bn_relu_is_one_kernel_the_batchnorm_its_epilogue(compiled):
    """Exact mode: the BatchNormalization is not folded into the weights (w * k rounds and
    overflows on its own) but runs inside the Conv's kernel, before the Relu."""
    (kernel,) = compiled.report.kernels
    assert kernel.ops[0] == "Conv" and kernel.ops[-1] == "Relu"
    assert "conv2d-bn-fold" not in compiled.report.matches_per_rule
    assert compiled.verify().ok


@pytest.mark.parametrize("with_bias, fold", [(True, "conv2d-bn-fold"),
                                             (False, "conv2d-nobias-bn-fold")])
def test_fast_math_folds_batchnorm_into_the_weights(rng, with_bias, fold):
    compiled = ef.compile(conv_bn_relu_model(rng, with_bias=with_bias), numerics="fast")
    assert [k.ops for k in compiled.report.kernels] == [["Conv", "Relu"]]
    assert compiled.report.matches_per_rule[fold] == 1
    assert compiled.report.inexact_rules.get(fold) == 1
    assert compiled.verify().ok


def test_an_output_that_is_also_read_later_survives_until_the_end():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Mul", ["b", "b"], ["c"])]
    model = make_model(nodes, [("x", [2, 3])], [("a", [2, 3]), ("c", [2, 3])])
    compiled = ef.compile(model)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    out = compiled.run({"x": x})
    np.testing.assert_allclose(out["a"], np.maximum(x, 0))
    np.testing.assert_allclose(out["c"], np.exp(np.maximum(x, 0)) ** 2, rtol=1e-6)


def test_memory_plan_peak_is_between_the_lower_bound_and_separate_allocation():
    from conftest import MODELS_DIR
    report = ef.compile(MODELS_DIR / "mobilenetv2_tiny_op17.onnx").report
    assert 0 < report.lower_bound_bytes <= report.peak_bytes < report.separate_bytes


def test_verify_reports_relative_error_over_elements_above_atol():
    from eqsat_fuse.checking.verify import compare
    want = np.array([1e-6, 2.0, -4.0], np.float32)
    got = np.array([0.0, 2.002, -4.0], np.float32)       # 1e-3 relative on 2.0: within rtol
    result = compare({"y": got}, {"y": want}, "test")
    (check,) = result.outputs
    assert check.ok
    assert abs(check.max_rel_diff - 1e-3) < 1e-5          # not 1.0 from the tiny first element
    assert abs(check.max_abs_diff - 2e-3) < 1e-5
    assert "max rel 0.001 where |want| > atol" in result.summary()
    bad = compare({"y": np.array([0.0, 2.1, -4.0], np.float32)}, {"y": want}, "test")
    assert not bad.ok and "MISMATCH" in bad.summary()


def test_the_collector_is_paused_for_the_body_and_put_back_as_it_was():
    import gc
    import threading

    from eqsat_fuse.collector import paused
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():                       # nested (or a second thread): still off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    inside = threading.Event()
    leave = threading.Event()

    def other():
        with paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(5)
    with paused():
        pass
    assert not gc.isenabled()                # the other thread's body has not ended
    leave.set()
    thread.join()
    assert gc.isenabled()
    gc.disable()                             # a caller who turned it off keeps it off
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
