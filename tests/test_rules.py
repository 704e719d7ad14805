"""Rule tests in the style of egg's: for every shipped rule, a small ONNX graph where it must
fire ("start => goal"), the shape of the program it leads to, and the numeric check against
onnxruntime. Every rule outside `analysis` must have a case here (test_every_rule_has_a_case).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.saturation.saturate import RuleProgram

from conftest import make_model

RNG = np.random.default_rng(7)
F = np.float32


def rand(*shape, low=None, high=None):
    if low is not None:
        return RNG.uniform(low, high, shape).astype(F)
    return RNG.standard_normal(shape).astype(F)


def graph(nodes, inputs, outputs, inits=None, opset=17):
    """nodes: (op, inputs, outputs, attrs); inputs/outputs: name -> shape (float32 unless a
    (shape, elem_type) pair)."""
    def spec(name, s):
        return (name, *s) if isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], int) \
            else (name, s)
    return make_model([helper.make_node(op, i, o, **a) for op, i, o, a in nodes],
                      [spec(k, v) for k, v in inputs.items()],
                      [spec(k, v) for k, v in outputs.items()], inits or {}, opset=opset)


# ---- goals: what the extracted program looks like once the rule has fired ----

def kernel_with(*ops: str) -> Callable:
    """Some kernel computes all of `ops` together."""
    def goal(report):
        return any(set(ops) <= set(k.ops) for k in report.kernels)
    goal.__doc__ = f"one kernel computes {'+'.join(ops)}"
    return goal


def no_op(op: str) -> Callable:
    def goal(report):
        return all(op not in k.ops for k in report.kernels)
    goal.__doc__ = f"no kernel computes {op}"
    return goal


def kernels_at_most(n: int) -> Callable:
    def goal(report):
        return report.kernels_out <= n
    goal.__doc__ = f"at most {n} kernels"
    return goal


def all_of(*goals):
    def goal(report):
        return all(g(report) for g in goals)
    goal.__doc__ = " and ".join(g.__doc__ for g in goals)
    return goal


CASES: dict[str, tuple] = {}


def case(name, model, goal=None, feeds=None):
    CASES[name] = (model, goal, feeds)


# ---- canon: no-ops ----
for op, extra_in, inits, attrs in [
        ("Identity", [], {}, {}),
        ("Dropout", [], {}, {}),
        ("Cast", [], {}, {"to": TensorProto.FLOAT}),
        ("Reshape", ["s"], {"s": np.array([4, 6], np.int64)}, {}),
        ("Expand", ["s"], {"s": np.array([4, 6], np.int64)}, {})]:
    name = {"Identity": "identity-removal", "Dropout": "dropout-removal",
            "Cast": "cast-same-type", "Reshape": "reshape-same-shape",
            "Expand": "expand-same-shape"}[op]
    case(name, graph([("Relu", ["x"], ["r"], {}), (op, ["r", *extra_in], ["n"], attrs),
                      ("Exp", ["n"], ["y"], {})], {"x": [4, 6]}, {"y": [4, 6]}, inits),
         all_of(no_op(op), kernel_with("Relu", "Exp")))

# ---- canon: views ----
case("flatten-as-reshape",
     graph([("Flatten", ["x"], ["f"], {"axis": 1}), ("Relu", ["f"], ["y"], {})],
           {"x": [2, 3, 4]}, {"y": [2, 12]}), kernel_with("Relu"))
case("squeeze-as-reshape",
     graph([("Squeeze", ["x", "a"], ["f"], {}), ("Relu", ["f"], ["y"], {})],
           {"x": [2, 1, 4]}, {"y": [2, 4]}, {"a": np.array([1], np.int64)}), kernel_with("Relu"))
case("unsqueeze-as-reshape",
     graph([("Unsqueeze", ["x", "a"], ["f"], {}), ("Relu", ["f"], ["y"], {})],
           {"x": [2, 4]}, {"y": [2, 1, 4]}, {"a": np.array([1], np.int64)}), kernel_with("Relu"))
case("reshape-reshape",
     graph([("Reshape", ["x", "s1"], ["a"], {}), ("Reshape", ["a", "s2"], ["b"], {}),
            ("Relu", ["b"], ["y"], {})], {"x": [2, 3, 4]}, {"y": [4, 6]},
           {"s1": np.array([6, 4], np.int64), "s2": np.array([4, 6], np.int64)}),
     kernels_at_most(1))
case("squeeze-unsqueeze",
     graph([("Relu", ["x"], ["r"], {}), ("Unsqueeze", ["r", "a"], ["u"], {}),
            ("Squeeze", ["u", "a"], ["s"], {}), ("Exp", ["s"], ["y"], {})],
           {"x": [3, 4]}, {"y": [3, 4]}, {"a": np.array([0], np.int64)}),
     kernel_with("Relu", "Exp"))
case("unsqueeze-squeeze",
     graph([("Relu", ["x"], ["r"], {}), ("Squeeze", ["r", "a"], ["u"], {}),
            ("Unsqueeze", ["u", "a"], ["s"], {}), ("Exp", ["s"], ["y"], {})],
           {"x": [3, 1, 4]}, {"y": [3, 1, 4]}, {"a": np.array([1], np.int64)}),
     kernel_with("Relu", "Exp"))
for rank, p, q in [(2, [1, 0], [1, 0]), (3, [1, 2, 0], [2, 0, 1]), (4, [0, 2, 3, 1], [0, 3, 1, 2])]:
    shape = [2, 3, 4, 5][:rank]
    case(f"transpose-transpose-{rank}d",
         graph([("Relu", ["x"], ["r"], {}), ("Transpose", ["r"], ["t1"], {"perm": p}),
                ("Transpose", ["t1"], ["t2"], {"perm": q}), ("Exp", ["t2"], ["y"], {})],
               {"x": shape}, {"y": shape}), kernel_with("Relu", "Exp"))
    case(f"transpose-identity-{rank}d",
         graph([("Relu", ["x"], ["r"], {}), ("Transpose", ["r"], ["t"], {"perm": list(range(rank))}),
                ("Exp", ["t"], ["y"], {})], {"x": shape}, {"y": shape}),
         all_of(no_op("Transpose"), kernel_with("Relu", "Exp")))
# the form the version converter gives an opset-9 Softmax over the last axis (see bert_tiny_op9)
case("softmax-through-flatten",
     graph([("Flatten", ["x"], ["f"], {"axis": 2}), ("Softmax", ["f"], ["s"], {"axis": 1}),
            ("Reshape", ["s", "shape"], ["y"], {})], {"x": [2, 3, 5]}, {"y": [2, 3, 5]},
           {"shape": np.array([2, 3, 5], np.int64)}),
     all_of(kernels_at_most(1), kernel_with("Softmax")))

# ---- canon: algebra ----
case("add-commute", graph([("Add", ["x", "c"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                          {"c": rand(4)}))
case("mul-commute", graph([("Mul", ["x", "c"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                          {"c": rand(4)}))
for name, op, value in [("mul-one", "Mul", 1.0), ("add-zero", "Add", 0.0),
                        ("sub-zero", "Sub", 0.0), ("div-one", "Div", 1.0)]:
    case(name, graph([("Relu", ["x"], ["r"], {}), (op, ["r", "c"], ["n"], {}),
                      ("Exp", ["n"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                     {"c": np.array(value, F)}),
         all_of(no_op(op), kernel_with("Relu", "Exp")))
case("pow-two", graph([("Pow", ["x", "c"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                      {"c": np.array(2.0, F)}))
case("sub-as-add-neg", graph([("Sub", ["x", "z"], ["y"], {})], {"x": [3, 4], "z": [3, 4]},
                             {"y": [3, 4]}))
case("div-const-as-mul", graph([("Div", ["x", "c"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                               {"c": rand(4, low=0.5, high=2.0)}))
case("div-exact-reciprocal-as-mul",
     graph([("Div", ["x", "c"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
           {"c": np.array([2.0, 0.25, -4.0, 2.0 ** 100], F)}))
for name, ops in [("mul-mul-const", ("Mul", "Mul")), ("add-add-const", ("Add", "Add")),
                  ("add-mul-const", ("Add", "Mul"))]:
    chain = graph([("Relu", ["x"], ["r"], {}), (ops[0], ["r", "a"], ["m"], {}),
                   (ops[1], ["m", "b"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                  {"a": rand(4), "b": rand(4)})
    case(name, chain, kernels_at_most(1))
    case(name + "-mat", chain, kernels_at_most(1))
fractions = graph([("Relu", ["x"], ["r"], {}), ("Mul", ["r", "a"], ["m"], {}),
                   ("Mul", ["m", "b"], ["y"], {})], {"x": [3, 4]}, {"y": [3, 4]},
                  {"a": rand(4, low=0.1, high=1.0), "b": rand(4, low=0.1, high=1.0)})
case("mul-mul-fraction", fractions, kernels_at_most(1))
case("mul-mul-fraction-mat", fractions, kernels_at_most(1))
for rank, shape in [(2, [3, 4]), (3, [2, 4, 5]), (4, [1, 4, 3, 3])]:
    case(f"batchnorm-as-affine-{rank}d",
         graph([("Relu", ["x"], ["r"], {}),
                ("BatchNormalization", ["r", "s", "b", "m", "v"], ["y"], {})],
               {"x": shape}, {"y": shape},
               {"s": rand(4), "b": rand(4), "m": rand(4), "v": rand(4, low=0.5, high=1.5)}),
         kernel_with("Relu"))


# ---- fold ----
def bn_inits(channels):
    return {"s": rand(channels, low=0.5, high=1.5), "b": rand(channels), "m": rand(channels),
            "v": rand(channels, low=0.5, high=1.5)}


for dims, suffix in [(1, "conv1d"), (2, "conv2d"), (3, "conv3d")]:
    spatial = [6] * dims
    for bias in (True, False):
        inits = {"w": rand(4, 3, *([3] * dims)), **bn_inits(4)}
        conv_in = ["x", "w"] + (["cb"] if bias else [])
        if bias:
            inits["cb"] = rand(4)
        case(f"{suffix}-bn-fold" if bias else f"{suffix}-nobias-bn-fold",
             graph([("Conv", conv_in, ["c"], {"pads": [1] * (2 * dims)}),
                    ("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], {})],
                   {"x": [1, 3, *spatial]}, {"y": [1, 4, *spatial]}, inits),
             all_of(no_op("BatchNormalization"), kernels_at_most(1)))
for bias in (True, False):
    inits = {"w": rand(3, 4, 3, 3), **bn_inits(4)}
    if bias:
        inits["cb"] = rand(4)
    case("convtranspose2d-bn-fold" if bias else "convtranspose2d-nobias-bn-fold",
         graph([("ConvTranspose", ["x", "w"] + (["cb"] if bias else []), ["c"],
                 {"strides": [2, 2]}),
                ("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], {})],
               {"x": [1, 3, 4, 4]}, {"y": [1, 4, 9, 9]}, inits),
         all_of(no_op("BatchNormalization"), kernels_at_most(1)))
for trans_b, name in [(0, "gemm-bn-fold"), (1, "gemm-transposed-bn-fold")]:
    case(name, graph([("Gemm", ["x", "w", "c"], ["g"], {"transB": trans_b, "beta": 0.5}),
                      ("BatchNormalization", ["g", "s", "b", "m", "v"], ["y"], {})],
                     {"x": [2, 5]}, {"y": [2, 4]},
                     {"w": rand(4, 5) if trans_b else rand(5, 4), "c": rand(4), **bn_inits(4)}),
         all_of(no_op("BatchNormalization"), kernels_at_most(1)))
case("matmul-bn-fold",
     graph([("MatMul", ["x", "w"], ["g"], {}),
            ("BatchNormalization", ["g", "s", "b", "m", "v"], ["y"], {})],
           {"x": [2, 5]}, {"y": [2, 4]}, {"w": rand(5, 4), **bn_inits(4)}),
     all_of(no_op("BatchNormalization"), kernels_at_most(1)))
for name, op, cshape, bias in [
        ("conv-channel-scale-fold", "Mul", (4, 1, 1), True),
        ("channel-scale-3d", "Mul", (1, 4, 1, 1), True),
        ("channel-shift-3d", "Add", (1, 4, 1, 1), True),
        ("conv-nobias-channel-scale-fold", "Mul", (4, 1, 1), False),
        ("conv-channel-shift-fold", "Add", (4, 1, 1), True),
        ("conv-nobias-channel-shift-fold", "Add", (4, 1, 1), False)]:
    inits = {"w": rand(4, 3, 3, 3), "k": rand(*cshape)}
    if bias:
        inits["cb"] = rand(4)
    case(name, graph([("Conv", ["x", "w"] + (["cb"] if bias else []), ["c"], {"pads": [1] * 4}),
                      (op, ["c", "k"], ["y"], {})], {"x": [1, 3, 5, 5]}, {"y": [1, 4, 5, 5]},
                     inits),
         # the channel-const-3d rules (exact) meet the folds' form; in exact mode the Mul or Add
         # stays, as the Conv's epilogue
         all_of(no_op(op), kernels_at_most(1)) if name.endswith("fold") else kernels_at_most(1))
case("pad-into-conv2d",
     graph([("Pad", ["x", "p"], ["xp"], {}), ("Conv", ["xp", "w"], ["y"], {"pads": [0, 1, 0, 1]})],
           {"x": [1, 3, 5, 5]}, {"y": [1, 4, 6, 6]},
           {"p": np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64), "w": rand(4, 3, 3, 3)}),
     all_of(no_op("Pad"), kernels_at_most(1)))
case("matmul-add-as-gemm",
     graph([("MatMul", ["x", "w"], ["m"], {}), ("Add", ["m", "b"], ["y"], {})],
           {"x": [3, 5]}, {"y": [3, 4]}, {"w": rand(5, 4), "b": rand(4)}), kernels_at_most(1))

# ---- fuse: an elementwise consumer absorbs its producer ----
UNARY = {"Relu": {}, "LeakyRelu": {"alpha": 0.1}, "Sigmoid": {}, "HardSigmoid": {},
         "HardSwish": {}, "Tanh": {}, "Erf": {}, "Gelu": {}, "Neg": {}, "Abs": {}}
POSITIVE = {"Sqrt": {}, "Exp": {}, "Log": {}, "Reciprocal": {}}
for op, attrs in {**UNARY, **POSITIVE}.items():
    producer = "Exp" if op in POSITIVE and op != "Exp" else "Neg"
    opset = 20 if op == "Gelu" else 17
    case(f"fuse-{op.lower()}",
         graph([(producer, ["x"], ["p"], {}), (op, ["p"], ["y"], attrs)], {"x": [4, 5]},
               {"y": [4, 5]}, opset=opset), kernel_with(producer, op))
case("fuse-clip", graph([("Neg", ["x"], ["p"], {}), ("Clip", ["p", "lo", "hi"], ["y"], {})],
                        {"x": [4, 5]}, {"y": [4, 5]},
                        {"lo": np.array(-0.5, F), "hi": np.array(0.5, F)}),
     kernel_with("Neg", "Clip"))
case("fuse-cast", graph([("Neg", ["x"], ["p"], {}), ("Cast", ["p"], ["y"], {"to": TensorProto.DOUBLE})],
                        {"x": [4, 5]}, {"y": ([4, 5], TensorProto.DOUBLE)}),
     kernel_with("Neg", "Cast"))
case("fuse-batchnorm",
     graph([("Neg", ["x"], ["p"], {}), ("BatchNormalization", ["p", "s", "b", "m", "v"], ["y"], {})],
           {"x": [1, 4, 3, 3]}, {"y": [1, 4, 3, 3]}, bn_inits(4)), kernels_at_most(1))
for op in ("Add", "Sub", "Mul", "Div", "Pow"):
    lhs = graph([("Exp", ["x"], ["p"], {}), (op, ["p", "z"], ["y"], {})],
                {"x": [4, 5], "z": [5]}, {"y": [4, 5]})
    rhs = graph([("Exp", ["x"], ["p"], {}), ("Exp", ["z"], ["q"], {}), (op, ["q", "p"], ["y"], {})],
                {"x": [4, 5], "z": [5]}, {"y": [4, 5]})
    case(f"fuse-{op.lower()}-lhs", lhs, kernel_with("Exp", op))
    case(f"fuse-{op.lower()}-rhs", rhs, kernels_at_most(1))
BOOL = TensorProto.BOOL
case("fuse-where-cond",
     graph([("Cast", ["x"], ["c"], {"to": BOOL}), ("Where", ["c", "a", "b"], ["y"], {})],
           {"x": [4, 5], "a": [4, 5], "b": [4, 5]}, {"y": [4, 5]}), kernel_with("Cast", "Where"))
case("fuse-where-lhs",
     graph([("Neg", ["a"], ["n"], {}), ("Where", ["c", "n", "b"], ["y"], {})],
           {"c": ([4, 5], BOOL), "a": [4, 5], "b": [4, 5]}, {"y": [4, 5]}),
     kernel_with("Neg", "Where"))
case("fuse-where-rhs",
     graph([("Neg", ["b"], ["n"], {}), ("Where", ["c", "a", "n"], ["y"], {})],
           {"c": ([4, 5], BOOL), "a": [4, 5], "b": [4, 5]}, {"y": [4, 5]}),
     kernel_with("Neg", "Where"))
for op in ("And", "Or", "Xor"):            # booleans: the producer a Cast to bool
    for side, args in (("lhs", ["p", "z"]), ("rhs", ["z", "p"])):
        case(f"fuse-{op.lower()}-{side}",
             graph([("Cast", ["x"], ["p"], {"to": BOOL}), (op, args, ["y"], {})],
                   {"x": [4, 5], "z": ([4, 5], BOOL)}, {"y": ([4, 5], BOOL)}),
             kernel_with("Cast", op))
case("fuse-not", graph([("Cast", ["x"], ["p"], {"to": BOOL}), ("Not", ["p"], ["y"], {})],
                       {"x": [4, 5]}, {"y": ([4, 5], BOOL)}), kernel_with("Cast", "Not"))

# ---- fuse: reductions with an elementwise prologue ----
case("fuse-softmax-prologue",
     graph([("Mul", ["x", "c"], ["p"], {}), ("Softmax", ["p"], ["y"], {"axis": -1})],
           {"x": [4, 6]}, {"y": [4, 6]}, {"c": np.array(0.5, F)}), kernel_with("Mul", "Softmax"))
case("fuse-layernorm-prologue",
     graph([("Add", ["x", "z"], ["p"], {}),
            ("LayerNormalization", ["p", "g", "b"], ["y"], {"axis": -1})],
           {"x": [4, 6], "z": [4, 6]}, {"y": [4, 6]}, {"g": rand(6), "b": rand(6)}),
     kernel_with("Add", "LayerNormalization"))
for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
    case(f"fuse-{op.lower()}-prologue",
         graph([("Neg", ["x"], ["p"], {}), (op, ["p", "a"], ["y"], {})], {"x": [4, 6]},
               {"y": [4, 1]}, {"a": np.array([1], np.int64)}, opset=18), kernel_with("Neg", op))

# ---- fuse: recognized compositions ----
case("layernorm-decomposed",
     graph([("ReduceMean", ["x"], ["mean"], {"axes": [-1]}), ("Sub", ["x", "mean"], ["d"], {}),
            ("Pow", ["d", "two"], ["sq"], {}), ("ReduceMean", ["sq"], ["var"], {"axes": [-1]}),
            ("Add", ["var", "eps"], ["ve"], {}), ("Sqrt", ["ve"], ["sd"], {}),
            ("Div", ["d", "sd"], ["n"], {}), ("Mul", ["n", "g"], ["s"], {}),
            ("Add", ["s", "b"], ["y"], {})],
           {"x": [2, 5, 8]}, {"y": [2, 5, 8]},
           {"two": np.array(2.0, F), "eps": np.array(1e-5, F), "g": rand(8), "b": rand(8)},
           opset=13),
     all_of(kernels_at_most(1), kernel_with("LayerNormalization")))
case("gelu-erf",
     graph([("Div", ["x", "r2"], ["q"], {}), ("Erf", ["q"], ["e"], {}),
            ("Add", ["e", "one"], ["o"], {}), ("Mul", ["x", "o"], ["p"], {}),
            ("Mul", ["p", "half"], ["y"], {})], {"x": [4, 8]}, {"y": [4, 8]},
           {"r2": np.array(np.sqrt(2), F), "one": np.array(1.0, F), "half": np.array(0.5, F)}),
     all_of(kernels_at_most(1), kernel_with("Gelu")))
case("gelu-tanh",
     graph([("Pow", ["x", "three"], ["c"], {}), ("Mul", ["c", "k1"], ["ck"], {}),
            ("Add", ["x", "ck"], ["i"], {}), ("Mul", ["i", "k2"], ["s"], {}),
            ("Tanh", ["s"], ["t"], {}), ("Add", ["t", "one"], ["o"], {}),
            ("Mul", ["x", "half"], ["h"], {}), ("Mul", ["h", "o"], ["y"], {})],
           {"x": [4, 8]}, {"y": [4, 8]},
           {"three": np.array(3.0, F), "k1": np.array(0.044715, F),
            "k2": np.array(np.sqrt(2 / np.pi), F), "one": np.array(1.0, F),
            "half": np.array(0.5, F)}),
     all_of(kernels_at_most(1), kernel_with("Gelu")))

# ---- fuse: attention as one kernel, in each spelling (q [1, 2, 6, 4], kt [1, 2, 4, 9]) ----
def _attention(scale_op=None, mask=False):
    nodes = [("MatMul", ["q", "kt"], ["s"], {})]
    last = "s"
    if scale_op:
        nodes.append((scale_op, [last, "c"], ["z"], {}))
        last = "z"
    if mask:
        nodes.append(("Add", [last, "m"], ["y"], {}))
        last = "y"
    nodes += [("Softmax", [last], ["p"], {"axis": -1}), ("MatMul", ["p", "v"], ["o"], {})]
    inits = {"c": np.array(2.0, F)}
    if mask:      # a padding mask over the keys: the last three are masked out
        inits["m"] = np.where(np.arange(9) < 6, 0.0, -1e4).astype(F).reshape(1, 1, 1, 9)
    return graph(nodes, {"q": [1, 2, 6, 4], "kt": [1, 2, 4, 9], "v": [1, 2, 9, 5]},
                 {"o": [1, 2, 6, 5]},
                 {k: v for k, v in inits.items() if k != "c" or scale_op})


for name, scale_op, mask in (("attention-mul-mask", "Mul", True),
                             ("attention-div-mask", "Div", True),
                             ("attention-mask", None, True), ("attention-mul", "Mul", False),
                             ("attention-div", "Div", False), ("attention", None, False)):
    # the rule fires and the program matches; whether FusedAttention is extracted at these
    # sizes is the cost model's choice (tests/test_attention.py: both sides of it)
    case(name, _attention(scale_op, mask))

case("half-out-of-rhs",    # the dynamo exporter's GELU: x * (0.5 * (1 + erf(x / sqrt 2)))
     graph([("Div", ["x", "r2"], ["q"], {}), ("Erf", ["q"], ["e"], {}),
            ("Add", ["e", "one"], ["o"], {}), ("Mul", ["half", "o"], ["ho"], {}),
            ("Mul", ["x", "ho"], ["y"], {})], {"x": [4, 8]}, {"y": [4, 8]},
           {"r2": np.array(np.sqrt(2), F), "one": np.array(1.0, F), "half": np.array(0.5, F)}),
     all_of(kernels_at_most(1), kernel_with("Gelu")))
case("gelu-erf-rsqrt2",    # x * (1 + erf(x * 0.7071..)) * 0.5
     graph([("Mul", ["x", "r2"], ["q"], {}), ("Erf", ["q"], ["e"], {}),
            ("Add", ["e", "one"], ["o"], {}), ("Mul", ["x", "o"], ["p"], {}),
            ("Mul", ["p", "half"], ["y"], {})], {"x": [4, 8]}, {"y": [4, 8]},
           {"r2": np.array(1 / np.sqrt(2), F), "one": np.array(1.0, F), "half": np.array(0.5, F)}),
     all_of(kernels_at_most(1), kernel_with("Gelu")))
case("half-out-of-lhs",    # onnxscript's GELU: (0.5 * x) * (1 + erf(x * 0.7071..))
     graph([("Mul", ["x", "r"], ["q"], {}), ("Erf", ["q"], ["e"], {}),
            ("Add", ["e", "one"], ["o"], {}), ("Mul", ["half", "x"], ["hx"], {}),
            ("Mul", ["hx", "o"], ["y"], {})], {"x": [4, 8]}, {"y": [4, 8]},
           {"r": np.array(1 / np.sqrt(2), F), "one": np.array(1.0, F),
            "half": np.array(0.5, F)}),
     all_of(kernels_at_most(1), kernel_with("Gelu")))
case("pow-three",
     graph([("Pow", ["x", "three"], ["c"], {}), ("Relu", ["c"], ["y"], {})],
           {"x": [4, 8]}, {"y": [4, 8]}, {"three": np.array(3.0, F)}), kernels_at_most(1))


def siblings(n):
    nodes, inits, outs = [], {}, {}
    for i in range(n):
        inits[f"w{i}"], inits[f"b{i}"] = rand(6, 4 + i), rand(4 + i)
        nodes += [("MatMul", ["x", f"w{i}"], [f"m{i}"], {}), ("Add", [f"m{i}", f"b{i}"], [f"y{i}"], {})]
        outs[f"y{i}"] = [1, 3, 4 + i]
    return graph(nodes, {"x": [1, 3, 6]}, outs, inits)


case("sibling-matmul-bias", siblings(2))
case("sibling-matmul-bias-3", siblings(3))
case("relu-before-reshape",
     graph([("MatMul", ["x", "w"], ["m"], {}), ("Reshape", ["m", "s"], ["r"], {}),
            ("Relu", ["r"], ["y"], {})], {"x": [6, 4]}, {"y": [2, 3, 5]},
           {"w": rand(4, 5), "s": np.array([2, 3, 5], np.int64)}), kernel_with("MatMul", "Relu"))
case("gelu-before-reshape",
     graph([("MatMul", ["x", "w"], ["m"], {}), ("Reshape", ["m", "s"], ["r"], {}),
            ("Gelu", ["r"], ["y"], {})], {"x": [6, 4]}, {"y": [2, 3, 5]},
           {"w": rand(4, 5), "s": np.array([2, 3, 5], np.int64)}, opset=20),
     kernel_with("MatMul", "Gelu"))
case("sigmoid-before-reshape",
     graph([("MatMul", ["x", "w"], ["m"], {}), ("Reshape", ["m", "s"], ["r"], {}),
            ("Sigmoid", ["r"], ["y"], {})], {"x": [6, 4]}, {"y": [2, 3, 5]},
           {"w": rand(4, 5), "s": np.array([2, 3, 5], np.int64)}),
     kernel_with("MatMul", "Sigmoid"))
case("tanh-before-reshape",
     graph([("MatMul", ["x", "w"], ["m"], {}), ("Reshape", ["m", "s"], ["r"], {}),
            ("Tanh", ["r"], ["y"], {})], {"x": [6, 4]}, {"y": [2, 3, 5]},
           {"w": rand(4, 5), "s": np.array([2, 3, 5], np.int64)}), kernel_with("MatMul", "Tanh"))
case("scale-before-reshape",
     graph([("MatMul", ["x", "w"], ["m"], {}), ("Reshape", ["m", "s"], ["r"], {}),
            ("Mul", ["r", "c"], ["y"], {})], {"x": [6, 4]}, {"y": [2, 3, 5]},
           {"w": rand(4, 5), "s": np.array([2, 3, 5], np.int64), "c": np.array(0.5, F)}),
     kernel_with("MatMul", "Mul"))
# ---- quantization (QDQ graphs, as onnxruntime's quantizer writes them) ----
U8 = TensorProto.UINT8


def qdq_params(scale=0.05, zero=128):
    return {"s": np.array(scale, F), "z": np.array(zero, np.uint8)}


case("fuse-quantize",
     graph([("Neg", ["x"], ["p"], {}), ("QuantizeLinear", ["p", "s", "z"], ["y"], {})],
           {"x": [4, 5]}, {"y": ([4, 5], U8)}, qdq_params()), kernel_with("Neg", "QuantizeLinear"))
case("fuse-dequantize",
     graph([("Neg", ["x"], ["p"], {}), ("QuantizeLinear", ["p", "s", "z"], ["q"], {}),
            ("DequantizeLinear", ["q", "s", "z"], ["y"], {})],
           {"x": [4, 5]}, {"y": [4, 5]}, qdq_params()),
     kernel_with("Neg", "QuantizeLinear", "DequantizeLinear"))
case("quantize-dequantize",     # the pair a quantizer writes around a value: the second Q goes
     graph([("Neg", ["x"], ["p"], {}), ("QuantizeLinear", ["p", "s", "z"], ["q"], {}),
            ("DequantizeLinear", ["q", "s", "z"], ["d"], {}),
            ("QuantizeLinear", ["d", "s", "z"], ["y"], {})],
           {"x": [4, 5]}, {"y": ([4, 5], U8)}, qdq_params()), no_op("DequantizeLinear"))
for view, node, attrs, shape in [
        ("reshape", "Reshape", {}, [2, 3, 5]), ("transpose", "Transpose", {"perm": [1, 0]}, [5, 6])]:
    inits = {**qdq_params(), **({"shape": np.array(shape, np.int64)} if node == "Reshape" else {})}
    extra = ["shape"] if node == "Reshape" else []
    case(f"quantize-before-{view}",
         graph([("MatMul", ["x", "w"], ["m"], {}), (node, ["m", *extra], ["r"], attrs),
                ("QuantizeLinear", ["r", "s", "z"], ["y"], {})],
               {"x": [6, 4]}, {"y": (shape, U8)}, {**inits, "w": rand(4, 5)}),
         kernel_with("MatMul", "QuantizeLinear"))
    case(f"dequantize-before-{view}",
         graph([("Neg", ["x"], ["p"], {}), ("QuantizeLinear", ["p", "s", "z"], ["q"], {}),
                (node, ["q", *extra], ["r"], attrs),
                ("DequantizeLinear", ["r", "s", "z"], ["y"], {})],
               {"x": [6, 5]}, {"y": shape}, inits),
         kernel_with("Neg", "QuantizeLinear", "DequantizeLinear"))
case("dequantize-after-gather",   # a quantized embedding table: rows gathered as integers
     graph([("DequantizeLinear", ["t", "s", "z"], ["d"], {}),
            ("Gather", ["d", "ids"], ["g"], {"axis": 0}), ("Relu", ["g"], ["y"], {})],
           {"ids": ([4, 64], TensorProto.INT64)}, {"y": [4, 64, 256]},
           {**qdq_params(), "t": RNG.integers(0, 256, (500, 256)).astype(np.uint8)}),
     kernel_with("DequantizeLinear", "Relu"),
     feeds={"ids": RNG.integers(0, 500, (4, 64)).astype(np.int64)})
# ---- quant: a contraction of dequantized integers as an integer contraction ----
I8 = TensorProto.INT8


def qdq_contraction(op, per_channel, bias, quantize_out=False, trans_b=False):
    """x -> QuantizeLinear -> DequantizeLinear -> op(., DequantizeLinear(int8 weights), bias),
    the weights per output channel (axis 0 of Conv weights, 1 of MatMul / Gemm weights) or
    per tensor, as onnxruntime's quantizer writes them; optionally quantized after."""
    conv = op == "Conv"
    # big enough that the integer contraction is the cheaper program under the cpu target
    wshape, xshape, yshape = ([32, 16, 3, 3], [1, 16, 18, 18], [1, 32, 16, 16]) if conv else \
        ([256, 64], [64, 256], [64, 64])
    channels = 32 if conv else 64
    if trans_b:                     # a classifier head: weights [N, K], per row (axis 0)
        wshape = [64, 256]
    inits = {"sx": np.array(0.02, F), "zx": np.array(120, np.uint8),
             "w8": RNG.integers(-127, 128, wshape).astype(np.int8),
             "sw": (RNG.uniform(0.005, 0.02, channels).astype(F) if per_channel
                    else np.array(0.01, F)),
             "zw": np.zeros(channels if per_channel else (), np.int8)}
    axis = {"axis": 0 if conv or trans_b else 1} if per_channel else {}
    nodes = [("QuantizeLinear", ["x", "sx", "zx"], ["q"], {}),
             ("DequantizeLinear", ["q", "sx", "zx"], ["d"], {}),
             ("DequantizeLinear", ["w8", "sw", "zw"], ["w"], axis)]
    inputs = ["d", "w"] + (["b"] if bias else [])
    if bias:
        inits["b"] = rand(channels)
    out = "m" if quantize_out else "y"
    nodes.append((op, inputs, [out], {"pads": [0] * 4} if conv else
                  {"transB": 1} if trans_b else {}))
    outputs = {"y": yshape}
    if quantize_out:
        inits.update(sy=np.array(0.05, F), zy=np.array(128, np.uint8))
        nodes.append(("QuantizeLinear", ["m", "sy", "zy"], ["y"], {}))
        outputs = {"y": (yshape, U8)}
    return graph(nodes, {"x": xshape}, outputs, inits)


for op, name, bias in [("Conv", "conv", True), ("Conv", "conv-nobias", False),
                       ("MatMul", "matmul", False), ("Gemm", "gemm", True),
                       ("Gemm", "gemm-nobias", False)]:
    anchor = "ConvInteger" if op == "Conv" else "MatMulInteger"
    for per_channel in (True, False):
        rule = f"qdq-{name}{'' if per_channel else '-per-tensor'}-integer"
        if op == "Conv" and not per_channel:
            rule = f"qdq-conv-per-tensor{'' if bias else '-nobias'}-integer"
        case(rule, qdq_contraction(op, per_channel, bias), kernel_with(anchor))
case("qdq-conv-integer", qdq_contraction("Conv", True, True, quantize_out=True),
     kernel_with("ConvInteger", "QuantizeLinear"))
for per_channel in (True, False):
    case(f"qdq-gemm-transb{'' if per_channel else '-per-tensor'}-integer",
         qdq_contraction("Gemm", per_channel, True, trans_b=True), kernel_with("MatMulInteger"))
case("quantize-integer-contraction", qdq_contraction("MatMul", True, False, quantize_out=True),
     kernel_with("MatMulInteger", "QuantizeLinear"))
case("quantize-integer-contraction-bias", qdq_contraction("Conv", False, True, quantize_out=True),
     kernel_with("ConvInteger", "QuantizeLinear"))
case("sibling-conv",
     graph([("Conv", ["x", "w0", "b0"], ["y0"], {"pads": [1] * 4}),
            ("Conv", ["x", "w1", "b1"], ["y1"], {"pads": [1] * 4})],
           {"x": [1, 3, 5, 5]}, {"y0": [1, 4, 5, 5], "y1": [1, 2, 5, 5]},
           {"w0": rand(4, 3, 3, 3), "b0": rand(4), "w1": rand(2, 3, 3, 3), "b1": rand(2)}))


def shipped_rules():
    return {name: info for name, info in RuleProgram().rules.items()
            if info.ruleset != "analysis"}


def test_every_rule_has_a_case():
    missing = sorted(set(shipped_rules()) - set(CASES))
    assert not missing, f"rules without a start => goal case: {missing}"
    assert not set(CASES) - set(shipped_rules()), "cases for rules that no longer exist"


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_and_the_program_matches_onnxruntime(rule):
    """Each rule on its model; a rule tagged `:numerics fast` under numerics="fast" (in the
    default exact mode it must not fire at all)."""
    model, goal, feeds = CASES[rule]
    if RuleProgram().rules[rule].numerics == "fast":
        assert rule not in ef.compile(model).report.matches_per_rule, \
            f"{rule} is tagged :numerics fast but fired in exact mode"
        compiled = ef.compile(model, numerics="fast")
    else:
        compiled = ef.compile(model)
    report = compiled.report
    assert report.matches_per_rule.get(rule, 0) >= 1, \
        f"{rule} did not fire; fired: {sorted(report.matches_per_rule)}"
    if goal is not None:
        assert goal(report), (f"{rule}: expected {goal.__doc__}; kernels: "
                              f"{[k.ops for k in report.kernels]}")
    result = compiled.verify(feeds)
    assert result.ok, f"{rule}\n{result.summary()}"
