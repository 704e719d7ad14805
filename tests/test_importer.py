"""Stage 1, import: opsets, static shapes, normalization, and clear errors for bad files."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.importer import CANONICAL_OPSET, import_model

from conftest import MODELS_DIR, make_model


def test_opset9_model_is_upgraded_to_the_canonical_opset():
    graph = import_model(MODELS_DIR / "resnet_tiny_op9.onnx")
    assert graph.source_opset == 9
    assert graph.opset == CANONICAL_OPSET
    ops = {n.op for n in graph.nodes}
    assert {"Conv", "BatchNormalization", "Relu", "Add"} <= ops
    assert "Opaque" not in ops


def test_every_value_has_a_static_shape_and_dtype():
    graph = import_model(MODELS_DIR / "bert_tiny_op17.onnx")
    for node in graph.nodes:
        for value in [*node.inputs, *node.outputs]:
            if value:
                info = graph.values[value]
                assert all(isinstance(d, int) and d >= 0 for d in info.shape)
                assert info.dtype


def test_shape_subgraphs_are_folded_away():
    # BERT's exporter computes reshape targets and masks from Shape/ConstantOfShape/Where chains
    graph = import_model(MODELS_DIR / "bert_tiny_op17.onnx")
    assert not {n.op for n in graph.nodes} & {"Shape", "ConstantOfShape"}
    assert graph.onnx_nodes > len(graph.nodes)


def test_constant_nodes_become_initializers(rng):
    nodes = [helper.make_node("Constant", [], ["c"], value_float=2.0),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    graph = import_model(make_model(nodes, [("x", [3])], [("y", [3])]))
    assert [n.op for n in graph.nodes] == ["Mul"]
    assert graph.initializers["c"] == np.float32(2.0)


def test_sum_becomes_a_chain_of_adds():
    nodes = [helper.make_node("Sum", ["a", "b", "c"], ["y"])]
    model = make_model(nodes, [("a", [2, 3]), ("b", [3]), ("c", [1, 3])], [("y", [2, 3])])
    graph = import_model(model)
    assert [n.op for n in graph.nodes] == ["Add", "Add"]
    compiled = ef.compile(model)
    assert compiled.verify().ok


def test_auto_pad_same_upper_becomes_explicit_pads(rng):
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])]
    model = make_model(nodes, [("x", [1, 1, 6, 6])], [("y", [1, 2, 3, 3])], {"w": w})
    conv = import_model(model).nodes[0]
    assert conv.attrs["pads"] == [0, 0, 1, 1]
    assert ef.compile(model).verify().ok


def test_uncovered_op_becomes_an_opaque_kernel_run_by_onnx_reference():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Softsign", ["r"], ["s"]),
             helper.make_node("Mul", ["s", "s"], ["y"])]
    model = make_model(nodes, [("x", [4, 5])], [("y", [4, 5])])
    compiled = ef.compile(model)
    assert compiled.report.opaque_ops == ["Softsign"]
    assert any(k.kind == "opaque" for k in compiled.report.kernels)
    assert compiled.verify().ok


def test_dynamic_input_needs_a_shape_and_compiles_with_one():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [("x", ["batch", 8])], [("y", ["batch", 8])])
    with pytest.raises(ef.ModelError, match=r"input 'x' has dynamic shape \['batch', 8\].*input_shapes"):
        ef.compile(model)
    compiled = ef.compile(model, input_shapes={"x": (3, 8)})
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x, 0))


def test_input_shapes_naming_an_unknown_input_is_refused():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    with pytest.raises(ef.ModelError, match="'nope'.*not inputs"):
        ef.compile(model, input_shapes={"nope": (1,)})


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b"this is not a protobuf at all \xff\xfe", "not an ONNX model"),
])
def test_unreadable_files_are_refused_with_the_path(tmp_path, content, message):
    path = tmp_path / "broken.onnx"
    path.write_bytes(content)
    with pytest.raises(ef.ModelError, match=message) as info:
        ef.compile(path)
    assert str(path) in str(info.value)


def test_truncated_model_is_refused(tmp_path):
    data = (MODELS_DIR / "resnet_tiny_op17.onnx").read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ef.ModelError, match="truncated.onnx"):
        ef.compile(path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ef.ModelError, match="no such file"):
        ef.compile(tmp_path / "nope.onnx")


def test_cyclic_graph_is_refused():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    graph = helper.make_graph(nodes, "cyclic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ef.ModelError, match="cycle"):
        ef.compile(model)


def test_node_reading_an_undefined_value_is_refused():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"])]
    model = make_model(nodes, [("x", [2])], [("y", [2])])
    with pytest.raises(ef.ModelError, match="reads 'ghost'"):
        ef.compile(model)


def test_unknown_opset_is_refused():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])],
                       opset=onnx.defs.onnx_opset_version() + 5)
    with pytest.raises(ef.ModelError, match="opset"):
        ef.compile(model)


def test_huge_declared_shape_is_refused_before_allocating():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [("x", [1 << 20, 1 << 20])], [("y", [1 << 20, 1 << 20])])
    with pytest.raises(ef.ModelError, match="refused before allocating"):
        ef.compile(model)
