"""Minimal cases the edge-value fuzzer (eqsat_fuse.testing.edge_graphs, tests/test_fuzz_edges.py)
found, each on both backends against onnxruntime in NaN, infinity and signed-zero pattern.
(conv-channel-scale-fold and the other folds into weights gave these; they are tagged
`:numerics fast` now, so exact mode keeps the scale as the Conv's epilogue.)"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from eqsat_fuse.testing import GraphCase, check_edge_case

_HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_conv_times_zero_keeps_the_sign_of_zero(backend):
    """conv(x, w) * 0 folded is conv(x, w * 0), a sum of zeros (+0), where the model gives -0
    for a negative conv(x, w)."""
    model = onnx.parser.parse_model(_HEADER + """
        g (float[1,1,1,2] x) => (float[1,1,1,2] y) <float[1,1,1,1] w = {1}, float[1,1,1] z = {0}> {
            c = Conv (x, w)
            y = Mul (c, z) }""")
    case = GraphCase(model, {"x": np.array([-2.0, 3.0], np.float32).reshape(1, 1, 1, 2)},
                     "Conv * 0")
    assert check_edge_case(case, backend=backend) == "ok"


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_an_overflowing_product_plus_inf_is_nan_not_a_fused_multiply_add(backend):
    """x * 3.4e38 + inf: the product overflows to -inf for a negative x, and -inf + inf is NaN;
    an FMA (LLVM `contract`) adds the exact product instead and gives inf."""
    model = onnx.parser.parse_model(_HEADER + """
        g (float[4] x) => (float[4] y) <float big = {3.4028235e+38}, float i = {inf}> {
            p = Mul (x, big)
            y = Add (p, i) }""")
    case = GraphCase(model, {"x": np.array([1.0, -0.5, -2.0, 0.0], np.float32)}, "x*max + inf")
    assert check_edge_case(case, backend=backend) == "ok"


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_square_root_power_keeps_the_chain_in_float32(backend):
    """x ** 0.5 was `np.sqrt(x) if x != -inf else np.inf`: the bare np.inf made the value, and
    every op after it in the kernel, float64, so (x^0.75)^2 did not overflow for x > 4.9e25
    and sqrt of it was finite where the model gives +inf."""
    model = onnx.parser.parse_model(_HEADER + """
        g (float[1,4] x) => (float[1,4] y) <float h = {0.5}, int64 two = {2}> {
            r = Pow (x, h)
            q = Pow (r, h)
            m = Mul (r, q)
            s = Pow (m, two)
            y = Sqrt (s) }""")
    x = np.array([[4.0, 1e20, 1e30, 3e38]], np.float32)
    assert check_edge_case(GraphCase(model, {"x": x}, "Pow 0.5 chain"), backend=backend) == "ok"
