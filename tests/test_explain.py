"""Which rules shaped the extracted program (report.rules_in_program, optimize --explain)."""

from __future__ import annotations

import numpy as np
from onnx import helper

import eqsat_fuse as ef

from conftest import conv_bn_relu_model, make_model


def test_rules_that_built_the_chosen_program_are_credited(rng):
    report = ef.compile(conv_bn_relu_model(rng), numerics="fast").report
    assert report.rules_in_program.get("conv2d-bn-fold") == 1
    assert report.rules_in_program.get("fuse-relu") == 1
    # it fired, but its output (an affine Add/Mul form of the BatchNormalization) was not chosen
    assert report.matches_per_rule.get("batchnorm-as-affine-4d", 0) >= 1
    assert "batchnorm-as-affine-4d" not in report.rules_in_program


def test_nothing_is_credited_when_the_program_is_the_model_as_written():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 3])],
                       [("y", [2, 4])], {"w": np.ones((3, 4), np.float32)})
    assert ef.compile(model).report.rules_in_program == {}


def test_a_rule_that_fired_but_lost_to_the_cost_model_is_not_credited():
    rng = np.random.default_rng(0)
    nodes, inits, outs = [], {}, []
    for i in range(3):   # Q/K/V-like siblings: fusing them is a choice the greedy extractor declines
        inits[f"w{i}"], inits[f"b{i}"] = rng.standard_normal((8, 8)).astype(np.float32), \
            rng.standard_normal(8).astype(np.float32)
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        outs.append((f"y{i}", [1, 4, 8]))
    report = ef.compile(make_model(nodes, [("x", [1, 4, 8])], outs, inits)).report
    assert report.matches_per_rule.get("sibling-matmul-bias-3", 0) >= 1
    chose_split = any(k.ops == ["Split"] for k in report.kernels)
    assert ("sibling-matmul-bias-3" in report.rules_in_program) == chose_split
