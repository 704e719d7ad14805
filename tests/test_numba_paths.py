"""The Numba backend's fast paths, each against onnxruntime on a model that takes it:
program segments (one compiled call per run of kernels), output buffers reused across runs
(`run(feeds, out=...)`), convolutions (the packed microkernel over row offsets, and the
BLAS paths of other CPUs: im2col, shifted GEMMs, depthwise), strided batched MatMul without packing,
data movement kernels (Gather, Concat, Pad, copies of views), pooling whose window is larger
than its input, and row reductions (Softmax, LayerNorm, ReduceMean, ReduceMax / ReduceMin) in lanes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.errors import FeedError
from eqsat_fuse.checking.verify import random_feeds

from conftest import make_model


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("numba-paths-cache")


def _compile(model, cache, **kw):
    return ef.compile(model, backend="numba", cache_dir=cache, **kw)


def _check(program, seed=1):
    result = program.verify(seed=seed)
    assert result.ok, result.summary()
    assert program.report.backend_report["fallback_kernels"] == []
    return result


def _conv_model(rng, c=6, m=5, size=20, k=3, pads=(1, 1, 1, 1), dil=(1, 1), group=1,
                relu=True, residual=True, strides=(1, 1), batch=1):
    w = (rng.standard_normal((m, c // group, k, k)) * 0.2).astype(np.float32)
    b = rng.normal(0, 0.1, m).astype(np.float32)
    oh = (size + pads[0] + pads[2] - ((k - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (size + pads[1] + pads[3] - ((k - 1) * dil[1] + 1)) // strides[1] + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=list(pads),
                              dilations=list(dil), group=group, strides=list(strides))]
    out = "c"
    inputs = [("x", [batch, c, size, size])]
    if residual:
        nodes.append(helper.make_node("Add", [out, "r"], ["a"]))
        inputs.append(("r", [batch, m, oh, ow]))
        out = "a"
    if relu:
        nodes.append(helper.make_node("Relu", [out], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [out], ["y"]))
    return make_model(nodes, inputs, [("y", [batch, m, oh, ow])], {"w": w, "b": b})


_CONVS = [
    dict(),                                             # 3x3 pad 1
    dict(k=5, pads=(2, 2, 2, 2)),
    dict(k=3, pads=(0, 1, 2, 1), relu=False),           # asymmetric pads
    dict(k=3, pads=(2, 2, 2, 2), dil=(2, 2)),           # dilation
    dict(c=6, m=4, group=2, residual=False),            # groups
    dict(size=5, residual=False),                       # small plane
    dict(k=1, pads=(0, 0, 0, 0)),                       # 1x1: reads the input planes as they are
    dict(k=1, pads=(0, 0, 0, 0), strides=(2, 2), residual=False),
    dict(c=3, m=16, size=23, k=7, pads=(3, 3, 3, 3), strides=(2, 2)),   # a stem
    dict(k=3, pads=(1, 0, 1, 2), strides=(2, 1), dil=(1, 2), residual=False),
    dict(c=8, m=26, size=40, group=2),                  # several column chunks, part row tiles
    dict(c=4, m=300, size=24, residual=False),          # several row blocks
    dict(c=12, m=12, group=12, size=17),                # depthwise 3x3
    dict(c=12, m=12, group=12, size=17, strides=(2, 2), residual=False),
    dict(c=8, m=8, group=8, k=5, pads=(2, 2, 2, 2), strides=(2, 2), residual=False),
    dict(c=8, m=8, group=8, dil=(2, 2), pads=(2, 2, 2, 2)),
    # strided depthwise, channel-blocked (`kernels._dw_blocked`): a partial last block of 8,
    # row stride only with dilation and asymmetric pads, stride 3, and one shared by threads
    dict(c=40, m=40, group=40, k=5, pads=(2, 2, 2, 2), strides=(2, 2), size=19,
         residual=False),
    dict(c=20, m=20, group=20, k=3, pads=(1, 0, 2, 1), strides=(2, 1), dil=(2, 2), size=15),
    dict(c=18, m=18, group=18, k=3, pads=(1, 1, 1, 1), strides=(3, 3), size=16,
         residual=False),
    dict(c=64, m=64, group=64, k=5, pads=(2, 2, 2, 2), strides=(2, 2), size=64),
    # stride-1 depthwise: blocked on narrow planes (7 x 7 taps, asymmetric pads), per channel
    # from `kernels.DW_PLANE_MIN` columns on (3 x 3 taps, asymmetric pads)
    dict(c=20, m=20, group=20, k=7, pads=(3, 2, 1, 4), size=9),
    dict(c=5, m=5, group=5, k=3, pads=(0, 1, 2, 1), size=33),
    # positions x channels (`conv_positions`): several blocks of output rows and a partial
    # last panel of channels, a batch, a 1x1 read in place, a stride-2 one split by phase
    dict(c=64, m=70, size=30, batch=2),
    dict(c=40, m=33, k=1, pads=(0, 0, 0, 0), size=7, batch=2, residual=False),
    dict(c=24, m=40, size=9, strides=(2, 2), pads=(1, 0, 1, 1), residual=False),
]


@pytest.mark.parametrize("path", ["rows", "positions", "blas"])
@pytest.mark.parametrize("cfg", _CONVS)
def test_convolutions_match_onnxruntime(cfg, path, kernel_cache, rng, monkeypatch):
    # rows: the AVX-512 microkernel over row offsets of the input (where the CPU has it);
    # positions: the microkernel over positions read straight from the planes x the packed
    # weights (one group; grouped ones take the rows path); blas: the paths of other CPUs (im2col, shifted GEMMs,
    # 1x1 straight from the planes)
    from eqsat_fuse.backends.numba import contraction
    from eqsat_fuse.backends.numba import packed_gemm as PG
    if path != "blas" and not PG.AVAILABLE:
        pytest.skip("the packed convolution needs AVX-512")
    monkeypatch.setattr(contraction, "PACKED_CONV", path != "blas")
    monkeypatch.setattr(contraction, "CONV_LAYOUT", None if path == "blas" else path)
    _check(_compile(_conv_model(rng, **cfg), kernel_cache))


def _sources(folder) -> str:
    return "".join(p.read_text() for p in folder.glob("k_*.py"))


def test_shifted_gemm_conv_is_used_for_wide_planes(tmp_path, rng, monkeypatch):
    from eqsat_fuse.backends.numba import contraction
    monkeypatch.setattr(contraction, "PACKED_CONV", False)
    _check(_compile(_conv_model(rng, size=40), tmp_path))
    assert "K.pad_planes" in _sources(tmp_path)


@pytest.mark.parametrize("k, direct", [(3, False), (1, True)])
def test_packed_conv_is_used_on_avx512(k, direct, tmp_path, rng):
    from eqsat_fuse.backends.numba import packed_gemm as PG
    if not PG.AVAILABLE:
        pytest.skip("the packed convolution needs AVX-512")
    pads = (k // 2,) * 4
    _check(_compile(_conv_model(rng, size=30, k=k, pads=pads), tmp_path))
    sources = _sources(tmp_path)
    assert "PG.gemm_rows_entry(" in sources and "np.dot(" not in sources
    # a 1x1 stride-1 Conv reads its input in place; others split it by phase, then compact
    assert ("K.phase_planes" in sources) == (not direct)
    assert ("K.compact_cols" in sources) == (not direct)
    assert "PG.gemm_gather_entry(" not in sources


@pytest.mark.parametrize("size, m, positions", [(7, 64, True), (14, 256, True), (30, 16, False)])
def test_small_planes_with_many_channels_go_by_positions(size, m, positions, tmp_path, rng):
    # on a 7 x 7 plane the rows path computes 64 columns for 49 positions (9 x 7 with the
    # taps' overhang, in panels of 32); positions x channels computes each position once
    from eqsat_fuse.backends.numba import packed_gemm as PG
    if not PG.AVAILABLE:
        pytest.skip("the packed convolution needs AVX-512")
    _check(_compile(_conv_model(rng, c=32, m=m, size=size), tmp_path))
    sources = _sources(tmp_path)
    assert ("PG.gemm_gather_entry(" in sources) == positions
    assert ("PG.gemm_rows_entry(" in sources) == (not positions)


def test_program_runs_in_few_segments_and_matches_per_kernel_steps(kernel_cache, rng):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["s", "g"], ["y"])]
    model = make_model(nodes, [("x", [8, 16])], [("y", [8, 12])],
                       {"w1": rng.standard_normal((16, 32)).astype(np.float32),
                        "w2": rng.standard_normal((32, 12)).astype(np.float32)})
    program = _compile(model, kernel_cache)
    _check(program)
    assert program.report.backend_report["segments"] == 1
    feeds = random_feeds(program.plan.inputs, 3)
    fast = program.run(feeds)
    # the per-kernel steps (what profilers time one by one) compute the same
    inner = program.program
    inner.steps = list(inner.steps)            # a swapped list: run() takes the steps one by one
    slow = program.run(feeds)
    np.testing.assert_array_equal(fast["y"], slow["y"])


def test_a_program_compiles_only_its_distinct_kernels(tmp_path, rng):
    """Cold compile pays for each distinct kernel source once, and for nothing per call: a
    segment is a table that one precompiled loop walks (issue 20: a Llama-style decoder's
    generated segment of 220 calls took 29 s to compile)."""
    nodes, x = [], "x"
    weights = {}
    for i in range(12):                 # 12 MatMul+Relu kernels of one shape: one source
        weights[f"w{i}"] = rng.standard_normal((43, 43)).astype(np.float32)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    model = make_model(nodes, [("x", [5, 43])], [("y", [5, 43])], weights)
    program = _compile(model, tmp_path / "kernels")
    _check(program)
    report = program.report.backend_report
    assert report["segments"] == 1 and report["compiled_kernels"] >= 12
    # (an earlier test in this process may have compiled the same source: then none is)
    assert report["sources"] == 1 and report["jit_compiled"] <= 1
    assert {p.name[:2] for p in (tmp_path / "kernels").glob("*.py")} <= {"k_"}


def test_outputs_can_be_written_into_caller_buffers(kernel_cache, rng):
    nodes = [helper.make_node("Mul", ["x", "x"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["y"]),
             helper.make_node("Reshape", ["y", "shape"], ["z"]),
             helper.make_node("Identity", ["x"], ["same"])]
    model = make_model(nodes, [("x", [4, 6])], [("y", [4, 6]), ("z", [24]), ("same", [4, 6])],
                       {"shape": np.array([24], np.int64)})
    for backend in ("numpy", "numba"):
        program = ef.compile(model, backend=backend, cache_dir=kernel_cache)
        x = rng.standard_normal((4, 6)).astype(np.float32)
        want = program.run({"x": x})
        outs = program.program.empty_outputs()
        got = program.run({"x": x}, out=outs)
        for name in want:
            assert got[name] is outs[name]
            np.testing.assert_array_equal(got[name], want[name])
        # a second run reuses the same arrays
        x2 = x + 1
        again = program.run({"x": x2}, out=outs)
        assert again["y"] is outs["y"]
        np.testing.assert_allclose(again["y"], x2 * x2 + x2, rtol=1e-6)
        # a subset of the outputs may be given; the rest are new arrays
        part = program.run({"x": x}, out={"y": outs["y"]})
        np.testing.assert_array_equal(part["z"], want["z"])
        with pytest.raises(FeedError):
            program.run({"x": x}, out={"y": np.empty((4, 5), np.float32)})
        with pytest.raises(FeedError):
            program.run({"x": x}, out={"nope": outs["y"]})
        with pytest.raises(FeedError):
            program.run({"x": x}, out={"y": x})            # overlaps an input


def test_default_outputs_are_fresh_arrays_each_run(kernel_cache, rng):
    model = make_model([helper.make_node("Tanh", ["x"], ["y"])], [("x", [3, 5])], [("y", [3, 5])])
    program = _compile(model, kernel_cache)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    first = program.run({"x": x})["y"]
    kept = first.copy()
    second = program.run({"x": x + 1})["y"]
    assert first is not second and not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, kept)


def test_attention_matmuls_on_transposed_views(kernel_cache, rng):
    s, h, d = 12, 3, 8
    nodes = [helper.make_node("Reshape", ["q", "shape"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["k", "shape"], ["k4"]),
             helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qt", "kt"], ["sc"]),
             helper.make_node("Mul", ["sc", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("Reshape", ["v", "shape"], ["v4"]),
             helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["p", "vt"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ct", "back"], ["y"])]
    model = make_model(nodes, [("q", [1, s, h * d]), ("k", [1, s, h * d]), ("v", [1, s, h * d])],
                       [("y", [1, s, h * d])],
                       {"shape": np.array([1, s, h, d], np.int64),
                        "back": np.array([1, s, h * d], np.int64),
                        "scale": np.array(0.3, np.float32)})
    _check(_compile(model, kernel_cache))


def test_movement_kernels_match_onnxruntime(kernel_cache, rng):
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("Gather", ["x", "col"], ["g1"], axis=1),
             helper.make_node("Concat", ["e", "x"], ["cat"], axis=0),
             helper.make_node("Pad", ["x", "pads", "val"], ["pd"], mode="constant"),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("Reshape", ["xt", "flat"], ["r"]),
             helper.make_node("Relu", ["r"], ["y3"])]
    model = make_model(
        nodes, [("x", [5, 6]), ("ids", [4], TensorProto.INT64)],
        [("g1", [5]), ("cat", [9, 6]), ("pd", [8, 7]), ("y3", [30])],
        {"table": rng.standard_normal((10, 6)).astype(np.float32),
         "col": np.array(-2, np.int64),
         "pads": np.array([1, 0, 2, 1], np.int64), "val": np.array(0.5, np.float32),
         "flat": np.array([30], np.int64)})
    program = _compile(model, kernel_cache)
    _check(program)
    ids = np.array([3, 0, 9, 3], np.int64)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    got = program.run({"x": x, "ids": ids})
    np.testing.assert_array_equal(got["g1"], x[:, -2])
    np.testing.assert_array_equal(got["y3"], np.maximum(x.T.reshape(-1), 0))
    with pytest.raises(ef.RunError, match="Gather: index out of range"):
        program.run({"x": x, "ids": np.array([0, 1, 2, 10], np.int64)})


@pytest.mark.parametrize("op,attrs", [
    ("AveragePool", dict(kernel_shape=[64, 64], strides=[64, 64], ceil_mode=1,
                         count_include_pad=1)),       # a window far beyond the input
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0])),
    # dilated column taps, some reaching inside the input only for some output columns
    ("MaxPool", dict(kernel_shape=[5, 9], dilations=[1, 2], pads=[2, 3, 2, 3], strides=[1, 3],
                     ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[5, 9], pads=[2, 4, 2, 4], strides=[1, 3], ceil_mode=1,
                         count_include_pad=0)),
    # rows of fewer than 4 outputs take each output's taps in turn (`kernels._pool_narrow`)
    ("AveragePool", dict(kernel_shape=[7, 7])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[3, 4], pads=[1, 1, 1, 1],
                     dilations=[2, 2])),
])
def test_pooling_matches_onnxruntime(op, attrs, kernel_cache, rng):
    import onnx
    x_shape = [1, 3, 7, 9] if attrs["kernel_shape"][0] < 10 else [1, 3, 2, 2]
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_empty_tensor_value_info("y")])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    _check(_compile(model, kernel_cache))


@pytest.mark.parametrize("dtype", [TensorProto.UINT8, TensorProto.INT8])
def test_max_pool_of_8_bit_integers_is_compiled(dtype, kernel_cache, rng):
    """A QOperator model max-pools its uint8 tensors directly: compiled (on exact float32
    copies of the integers), equal to onnxruntime, extremes included."""
    import onnx
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info(
        "x", dtype, [2, 5, 15, 17])], [helper.make_empty_tensor_value_info("y")])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    program = _compile(model, kernel_cache)
    _check(program)
    np_dtype = np.uint8 if dtype == TensorProto.UINT8 else np.int8
    info = np.iinfo(np_dtype)
    x = rng.integers(info.min, info.max + 1, (2, 5, 15, 17)).astype(np_dtype)
    x[0, 0] = info.min
    got = program.run({"x": x})["y"]
    assert got.dtype == np_dtype
    np.testing.assert_array_equal(got, ef.compile(model, backend="numpy").run({"x": x})["y"])


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),         # ResNet's stem
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 5], strides=[2, 2], pads=[0, 2, 1, 1], dilations=[2, 2],
         ceil_mode=1),
])
def test_wide_max_pools_take_their_inside_columns_in_vectors(attrs, kernel_cache, rng):
    # rows 53 wide: the columns whose taps are all inside go 16 at a time (`vectors.tap_max`),
    # the edges one at a time; NaN and -inf come out as the NumPy backend's (a NaN counts as
    # float32's lowest value; which zero wins a tie of -0 and +0 is left open, as in ONNX)
    import onnx
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3, 37, 53])], [helper.make_empty_tensor_value_info("y")])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    program = _compile(model, kernel_cache)
    _check(program)
    x = rng.standard_normal((2, 3, 37, 53)).astype(np.float32)
    special = rng.integers(0, 6, x.shape)
    x[special == 0] = np.nan
    x[special == 1] = -np.inf
    x[special == 2] = -0.0
    x[special == 3] = 0.0
    x[0, 0] = np.nan                        # whole planes of NaN and of -inf
    x[0, 1] = -np.inf
    reference = ef.compile(model, backend="numpy").run({"x": x})["y"]
    got = program.run({"x": x})["y"]
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize("cols", [1, 15, 16, 17, 100, 20000])   # 20000: past ROW_FOLD_MAX
def test_row_reductions_in_lanes(cols, kernel_cache, rng):
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1,
                              epsilon=1e-5),
             helper.make_node("ReduceMean", ["x"], ["rm"], axes=[-1], keepdims=1)]
    model = make_model(nodes, [("x", [3, 4, cols])],
                       [("s", [3, 4, cols]), ("ln", [3, 4, cols]), ("rm", [3, 4, 1])],
                       {"g": rng.uniform(0.5, 1.5, cols).astype(np.float32),
                        "b": rng.normal(0, 0.1, cols).astype(np.float32)})
    _check(_compile(model, kernel_cache))


@pytest.mark.parametrize("shape,axes,keepdims,prologue", [
    ((3, 4, 17), [-1], 1, False), ((2, 5, 7, 9), [2, 3], 1, False),
    ((2, 3, 150, 150), [0, 1, 2, 3], 0, False), ((3, 4, 17), [-1], 1, True),
    ((1, 40000), [0, 1], 0, True)])       # a whole tensor in three chunks of the row buffer
def test_max_and_min_reductions_compile_with_their_epilogues(shape, axes, keepdims, prologue,
                                                             kernel_cache, rng):
    """ReduceMax / ReduceMin (what DynamicQuantizeLinear's range is) are compiled reductions
    with the scalar arithmetic after them fused in (and an elementwise producer before them),
    and equal NumPy's exactly, NaN and infinities included."""
    x = "x"
    nodes = []
    if prologue:
        nodes.append(helper.make_node("Mul", ["x", "three"], ["x3"]))
        x = "x3"
    nodes += [helper.make_node("ReduceMax", [x], ["mx"], axes=axes, keepdims=keepdims),
             helper.make_node("Relu", ["mx"], ["hi"]),
             helper.make_node("ReduceMin", [x], ["mn"], axes=axes, keepdims=keepdims),
             helper.make_node("Neg", ["mn"], ["nm"]),
             helper.make_node("Relu", ["nm"], ["lo"])]
    out = [1 if i in [a % len(shape) for a in axes] else d for i, d in enumerate(shape)]
    if not keepdims:
        out = [d for i, d in enumerate(shape) if i not in [a % len(shape) for a in axes]]
    model = make_model(nodes, [("x", list(shape))], [("hi", out), ("lo", out)],
                       {"three": np.array(3.0, np.float32)})
    program = _compile(model, kernel_cache, threads=2)
    _check(program)
    kernels = sorted(k.ops for k in program.plan.kernels if k.kind == "compute")
    pro = ["Mul"] if prologue else []
    assert kernels == [pro + ["ReduceMax", "Relu"], pro + ["ReduceMin", "Neg", "Relu"]], kernels
    reference = ef.compile(model, backend="numpy")
    for special in ([], [np.nan], [-np.inf, np.inf]):
        x = rng.standard_normal(shape).astype(np.float32)
        if special:
            spots = rng.integers(0, 200, shape)
            for i, v in enumerate(special):
                x[spots == i] = v
        want, got = reference.run({"x": x}), program.run({"x": x})
        for name in ("hi", "lo"):
            np.testing.assert_array_equal(got[name], want[name])
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[-1] = np.nan                      # in the last chunk only
    assert np.isnan(program.run({"x": x})["hi"]).any()


def _lane_order(x, step, init):
    """The 16-lane fold of `kernels.row_*` in plain float32 steps: lane k over x[k::16] of the
    full blocks, the lanes in order, then the tail."""
    full = len(x) - len(x) % 16
    lanes = [np.float32(init)] * 16
    for c in range(full):
        lanes[c % 16] = step(lanes[c % 16], x[c])
    total = np.float32(init)
    for v in lanes + list(x[full:]):
        total = step(total, v)
    return total


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 128, 771])
def test_row_sums_and_max_fold_sixteen_lanes_in_order(n, rng):
    """The vector folds (`vectors.lane_sum`, `lane_max`) give exactly the lane-order result:
    the same float32 sum the per-lane loops gave, a NaN anywhere gives NaN."""
    from eqsat_fuse.backends.numba import kernels as K
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
    assert K.row_sum(x, n) == _lane_order(x, lambda a, v: np.float32(a + v), 0.0)
    assert K.row_max(x, n) == _lane_order(x, lambda a, v: v if (v > a or v != v) else a,
                                          -np.inf)
    mean = np.float32(0.25)
    want = float(np.sum((x.astype(np.float64) - mean) ** 2))
    assert K.row_sumsq(x, n, mean) == pytest.approx(want, rel=1e-5, abs=1e-30)
    if n:
        for at in (0, n - 1, n // 2):
            y = x.copy()
            y[at] = np.nan
            assert np.isnan(K.row_max(y, n)) and np.isnan(K.row_sum(y, n))


def test_a_mask_broadcast_over_heads_is_read_through_a_row_table_once_a_row(tmp_path, rng):
    """Attention scores plus a [1, 1, S, S] mask chosen by Where: the mask's rows repeat every
    S rows of the [1, H, S, S] output, so each row's base comes from a table; it is read once
    a row, outside the column loop (read inside, it kept the loop scalar: 1.3x slower)."""
    h, s, d = 3, 20, 8
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["sc"]),
             helper.make_node("Mul", ["sc", "scale"], ["ss"]),
             helper.make_node("Where", ["cond", "zero", "low"], ["mk"]),
             helper.make_node("Add", ["ss", "mk"], ["y"])]
    model = make_model(nodes, [("q", [1, h, s, d]), ("k", [1, h, s, d]),
                               ("cond", [1, 1, s, s], TensorProto.BOOL)],
                       [("y", [1, h, s, s])],
                       {"scale": np.array(0.125, np.float32), "zero": np.array(0, np.float32),
                        "low": np.array(np.finfo(np.float32).min, np.float32)})
    program = _compile(model, tmp_path)
    feeds = {"q": rng.standard_normal((1, h, s, d)).astype(np.float32),
             "k": rng.standard_normal((1, h, s, d)).astype(np.float32),
             "cond": np.tril(np.ones((s, s), bool))[None, None]}
    result = program.verify(feeds=feeds)
    assert result.ok, result.summary()
    source = _sources(tmp_path)
    assert re.search(r"\n( +)x\d+b = G\[g\d+ \+ r\]\n\1for c in range", source), source


def test_masked_softmax_rows(kernel_cache, rng):
    """Rows of -3.4e38 (attention masks) and -inf: no NaN where onnxruntime has none."""
    nodes = [helper.make_node("Add", ["x", "mask"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    mask = np.zeros((1, 40), np.float32)
    mask[0, 30:] = np.finfo(np.float32).min
    model = make_model(nodes, [("x", [4, 40])], [("y", [4, 40])], {"mask": mask})
    program = _compile(model, kernel_cache)
    _check(program)
    y = program.run({"x": rng.standard_normal((4, 40)).astype(np.float32)})["y"]
    assert np.all(y[:, 30:] == 0) and np.allclose(y.sum(1), 1, rtol=1e-5)


def _heavy_chain(rows, cols, rng):
    """sigmoid, tanh and erf in one body; the sigmoid's value is read again after the erf, and
    x by every stage; b broadcasts along the rows."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["m"]),
             helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("Add", ["t", "x"], ["a"]),
             helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("Mul", ["e", "s"], ["y"])]
    return make_model(nodes, [("x", [rows, cols])], [("y", [rows, cols])],
                      {"b": rng.uniform(0.5, 2.0, cols).astype(np.float32)})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_bodies_with_several_transcendentals_run_in_stages(threads, storage, tmp_path, rng):
    # 200 x 1500: above the size that runs threaded; two column tiles per row, the second short
    import numba
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("this process allows fewer threads")
    before = numba.get_num_threads()
    numba.set_num_threads(threads)          # the backend plans for the caller's thread count
    try:
        program = _compile(_heavy_chain(200, 1500, rng), tmp_path, storage_dtype=storage)
    finally:
        numba.set_num_threads(before)
    _check(program)
    sources = _sources(tmp_path)
    assert "# stage 3 of 3" in sources
    assert ("parallel=True" in sources) == (threads > 1)


def test_narrow_rows_keep_one_loop(tmp_path, rng):
    program = _compile(_heavy_chain(50, 20, rng), tmp_path)
    _check(program)
    sources = _sources(tmp_path)
    assert "erf_f32" in sources and "# stage" not in sources
