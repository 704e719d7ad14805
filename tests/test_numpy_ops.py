"""eqsat_fuse.backends.numpy.ops checked against onnxruntime, one single-node opset-21 model per
case."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

from eqsat_fuse.backends.numpy import ops as F

ort.set_default_logger_severity(3)  # ONNX shape inference disagrees with ORT on ceil-mode pools

OPSET = 21
HYP = settings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

TOL = {
    np.dtype(np.float16): dict(rtol=2e-3, atol=2e-3),
    np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
    np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12),
}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def ort_run(op_type, inputs, attrs=None, n_outputs=1):
    """Build a one-node opset-21 model with `inputs` as graph inputs (None = omitted) and run it."""
    names, vinfos, feeds = [], [], {}
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        a = np.asarray(a)
        name = f"in{i}"
        names.append(name)
        vinfos.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        feeds[name] = a
    while names and names[-1] == "":
        names.pop()
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], "g", vinfos, [onnx.ValueInfoProto(name=o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def ref_run(op_type, inputs, attrs=None, n_outputs=1):
    """Same one-node model through onnx.reference, for dtypes/attributes onnxruntime lacks."""
    from onnx.reference import ReferenceEvaluator

    names, vinfos, feeds = [], [], {}
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        a = np.asarray(a)
        names.append(f"in{i}")
        vinfos.append(helper.make_tensor_value_info(
            f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        feeds[f"in{i}"] = a
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], "g", vinfos, [onnx.ValueInfoProto(name=o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    return ReferenceEvaluator(model).run(None, feeds)


def frozen(*arrays):
    """Read-only copies, so an implementation writing into its inputs fails loudly."""
    out = []
    for a in arrays:
        if a is None:
            out.append(None)
            continue
        a = np.array(a)
        a.flags.writeable = False
        out.append(a)
    return out


def assert_same(got, want, exact=False, **tol):
    """Same dtype and shape; then exact equality or the dtype's tolerance."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != onnxruntime {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != onnxruntime {want.shape}"
    if exact or not np.issubdtype(want.dtype, np.floating):
        np.testing.assert_array_equal(got, want)
    else:
        tol = {k: v for k, v in tol.items() if v is not None}
        np.testing.assert_allclose(got, want, **{**TOL[want.dtype], **tol})


def check(op_type, fn, inputs, attrs=None, kwargs=None, exact=False, runner=ort_run, **tol):
    """Compare fn(*inputs, **kwargs) with onnxruntime's op_type(inputs; attrs)."""
    inputs = frozen(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / invalid-value warnings in the reference
        got = fn(*inputs, **(kwargs or {}))
    want = runner(op_type, inputs, attrs)[0]
    assert_same(got, want, exact=exact, **tol)
    return got


def dyadic(rng, shape, dtype=np.float32):
    """Values k/4, k in [-4, 4]: dot products of these are exact in float32."""
    return (rng.integers(-4, 5, size=shape) / 4).astype(dtype)


def normal(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


seeds = st.integers(0, 2**32 - 1)


# --------------------------------------------------------------------------
# elementwise
# --------------------------------------------------------------------------

FLOATS = [np.float16, np.float32, np.float64]

UNARY = [
    # op_type, function, onnx attrs, kwargs, dtypes, input domain
    ("Relu", F.relu, {}, {}, FLOATS + [np.int32, np.int8], "any"),
    ("LeakyRelu", F.leaky_relu, dict(alpha=0.1), dict(alpha=0.1), [np.float16, np.float32], "any"),
    ("Sigmoid", F.sigmoid, {}, {}, FLOATS, "wide"),
    ("HardSigmoid", F.hard_sigmoid, dict(alpha=0.3, beta=0.4), dict(alpha=0.3, beta=0.4),
     [np.float16, np.float32], "any"),
    ("HardSwish", F.hard_swish, {}, {}, [np.float16, np.float32], "any"),
    ("Tanh", F.tanh, {}, {}, FLOATS, "wide"),
    ("Erf", F.erf, {}, {}, [np.float16, np.float32], "any"),
    ("Gelu", F.gelu, dict(approximate="none"), dict(approximate="none"),
     [np.float16, np.float32], "any"),
    ("Gelu", F.gelu, dict(approximate="tanh"), dict(approximate="tanh"),
     [np.float16, np.float32], "any"),
    ("Sqrt", F.sqrt, {}, {}, FLOATS, "pos"),
    ("Exp", F.exp, {}, {}, FLOATS, "any"),
    ("Log", F.log, {}, {}, FLOATS, "pos"),
    ("Neg", F.neg, {}, {}, FLOATS + [np.int32, np.int64], "any"),
    ("Abs", F.abs_, {}, {}, FLOATS + [np.int8, np.int32, np.int64], "any"),
    ("Reciprocal", F.reciprocal, {}, {}, FLOATS, "nonzero"),
    ("Identity", F.identity, {}, {}, FLOATS + [np.int64, np.bool_], "any"),
]


def unary_input(rng, dtype, domain, shape=(3, 4, 5)):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100, 100, size=shape).astype(dtype)
    if domain == "wide":
        x = rng.standard_normal(shape) * 30
        x.flat[:4] = [-1000.0, 1000.0, -80.0, 80.0]
    elif domain == "pos":
        x = rng.uniform(0.01, 10, size=shape)
    elif domain == "nonzero":
        x = rng.uniform(0.1, 4, size=shape) * rng.choice([-1, 1], size=shape)
    else:
        x = rng.standard_normal(shape) * 3
    return x.astype(dtype)


@pytest.mark.parametrize(
    "op_type,fn,attrs,kwargs,dtype,domain",
    [pytest.param(o, f, a, k, d, dom, id=f"{o}-{a.get('approximate', '')}-{np.dtype(d).name}")
     for o, f, a, k, ds, dom in UNARY for d in ds])


def test_unary(op_type, fn, attrs, kwargs, dtype, domain):
    rng = np.random.default_rng(0)
    x = unary_input(rng, dtype, domain)
    check(op_type, fn, [x], attrs, kwargs)


def test_dropout_and_identity_table():
    assert F.OPS["Dropout"] is F.identity
    assert F.OPS["Identity"] is F.identity
    x = np.arange(6.0, dtype=np.float32)
    y = F.OPS["Dropout"](x)
    assert np.shares_memory(x, y) and y is not x


def test_sigmoid_is_stable():
    x = np.array([-1e4, -100, -30, 0, 30, 100, 1e4], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = F.sigmoid(x)
    assert y.dtype == np.float32
    assert np.all(np.isfinite(y)) and y[0] == 0 and y[-1] == 1 and y[3] == 0.5


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("bounds", [(None, None), (-1, None), (None, 2), (-1, 2), (3, -2)])
def test_clip(dtype, bounds):
    rng = np.random.default_rng(1)
    x = unary_input(rng, dtype, "any")
    lo, hi = (None if b is None else np.array(b, dtype=dtype) for b in bounds)
    check("Clip", F.clip, [x, lo, hi])


def test_clip_nan_passes_through():
    x = np.array([np.nan, -5, 5], np.float32)
    check("Clip", F.clip, [x, np.array(-1, np.float32), np.array(1, np.float32)])


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       op=st.sampled_from(["Add", "Sub", "Mul", "Div"]),
       dtype=st.sampled_from([np.float32, np.int32, np.int64, np.float16]),
       seed=seeds)


@HYP
def test_binary_broadcast(shapes, op, dtype, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    if np.issubdtype(dtype, np.integer):
        a = rng.integers(-50, 50, size=sa).astype(dtype)
        b = rng.integers(-9, 10, size=sb).astype(dtype)
        if op == "Div":
            b[b == 0] = 3
    else:
        a = normal(rng, sa, dtype, 4)
        b = normal(rng, sb, dtype, 4)
        if op == "Div":
            b = np.where(np.abs(b) < 0.1, dtype(0.5), b)
    fn = {"Add": F.add, "Sub": F.sub, "Mul": F.mul, "Div": F.div}[op]
    check(op, fn, [a, b], exact=(dtype != np.float16))


def test_no_accidental_upcast():
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    h = x.astype(np.float16)
    for fn in (F.add, F.sub, F.mul, F.div, F.pow):
        assert fn(x, np.float64(2.0)).dtype == np.float32
        assert fn(x, np.array(2.0)).dtype == np.float32
        assert fn(h, np.array(2.0, np.float32)).dtype == np.float16
    assert F.pow(x, np.array([1, 2, 3, 2], np.int64)).dtype == np.float32
    assert F.reduce_sum(x.astype(np.int32), axes=(1,), keepdims=False).dtype == np.int32
    assert F.reduce_mean(x.astype(np.int32), axes=(1,), keepdims=False).dtype == np.int32
    y = F.gemm(x, x.T, np.float64(1.0), alpha=0.5, beta=0.5, trans_a=0, trans_b=0)
    assert y.dtype == np.float32
    assert F.cast(x, to=np.dtype("int64")).dtype == np.int64


def test_div_int_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, -1], np.int32)
    b = np.array([2, 2, -2, -2, 3, 4], np.int32)
    got = check("Div", F.div, [a, b])
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 0, 0])


@pytest.mark.parametrize("dx,dy", [(np.float32, np.float32), (np.float32, np.int64),
                                   (np.float32, np.int32), (np.int32, np.int32),
                                   (np.int64, np.int64), (np.int64, np.float32),
                                   (np.float16, np.float16), (np.float64, np.float64),
                                   (np.float32, np.float64)])


def test_pow(dx, dy):
    rng = np.random.default_rng(2)
    if np.issubdtype(dx, np.integer):
        x = rng.integers(-6, 7, size=(4, 5)).astype(dx)
        x[x == 0] = 2
    else:
        x = rng.uniform(0.1, 3, size=(4, 5)).astype(dx)
    if np.issubdtype(dy, np.integer):
        y = rng.integers(-2 if np.issubdtype(dx, np.integer) else -3, 5, size=(5,)).astype(dy)
    else:
        y = rng.uniform(-2, 2.5, size=(5,)).astype(dy)
    check("Pow", F.pow, [x, y])


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3),
       dtype=st.sampled_from([np.float32, np.int64]), seed=seeds)


@HYP
def test_where(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    sc, sx, sy = shapes.input_shapes
    c = rng.integers(0, 2, size=sc).astype(bool)
    x = rng.integers(-9, 9, size=sx).astype(dtype)
    y = rng.integers(-9, 9, size=sy).astype(dtype)
    check("Where", F.where, [c, x, y])


CASTS = [(np.float32, "int32"), (np.float32, "int64"), (np.float32, "bool"),
         (np.float32, "float16"), (np.float32, "float64"), (np.float32, "uint8"),
         (np.float32, "int8"), (np.int64, "float32"),
         (np.int32, "int64"), (np.int64, "int32"), (np.bool_, "float32"), (np.float16, "float32"),
         (np.float64, "float32"), (np.int64, "bool"), (np.bool_, "int64")]


@pytest.mark.parametrize("src,to", CASTS)
def test_cast(src, to):
    rng = np.random.default_rng(3)
    if src == np.bool_:
        x = rng.integers(0, 2, size=(20,)).astype(bool)
    elif np.issubdtype(src, np.integer):
        x = rng.integers(-1000, 1000, size=(20,)).astype(src)
        x[:3] = [0, 1, -1]
    elif to in ("uint8",):
        x = rng.uniform(0, 255, size=(20,)).astype(src)
    elif to in ("int8",):
        x = rng.uniform(-127, 127, size=(20,)).astype(src)
    else:
        x = (rng.standard_normal(20) * 50).astype(src)
        x[:6] = [3.9, -3.9, 0.5, -0.5, 0.0, 65519.0]
    to_onnx = helper.np_dtype_to_tensor_dtype(np.dtype(to))
    check("Cast", F.cast, [x], dict(to=to_onnx), dict(to=to), exact=True)


def test_cast_nan_inf_to_int_and_bool():
    x = np.array([np.nan, np.inf, -np.inf, 1e20, -0.0, 0.25], np.float32)
    check("Cast", F.cast, [x], dict(to=onnx.TensorProto.INT64), dict(to="int64"))
    check("Cast", F.cast, [x], dict(to=onnx.TensorProto.INT32), dict(to="int32"))
    check("Cast", F.cast, [x], dict(to=onnx.TensorProto.BOOL), dict(to="bool"))


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_batch_normalization(shape, dtype):
    rng = np.random.default_rng(4)
    C = shape[1]
    x = normal(rng, shape, dtype)
    scale, bias, mean = (normal(rng, (C,), dtype) for _ in range(3))
    var = rng.uniform(0.1, 2, size=(C,)).astype(dtype)
    eps = float(np.float32(1e-3))  # ONNX float attributes are float32 (the importer's value)
    check("BatchNormalization", F.batch_normalization, [x, scale, bias, mean, var],
          dict(epsilon=eps), dict(epsilon=eps), rtol=1e-4 if dtype == np.float32 else None)


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

@st.composite
def conv_cases(draw, nd):
    depthwise = draw(st.booleans())
    if depthwise:
        G, Cg, Mg = draw(st.integers(2, 6)), 1, draw(st.integers(1, 2))
    else:
        G, Cg, Mg = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    maxk, maxn = (3, 9) if nd < 3 else (2, 5)
    ks = [draw(st.integers(1, maxk)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    spatial = []
    for i in range(nd):
        eff = (ks[i] - 1) * dil[i] + 1
        lo = max(1, eff - pads[i] - pads[nd + i])
        spatial.append(draw(st.integers(lo, max(lo, maxn))))
    N = draw(st.integers(1, 2))
    return dict(N=N, G=G, Cg=Cg, Mg=Mg, ks=ks, strides=strides, dil=dil, pads=pads,
                spatial=spatial, bias=draw(st.booleans()), seed=draw(seeds))


def run_conv_case(c, dtype=np.float32, runner=ort_run):
    rng = np.random.default_rng(c["seed"])
    x = dyadic(rng, (c["N"], c["G"] * c["Cg"], *c["spatial"]), dtype)
    w = dyadic(rng, (c["G"] * c["Mg"], c["Cg"], *c["ks"]), dtype)
    b = dyadic(rng, (c["G"] * c["Mg"],), dtype) if c["bias"] else None
    kw = dict(pads=c["pads"], strides=c["strides"], dilations=c["dil"], group=c["G"])
    check("Conv", F.conv, [x, w, b], dict(kernel_shape=c["ks"], **kw), kw, runner=runner)


@given(c=conv_cases(2))
@HYP
def test_conv2d(c):
    run_conv_case(c)


@given(c=conv_cases(1))
@settings(max_examples=15, deadline=None)
def test_conv1d(c):
    run_conv_case(c)


@given(c=conv_cases(3))
@settings(max_examples=15, deadline=None)
def test_conv3d(c):
    run_conv_case(c)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_other_float_dtypes(dtype):
    c = dict(N=1, G=2, Cg=3, Mg=2, ks=[3, 3], strides=[2, 1], dil=[1, 2], pads=[1, 0, 1, 2],
             spatial=[7, 8], bias=True, seed=5)
    # onnxruntime has no float64 Conv on CPU: use the ONNX reference evaluator there
    run_conv_case(c, dtype, ort_run if dtype == np.float16 else ref_run)


def test_conv_normal_data_resnet_block():
    rng = np.random.default_rng(6)
    x = normal(rng, (1, 16, 14, 14))
    w = normal(rng, (16, 16, 3, 3), scale=0.1)
    b = normal(rng, (16,))
    kw = dict(pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1)
    check("Conv", F.conv, [x, w, b], kw, kw, rtol=1e-4, atol=1e-5)
    kw = dict(pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1], group=1)  # 1x1 fast path
    w1 = normal(rng, (8, 16, 1, 1))
    check("Conv", F.conv, [x, w1, None], kw, kw, rtol=1e-4, atol=1e-5)


@st.composite
def conv_transpose_cases(draw, nd):
    G, Cg, Mg = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    maxk, maxn = (3, 6) if nd < 3 else (2, 4)
    ks = [draw(st.integers(1, maxk)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    spatial = [draw(st.integers(1, maxn)) for _ in range(nd)]
    opad = [draw(st.integers(0, s - 1)) for s in strides]
    pads = [0] * (2 * nd)
    for i in range(nd):
        eff = (ks[i] - 1) * dil[i] + 1
        full = strides[i] * (spatial[i] - 1) + eff + opad[i]
        pads[i] = draw(st.integers(0, max(0, min(eff - 1, full - 1))))
        pads[nd + i] = draw(st.integers(0, max(0, min(eff - 1, full - 1 - pads[i]))))
    return dict(N=draw(st.integers(1, 2)), G=G, Cg=Cg, Mg=Mg, ks=ks, strides=strides, dil=dil,
                pads=pads, opad=opad, spatial=spatial, bias=draw(st.booleans()), seed=draw(seeds))


def run_conv_transpose_case(c, dtype=np.float32):
    rng = np.random.default_rng(c["seed"])
    x = dyadic(rng, (c["N"], c["G"] * c["Cg"], *c["spatial"]), dtype)
    w = dyadic(rng, (c["G"] * c["Cg"], c["Mg"], *c["ks"]), dtype)
    b = dyadic(rng, (c["G"] * c["Mg"],), dtype) if c["bias"] else None
    kw = dict(pads=c["pads"], strides=c["strides"], dilations=c["dil"], group=c["G"],
              output_padding=c["opad"])
    check("ConvTranspose", F.conv_transpose, [x, w, b], dict(kernel_shape=c["ks"], **kw), kw)


@given(c=st.integers(1, 3).flatmap(conv_transpose_cases))
@HYP
def test_conv_transpose(c):
    run_conv_transpose_case(c)


def test_conv_transpose_negative_pads_from_output_shape():
    # output_shape one larger than natural: the importer resolves it to pads [0, -1]
    rng = np.random.default_rng(20)
    x = dyadic(rng, (1, 2, 3))
    w = dyadic(rng, (2, 3, 2))
    b = dyadic(rng, (3,))
    kw = dict(strides=[2], dilations=[1], group=1, output_padding=[0])
    check("ConvTranspose", F.conv_transpose, [x, w, b], dict(output_shape=[7], **kw),
          dict(pads=[0, -1], **kw))


def test_conv_transpose_float16():
    c = dict(N=1, G=2, Cg=2, Mg=3, ks=[3, 2], strides=[2, 3], dil=[1, 2], pads=[1, 0, 1, 1],
             opad=[1, 2], spatial=[4, 3], bias=True, seed=7)
    run_conv_transpose_case(c, np.float16)


# --------------------------------------------------------------------------
# matmul / gemm
# --------------------------------------------------------------------------

MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)),
                 ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)), ((2, 1, 2, 3), (5, 3, 4)),
                 ((4,), (2, 4, 3)), ((2, 2, 3), (3,)), ((1, 0, 3), (3, 2))]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float16])
def test_matmul(sa, sb, dtype):
    rng = np.random.default_rng(9)
    a = dyadic(rng, sa, np.float32) * 4
    b = dyadic(rng, sb, np.float32) * 4
    check("MatMul", F.matmul, [a.astype(dtype), b.astype(dtype)])


def test_matmul_normal_data():
    rng = np.random.default_rng(10)
    check("MatMul", F.matmul, [normal(rng, (3, 17, 64)), normal(rng, (64, 33))],
          rtol=1e-4, atol=1e-5)


@given(M=st.integers(1, 5), K=st.integers(1, 5), N=st.integers(1, 5), ta=st.booleans(),
       tb=st.booleans(), alpha=st.sampled_from([1.0, 0.5, -2.0]),
       beta=st.sampled_from([1.0, 0.25, 0.0]),
       cshape=st.sampled_from(["none", "scalar", "1", "N", "M1", "MN", "1N"]),
       dtype=st.sampled_from([np.float32, np.float64, np.float16]), seed=seeds)


@HYP
def test_gemm(M, K, N, ta, tb, alpha, beta, cshape, dtype, seed):
    rng = np.random.default_rng(seed)
    a = dyadic(rng, (K, M) if ta else (M, K), dtype)
    b = dyadic(rng, (N, K) if tb else (K, N), dtype)
    cs = {"none": None, "scalar": (), "1": (1,), "N": (N,), "M1": (M, 1), "MN": (M, N),
          "1N": (1, N)}[cshape]
    c = None if cs is None else dyadic(rng, cs, dtype)
    attrs = dict(alpha=alpha, beta=beta, transA=int(ta), transB=int(tb))
    check("Gemm", F.gemm, [a, b, c], attrs, dict(alpha=alpha, beta=beta, trans_a=ta, trans_b=tb))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (2.0, -3.0)])
def test_gemm_int(dtype, alpha, beta):
    # onnxruntime has no integer Gemm kernel: compare with the ONNX reference evaluator
    rng = np.random.default_rng(19)
    a = rng.integers(-5, 5, size=(3, 4)).astype(dtype)
    b = rng.integers(-5, 5, size=(2, 4)).astype(dtype)
    c = rng.integers(-5, 5, size=(2,)).astype(dtype)
    check("Gemm", F.gemm, [a, b, c], dict(alpha=alpha, beta=beta, transB=1),
          dict(alpha=alpha, beta=beta, trans_a=False, trans_b=True), runner=ref_run)


def test_gemm_beta_zero_ignores_c():
    a = np.ones((2, 2), np.float32)
    c = np.array([np.nan, np.inf], np.float32)
    got = check("Gemm", F.gemm, [a, a, c], dict(beta=0.0),
                dict(alpha=1.0, beta=0.0, trans_a=False, trans_b=False))
    assert np.all(got == 2)


# --------------------------------------------------------------------------
# softmax, normalizations, reductions
# --------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_softmax(axis, dtype):
    rng = np.random.default_rng(11)
    x = normal(rng, (2, 3, 4, 5), dtype, 5)
    x.flat[0] = 80  # would overflow exp without max subtraction in float16/32
    check("Softmax", F.softmax, [x], dict(axis=axis), dict(axis=axis))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_normalization(axis, with_bias, dtype):
    rng = np.random.default_rng(12)
    shape = (2, 3, 4, 5)
    x = normal(rng, shape, dtype, 2) + dtype(1)
    norm_shape = shape[axis:]
    scale = normal(rng, norm_shape, dtype)
    bias = normal(rng, norm_shape, dtype) if with_bias else None
    got = check("LayerNormalization", F.layer_normalization, [x, scale, bias],
                dict(axis=axis, epsilon=1e-5), dict(axis=axis, epsilon=1e-5),
                rtol=1e-4 if dtype == np.float32 else None,
                atol=1e-5 if dtype == np.float32 else None)
    assert got.dtype == dtype


def _reduce_call(fn):
    return lambda x, axes, *, keepdims: fn(x, axes=tuple(int(a) for a in axes), keepdims=keepdims)


@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), data=st.data(),
       keepdims=st.booleans(), op=st.sampled_from(["ReduceMean", "ReduceSum"]),
       dtype=st.sampled_from([np.float32, np.int32, np.int64]), seed=seeds)


@HYP
def test_reduce(shape, data, keepdims, op, dtype, seed):
    rng = np.random.default_rng(seed)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    x = (rng.integers(-20, 20, size=shape)).astype(dtype)
    if dtype == np.float32:
        x = x / np.float32(8)
    fn = F.reduce_mean if op == "ReduceMean" else F.reduce_sum
    got = check(op, _reduce_call(fn), [x, np.array(axes, np.int64)], dict(keepdims=int(keepdims)),
                dict(keepdims=keepdims))
    assert got.dtype == dtype


@pytest.mark.parametrize("op,fn", [("ReduceMean", F.reduce_mean), ("ReduceSum", F.reduce_sum)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32])
def test_reduce_fixed(op, fn, dtype):
    rng = np.random.default_rng(13)
    x = (rng.integers(-20, 20, size=(3, 4, 5))).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        x = (x / dtype(8)).astype(dtype)
    check(op, _reduce_call(fn), [x, np.array([0, 2], np.int64)], dict(keepdims=0), dict(keepdims=0))
    check(op, _reduce_call(fn), [x, np.array([1], np.int64)], dict(keepdims=1), dict(keepdims=1))


def test_reduce_int_mean_truncates():
    x = np.array([[1, 2], [-3, -4], [5, 5]], np.int32)
    got = check("ReduceMean", _reduce_call(F.reduce_mean), [x, np.array([1], np.int64)],
                dict(keepdims=0), dict(keepdims=0))
    np.testing.assert_array_equal(got, [1, -3, 5])


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------

@st.composite
def pool_cases(draw):
    nd = draw(st.integers(1, 3))
    maxn = 9 if nd < 3 else 5
    ks = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, k - 1)) for k in ks] + [draw(st.integers(0, k - 1)) for k in ks]
    spatial = []
    for i in range(nd):
        eff = (ks[i] - 1) * dil[i] + 1
        lo = max(1, eff - pads[i] - pads[nd + i])
        spatial.append(draw(st.integers(lo, max(lo, maxn))))
    return dict(nd=nd, ks=ks, strides=strides, dil=dil, pads=pads, spatial=spatial,
                N=draw(st.integers(1, 2)), C=draw(st.integers(1, 3)),
                ceil=draw(st.sampled_from([0, 1])), cip=draw(st.sampled_from([0, 1])),
                seed=draw(seeds))


def _pool_input(c, dtype=np.float32):
    rng = np.random.default_rng(c["seed"])
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100, 100, size=(c["N"], c["C"], *c["spatial"])).astype(dtype)
    # all negative values: a padded zero winning a max would be caught
    return normal(rng, (c["N"], c["C"], *c["spatial"]), dtype) - dtype(10)


@given(c=pool_cases())
@HYP
def test_max_pool(c):
    x = _pool_input(c)
    kw = dict(kernel_shape=c["ks"], pads=c["pads"], strides=c["strides"], dilations=c["dil"],
              ceil_mode=c["ceil"])
    check("MaxPool", F.max_pool, [x], kw, kw, exact=True)


@given(c=pool_cases())
@HYP
def test_average_pool(c):
    x = _pool_input(c)
    kw = dict(kernel_shape=c["ks"], pads=c["pads"], strides=c["strides"], dilations=c["dil"],
              ceil_mode=c["ceil"], count_include_pad=c["cip"])
    check("AveragePool", F.average_pool, [x], kw, kw)


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.uint8, np.float64])
def test_max_pool_dtypes(dtype):
    c = dict(nd=2, ks=[3, 2], strides=[2, 2], dil=[1, 2], pads=[1, 1, 2, 0], spatial=[7, 6],
             N=1, C=2, ceil=1, cip=0, seed=14)
    x = _pool_input(c, dtype)
    kw = dict(kernel_shape=c["ks"], pads=c["pads"], strides=c["strides"], dilations=c["dil"],
              ceil_mode=1)
    check("MaxPool", F.max_pool, [x], kw, kw, exact=True)


@pytest.mark.parametrize("n,k,pb,pe,s,d", [(5, 3, 1, 1, 2, 1), (6, 3, 1, 1, 2, 1),
                                           (6, 3, 0, 0, 2, 1), (7, 2, 1, 1, 3, 2),
                                           (7, 2, 1, 0, 3, 2), (4, 3, 2, 2, 3, 1),
                                           (1, 3, 2, 2, 2, 1)])


@pytest.mark.parametrize("cip", [0, 1])
def test_average_pool_ceil_mode_edges(n, k, pb, pe, s, d, cip):
    x = np.arange(1, n + 1, dtype=np.float32).reshape(1, 1, n)
    kw = dict(kernel_shape=[k], pads=[pb, pe], strides=[s], dilations=[d], ceil_mode=1,
              count_include_pad=cip)
    check("AveragePool", F.average_pool, [x], kw, kw)


@pytest.mark.parametrize("ks, strides, dil, pads, ceil", [
    ([7, 7], [1, 1], [1, 1], [3, 3, 3, 3], 0),      # a 7x7 window: one reduction over a view
    ([6, 6], [2, 3], [2, 1], [1, 2, 0, 1], 1),      # dilated, ceil-mode overhang
    ([20, 20], [20, 20], [1, 1], [0, 0, 0, 0], 1),  # a whole-image window (EfficientNet's)
    ([4, 4, 3], [1, 2, 1], [1, 1, 2], [1, 0, 1, 2, 1, 0], 1),
    # windows larger than the input, few outputs: reduced window by window, never padded to
    # the window's size (EfficientNet's 320x320 AveragePool over 2x2 padded 131 MB)
    ([32, 32], [32, 32], [1, 1], [0, 0, 0, 0], 1),
    ([9, 12], [6, 9], [1, 1], [2, 4, 3, 0], 1),
    ([9, 8, 7], [9, 8, 7], [1, 1, 1], [0, 0, 0, 0, 0, 0], 0),
])
def test_pools_with_large_windows(ks, strides, dil, pads, ceil):
    x = _pool_input(dict(N=2, C=3, spatial=[20, 20] if len(ks) == 2 else [9, 8, 7], seed=3))
    kw = dict(kernel_shape=ks, pads=pads, strides=strides, dilations=dil, ceil_mode=ceil)
    check("MaxPool", F.max_pool, [x], kw, kw, exact=True)
    for cip in (0, 1):
        check("AveragePool", F.average_pool, [x], dict(kw, count_include_pad=cip),
              dict(kw, count_include_pad=cip))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_pools_window_of_padding_only(nd):
    # kernel 2, dilation 2, pad 1 on a length-1 axis: the only window holds just padding
    x = np.full((1, 1) + (1,) * nd, 3.0, np.float32)
    kw = dict(kernel_shape=[2] * nd, pads=[1] * (2 * nd), strides=[1] * nd, dilations=[2] * nd)
    got = check("MaxPool", F.max_pool, [x], dict(kw, ceil_mode=0), dict(kw, ceil_mode=0))
    assert np.all(got == np.finfo(np.float32).min)  # ORT: lowest(), not -inf
    for cip in (0, 1):
        kwa = dict(kw, ceil_mode=0, count_include_pad=cip)
        got = check("AveragePool", F.average_pool, [x], kwa, kwa)
        assert np.all(got == 0)


def test_average_pool_float16():
    c = dict(nd=2, ks=[3, 3], strides=[2, 2], dil=[1, 1], pads=[1, 1, 1, 1], spatial=[8, 7],
             N=1, C=2, ceil=1, cip=1, seed=15)
    x = _pool_input(c, np.float16)
    kw = dict(kernel_shape=c["ks"], pads=c["pads"], strides=c["strides"], dilations=c["dil"],
              ceil_mode=1, count_include_pad=1)
    check("AveragePool", F.average_pool, [x], kw, kw)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_average_pool(shape, dtype):
    rng = np.random.default_rng(16)
    check("GlobalAveragePool", F.global_average_pool, [normal(rng, shape, dtype)])


def lrn_spec(op_type, inputs, attrs):
    """LRN written literally from the ONNX spec (onnxruntime rejects even sizes and
    onnx.reference's LRN loops over the batch axis instead of channels)."""
    (x,) = inputs
    size, alpha, beta, bias = attrs["size"], attrs["alpha"], attrs["beta"], attrs["bias"]
    xd = x.astype(np.float64)
    C = x.shape[1]
    y = np.empty_like(xd)
    for c in range(C):
        lo = max(0, c - (size - 1) // 2)
        hi = min(C - 1, c + -(-(size - 1) // 2))
        ss = np.sum(xd[:, lo:hi + 1] ** 2, axis=1)
        y[:, c] = xd[:, c] / (bias + alpha / size * ss) ** beta
    return [y.astype(x.dtype)]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_lrn(size, dtype):
    rng = np.random.default_rng(17)
    x = normal(rng, (2, 6, 3, 4), dtype, 3)
    attrs = dict(size=size, alpha=1e-2, beta=0.75, bias=2.0)
    if size % 2:
        check("LRN", F.lrn, [x], attrs, attrs, rtol=1e-5 if dtype == np.float32 else None)
    check("LRN", F.lrn, [x], attrs, attrs, runner=lrn_spec,
          rtol=1e-5 if dtype == np.float32 else None)


# --------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------

@given(shape=hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=4), data=st.data())
@HYP
def test_transpose(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    check("Transpose", F.transpose, [x], dict(perm=perm), dict(perm=perm))


@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), data=st.data())
@HYP
def test_reshape(shape, data):
    size = int(np.prod(shape))
    # random factorization of size into new dims
    new = []
    rest = size
    for _ in range(data.draw(st.integers(0, 3))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = data.draw(st.sampled_from(divs))
        new.append(d)
        rest //= d
    new.append(rest)
    new = data.draw(st.permutations(new))
    spec = list(new)
    for i in range(len(spec)):
        if i < len(shape) and spec[i] == shape[i] and data.draw(st.booleans()):
            spec[i] = 0
    if data.draw(st.booleans()):
        spec[data.draw(st.integers(0, len(spec) - 1))] = -1
    x = np.arange(size, dtype=np.float32).reshape(shape)
    sh = np.array(spec, np.int64)
    check("Reshape", F.reshape, [x, sh], dict(allowzero=0), dict(allowzero=0), exact=True)
    if 0 not in spec:
        check("Reshape", F.reshape, [x, sh], dict(allowzero=1), dict(allowzero=1), exact=True)


def test_reshape_allowzero_true_zero():
    x = np.zeros((0, 3), np.float32)
    got = check("Reshape", F.reshape, [x, np.array([3, 0], np.int64)], dict(allowzero=1),
                dict(allowzero=1))
    assert got.shape == (3, 0)
    got = check("Reshape", F.reshape, [x, np.array([0, 3], np.int64)], dict(allowzero=0),
                dict(allowzero=0))
    assert got.shape == (0, 3)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_flatten(axis):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 1, 4)
    check("Flatten", F.flatten, [x], dict(axis=axis), dict(axis=axis), exact=True)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat(axis):
    rng = np.random.default_rng(18)
    xs = []
    for n in (1, 3, 2):
        shape = [2, 3, 4]
        shape[axis] = n
        xs.append(rng.integers(0, 9, size=shape).astype(np.int64))
    xs = frozen(*xs)
    got = F.concat(xs, axis=axis)
    want = ort_run("Concat", xs, dict(axis=axis))[0]
    assert_same(got, want)


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=7), data=st.data())
@HYP
def test_split(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    if data.draw(st.booleans()):
        k = data.draw(st.integers(1, 4))
        cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
        sizes = np.diff([0] + cuts + [n]).astype(np.int64)
        want = ort_run("Split", frozen(x, sizes), dict(axis=axis), n_outputs=k)
        got = F.split(*frozen(x, sizes), axis=axis, num_outputs=None)
    else:
        k = data.draw(st.integers(1, n))
        chunk = -(-n // k)
        assume(n - chunk * (k - 1) >= 0)
        want = ort_run("Split", frozen(x), dict(axis=axis, num_outputs=k), n_outputs=k)
        got = F.split(*frozen(x), None, axis=axis, num_outputs=k)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w)


def test_split_uneven_num_outputs():
    x = np.arange(5, dtype=np.float32)
    got = F.split(x, None, axis=0, num_outputs=3)
    assert [g.tolist() for g in got] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError):
        F.split(x, None, axis=0, num_outputs=4)  # ORT: "negative final split"


index_values = st.one_of(st.integers(-9, 9), st.sampled_from([INT64_MIN, INT64_MAX]))


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6), data=st.data(),
       with_steps=st.booleans(), with_axes=st.booleans())


@HYP
def test_slice(shape, data, with_steps, with_axes):
    r = len(shape)
    if with_axes:
        axes = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
        axes = [a - r if data.draw(st.booleans()) else a for a in axes]
    else:
        axes = list(range(data.draw(st.integers(1, r))))
    k = len(axes)
    starts = data.draw(st.lists(index_values, min_size=k, max_size=k))
    ends = data.draw(st.lists(index_values, min_size=k, max_size=k))
    steps = data.draw(st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3, INT64_MAX, INT64_MIN + 1]),
                               min_size=k, max_size=k)) if with_steps else None
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    ins = [x, np.array(starts, np.int64), np.array(ends, np.int64),
           np.array(axes, np.int64) if (with_axes or with_steps) else None,
           np.array(steps, np.int64) if with_steps else None]
    check("Slice", F.slice, ins, exact=True)


def test_slice_sentinels():
    x = np.arange(5, dtype=np.int64)
    cases = [([-1], [INT64_MIN], [-1]),   # torch.flip export: full reverse
             ([0], [INT64_MAX], [-1]),    # ORT: INT_MAX end + negative step runs through index 0
             ([4], [2**31 - 1], [-2]),    # INT32_MAX is a sentinel too
             ([INT64_MIN], [INT64_MAX], [2]),
             ([-100], [100], [1]), ([100], [-100], [-1])]
    for starts, ends, steps in cases:
        ins = [x, np.array(starts, np.int64), np.array(ends, np.int64), np.array([0], np.int64),
               np.array(steps, np.int64)]
        check("Slice", F.slice, ins, exact=True)


@given(dshape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
       ishape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4), data=st.data(),
       idtype=st.sampled_from([np.int32, np.int64]))


@HYP
def test_gather(dshape, ishape, data, idtype):
    axis = data.draw(st.integers(0, len(dshape) - 1))
    n = dshape[axis]
    rng = np.random.default_rng(data.draw(seeds))
    x = rng.standard_normal(dshape).astype(np.float32)
    idx = rng.integers(-n, n, size=ishape).astype(idtype)
    check("Gather", F.gather, [x, idx], dict(axis=axis), dict(axis=axis), exact=True)


@pytest.mark.parametrize("shape,axes", [((3, 4), [0]), ((3, 4), [-1]), ((3, 4), [1, 0]),
                                        ((3,), [0, 2, -1]), ((), [0]), ((2, 3), [-3, 2])])


def test_unsqueeze(shape, axes):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    check("Unsqueeze", F.unsqueeze, [x, np.array(axes, np.int64)], exact=True)


@pytest.mark.parametrize("shape,axes", [((1, 3, 1, 4), [0]), ((1, 3, 1, 4), [-2, 0]),
                                        ((1, 3, 1, 4), None), ((1, 1), None), ((1,), [-1]),
                                        ((2, 3), None)])


def test_squeeze(shape, axes):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    check("Squeeze", F.squeeze, [x, None if axes is None else np.array(axes, np.int64)], exact=True)


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4))
@HYP
def test_expand(shapes):
    sx, ss = shapes.input_shapes
    x = np.arange(int(np.prod(sx)), dtype=np.float32).reshape(sx)
    check("Expand", F.expand, [x, np.array(ss, np.int64)], exact=True)


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), data=st.data(),
       mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]),
       with_axes=st.booleans(), with_value=st.booleans())


@HYP
def test_pad(shape, data, mode, with_axes, with_value):
    r = len(shape)
    axes = (data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
            if with_axes else list(range(r)))
    before, after = [], []
    for a in axes:
        n = shape[a]
        b = data.draw(st.integers(-2, 4))
        e = data.draw(st.integers(-2, 4))
        crop = max(-b, 0) + max(-e, 0)
        assume(n - crop >= 1)
        m = n - crop
        if mode == "reflect":
            assume(m >= 2 and max(b, 0) <= m - 1 and max(e, 0) <= m - 1)
        before.append(b)
        after.append(e)
    axes_in = [a - r if data.draw(st.booleans()) else a for a in axes]
    x = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape)
    pads = np.array(before + after, np.int64)
    cv = np.array(-7.5, np.float32) if with_value and mode == "constant" else None
    ins = [x, pads, cv, np.array(axes_in, np.int64) if with_axes else None]
    check("Pad", F.pad, ins, dict(mode=mode), dict(mode=mode), exact=True)


def test_pad_reflect_too_large_raises_like_ort():
    x = np.arange(5, dtype=np.float32)
    with pytest.raises(Exception):
        ort_run("Pad", [x, np.array([0, 6], np.int64)], dict(mode="reflect"))
    with pytest.raises(ValueError):
        F.pad(x, np.array([0, 6], np.int64), mode="reflect")


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float16])
def test_pad_dtypes(dtype):
    x = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    check("Pad", F.pad, [x, np.array([1, -1, 0, 2], np.int64), np.array(1, dtype)],
          dict(mode="constant"), dict(mode="constant"), exact=True)


@pytest.mark.parametrize("start,end", [(0, None), (1, None), (-2, None), (0, -1), (1, 3), (-10, 10),
                                       (3, 1), (5, None)])


def test_shape(start, end):
    x = np.zeros((2, 3, 4, 5), np.float32)
    attrs = dict(start=start) if end is None else dict(start=start, end=end)
    check("Shape", F.shape, [x], attrs, dict(start=start, end=end), exact=True)


# --------------------------------------------------------------------------
# op table
# --------------------------------------------------------------------------

def test_ops_table_complete():
    expected = {
        "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu",
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal",
        "Where", "Cast", "BatchNormalization", "Identity", "Dropout", "Conv", "ConvTranspose", "MatMul",
        "Gemm", "Softmax", "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
        "MaxPool",
        "AveragePool", "GlobalAveragePool", "LRN", "Transpose", "Reshape", "Flatten", "Concat",
        "Split", "Slice", "Gather", "Unsqueeze", "Squeeze", "Expand", "Pad", "Shape",
    }
    assert set(F.OPS) == expected
    assert all(callable(f) and f.__doc__ for f in F.OPS.values())
    assert F.__doc__ and "opset-21" in F.__doc__
