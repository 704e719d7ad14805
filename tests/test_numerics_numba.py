"""Numerics of the Numba backend at the edges of floating point (issue 21, items 6-11): each
minimal case compiled on both backends and compared with the oracle (onnxruntime with its
graph optimizations off, or `onnx.reference` where onnxruntime itself departs from the spec)
in values and, exactly, in which elements are NaN, +-inf or signed zero.

The contract: no kernel may change which elements are NaN, +-inf or a signed zero (exact mode
compiles the generated kernels without fast-math flags, not even `contract`; see
eqsat_fuse/numerics.py).
The rewrites' side of the contract (items 1-5) is tests/test_numerics_contract.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import check_ieee, make_model

F16, F64, I64 = TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("numerics-cache")


def _unary_chain(ops, shape, dtype=TensorProto.FLOAT):
    """x -> ops[0] -> ops[1] ... -> y."""
    names = ["x"] + [f"t{k}" for k in range(len(ops) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[k]], [names[k + 1]]) for k, op in enumerate(ops)]
    return make_model(nodes, [("x", shape, dtype)], [("y", shape, dtype)])


def _scalar_forms():
    """(label, BodyNode, constant exponent) for every elementwise op with a Numba scalar form,
    and each special case of Pow's exponent."""
    from eqsat_fuse.ir import BodyNode, Operand
    from eqsat_fuse.ops import OPS

    forms = []
    for name, spec in OPS.items():
        if spec.kind != "elementwise" or name in ("Cast", "QuantizeLinear"):
            continue            # (their results are of another dtype: integers, for Q)
        attrs = {a: 0.5 for a in spec.attrs}
        if name == "Gelu":
            for approx in ("none", "tanh"):
                forms.append((f"Gelu-{approx}", BodyNode(name, [Operand("buffer", "x")],
                                                         {"approximate": approx}), None))
            continue
        args = [Operand("buffer", f"x{k}") for k in range(len(spec.inputs))]
        forms.append((name, BodyNode(name, args, attrs), None))
    for y in (1.0, 2.0, 3.0, 0.5, -1.0, 1.7, 2):
        forms.append((f"Pow-{y!r}", BodyNode("Pow", [Operand("buffer", "x0"),
                                                     Operand("const", "y")], {}), y))
    return forms


@pytest.mark.parametrize("label, node, exponent", _scalar_forms(),
                         ids=[f[0] for f in _scalar_forms()])
def test_every_float32_scalar_form_computes_in_float32(label, node, exponent):
    """A float32 kernel computes every op in float32: a float64 constant anywhere in an op's
    form (a bare `np.inf`, `1.0` in a sum) makes its value, and every op after it in the
    kernel, float64, which rounds and overflows differently (x ** 0.5 did, the edge fuzzer
    found it). Each form is compiled on float32 arguments and its type is read back."""
    from numba import njit

    from eqsat_fuse.backends.numba import scalars
    from eqsat_fuse.backends.numba.spaces import Unsupported

    n = len(node.args)
    names = [f"a{k}" for k in range(n)]
    dtypes = ["float32"] * n
    if label == "Pow-2":
        dtypes[1] = "int64"
    if node.op == "Where":
        dtypes[0] = "bool"
    try:
        expr = scalars.scalar_expr(node, names, dtypes, "float32",
                                   lambda i: exponent if i == 1 else None)
    except Unsupported:
        pytest.skip(f"{label} has no float32 Numba form")
    env: dict = {}
    exec(f"def f({', '.join(names)}):\n    return {expr}\n",
         {"np": np, "math": __import__("math"), "F32": np.float32,
          **{k: getattr(__import__("eqsat_fuse.backends.numba.approx",
                                   fromlist=["x"]), k)
             for k in ("exp_f32", "tanh_f32", "sigmoid_f32", "erf_f32", "gelu_f32",
                       "gelu_tanh_f32", "f16_to_f32", "f32_to_f16")}}, env)
    fn = njit(env["f"])
    values = [np.bool_(True) if d == "bool" else np.int64(2) if d == "int64"
              else np.float32(1.5) for d in dtypes]
    fn(*values)
    returned = fn.nopython_signatures[0].return_type    # Numba's type; the call boxes it
    assert str(returned) == "float32", f"{label}: {expr} is {returned}"


# -- item 6: x / y with y invariant in the inner loop was x * (1 / y) (fastmath arcp) --

_NUM = np.array([1e-30, 3.0, 2e-39, 1.0], np.float32)


@pytest.mark.parametrize("y_shape", [[4, 1], [1]], ids=["per-row", "scalar"])
def test_division_by_a_subnormal_loop_invariant(kernel_cache, y_shape):
    nodes = [helper.make_node("Div", ["x", "y"], ["q"]), helper.make_node("Relu", ["q"], ["o"])]
    model = make_model(nodes, [("x", [4, 4]), ("y", y_shape)], [("o", [4, 4])])
    x = np.tile(_NUM, (4, 1))
    y = np.array([1e-40, 2e-39, 1e-38, 3.0], np.float32)[:int(np.prod(y_shape))]
    check_ieee(model, {"x": x, "y": y.reshape(y_shape)}, kernel_cache)


# -- item 7: a float64 inf / NaN constant in a kernel was written as the bare name `inf` --

@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_float64_nonfinite_constant(kernel_cache, value):
    nodes = [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    model = make_model(nodes, [("x", [4], F64)], [("y", [4], F64)],
                       {"c": np.array(value, np.float64)})
    check_ieee(model, {"x": np.array([1.0, -2.0, 0.5, 3.0])}, kernel_cache)


# -- item 8: Pow with an integer exponent <= -2 and a zero base raised ZeroDivisionError --

def test_pow_constant_negative_integer_exponent(kernel_cache):
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Neg", ["p"], ["y"])]
    model = make_model(nodes, [("x", [4])], [("y", [4])], {"e": np.array(-3, np.int64)})
    check_ieee(model, {"x": np.array([0.0, -0.0, 2.0, 1.0], np.float32)}, kernel_cache)


def test_pow_integer_exponent_input(kernel_cache):
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Neg", ["p"], ["y"])]
    model = make_model(nodes, [("x", [4]), ("e", [4], I64)], [("y", [4])])
    feeds = {"x": np.array([0.0, -0.0, 2.0, 0.0], np.float32),
             "e": np.array([-2, -3, -2, -5], np.int64)}
    check_ieee(model, feeds, kernel_cache)


# -- item 9: a row whose variance overflows float32 gave NaN (1 / sqrt(inf) estimated) --

@pytest.mark.parametrize("fused", [False, True], ids=["alone", "prologue-epilogue"])
def test_layernorm_variance_overflow(kernel_cache, fused):
    inits = {"s": np.array([1.0, 2.0, 0.5, 1.0], np.float32),
             "b": np.array([0.5, -0.25, 0.0, 1.0], np.float32)}
    x = np.array([[3e19, -3e19, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    if fused:
        nodes = [helper.make_node("Add", ["x", "r"], ["a"]),
                 helper.make_node("LayerNormalization", ["a", "s", "b"], ["n"], axis=-1),
                 helper.make_node("Relu", ["n"], ["y"])]
        model = make_model(nodes, [("x", [2, 4]), ("r", [2, 4])], [("y", [2, 4])], inits)
        feeds = {"x": x, "r": np.zeros((2, 4), np.float32)}
    else:
        nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)]
        model = make_model(nodes, [("x", [2, 4])], [("y", [2, 4])], inits)
        feeds = {"x": x}
    with np.errstate(over="ignore"):
        check_ieee(model, feeds, kernel_cache)


# -- item 10: 1 / sqrt(x) was a reciprocal-square-root estimate (arcp): NaN at 0 and inf --

_RSQRT_X = np.array([0.0, -0.0, np.inf, 1e-40], np.float32)


def test_reciprocal_of_sqrt(kernel_cache):
    check_ieee(_unary_chain(["Sqrt", "Reciprocal"], [4]), {"x": _RSQRT_X}, kernel_cache)


def test_division_by_sqrt(kernel_cache):
    nodes = [helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Div", ["w", "s"], ["y"])]
    model = make_model(nodes, [("x", [4]), ("w", [4])], [("y", [4])])
    feeds = {"x": _RSQRT_X, "w": np.array([1.0, 1.0, -1.0, 1.0], np.float32)}
    check_ieee(model, feeds, kernel_cache)


# -- item 11: a float16 result is rounded to float16 before a Cast reads it --

def test_float16_add_rounds_before_cast(kernel_cache):
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)]
    model = make_model(nodes, [("a", [4], F16), ("b", [4], F16)], [("y", [4])])
    feeds = {"a": np.array([0.4307, 0.1, 1.0, 2.0], np.float16),
             "b": np.array([0.4304, 0.2, 1.0, 3.0], np.float16)}
    # onnxruntime's CPU provider computes float16 Add in float32 (a Cast it inserts itself)
    check_ieee(model, feeds, kernel_cache, oracle="reference")


def test_float16_chain_rounds_each_op(kernel_cache):
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Sub", ["m", "a"], ["d"]),
             helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT)]
    model = make_model(nodes, [("a", [4], F16), ("b", [4], F16)], [("y", [4])])
    feeds = {"a": np.array([0.333, 1.001, 3.0, 7.77], np.float16),
             "b": np.array([3.0, 1.001, 0.1, 1.3], np.float16)}
    check_ieee(model, feeds, kernel_cache, oracle="reference")


# -- signed zeros (fastmath nsz): -(x - y) is not y - x, 0 + p is not p --

_ZEROS = {"x": np.array([0.0, -0.0, 0.0, -0.0], np.float32),
          "y": np.array([0.0, 0.0, -0.0, -0.0], np.float32)}


@pytest.mark.parametrize("case", ["neg-sub", "add", "mul-neg", "where-neg"])
def test_signed_zeros(kernel_cache, case):
    if case == "neg-sub":
        nodes = [helper.make_node("Sub", ["x", "y"], ["t"]), helper.make_node("Neg", ["t"], ["o"])]
    elif case == "add":
        nodes = [helper.make_node("Add", ["x", "y"], ["t"]), helper.make_node("Neg", ["t"], ["o"])]
    elif case == "mul-neg":
        nodes = [helper.make_node("Neg", ["x"], ["t"]), helper.make_node("Mul", ["t", "y"], ["o"])]
    else:
        nodes = [helper.make_node("Neg", ["x"], ["t"]),
                 helper.make_node("Less", ["y", "x"], ["c"]),
                 helper.make_node("Where", ["c", "t", "y"], ["o"])]
    model = make_model(nodes, [("x", [4]), ("y", [4])], [("o", [4])])
    check_ieee(model, _ZEROS, kernel_cache)


@pytest.mark.parametrize("kernel, group", [(3, 4), (5, 4), (3, 1)])
def test_conv_of_zeros_with_negative_weights_is_plus_zero(kernel_cache, kernel, group):
    """A Conv without bias over a zero patch sums products that are all -0 (negative weight
    times +0): an accumulator starting from +0 gives +0, as onnxruntime does; the 3x3
    depthwise kernel, which summed its nine taps directly, gave -0."""
    weights = -np.ones((4, 4 // group, kernel, kernel), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[1] * 4)]
    out = 8 - kernel + 3
    model = make_model(nodes, [("x", [1, 4, 8, 8])], [("y", [1, 4, out, out])], {"w": weights})
    x = np.zeros((1, 4, 8, 8), np.float32)
    x[0, :, 0, 0] = 1.0
    check_ieee(model, {"x": x}, kernel_cache)
