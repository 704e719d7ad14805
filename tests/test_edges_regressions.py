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
