"""The operators of the term language: what each one is, and how to evaluate it on NumPy arrays.

The constructors themselves (their sorts) are declared in `rules/lang.egg`; this table says, for
each constructor, the names of its tensor inputs and attributes (in constructor order) and its
kind, which the cost model and the kernel legality rules use:

- ``elementwise``: one output element from the same element of each (broadcast) input;
- ``anchor``: a contraction (Conv, MatMul, Gemm) that reads materialized inputs and can carry a
  fused elementwise epilogue;
- ``reduction``: a row or window kernel (Softmax, LayerNormalization, ReduceMean, pooling);
- ``view``: changes how data is addressed without computing (Reshape, Transpose, Slice...);
- ``leaf``: Input, Const and literals; ``structure``: Mat and tensor lists; ``opaque``: an ONNX
  node run as is through `onnx.reference`.

`evaluate` is the one place that maps a term-language operation onto `numpy_ops`; constant
folding, the NumPy backend and the rule checker all go through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .backends.numpy import ops as npo


@dataclass(frozen=True)
class OpSpec:
    """One constructor: tensor input slots, attributes (in constructor order) and its kind."""

    name: str
    inputs: tuple[str, ...]
    attrs: tuple[str, ...] = ()
    kind: str = "elementwise"
    optional: tuple[str, ...] = ()       # input slots that may be `(Absent)`
    # elementwise only: the input slots through which a fusable producer may be computed inside
    # this op's kernel (`fuse-<op>` rules in rules/generated.egg, with the `elementwise-<op>`
    # fact); () for none: no rule is generated
    fused_inputs: tuple[str, ...] = ()
    short: str = ""                      # its name in rule names (default: the name, lower case)

    @property
    def rule_stem(self) -> str:
        return self.short or self.name.lower()

    def fuse_rule_names(self) -> dict[str, str]:
        """Fused input slot -> the name of its generated rule: `fuse-<op>` for one slot,
        `-cond` / `-lhs` / `-rhs` suffixes for several (the condition, then operands in order)."""
        if len(self.fused_inputs) == 1:
            return {self.fused_inputs[0]: f"fuse-{self.rule_stem}"}
        operands = iter(("lhs", "rhs"))
        return {slot: f"fuse-{self.rule_stem}-{'cond' if slot == 'cond' else next(operands)}"
                for slot in self.fused_inputs}


def _spec(name, inputs, attrs=(), kind="elementwise", optional=(), fused=None, short=""):
    """`fused`: the elementwise op's fused input slots (default: all of them)."""
    if fused is None:
        fused = inputs if kind == "elementwise" else ()
    return OpSpec(name, tuple(inputs), tuple(attrs), kind, tuple(optional), tuple(fused), short)


_SPECS = [
    # leaves and structure
    _spec("Input", [], ["name"], "leaf"),
    _spec("Const", [], ["name"], "leaf"),
    _spec("Absent", [], [], "leaf"),
    _spec("Scalar", [], ["value", "dtype"], "leaf"),
    _spec("Ints", [], ["values"], "leaf"),
    _spec("Mat", ["x"], [], "structure"),
    _spec("TNil", [], [], "structure"),
    _spec("TCons", ["head", "tail"], [], "structure"),
    # elementwise
    _spec("Relu", ["x"]),
    _spec("LeakyRelu", ["x"], ["alpha"]),
    _spec("Clip", ["x", "min", "max"], optional=["min", "max"], fused=["x"]),
    _spec("Sigmoid", ["x"]),
    _spec("HardSigmoid", ["x"], ["alpha", "beta"]),
    _spec("HardSwish", ["x"]),
    _spec("Tanh", ["x"]),
    _spec("Erf", ["x"]),
    _spec("Gelu", ["x"], ["approximate"]),
    _spec("Add", ["a", "b"]),
    _spec("Sub", ["a", "b"]),
    _spec("Mul", ["a", "b"]),
    _spec("Div", ["a", "b"]),
    _spec("Pow", ["x", "y"]),
    _spec("Sqrt", ["x"]),
    _spec("Exp", ["x"]),
    _spec("Log", ["x"]),
    _spec("Neg", ["x"]),
    _spec("Abs", ["x"]),
    _spec("Reciprocal", ["x"]),
    _spec("Where", ["cond", "x", "y"]),
    _spec("Cast", ["x"], ["to"]),
    _spec("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["epsilon"], fused=["x"],
          short="batchnorm"),
    # removed by the canon rules before fusion: no fusion rule of their own
    _spec("Identity", ["x"], fused=[]),
    _spec("Dropout", ["x"], fused=[]),
    # anchors: contractions
    _spec("Conv", ["x", "w", "b"], ["pads", "strides", "dilations", "group"], "anchor", ["b"]),
    _spec("ConvTranspose", ["x", "w", "b"],
          ["pads", "strides", "dilations", "group", "output_padding"], "anchor", ["b"]),
    _spec("MatMul", ["a", "b"], [], "anchor"),
    _spec("Gemm", ["a", "b", "c"], ["alpha", "beta", "trans_a", "trans_b"], "anchor", ["c"]),
    # reductions: row and window kernels
    _spec("Softmax", ["x"], ["axis"], "reduction"),
    _spec("LayerNormalization", ["x", "scale", "bias"], ["axis", "epsilon"], "reduction", ["bias"]),
    _spec("ReduceMean", ["x"], ["axes", "keepdims"], "reduction"),
    _spec("ReduceSum", ["x"], ["axes", "keepdims"], "reduction"),
    _spec("MaxPool", ["x"], ["kernel_shape", "pads", "strides", "dilations", "ceil_mode"], "reduction"),
    _spec("AveragePool", ["x"],
          ["kernel_shape", "pads", "strides", "dilations", "ceil_mode", "count_include_pad"],
          "reduction"),
    _spec("GlobalAveragePool", ["x"], [], "reduction"),
    _spec("LRN", ["x"], ["size", "alpha", "beta", "bias"], "reduction"),
    # data movement
    _spec("Concat", ["xs"], ["axis"], "movement"),
    _spec("Gather", ["data", "indices"], ["axis"], "movement"),
    _spec("Pad", ["x"], ["pads", "mode", "value"], "movement"),
    # views: no arithmetic; NumPy gives a view (a copy only where strides force one)
    _spec("Transpose", ["x"], ["perm"], "view"),
    _spec("Reshape", ["x"], ["shape"], "view"),
    _spec("Flatten", ["x"], ["axis"], "view"),
    _spec("Squeeze", ["x"], ["axes"], "view"),
    _spec("Unsqueeze", ["x"], ["axes"], "view"),
    _spec("Slice", ["x"], ["starts", "ends", "axes", "steps"], "view"),
    _spec("Split", ["x"], ["split", "axis", "index"], "view"),
    _spec("Expand", ["x"], ["shape"], "view"),
    # an ONNX node outside the covered set, run through onnx.reference
    _spec("Opaque", ["xs"], ["node", "index"], "opaque"),
]

OPS: dict[str, OpSpec] = {s.name: s for s in _SPECS}

# ONNX op types the importer maps one-to-one onto a constructor of the same name (Sum, Shape and
# Constant are rewritten by the importer into these; everything else becomes Opaque).
COVERED_ONNX_OPS = frozenset(
    name for name, s in OPS.items() if s.kind not in ("leaf", "structure", "opaque")
) | {"Sum", "Shape", "Constant"}


def kind(op: str) -> str:
    return OPS[op].kind


# ---- evaluation --------------------------------------------------------------------------------

def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


# Ops whose NumPy function takes the tensor inputs positionally and the attributes as keywords
# under the same names; the rest are adapted below.
_DIRECT: dict[str, Callable[..., np.ndarray]] = {
    "Relu": npo.relu, "LeakyRelu": npo.leaky_relu, "Sigmoid": npo.sigmoid,
    "HardSigmoid": npo.hard_sigmoid, "HardSwish": npo.hard_swish, "Tanh": npo.tanh, "Erf": npo.erf,
    "Gelu": npo.gelu, "Add": npo.add, "Sub": npo.sub, "Mul": npo.mul, "Div": npo.div,
    "Pow": npo.pow, "Sqrt": npo.sqrt, "Exp": npo.exp, "Log": npo.log, "Neg": npo.neg, "Abs": npo.abs_,
    "Reciprocal": npo.reciprocal, "Where": npo.where, "Cast": npo.cast,
    "BatchNormalization": npo.batch_normalization, "Identity": npo.identity, "Dropout": npo.identity,
    "Conv": npo.conv, "ConvTranspose": npo.conv_transpose, "MatMul": npo.matmul, "Gemm": npo.gemm,
    "Softmax": npo.softmax, "LayerNormalization": npo.layer_normalization,
    "MaxPool": npo.max_pool, "AveragePool": npo.average_pool,
    "GlobalAveragePool": npo.global_average_pool, "LRN": npo.lrn,
    "Gather": npo.gather, "Transpose": npo.transpose, "Flatten": npo.flatten,
}


def evaluate(op: str, args: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    """Compute one term-language operation on NumPy arrays (None for an absent input)."""
    if op in _DIRECT:
        return _DIRECT[op](*args, **attrs)
    if op == "Clip":
        return npo.clip(*args)
    if op in ("ReduceMean", "ReduceSum"):
        fn = npo.reduce_mean if op == "ReduceMean" else npo.reduce_sum
        return fn(args[0], axes=tuple(attrs["axes"]), keepdims=attrs["keepdims"])
    if op == "Concat":
        return npo.concat(args[0], axis=attrs["axis"])
    if op == "Pad":
        x = args[0]
        return npo.pad(x, _ints(attrs["pads"]), np.asarray(attrs["value"], dtype=x.dtype),
                       mode=attrs["mode"])
    if op == "Reshape":
        return npo.reshape(args[0], _ints(attrs["shape"]), allowzero=1)
    if op == "Expand":
        return npo.expand(args[0], _ints(attrs["shape"]))
    if op == "Squeeze":
        return npo.squeeze(args[0], _ints(attrs["axes"]))
    if op == "Unsqueeze":
        return npo.unsqueeze(args[0], _ints(attrs["axes"]))
    if op == "Slice":
        return npo.slice(args[0], _ints(attrs["starts"]), _ints(attrs["ends"]),
                         _ints(attrs["axes"]), _ints(attrs["steps"]))
    if op == "Split":
        sizes = _ints(attrs["split"])
        return npo.split(args[0], sizes, axis=attrs["axis"], num_outputs=len(sizes))[attrs["index"]]
    if op == "Scalar":
        return np.asarray(attrs["value"], dtype=attrs["dtype"])
    if op == "Ints":
        return _ints(attrs["values"])
    raise KeyError(f"no NumPy evaluation for term-language op {op!r}")
