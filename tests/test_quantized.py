"""Quantized models end to end (issue 18): the project's float test models quantized by
onnxruntime's own tool (`tests/models/quantize_models.py`: QDQ, QOperator and dynamic),
compiled on both backends.

A QDQ model's QuantizeLinear and DequantizeLinear are covered operators: they fuse into the
kernels around them instead of running through `onnx.reference`, so the quantized model has
about as many kernels as its float model. Its outputs are compared with onnxruntime's
unoptimized run of the same file (ORT_DISABLE_ALL, the QDQ semantics op by op): a float
contraction between a DequantizeLinear and a QuantizeLinear leaves its summation order open, so
two correct runtimes may round a quantized tensor one step apart, and the difference is bounded
in steps of the output's own quantization scale.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import eqsat_fuse as ef
from eqsat_fuse.frontend.qoperator import FORMS as QOPERATOR_FORMS
from eqsat_fuse.lowering.lower import BACKENDS

MODELS = Path(__file__).resolve().parent / "models"
sys.path.insert(0, str(MODELS))
from quantize_models import MODELS as QUANTIZED, sample_inputs  # noqa: E402

# static quantization, as QDQ and as QOperator (QLinearConv...) models
QDQ = sorted(n for n, (_, form) in QUANTIZED.items() if form in ("qdq", "qop"))
DYNAMIC = sorted(n for n, (_, form) in QUANTIZED.items() if form == "dynq")
QUANTIZATION_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                    "ConvInteger", "QLinearConcat"} | {op for _, op in QOPERATOR_FORMS}
# a flipped rounding at one QuantizeLinear moves the output by a few of its steps at most
STEPS = 4


def _compute_kernels(compiled) -> int:
    return sum(k["kind"] != "alias" for k in compiled.report.as_dict()["kernels"])


def _output_steps(model: onnx.ModelProto) -> dict[str, float]:
    """Each output's quantization step: the scale of the DequantizeLinear that writes it."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    steps = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in \
                {o.name for o in model.graph.output}:
            steps[node.output[0]] = float(np.max(inits[node.input[1]]))
    return steps


def _unoptimized(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", QDQ)
def test_qdq_model_fuses_its_quantization_and_matches_onnxruntime(name, backend):
    path = MODELS / f"{name}.onnx"
    float_path = MODELS / f"{QUANTIZED[name][0]}.onnx"
    compiled = ef.compile(path, backend=backend)
    assert not QUANTIZATION_OPS & set(compiled.report.opaque_ops)
    float_compiled = ef.compile(float_path, backend="numpy")
    # an integer contraction reads its operand as integers, which some consumers then also
    # need as floats: a few kernels more than the float model, at most a fifth more; and an
    # attention whose scores and probabilities are quantized stays three kernels (MatMul,
    # Softmax, MatMul), where the float model's is one FusedAttention
    float_kernels = _compute_kernels(float_compiled) \
        + 2 * float_compiled.report.fusions.get("FusedAttention", 0)
    assert _compute_kernels(compiled) <= max(float_kernels + 3, 1.2 * float_kernels), \
        compiled.report.summary()
    model = onnx.load(str(path))
    steps = _output_steps(model)
    session = _unoptimized(path)
    names = [o.name for o in session.get_outputs()]
    for feed in sample_inputs(float_path, 4, seed=5):
        want = dict(zip(names, session.run(None, feed)))
        got = compiled.run(feed)
        for out in names:
            diff = float(np.max(np.abs(np.asarray(got[out]) - want[out])))
            assert diff <= STEPS * steps.get(out, 0.0) + 1e-6, (out, diff)
        if "logits" in want:
            assert np.argmax(got["logits"]) == np.argmax(want["logits"])


def _integer_kernels(compiled) -> int:
    return sum(bool({"ConvInteger", "MatMulInteger"} & set(k["ops"]))
               for k in compiled.report.as_dict()["kernels"])


@pytest.mark.parametrize("name", QDQ)
def test_qdq_contractions_run_as_integer_kernels(name):
    """DQ -> Conv / MatMul / Gemm -> Q with constant int8 weights becomes an integer
    contraction (rules/quant.egg) that the Numba backend runs itself (VNNI int8 GEMM, or the
    exact float32 depthwise kernel), nothing through the NumPy fallback. Extraction may keep a
    float contraction where its input is in memory as floats anyway (a residual's), so at least
    four in five of them are integer."""
    from eqsat_fuse.backends.numba.int8_gemm import AVAILABLE
    from eqsat_fuse.checking.quantized import find_contractions

    path = MODELS / f"{name}.onnx"
    compiled = ef.compile(path, backend="numba")
    contractions = len(find_contractions(onnx.load(str(path))))
    assert contractions > 0
    assert _integer_kernels(compiled) >= 0.8 * contractions, compiled.report.summary()
    if AVAILABLE:
        assert compiled.report.as_dict()["backend_report"]["fallback_kernels"] == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", QDQ)
def test_quantized_outputs_equal_the_exact_requantization(name, backend):
    """Every quantized output of a QDQ contraction that runs as an integer kernel equals its
    exact value bit for bit (integer sums, the requantization in float64, half to even:
    `checking.quantized`); one that extraction keeps a float contraction may round an element
    whose exact quotient lies within its float32 rounding of a tie the other way, by one step."""
    from eqsat_fuse.checking.quantized import exactness, find_contractions

    path = MODELS / f"{name}.onnx"
    float_path = MODELS / f"{QUANTIZED[name][0]}.onnx"
    found = exactness(onnx.load(str(path)), lambda m: ef.compile(m, backend=backend),
                      sample_inputs(float_path, 2, seed=5))
    assert found.elements > 10_000
    assert found.off_tie == 0 and found.max_steps <= 1, found
    contractions = len(find_contractions(onnx.load(str(path))))
    if _integer_kernels(ef.compile(path, backend=backend)) >= contractions:
        assert found.differing == 0, found
    else:
        assert found.differing <= 1e-4 * found.elements, found


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamically_quantized_model_compiles_and_matches_onnxruntime(name):
    """Dynamic quantization: MatMulInteger and ConvInteger are covered (exact int32 sums),
    DynamicQuantizeLinear is the arithmetic it stands for (ReduceMax, ReduceMin, QuantizeLinear):
    nothing of it runs through `onnx.reference`, and the outputs match onnxruntime's."""
    path = MODELS / f"{name}.onnx"
    compiled = ef.compile(path, backend="numba")
    assert not {"MatMulInteger", "ConvInteger", "DynamicQuantizeLinear"} & \
        set(compiled.report.opaque_ops)
    session = _unoptimized(path)
    names = [o.name for o in session.get_outputs()]
    for feed in sample_inputs(MODELS / f"{QUANTIZED[name][0]}.onnx", 2, seed=5):
        want = session.run(None, feed)
        got = compiled.run(feed)
        for out, w in zip(names, want):
            np.testing.assert_allclose(np.asarray(got[out]), w, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("out", ["uint8", "int8", "int16"])
def test_a_contraction_that_writes_integers_is_one_numba_kernel(out):
    """Gemm + QuantizeLinear writes its quantized integers itself on the Numba backend (the
    product in a float32 workspace), not through the NumPy fallback, and equals the NumPy
    backend bit for bit."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    zero = np.array(3, out)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
         helper.make_node("QuantizeLinear", ["g", "s", "z"], ["q"])],
        "gq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
        [helper.make_tensor_value_info("q", helper.np_dtype_to_tensor_dtype(zero.dtype),
                                       [16, 24])],
        initializer=[numpy_helper.from_array(rng.standard_normal((32, 24)).astype(np.float32),
                                             "w"),
                     numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b"),
                     numpy_helper.from_array(np.array(0.03, np.float32), "s"),
                     numpy_helper.from_array(zero, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = rng.standard_normal((16, 32)).astype(np.float32) * 3
    numba = ef.compile(model, backend="numba")
    fallbacks = numba.report.as_dict()["backend_report"]["fallback_kernels"]
    assert fallbacks == [] and [k["ops"] for k in numba.report.as_dict()["kernels"]] == \
        [["Gemm", "QuantizeLinear"]]
    got, want = numba.run({"x": x})["q"], ef.compile(model, backend="numpy").run({"x": x})["q"]
    assert got.dtype == np.dtype(out)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 10                 # the values spread over many steps


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_contractions_are_exact_past_float32s_range(backend):
    """MatMulInteger's and ConvInteger's int32 sums are exact, with per-row / per-channel zero
    points, also where a float32 sum of the same products would round (sums past 2^24)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    k = 4096
    a = rng.integers(0, 256, (3, k)).astype(np.uint8)
    a[0] = 255                                   # 255 * 127 * 4096 > 2^27: float32 rounds
    b = rng.integers(-128, 128, (k, 5)).astype(np.int8)
    b[:, 0] = 127
    za = np.array([0, 7, 250], np.uint8)         # per row of a
    zb = np.array([0, 1, -1, 5, -128], np.int8)  # per column of b
    w = rng.integers(-128, 128, (4, 2, 3, 3)).astype(np.int8)
    zw = np.array([0, 3, -3, 100], np.int8)      # per output channel
    x = rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["m"]),
         helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["c"], pads=[1, 1, 1, 1])],
        "int", [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, k]),
                helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("m", TensorProto.INT32, [3, 5]),
         helper.make_tensor_value_info("c", TensorProto.INT32, [1, 4, 5, 5])],
        initializer=[numpy_helper.from_array(v, n) for n, v in
                     (("b", b), ("za", za), ("zb", zb), ("w", w), ("zw", zw),
                      ("zx", np.array(131, np.uint8)))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    compiled = ef.compile(model, backend=backend)
    assert compiled.report.opaque_ops == []
    got = compiled.run({"a": a, "x": x})
    want_m = (a.astype(np.int64) - za.astype(np.int64)[:, None]) @ \
        (b.astype(np.int64) - zb.astype(np.int64))
    np.testing.assert_array_equal(got["m"], want_m.astype(np.int32))
    assert abs(float(want_m[0, 0])) > 2 ** 24
    padded = np.pad(x.astype(np.int64) - 131, [(0, 0), (0, 0), (1, 1), (1, 1)])
    taps = w.astype(np.int64) - zw.astype(np.int64)[:, None, None, None]
    want_c = np.zeros((1, 4, 5, 5), np.int64)
    for i in range(5):
        for j in range(5):
            want_c[0, :, i, j] = np.tensordot(taps, padded[0, :, i:i + 3, j:j + 3], 3)
    np.testing.assert_array_equal(got["c"], want_c.astype(np.int32))
    # (onnxruntime's kernels take one zero point per tensor only: the oracle is int64 NumPy)


def test_per_axis_quantization_is_one_broadcast_operator():
    """A per-axis QuantizeLinear (axis 1 of NCHW) without a zero point is covered: the scale
    becomes a [C, 1, 1] broadcast and the zero point zeros of uint8, on both backends."""
    from onnx import TensorProto, helper

    scale = numpy_helper.from_array(np.array([0.5, 0.25, 0.125], np.float32), "scale")
    zero = numpy_helper.from_array(np.array([0, 10, 250], np.uint8), "zero")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale"], ["q"], axis=1),
         helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1)],
        "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [1, 3, 2, 2]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 2, 2])],
        initializer=[scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.array([-1.0, 0.3, 0.75, 1.25, 7.0, 200.0, np.nan, 0.0625, 1.0, 31.9, 32.0, -3.0],
                 np.float32).reshape(1, 3, 2, 2)
    with np.errstate(invalid="ignore"):
        want = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
    for backend in BACKENDS:
        compiled = ef.compile(model, backend=backend)
        assert compiled.report.opaque_ops == []
        got = compiled.run({"x": x})
        assert got["q"].dtype == np.uint8
        # NaN saturates to 0 here, where onnx.reference's cast of NaN is undefined
        finite = ~np.isnan(x)
        np.testing.assert_array_equal(got["q"][finite], want[0][finite])
        np.testing.assert_array_equal(got["y"][finite], want[1][finite])
        assert got["q"][~finite].tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_requantization_is_exact_where_float32_would_round_a_near_tie_the_wrong_way(backend):
    """An integer kernel requantizes in float32 and redoes, in float64, each block of columns
    holding a value near a rounding tie (`backends/numba/requantize.py`). With these scales,
    250 * sx * sw / sy = 73.49999855: float32 makes it 73.5, which rounds to 74; the exact
    value is 73. Every output equals the float64 requantization."""
    from onnx import TensorProto, helper

    sx, sw, sy = np.float32(0.079181425), np.float32(0.09418808), np.float32(0.025367165)
    x = np.arange(256, dtype=np.uint8).reshape(4, 64)
    t64 = x.astype(np.float64) * (np.float64(sx) * np.float64(sw)) / np.float64(sy)
    naive = np.rint(x.astype(np.float32) * np.float32(np.float64(sx) * sw / np.float64(sy)))
    assert (naive != np.rint(t64)).any()                # the case this test is about
    inits = {"sx": sx, "zx": np.uint8(0), "w": np.eye(64, dtype=np.int8), "sw": sw,
             "zw": np.int8(0), "sy": sy, "zy": np.uint8(0)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
             helper.make_node("MatMul", ["xf", "wf"], ["yf"]),
             helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"])]
    graph = helper.make_graph(
        nodes, "near-tie", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 64])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = ef.compile(model, backend=backend)
    assert any("MatMulInteger" in k.ops for k in compiled.plan.kernels)
    got = np.asarray(compiled.run({"x": x})["y"])
    np.testing.assert_array_equal(got, np.clip(np.rint(t64), 0, 255).astype(np.uint8))


@pytest.mark.parametrize("weight_scale, integer", [(2.0 ** -9, True), (2.0 ** 40, False)])
def test_a_qdq_conv_becomes_integer_only_for_scales_whose_float32_conv_cannot_overflow(
        weight_scale, integer):
    """DQ -> Conv with scales within quant-scale's 2^-30..2^30 becomes an integer contraction.
    Past them a float32 product of two dequantized values may overflow where the integer sum
    does not (the rule checker found that at 2^60), so the float Conv is kept; both match
    onnxruntime."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (8, 4, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "wq"),
             numpy_helper.from_array(np.full(8, weight_scale, np.float32), "sw"),
             numpy_helper.from_array(np.zeros(8, np.int8), "zw"),
             numpy_helper.from_array(np.array(2.0 ** -20, np.float32), "sx"),
             numpy_helper.from_array(np.array(128, np.uint8), "zx")]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
         helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=0),
         helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "qdq_conv", [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    compiled = ef.compile(model, backend="numpy")
    assert (_integer_kernels(compiled) == 1) is integer, compiled.report.summary()
    xq = rng.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"xq": xq})[0]
    np.testing.assert_allclose(compiled.run({"xq": xq})["y"], want, rtol=1e-5)
