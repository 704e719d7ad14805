"""Stage 1, import: opsets, static shapes, normalization, and clear errors for bad files."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.frontend.importer import CANONICAL_OPSET, import_model

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


def test_dynamic_input_compiles_symbolic_and_input_shapes_fix_it():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [("x", ["batch", 8])], [("y", ["batch", 8])])
    generic = ef.compile(model)
    assert str(generic.inputs["x"].shape[0]) == "batch"
    for n in (1, 3, 5):
        x = np.linspace(-1, 1, 8 * n, dtype=np.float32).reshape(n, 8)
        np.testing.assert_array_equal(generic.run({"x": x})["y"], np.maximum(x, 0))
    compiled = ef.compile(model, input_shapes={"x": (3, 8)})
    assert compiled.inputs["x"].shape == (3, 8)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x, 0))


def test_a_dim_that_is_not_a_number_is_named():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["N", 3, 32, 32])],
                       [("y", ["N", 3, 32, 32])])
    with pytest.raises(ef.ModelError, match=r"input_shapes\['x'\] = \('N', 3, 32, 32\): dim 0 "
                                            r"is 'N', not a whole number"):
        ef.compile(model, input_shapes={"x": ("N", 3, 32, 32)})
    with pytest.raises(ef.ModelError, match=r"input_shapes\['x'\] = 5 is not a sequence"):
        ef.compile(model, input_shapes={"x": 5})
    with pytest.raises(ef.ModelError, match=r"input 'x' has rank 4 .* of rank 3"):
        ef.compile(model, input_shapes={"x": (1, 3, 32)})
    assert ef.compile(model, input_shapes={"x": np.array([2, 3, 4, 4])}).verify().ok


def _two_dynamic_inputs():
    nodes = [helper.make_node("Add", ["input_ids", "attention_mask"], ["y"])]
    dims = ["batch", "seq"]
    return make_model(nodes, [("input_ids", dims), ("attention_mask", dims)], [("y", dims)])


def test_two_inputs_sharing_symbols_and_a_partial_input_shapes():
    compiled = ef.compile(_two_dynamic_inputs())
    assert compiled.report.symbolic["inputs"] == {"input_ids": ["batch", "seq"],
                                                   "attention_mask": ["batch", "seq"]}
    ones = np.ones((2, 5), np.float32)
    np.testing.assert_array_equal(compiled.run({"input_ids": ones, "attention_mask": ones})["y"],
                                  2 * ones)
    half = ef.compile(_two_dynamic_inputs(), input_shapes={"input_ids": (2, 5)})
    assert half.report.symbolic["inputs"]["attention_mask"] == ["batch", "seq"]
    np.testing.assert_array_equal(half.run({"input_ids": ones, "attention_mask": ones})["y"],
                                  2 * ones)
    with pytest.raises(ef.FeedError):
        half.run({"input_ids": ones, "attention_mask": np.ones((2, 4), np.float32)})


def test_a_static_dim_is_resized_and_the_oracle_takes_the_new_size():
    compiled = ef.compile(MODELS_DIR / "resnet_tiny_op17.onnx",
                          input_shapes={"pixel_values": (4, 3, 32, 32)})
    assert compiled.inputs["pixel_values"].shape == (4, 3, 32, 32)
    assert compiled.report.kernels[-1].shape == [4, 10]
    assert compiled.verify().ok


def test_a_size_the_model_fixes_is_refused_in_one_line():
    shapes = {"input_ids": (1, 64), "attention_mask": (1, 64)}
    with pytest.raises(ef.ModelError) as info:
        ef.compile(MODELS_DIR / "bert_tiny_op17.onnx", input_shapes=shapes)
    message = str(info.value)
    assert "cannot re-size input 'input_ids' from [1, 16] to [1, 64]" in message
    assert "fixes the old size" in message and "\n" not in message
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", [2, 6])],
                       [("y", [3, 4])], {"s": np.array([3, 4], np.int64)})
    with pytest.raises(ef.ModelError, match=r"cannot re-size input 'x' from \[2, 6\] to \[4, 6\]: "
                       r"node 'Reshape' \(Reshape\) cannot reshape \[4, 6\] \(24 elements\) to "
                       r"\[3, 4\] \(12 elements\)"):
        ef.compile(model, input_shapes={"x": (4, 6)})


def test_the_report_counts_the_file_s_nodes_and_says_what_the_opset_upgrade_added():
    path = MODELS_DIR / "bert_tiny_op9.onnx"
    in_file = len(onnx.load(path).graph.node)
    report = ef.compile(path).report
    assert report.nodes_in == in_file
    converted = onnx.version_converter.convert_version(onnx.load(path), CANONICAL_OPSET)
    added = len(converted.graph.node) - in_file
    assert added > 0 and report.nodes_added_by_conversion == added
    assert f"{in_file} in the file (+{added} added by upgrading opset 9) -> " in report.summary()
    resnet = ef.compile(MODELS_DIR / "resnet_tiny_op9.onnx").report     # nothing added: no note
    assert f"{resnet.nodes_in} in the file -> " in resnet.summary()


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


# ---- regressions found by the ONNX node tests (tests/test_conformance.py) ----------------------

def test_an_input_no_node_reads_still_compiles_and_is_still_fed():
    # Shape(x) folds to a constant and inference-mode Dropout ignores its ratio, so nothing
    # reads x or ratio any more; both stay inputs of the model
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Dropout", ["z", "ratio"], ["d"])]
    model = make_model(nodes, [("x", [2, 3, 4]), ("z", [2]), ("ratio", [])],
                       [("s", [3], TensorProto.INT64), ("d", [2])])
    compiled = ef.compile(model)
    assert set(compiled.inputs) == {"x", "z", "ratio"}
    feeds = {"x": np.zeros((2, 3, 4), np.float32), "z": np.array([1.0, -2.0], np.float32),
             "ratio": np.float32(0.5)}
    out = compiled.run(feeds)
    np.testing.assert_array_equal(out["s"], [2, 3, 4])
    np.testing.assert_array_equal(out["d"], feeds["z"])
    with pytest.raises(ef.FeedError, match="missing input 'x'"):
        compiled.run({"z": feeds["z"], "ratio": feeds["ratio"]})


@pytest.mark.parametrize("op, out_shape, expected", [
    ("Reshape", [1, 3], lambda x: x.reshape(1, 3)),
    ("Expand", [3, 4], lambda x: np.broadcast_to(x, (3, 4))),
])
def test_a_shape_fed_at_run_time_keeps_the_node_opaque(op, out_shape, expected):
    # the program must follow the shape fed at run time, not the one shape inference assumed
    model = make_model([helper.make_node(op, ["x", "shape"], ["y"])],
                       [("x", [3, 1]), ("shape", [2], TensorProto.INT64)], [("y", out_shape)])
    compiled = ef.compile(model)
    assert compiled.report.opaque_ops == [op]
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    y = compiled.run({"x": x, "shape": np.array(out_shape, np.int64)})["y"]
    np.testing.assert_array_equal(y, expected(x))


def test_split_sizes_fed_at_run_time_keep_split_opaque():
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=0)]
    model = make_model(nodes, [("x", [5]), ("sizes", [2], TensorProto.INT64)],
                       [("a", [2]), ("b", [3])])
    compiled = ef.compile(model)
    assert compiled.report.opaque_ops == ["Split"]
    x = np.arange(5, dtype=np.float32)
    out = compiled.run({"x": x, "sizes": np.array([2, 3], np.int64)})
    np.testing.assert_array_equal(out["a"], x[:2])
    np.testing.assert_array_equal(out["b"], x[2:])


def test_saturating_cast_to_float8_is_run_by_onnx_reference():
    # Cast(saturate=1) to float8 clamps to the largest finite value; a plain astype gives NaN
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)]
    model = make_model(nodes, [("x", [3])], [("y", [3], TensorProto.FLOAT8E4M3FN)], opset=19)
    compiled = ef.compile(model)
    assert compiled.report.opaque_ops == ["Cast"]
    y = compiled.run({"x": np.array([1.0, 1e6, -1e6], np.float32)})["y"]
    np.testing.assert_array_equal(y.astype(np.float32), [1.0, 448.0, -448.0])
    plain = make_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN,
                                         saturate=0)],
                       [("x", [3])], [("y", [3], TensorProto.FLOAT8E4M3FN)], opset=19)
    assert ef.compile(plain).report.opaque_ops == []


def test_opaque_nodes_run_under_the_opset_the_model_keeps():
    # a Cast to float8e8m0 with round_mode exists from opset 24 and cannot be taken down to 21
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, round_mode="up")]
    model = make_model(nodes, [("x", [2])], [("y", [2], TensorProto.FLOAT8E8M0)], opset=24)
    graph = import_model(model)
    assert graph.opset == 24
    y = ef.compile(model).run({"x": np.array([0.3, 4.0], np.float32)})["y"]
    np.testing.assert_array_equal(y.astype(np.float32), [0.5, 4.0])


@pytest.mark.parametrize("declared", [[1, 1, 3, 3], ["n", "c", "h", "w"]])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_ceil_mode_pool_drops_a_last_window_that_starts_in_the_padding(op, declared):
    # ONNX's shape inference keeps that window (4x4, or a conflict with the declared 3x3);
    # onnxruntime, PyTorch and numpy_ops drop it (3x3)
    nodes = [helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                              pads=[1, 1, 1, 1], ceil_mode=1)]
    model = make_model(nodes, [("x", [1, 1, 5, 5])], [("y", declared)])
    graph = import_model(model)
    assert graph.values["y"].shape == (1, 1, 3, 3)
    compiled = ef.compile(model)
    assert [k.ops for k in compiled.report.kernels] == [[op]]
    assert compiled.verify().ok


# ---- weights held aside while ONNX's passes run (a weightless copy of the model) ------------------

def _weighty_model(rng, opset=9):
    """x @ w + c, reshaped: a 16 KiB weight, a 2 KiB Constant node, a small shape initializer."""
    w = rng.standard_normal((64, 64)).astype(np.float32)
    c = rng.standard_normal((8, 64)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(c)),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "c"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["y"])]
    model = make_model(nodes, [("x", [8, 64])], [("y", [4, 128])],
                       {"w": w, "shape": np.array([4, 128], np.int64)}, opset=opset)
    return model, w, c


@pytest.mark.parametrize("opset", [9, 17])
def test_big_weights_come_back_by_name_and_the_program_computes_with_them(rng, opset):
    model, w, c = _weighty_model(rng, opset)
    before = model.SerializeToString()
    graph = import_model(model)
    np.testing.assert_array_equal(graph.initializers["w"], w)
    np.testing.assert_array_equal(graph.initializers["c"], c)
    assert graph.values["y"].shape == (4, 128)
    assert model.SerializeToString() == before          # the caller's model is left as it was
    x = rng.standard_normal((8, 64)).astype(np.float32)
    y = ef.compile(model).run({"x": x})["y"]
    np.testing.assert_allclose(y, (x @ w + c).reshape(4, 128), rtol=1e-5, atol=1e-5)


def test_a_big_weight_saved_as_external_data_comes_back(rng, tmp_path):
    model, w, _ = _weighty_model(rng, 17)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    graph = import_model(path)
    np.testing.assert_array_equal(graph.initializers["w"], w)
    assert graph.values["y"].shape == (4, 128)   # Reshape's shape, small, read from its file too


def test_a_big_folded_value_stays_exact(rng):
    # Transpose of a weight is folded at import; its 16 KiB result is held aside like a weight
    w = rng.standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]),
             helper.make_node("MatMul", ["x", "wt"], ["y"])]
    graph = import_model(make_model(nodes, [("x", [2, 64])], [("y", [2, 64])], {"w": w}))
    assert [n.op for n in graph.nodes] == ["MatMul"]
    np.testing.assert_array_equal(graph.initializers["wt"], w.T)


def test_a_big_weight_whose_data_is_too_short_is_refused_in_one_line(rng):
    model, _, _ = _weighty_model(rng, 17)
    tensor = next(t for t in model.graph.initializer if t.name == "w")
    tensor.raw_data = tensor.raw_data[:100]
    with pytest.raises(ef.ModelError, match=r"tensor 'w': raw_data size \(100 bytes\) is too small "
                                            r"for its shape \[64, 64\] \(float32, 16384 bytes\)"):
        import_model(model)


def test_the_graph_keeps_the_seconds_of_each_import_step():
    graph = import_model(MODELS_DIR / "bert_tiny_op9.onnx")
    assert set(graph.import_seconds) == {"read", "check", "convert", "infer", "fold", "normalize"}
    assert all(s >= 0 for s in graph.import_seconds.values())


def test_the_report_shows_where_import_time_went():
    report = ef.compile(MODELS_DIR / "bert_tiny_op9.onnx").report
    assert set(report.import_seconds) == {"read", "check", "convert", "infer", "fold",
                                          "normalize"}
    time_line = next(l for l in report.summary().splitlines() if l.startswith("time"))
    assert "import " in time_line and "(read " in time_line and "normalize " in time_line
    assert report.as_dict()["import_seconds"] == report.import_seconds
