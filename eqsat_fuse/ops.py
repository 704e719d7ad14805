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

The table is also where the stages look an operator up instead of keeping their own lists
(docs/adding-an-op.md): its NumPy reference kernel (`reference`), its Numba scalar form
(`scalar`, `scalar_f32`, `integers`), the inputs it is defined on (`domain`: the rule checker,
the graph fuzzer and `calibrate` draw inputs inside it) and whether ONNX writes it as the op of
the same name with the attributes defaulted (`onnx_plain`, `defaults`: the importer and the
exporter take it one to one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .backends.numpy import ops as npo
from .backends.numpy import quantize as npq


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
    # the NumPy reference kernel: tensor inputs positionally (None for an absent one), the
    # attributes as keywords under the names above; None: `evaluate` adapts the call itself
    reference: Callable[..., np.ndarray] | None = None
    # elementwise only: the Numba backend's scalar form, a `str.format` template: {0}, {1}...
    # are the arguments' expressions, {alpha}... the attributes as literals of the compute
    # dtype, {lit[0.5]} any number as such a literal; None: a case of its own in
    # backends/numba/scalars.py (or no Numba form: the kernel runs on the NumPy backend)
    scalar: str | None = None
    scalar_f32: str | None = None        # the form in float32 where it differs (approximations)
    integers: bool = False               # the scalar form holds on integer dtypes too
    # the inputs the op is defined on, which checker, fuzzer and calibration draw inside:
    # "any", "positive" (> 0), "nonzero" or "bool" (booleans only: And, Or, Xor, Not)
    domain: str = "any"
    # the ONNX node of the same name, inputs as they are, attributes `defaults` where absent:
    # the importer and the exporter take it one to one
    onnx_plain: bool = False
    defaults: tuple[tuple[str, Any], ...] = ()   # ONNX default of each attribute (onnx_plain)
    # the input slot whose dtype the result has (a Cast's is its `to`), or a dtype of its own
    # (`result_dtype`: the integer contractions' int32)
    dtype_of: str = ""
    result_dtype: str = ""
    # an ONNX operator of the same name, which the importer reads one to one; False for a
    # term of the language only (FusedAttention: what rules make of several ONNX nodes)
    onnx: bool = True

    @property
    def dtype_slot(self) -> int:
        """The position of the input whose dtype the result has (the first by default)."""
        return self.inputs.index(self.dtype_of) if self.dtype_of else 0

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


def _spec(name, inputs, attrs=(), kind="elementwise", optional=(), fused=None, short="", *,
          ref=None, scalar=None, scalar_f32=None, integers=False, domain="any", plain=None,
          defaults=None, dtype_of="", result_dtype="", onnx=True):
    """`fused`: the elementwise op's fused input slots (default: all of them); `plain`: whether
    ONNX writes it one to one (default: an elementwise op without attributes, or one whose
    attribute `defaults` are given)."""
    if fused is None:
        fused = inputs if kind == "elementwise" else ()
    if plain is None:
        plain = kind == "elementwise" and (not attrs or defaults is not None)
    return OpSpec(name, tuple(inputs), tuple(attrs), kind, tuple(optional), tuple(fused), short,
                  ref, scalar, scalar_f32, integers, domain, plain,
                  tuple((defaults or {}).items()), dtype_of, result_dtype, onnx)


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
    _spec("Relu", ["x"], ref=npo.relu, scalar="({lit[0]} if {0} < {lit[0]} else {0})",
          integers=True),
    _spec("LeakyRelu", ["x"], ["alpha"], ref=npo.leaky_relu,
          scalar="({0} if {0} >= {lit[0]} else {0} * {alpha})", defaults={"alpha": 0.01}),
    _spec("Clip", ["x", "min", "max"], optional=["min", "max"], fused=["x"], ref=npo.clip),
    _spec("Sigmoid", ["x"], ref=npo.sigmoid, scalar="(1.0 / (1.0 + np.exp(-{0})))",
          scalar_f32="sigmoid_f32({0})"),
    _spec("HardSigmoid", ["x"], ["alpha", "beta"], ref=npo.hard_sigmoid,
          scalar="min(max(({0} * {alpha} + {beta}), {lit[0]}), {lit[1]})",
          defaults={"alpha": 0.2, "beta": 0.5}),
    _spec("HardSwish", ["x"], ref=npo.hard_swish,
          scalar="({0} * min(max(({0} * {lit[0.16666666666666666]} + {lit[0.5]}), {lit[0]}), "
                 "{lit[1]}))"),
    _spec("Tanh", ["x"], ref=npo.tanh, scalar="np.tanh({0})", scalar_f32="tanh_f32({0})"),
    _spec("Erf", ["x"], ref=npo.erf, scalar="math.erf({0})", scalar_f32="erf_f32({0})"),
    _spec("Gelu", ["x"], ["approximate"], ref=npo.gelu, defaults={"approximate": "none"}),
    _spec("Add", ["a", "b"], ref=npo.add, scalar="({0} + {1})", integers=True),
    _spec("Sub", ["a", "b"], ref=npo.sub, scalar="({0} - {1})", integers=True),
    _spec("Mul", ["a", "b"], ref=npo.mul, scalar="({0} * {1})", integers=True),
    _spec("Div", ["a", "b"], ref=npo.div),
    _spec("Pow", ["x", "y"], ref=npo.pow),
    _spec("Sqrt", ["x"], ref=npo.sqrt, scalar="np.sqrt({0})", domain="positive"),
    _spec("Exp", ["x"], ref=npo.exp, scalar="np.exp({0})", scalar_f32="exp_f32({0})"),
    _spec("Log", ["x"], ref=npo.log, scalar="np.log({0})", domain="positive"),
    _spec("Neg", ["x"], ref=npo.neg, scalar="(-{0})", integers=True),
    _spec("Abs", ["x"], ref=npo.abs_, scalar="abs({0})"),
    _spec("Reciprocal", ["x"], ref=npo.reciprocal, scalar="({lit[1]} / {0})", domain="nonzero"),
    _spec("Where", ["cond", "x", "y"], ref=npo.where, dtype_of="x"),
    # logic on booleans (the masks of transformer exports: padding and causal masks combined)
    _spec("And", ["a", "b"], ref=npo.logical_and, scalar="({0} & {1})", integers=True,
          domain="bool"),
    _spec("Or", ["a", "b"], ref=npo.logical_or, scalar="({0} | {1})", integers=True,
          domain="bool"),
    _spec("Xor", ["a", "b"], ref=npo.logical_xor, scalar="({0} != {1})", integers=True,
          domain="bool"),
    _spec("Not", ["x"], ref=npo.logical_not, scalar="(not {0})", integers=True,
          domain="bool"),
    _spec("Cast", ["x"], ["to"], ref=npo.cast),
    # quantization, per tensor or per axis (the importer makes a per-axis scale and zero point
    # a broadcast against x); the result has the zero point's integer dtype, or the scale's float
    _spec("QuantizeLinear", ["x", "scale", "zero_point"], fused=["x"], short="quantize",
          ref=npq.quantize_linear, plain=False, dtype_of="zero_point"),
    _spec("DequantizeLinear", ["x", "scale", "zero_point"], fused=["x"], short="dequantize",
          ref=npq.dequantize_linear, plain=False, dtype_of="scale"),
    _spec("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["epsilon"], fused=["x"],
          short="batchnorm", ref=npo.batch_normalization,
          scalar="({0} * (({lit[1]} / np.sqrt({4} + {epsilon})) * {1})"
                 " + ({2} - {3} * (({lit[1]} / np.sqrt({4} + {epsilon})) * {1})))"),
    # removed by the canon rules before fusion: no fusion rule of their own
    _spec("Identity", ["x"], fused=[], ref=npo.identity, scalar="{0}", integers=True),
    _spec("Dropout", ["x"], fused=[], ref=npo.identity, scalar="{0}", integers=True),
    # anchors: contractions
    _spec("Conv", ["x", "w", "b"], ["pads", "strides", "dilations", "group"], "anchor", ["b"],
          ref=npo.conv),
    _spec("ConvTranspose", ["x", "w", "b"],
          ["pads", "strides", "dilations", "group", "output_padding"], "anchor", ["b"],
          ref=npo.conv_transpose),
    _spec("MatMul", ["a", "b"], [], "anchor", ref=npo.matmul, plain=True),
    # integer contractions: int32 sums of 8-bit integers less their zero points, exactly
    _spec("MatMulInteger", ["a", "b", "a_zero_point", "b_zero_point"], [], "anchor",
          ["a_zero_point", "b_zero_point"], ref=npq.matmul_integer, plain=True,
          result_dtype="int32"),
    _spec("ConvInteger", ["x", "w", "x_zero_point", "w_zero_point"],
          ["pads", "strides", "dilations", "group"], "anchor", ["x_zero_point", "w_zero_point"],
          ref=npq.conv_integer, result_dtype="int32"),
    _spec("Gemm", ["a", "b", "c"], ["alpha", "beta", "trans_a", "trans_b"], "anchor", ["c"],
          ref=npo.gemm),
    # attention in one kernel: the scores never reach memory (rules/fuse.egg: attention-*)
    _spec("FusedAttention", ["q", "kt", "v", "mask", "scale"], ["how"], "anchor",
          ["mask", "scale"], short="attention", ref=npo.fused_attention, onnx=False),
    # reductions: row and window kernels
    _spec("Softmax", ["x"], ["axis"], "reduction", ref=npo.softmax),
    _spec("LayerNormalization", ["x", "scale", "bias"], ["axis", "epsilon"], "reduction", ["bias"],
          ref=npo.layer_normalization),
    _spec("ReduceMean", ["x"], ["axes", "keepdims"], "reduction"),
    _spec("ReduceSum", ["x"], ["axes", "keepdims"], "reduction"),
    _spec("ReduceMax", ["x"], ["axes", "keepdims"], "reduction", ref=npo.reduce_max),
    _spec("ReduceMin", ["x"], ["axes", "keepdims"], "reduction", ref=npo.reduce_min),
    _spec("MaxPool", ["x"], ["kernel_shape", "pads", "strides", "dilations", "ceil_mode"],
          "reduction", ref=npo.max_pool),
    _spec("AveragePool", ["x"],
          ["kernel_shape", "pads", "strides", "dilations", "ceil_mode", "count_include_pad"],
          "reduction", ref=npo.average_pool),
    _spec("GlobalAveragePool", ["x"], [], "reduction", ref=npo.global_average_pool, plain=True),
    _spec("LRN", ["x"], ["size", "alpha", "beta", "bias"], "reduction", ref=npo.lrn),
    # data movement
    _spec("Concat", ["xs"], ["axis"], "movement"),
    _spec("Gather", ["data", "indices"], ["axis"], "movement", ref=npo.gather),
    _spec("Pad", ["x"], ["pads", "mode", "value"], "movement"),
    # views: no arithmetic; NumPy gives a view (a copy only where strides force one)
    _spec("Transpose", ["x"], ["perm"], "view", ref=npo.transpose),
    _spec("Reshape", ["x"], ["shape"], "view"),
    _spec("Flatten", ["x"], ["axis"], "view", ref=npo.flatten),
    _spec("Squeeze", ["x"], ["axes"], "view"),
    _spec("Unsqueeze", ["x"], ["axes"], "view"),
    _spec("Slice", ["x"], ["starts", "ends", "axes", "steps"], "view"),
    _spec("Split", ["x"], ["split", "axis", "index"], "view"),
    _spec("Expand", ["x"], ["shape"], "view"),
    # an ONNX node outside the covered set, run through onnx.reference
    _spec("Opaque", ["xs"], ["node", "index"], "opaque"),
]

OPS: dict[str, OpSpec] = {s.name: s for s in _SPECS}

# ONNX op types the importer maps one-to-one onto a constructor of the same name (Sum, Shape,
# Constant and DynamicQuantizeLinear are rewritten by the importer into these; everything else
# becomes Opaque).
COVERED_ONNX_OPS = frozenset(
    name for name, s in OPS.items() if s.kind not in ("leaf", "structure", "opaque") and s.onnx
) | {"Sum", "Shape", "Constant", "DynamicQuantizeLinear"}


def kind(op: str) -> str:
    return OPS[op].kind


def result_dtype(op: str, attrs: dict[str, Any], dtype_at: Callable[[int], str | None]
                 ) -> str | None:
    """The dtype of an op's result (None where it is not known): a Cast's `to`, an op's fixed
    result dtype, else the dtype of the input the table names (`dtype_of`, the first by
    default), which `dtype_at(position)` gives (None for an absent one)."""
    if op == "Cast":
        return str(np.dtype(attrs["to"]))
    spec = OPS.get(op)
    if spec is None:
        return None
    return spec.result_dtype or dtype_at(spec.dtype_slot)


# ---- evaluation --------------------------------------------------------------------------------

def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def evaluate(op: str, args: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    """Compute one term-language operation on NumPy arrays (None for an absent input)."""
    spec = OPS.get(op)
    if spec is not None and spec.reference is not None:
        return spec.reference(*args, **attrs)
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
