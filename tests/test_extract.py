"""Stage 3, extract: the greedy DAG extractor, the program cost and the validity check."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.extraction.costmodel import load_cost_model
from eqsat_fuse.frontend.encode import encode
from eqsat_fuse.extraction.cost import ExtractionError, constant_classes, program_cost, roots_of
from eqsat_fuse.extraction.registry import extract
from eqsat_fuse.frontend.importer import import_model
from eqsat_fuse.saturation.saturate import saturate
from eqsat_fuse.saturation.serialized import fill_missing_facts, read_egraph

from conftest import MODELS_DIR, conv_bn_relu_model, make_model


def saturated(model):
    encoding = encode(import_model(model))
    egraph, _ = saturate(encoding)
    eg = read_egraph(egraph)
    fill_missing_facts(eg)
    return eg, roots_of(eg, encoding.output_vars)


@pytest.fixture(scope="module")
def resnet():
    eg, roots = saturated(MODELS_DIR / "resnet_tiny_op17.onnx")
    return eg, roots, extract(eg, roots, load_cost_model("cpu"))


def test_reported_cost_equals_the_cost_recomputed_from_the_choice(resnet):
    eg, roots, result = resnet
    cost, kernels = program_cost(eg, load_cost_model("cpu"), result.choice, roots, result.constant)
    assert cost == pytest.approx(result.cost, rel=1e-12)
    assert set(kernels) == set(result.kernels)


def test_fused_program_is_predicted_cheaper_than_the_unfused_one():
    path = MODELS_DIR / "resnet_tiny_op17.onnx"
    unfused = ef.compile(path, budgets=ef.Budgets(iterations=0)).report   # no rule runs
    fused = ef.compile(path).report
    assert unfused.kernels_out + unfused.views == unfused.nodes_imported
    assert fused.kernels_out < unfused.kernels_out
    assert fused.cost < unfused.cost


def test_choice_with_a_node_outside_its_class_is_rejected(resnet):
    eg, roots, result = resnet
    choice = dict(result.choice)
    some_class = next(c for c in choice if c not in result.constant)
    other = next(n for n in range(len(eg.nodes)) if eg.nodes[n].eclass != some_class)
    choice[some_class] = other
    with pytest.raises(ExtractionError, match="not in the class"):
        program_cost(eg, load_cost_model("cpu"), choice, roots, result.constant)


def test_choice_missing_a_needed_class_is_rejected(resnet):
    eg, roots, result = resnet
    choice = dict(result.choice)
    victim = next(ch for c in choice for ch in eg.nodes[choice[c]].children)
    del choice[victim]
    with pytest.raises(ExtractionError, match="no chosen node"):
        program_cost(eg, load_cost_model("cpu"), choice, roots, result.constant)


def test_two_convolutions_never_share_one_kernel(rng):
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])], {"w1": w1, "w2": w2})
    compiled = ef.compile(model)
    kernels = [k.ops for k in compiled.report.kernels if k.kind == "compute"]
    assert all(ops.count("Conv") <= 1 for ops in kernels)
    assert sorted(map(tuple, kernels)) in ([("Conv",), ("Conv", "Add", "Relu")],
                                           [("Conv",), ("Conv", "Relu", "Add")])
    assert compiled.verify().ok


def test_an_illegal_body_is_rejected_by_the_check(rng):
    eg, roots = saturated(conv_bn_relu_model(rng))
    model = load_cost_model("cpu")
    result = extract(eg, roots, model)
    # a target that allows no anchor in a body: the fused Conv+Relu is now illegal
    strict = type(model)(**{**model.__dict__, "max_anchors": 0})
    with pytest.raises(ExtractionError, match="contractions/reductions"):
        program_cost(eg, strict, result.choice, roots, result.constant)


def test_batchnorm_weights_are_constant_classes(rng):
    eg, roots = saturated(conv_bn_relu_model(rng))
    constant = constant_classes(eg)
    folded = [c for c in constant if eg.nodes[constant[c]].op == "Mul"]
    assert folded, "the BN-folded weight (w * k) should be a compile-time constant"


def test_unknown_extractor_is_refused(resnet):
    eg, roots, _ = resnet
    with pytest.raises(ef.EqsatFuseError, match="unknown extractor"):
        extract(eg, roots, load_cost_model("cpu"), "magic")


def test_a_fused_elementwise_chain_is_illegal_on_edge_npu():
    from onnx import helper as h

    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Sigmoid", ["r"], ["y"])]
    model = make_model(nodes, [("x", [1, 8])], [("y", [1, 8])])
    eg, roots = saturated(model)
    result = extract(eg, roots, load_cost_model("cpu"))
    assert [k.ops for k in result.kernels.values()] == [["Relu", "Sigmoid"]]
    with pytest.raises(ExtractionError, match="illegal kernel body on target edge-npu"):
        program_cost(eg, load_cost_model("edge-npu"), result.choice, roots, result.constant)


def test_missing_facts_of_rule_made_contractions_and_lists_are_filled():
    from eqsat_fuse.saturation.serialized import ENode, SerializedEGraph

    nodes = [ENode("Input", 0, (), ("x",)), ENode("Const", 1, (), ("wa",)),
             ENode("Const", 2, (), ("wb",)), ENode("TNil", 3, (), ()),
             ENode("TCons", 4, (2, 3), ()), ENode("TCons", 5, (1, 4), ()),
             ENode("Concat", 6, (5,), (1,)), ENode("MatMul", 7, (0, 6), ()),
             ENode("Split", 8, (7,), ((3, 5), 2, 1))]
    eg = SerializedEGraph(nodes=nodes, class_nodes=[[i] for i in range(9)],
                          class_sort=["T", "T", "T", "TList", "TList", "TList", "T", "T", "T"],
                          class_ids=[f"c{i}" for i in range(9)],
                          shapes={0: (1, 4, 6), 1: (6, 3), 2: (6, 5)},
                          dtypes={0: "float32", 1: "float32", 2: "float32"})
    fill_missing_facts(eg)
    assert eg.shapes[6] == (6, 8) and eg.shapes[7] == (1, 4, 8) and eg.shapes[8] == (1, 4, 5)
    assert eg.dtypes[7] == "float32"
