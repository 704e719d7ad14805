"""Shape and opaque-node edges of issue 21: ceil-mode pools whose input is a graph output, MaxPool
with its Indices output, a graph input that is also an output, and MaxPool over NaN. Each case
runs on both backends against onnxruntime (ORT_DISABLE_ALL), output shapes included."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.frontend.importer import import_model

from conftest import make_model, ort_outputs

BACKENDS = ["numpy", "numba"]
LOWEST = np.finfo(np.float32).min


def _check(model, feeds, backend, exact=False):
    """The compiled model's outputs equal onnxruntime's, shapes and dtypes included."""
    compiled = ef.compile(model, backend=backend)
    got = compiled.run(feeds)
    names = [o.name for o in model.graph.output]
    for name, want in zip(names, ort_outputs(model, feeds)):
        assert got[name].shape == want.shape, name
        assert got[name].dtype == want.dtype, name
        if exact:
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)
    return compiled


def _unknown(rank):
    return [f"d{i}" for i in range(rank)]


# ---- item 12: ceil-mode pools whose input is also a graph output ------------------------------

CEIL = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)


def _ceil_models(op):
    relu = helper.make_node("Relu", ["x"], ["r"])
    yield "intermediate-output", make_model(
        [relu, helper.make_node(op, ["r"], ["y"], **CEIL)],
        [("x", [1, 1, 5, 5])], [("r", [1, 1, 5, 5]), ("y", _unknown(4))])
    yield "intermediate-output-unknown", make_model(
        [relu, helper.make_node(op, ["r"], ["y"], **CEIL)],
        [("x", [1, 1, 5, 5])], [("r", _unknown(4)), ("y", _unknown(4))])
    yield "input-output", make_model(
        [helper.make_node(op, ["x"], ["y"], **CEIL)],
        [("x", [1, 1, 5, 5])], [("x", _unknown(4)), ("y", _unknown(4))])
    # a chain: the second pool reads the first one's right size (3x3 -> 2x2, not 4x4 -> 3x3)
    yield "chain", make_model(
        [relu, helper.make_node(op, ["r"], ["p"], **CEIL),
         helper.make_node(op, ["p"], ["y"], **CEIL)],
        [("x", [1, 1, 5, 5])], [("r", _unknown(4)), ("p", _unknown(4)), ("y", _unknown(4))])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_ceil_mode_pool_whose_input_is_a_graph_output_drops_the_last_window(op, backend):
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5) - 12
    for label, model in _ceil_models(op):
        assert import_model(model).values["y"].shape[2:] == ((2, 2) if label == "chain"
                                                             else (3, 3)), label
        _check(model, {"x": x}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("size, kernel, strides, dilations, pads", [
    (5, 2, 2, 1, [1, 1, 1, 1]),
    (6, 3, 2, 1, [1, 0, 2, 1]),
    (7, 3, 3, 1, [0, 2, 0, 1]),
    (7, 2, 2, 2, [1, 1, 0, 0]),
    (8, 3, 2, 2, [2, 1, 1, 2]),
    (4, 3, 1, 2, [0, 0, 0, 0]),      # a window larger than the input: an empty output
])
def test_ceil_mode_shapes_equal_what_onnxruntime_and_the_kernel_compute(
        op, backend, size, kernel, strides, dilations, pads):
    attrs = dict(kernel_shape=[kernel] * 2, strides=[strides] * 2, dilations=[dilations] * 2,
                 pads=pads, ceil_mode=1)
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node(op, ["r"], ["y"], **attrs)],
                       [("x", [2, 3, size, size + 1])], [("r", _unknown(4)), ("y", _unknown(4))],
                       opset=19)                      # AveragePool's dilations: opset 19
    x = np.random.default_rng(size).standard_normal((2, 3, size, size + 1)).astype(np.float32)
    want = ort_outputs(model, {"x": x})[1].shape
    assert import_model(model).values["y"].shape == want
    _check(model, {"x": x}, backend)


# ---- item 13: MaxPool with its Indices output -------------------------------------------------

INDICES = [
    ("1d-pads", [1, 2, 3], dict(kernel_shape=[2], pads=[1, 1])),
    ("2d-pads-strides", [2, 2, 5, 4], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                           strides=[2, 2])),
    ("2d-column-major", [2, 2, 5, 4], dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                                           strides=[2, 1], storage_order=1)),
    ("2d-same-upper", [1, 2, 5, 4], dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER")),
    ("2d-dilated-ceil", [1, 2, 7, 6], dict(kernel_shape=[2, 2], dilations=[2, 2],
                                           strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ("3d", [1, 2, 4, 3, 5], dict(kernel_shape=[2, 2, 2], pads=[1, 0, 1, 0, 1, 1],
                                 storage_order=1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("label, shape, attrs", INDICES, ids=[c[0] for c in INDICES])
@pytest.mark.parametrize("values", ["distinct", "ties"])
def test_max_pool_with_indices_follows_onnxruntime(backend, label, shape, attrs, values):
    rank = len(shape)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)],
                       [("x", shape)], [("y", _unknown(rank)),
                                        ("i", _unknown(rank), TensorProto.INT64)])
    rng = np.random.default_rng(rank)
    x = (rng.standard_normal(shape) if values == "distinct"
         else rng.integers(0, 2, shape)).astype(np.float32)
    _check(model, {"x": x}, backend, exact=True)


def test_max_pool_indices_are_flat_over_batch_and_channels():
    # onnx.reference numbers ties per channel; onnxruntime (and eqsat-fuse) over the tensor
    model = make_model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])],
                       [("x", [1, 2, 3, 3])], [("y", _unknown(4)),
                                               ("i", _unknown(4), TensorProto.INT64)])
    got = ef.compile(model).run({"x": np.ones((1, 2, 3, 3), np.float32)})["i"]
    np.testing.assert_array_equal(got[0, :, 0, 0], [0, 9])


# ---- item 14: a graph input that is also a graph output ----------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [17, 21])
def test_an_input_that_is_also_an_output_with_unknown_dims_keeps_its_shape(backend, opset):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 3])],
                       [("x", ["a", "b"]), ("y", ["a", "b"])], opset=opset)
    graph = import_model(model)
    assert graph.values["x"].shape == (1, 3) and graph.values["y"].shape == (1, 3)
    compiled = _check(model, {"x": np.array([[-1, 0, 2]], np.float32)}, backend, exact=True)
    assert compiled.verify().ok


# ---- item 15: MaxPool over NaN -----------------------------------------------------------------

def _nan_input(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.3] = np.nan
    x[0, 0, :2, :2] = np.nan            # a window of NaN only
    x[0, 0, 0, 3] = np.nan              # NaN first in its window
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2],
         ceil_mode=1),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], ceil_mode=1),
])
def test_max_pool_skips_nan_as_documented(backend, attrs):
    # docs/reliability.md: a NaN cell counts as float32's lowest value, so NaN never wins
    # against a number and a window of NaN only gives lowest; onnxruntime's answer on the
    # input with NaN replaced by lowest is that rule's oracle (onnxruntime itself, on NaN,
    # depends on the window's position and on which of its kernels runs)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
                       [("x", [2, 3, 7, 6])], [("y", _unknown(4))])
    x = _nan_input((2, 3, 7, 6), len(attrs))
    want = ort_outputs(model, {"x": np.where(np.isnan(x), LOWEST, x)})[0]
    got = ef.compile(model, backend=backend).run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert not np.isnan(got).any() and got[0, 0, 0, 0] == LOWEST


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel, row, want", [
    (2, [np.nan, 1, 5, 2], [1, 5, 5]),
    (4, [9, np.nan, 1, 2], [9]),
])
def test_max_pool_over_nan_agrees_with_onnxruntime_where_it_ignores_nan(backend, kernel, row,
                                                                         want):
    # windows whose NaN onnxruntime ignores (elsewhere its answer depends on where the NaN
    # sits: [9, nan, 1] gives 1, [1, nan] sometimes nan; see docs/reliability.md)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, kernel])],
                       [("x", [1, 1, 1, len(row)])], [("y", _unknown(4))])
    x = np.array(row, np.float32).reshape(1, 1, 1, -1)
    got = ef.compile(model, backend=backend).run({"x": x})["y"]
    np.testing.assert_array_equal(got, ort_outputs(model, {"x": x})[0])
    np.testing.assert_array_equal(got.ravel(), want)


def test_max_pool_with_indices_skips_nan_too():
    model = make_model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[1, 3])],
                       [("x", [1, 1, 1, 4])], [("y", _unknown(4)),
                                               ("i", _unknown(4), TensorProto.INT64)])
    x = np.array([[[[np.nan, 1, np.nan, 0]]]], np.float32)
    for backend in BACKENDS:
        out = ef.compile(model, backend=backend).run({"x": x})
        np.testing.assert_array_equal(out["y"], [[[[1, 1]]]])
        np.testing.assert_array_equal(out["i"], [[[[1, 1]]]])
