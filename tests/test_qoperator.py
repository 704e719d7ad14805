"""QOperator-format models (`frontend.qoperator`): each QLinear operator, ONNX's and
onnxruntime's com.microsoft ones, is read as the DequantizeLinear -> float op -> QuantizeLinear
graph it is defined as, so it runs covered (the contractions as integer kernels), and its
quantized output matches onnxruntime's own kernel for it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import eqsat_fuse as ef

MS = "com.microsoft"
U8, I8 = TensorProto.UINT8, TensorProto.INT8


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(
        nodes, "qop", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid(MS, 1)])


def _scales(x=0.0517, y=0.1033, yz=128):
    return {"xs": np.float32(x), "xz": np.uint8(120), "ys": np.float32(y), "yz": np.uint8(yz)}


def _ort(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _unary(op, attrs=None, shape=(2, 6, 5, 5), out_shape=None, unit=False):
    inits = _scales(y=0.0041, yz=0) if unit else _scales()     # unit: outputs in [0, 1]
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **(attrs or {}))
    return _model([node], [("x", U8, list(shape))], [("y", U8, list(out_shape or shape))], inits)


def _binary(op, shape=(2, 6, 5, 5)):
    inits = {**_scales(), "bs": np.float32(0.0291), "bz": np.uint8(100)}
    node = helper.make_node(op, ["x", "xs", "xz", "b", "bs", "bz", "ys", "yz"], ["y"], domain=MS)
    return _model([node], [("x", U8, list(shape)), ("b", U8, list(shape))],
                  [("y", U8, list(shape))], inits)


def _concat():
    inits = {**_scales(), "bs": np.float32(0.0291), "bz": np.uint8(100)}
    node = helper.make_node("QLinearConcat", ["ys", "yz", "x", "xs", "xz", "b", "bs", "bz"],
                            ["y"], domain=MS, axis=1)
    return _model([node], [("x", U8, [2, 3, 4, 4]), ("b", U8, [2, 5, 4, 4])],
                  [("y", U8, [2, 8, 4, 4])], inits)


CASES = {
    "QLinearAdd": lambda: _binary("QLinearAdd"),
    "QLinearMul": lambda: _binary("QLinearMul"),
    "QLinearSigmoid": lambda: _unary("QLinearSigmoid", unit=True),
    "QLinearLeakyRelu": lambda: _unary("QLinearLeakyRelu", {"alpha": 0.1}),
    "QLinearSoftmax": lambda: _unary("QLinearSoftmax", {"axis": -1, "opset": 13}, unit=True),
    "QLinearGlobalAveragePool": lambda: _unary("QLinearGlobalAveragePool",
                                               out_shape=(2, 6, 1, 1)),
    "QLinearAveragePool": lambda: _unary("QLinearAveragePool",
                                         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                          "strides": [2, 2]}, out_shape=(2, 6, 3, 3)),
    "QLinearConcat": _concat,
}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_a_com_microsoft_qlinear_operator_runs_covered_and_matches_onnxruntime(op, backend,
                                                                               rng):
    model = CASES[op]()
    compiled = ef.compile(model, backend=backend)
    assert compiled.report.opaque_ops == [], compiled.report.summary()
    assert [n.op_type for n in model.graph.node] == [op]      # the caller's model as it was
    feeds = {i.name: rng.integers(0, 256, [d.dim_value for d in i.type.tensor_type.shape.dim]
                                  ).astype(np.uint8) for i in model.graph.input}
    got = np.asarray(compiled.run(feeds)["y"]).astype(np.int64)
    want = _ort(model, feeds).astype(np.int64)
    assert got.shape == want.shape
    # an element at a rounding tie may land one step away, nothing more
    diff = np.abs(got - want)
    assert diff.max() <= 1, diff.max()
    if op == "QLinearSoftmax":
        # onnxruntime's QLinearSoftmax approximates (a table of exponentials, a fixed-point
        # normalization: ~17% of the elements a step off); the definition, in float64:
        x = (feeds["x"].astype(np.float64) - 120) * np.float64(np.float32(0.0517))
        e = np.exp(x - x.max(-1, keepdims=True))
        want = np.clip(np.round(e / e.sum(-1, keepdims=True) / np.float64(np.float32(0.0041))),
                       0, 255)
        diff = np.abs(got - want)
    assert (diff > 0).mean() <= 0.01, (diff > 0).mean()


def _exact(acc, scale, ys, yz):
    q = np.round(acc.astype(np.float64) * scale / np.float64(ys)) + int(yz)
    return np.clip(q, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_qlinear_matmul_is_an_integer_contraction_with_the_exact_requantization(backend, rng):
    """QLinearMatMul of uint8 activations by constant int8 weights, per-column weight scales:
    one MatMulInteger kernel whose output is the exact value (integer sum, the requantization
    in float64, half to even), and within a step of onnxruntime's."""
    k, n = 48, 24
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    ws = rng.uniform(0.002, 0.02, n).astype(np.float32)
    inits = {**_scales(0.04, 0.5), "w": w, "ws": ws, "wz": np.zeros(n, np.int8)}
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                            ["y"])
    model = _model([node], [("x", U8, [3, 7, k])], [("y", U8, [3, 7, n])], inits)
    compiled = ef.compile(model, backend=backend)
    assert any("MatMulInteger" in k.ops for k in compiled.plan.kernels), \
        compiled.report.summary()
    x = rng.integers(0, 256, (3, 7, k)).astype(np.uint8)
    got = np.asarray(compiled.run({"x": x})["y"])
    acc = (x.astype(np.int64) - 120) @ w.astype(np.int64)
    scale = np.float64(np.float32(0.04)) * ws.astype(np.float64)
    np.testing.assert_array_equal(got, _exact(acc, scale, np.float32(0.5), 128))
    assert np.abs(got.astype(np.int64) - _ort(model, {"x": x}).astype(np.int64)).max() <= 1


@pytest.mark.parametrize("opset,per_channel,covered", [(17, True, True), (17, False, True),
                                                        (11, True, False)])
def test_qlinear_conv_with_an_int32_bias(opset, per_channel, covered, rng):
    """QLinearConv with its int32 bias (dequantized with x_scale * w_scale): a ConvInteger
    kernel matching onnxruntime; a per-channel one in a model older than opset 13, where
    DequantizeLinear has no axis, stays the opaque QLinearConv and still runs."""
    m, c = 6, 4
    w = rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8)
    ws = (rng.uniform(0.005, 0.02, m) if per_channel else np.array(0.01)).astype(np.float32)
    wz = np.zeros(ws.shape, np.int8)
    bias = rng.integers(-2000, 2000, m).astype(np.int32)
    inits = {**_scales(0.05, 0.3), "w": w, "ws": ws, "wz": wz, "B": bias}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"],
                            ["y"], pads=[1, 1, 1, 1], strides=[1, 1])
    model = _model([node], [("x", U8, [1, c, 9, 9])], [("y", U8, [1, m, 9, 9])], inits,
                   opset=opset)
    compiled = ef.compile(model, backend="numba")
    assert (compiled.report.opaque_ops == []) == covered, compiled.report.summary()
    assert any("ConvInteger" in k.ops for k in compiled.plan.kernels) == covered
    x = rng.integers(0, 256, (1, c, 9, 9)).astype(np.uint8)
    got = np.asarray(compiled.run({"x": x})["y"]).astype(np.int64)
    diff = np.abs(got - _ort(model, {"x": x}).astype(np.int64))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.01
