"""The VNNI int8 GEMM (`backends/numba/int8_gemm.py`) and the integer contraction family that
calls it (`backends/numba/integer.py`): exact int32 results, against an int64 NumPy oracle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import int8_gemm as I8

needs_vnni = pytest.mark.skipif(not I8.AVAILABLE, reason="this CPU has no AVX-512 VNNI")


def _oracle(a, b, za=0):
    return (a.astype(np.int64) - za) @ b.astype(np.int64)


@needs_vnni
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (5, 7, 3), (17, 33, 65), (64, 768, 96)])
@pytest.mark.parametrize("za", [0, 131])
def test_int8_gemm_is_exact_in_row_blocks(m, k, n, za):
    """Shapes off every tile size (rows of 8, columns of 32, k in steps of 4), extreme values
    (255 x -128 everywhere in a row and a column), and the rows in blocks of 16, as the
    generated kernels call it."""
    I8.ensure_compiled()
    rng = np.random.default_rng(m * 1000 + k)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    a[0], b[:, 0] = 255, -128
    ldc = I8.c_cols(n)
    colsum = np.zeros(ldc, np.int32)
    colsum[:n] = b.astype(np.int64).sum(axis=0)
    c = np.full(I8.c_rows(m) * ldc, -7, np.int32)
    ws = np.zeros(I8.a_workspace(16, k), np.uint8)
    packed = I8.pack_b(b)
    for r0 in range(0, m, 16):
        I8.gemm(a.reshape(-1), 0, k, r0, min(r0 + 16, m), packed, n, k, c, ldc, ws, colsum, za)
    np.testing.assert_array_equal(c.reshape(-1, ldc)[:m, :n], _oracle(a, b, za))


def _matmul_integer_model(k, n, za_input: bool):
    rng = np.random.default_rng(3)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.zeros(n, np.int8), "zb"),
             numpy_helper.from_array(np.array(0.01, np.float32), "s")]
    inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 6, k])]
    if za_input:
        inputs.append(helper.make_tensor_value_info("za", TensorProto.UINT8, []))
    else:
        inits.append(numpy_helper.from_array(np.array(77, np.uint8), "za"))
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"]),
         helper.make_node("Cast", ["y"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["f", "s"], ["o"])],
        "mmi", inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 6, n])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), b


@needs_vnni
@pytest.mark.parametrize("za_input", [False, True])
def test_matmul_integer_is_one_vnni_kernel_with_its_epilogue(za_input):
    """MatMulInteger + Cast + Mul (a dynamically quantized projection) is one Numba kernel, its
    activations' zero point a constant or computed at run time (as DynamicQuantizeLinear's
    is), the weights' zero points zeros per column; exact against the oracle."""
    k, n = 100, 40
    model, b = _matmul_integer_model(k, n, za_input)
    compiled = ef.compile(model, backend="numba")
    report = compiled.report.as_dict()
    assert report["backend_report"]["fallback_kernels"] == []
    assert [kern["ops"] for kern in report["kernels"]] == [["MatMulInteger", "Cast", "Mul"]]
    a = np.random.default_rng(4).integers(0, 256, (2, 6, k)).astype(np.uint8)
    za = 201 if za_input else 77
    feeds = {"a": a, **({"za": np.array(za, np.uint8)} if za_input else {})}
    got = compiled.run(feeds)["o"]
    want = _oracle(a.reshape(-1, k), b, za).reshape(2, 6, n).astype(np.float32) * np.float32(0.01)
    np.testing.assert_array_equal(got, want)


@needs_vnni
@pytest.mark.parametrize("case", [
    # (x dtype, channels in, out, groups, kernel, stride, pads, size)
    ("uint8", 16, 24, 1, 3, 1, [1, 1, 1, 1], 9),      # 3x3 padded: the padded planes
    ("uint8", 16, 40, 1, 1, 1, [0, 0, 0, 0], 7),      # 1x1: the image itself
    ("int8", 8, 16, 1, 3, 2, [1, 0, 2, 1], 11),        # int8 read as uint8 + 128; uneven pads
    ("uint8", 3, 16, 1, 7, 2, [3, 3, 3, 3], 20),       # a stem: K not a multiple of 4
    ("uint8", 12, 12, 12, 3, 2, [1, 1, 1, 1], 10),     # depthwise: the float32 kernel, exact
    ("int8", 16, 16, 16, 3, 1, [1, 1, 1, 1], 70),      # depthwise, blocks made x - zx by threads
    ("uint8", 128, 256, 1, 1, 1, [0, 0, 0, 0], 7),     # a 7 x 7 plane: its 49 positions split
    ("int8", 8, 8, 2, 3, 1, [1, 1, 1, 1], 6),          # grouped: direct loops
    # stride 1 reads the quad image unpacked, its rows Wp wide:
    ("uint8", 6, 64, 1, 3, 1, [1, 1, 1, 1], 70, 1),    # channels past a quad; rows in chunks
    ("int8", 5, 9, 1, 5, 1, [2, 0, 1, 3], 13, 1),      # uneven pads, a 5x5, int8
    ("uint8", 16, 16, 1, 3, 1, [2, 2, 2, 2], 12, 2),   # dilation 2
    ("uint8", 24, 8, 1, 1, 1, [1, 0, 0, 1], 9, 1),     # a padded 1x1
])
@pytest.mark.parametrize("threads", [1, 2])
def test_numba_conv_integer_is_exact_and_runs_itself(case, threads):
    """Every ConvInteger path of the Numba backend equals an int64 NumPy oracle bit for bit,
    with a zero point, at one and two threads, and none falls back to NumPy."""
    from numpy.lib.stride_tricks import sliding_window_view

    dtype, cin, cout, groups, k, stride, pads, size, *dilation = case
    dil = dilation[0] if dilation else 1
    rng = np.random.default_rng(cin * cout + k)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (2, cin, size, size)).astype(dtype)
    x[0, 0] = info.max
    w = rng.integers(-128, 128, (cout, cin // groups, k, k)).astype(np.int8)
    zx = np.array(info.min + 37, dtype)
    graph = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w", "zx"], ["y"], pads=pads,
                          strides=[stride, stride], group=groups, dilations=[dil, dil])],
        "ci", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype),
                                             x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None] * 4)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(zx, "zx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    compiled = ef.compile(model, backend="numba", threads=threads)
    assert compiled.report.as_dict()["backend_report"]["fallback_kernels"] == []
    got = compiled.run({"x": x})["y"]
    d = np.pad(x.astype(np.int64) - int(zx), ((0, 0), (0, 0), (pads[0], pads[2]),
                                               (pads[1], pads[3])))
    span = (k - 1) * dil + 1
    win = sliding_window_view(d, (span, span), axis=(2, 3))[:, :, ::stride, ::stride,
                                                            ::dil, ::dil]
    cg, mg = cin // groups, cout // groups
    want = np.concatenate([np.einsum("ncyxij,mcij->nmyx", win[:, g * cg:(g + 1) * cg],
                                     w[g * mg:(g + 1) * mg].astype(np.int64))
                           for g in range(groups)], axis=1)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
