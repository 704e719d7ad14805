"""Step 5 of import: normalize each node into the term language's form (defaults filled in,
negative axes resolved, auto_pad turned into pads, attribute-like inputs such as Unsqueeze's
axes turned into attributes, very wide Concat/Max/Min split into trees); a node outside the
covered set becomes `Opaque`."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper

from ..dims import dim, has_dims
from ..errors import ModelError
from ..ir import Node, TensorInfo
from ..ops import OPS
from .protos import _attrs, _np_dtype, _str


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base'1`, `base'2`... : the first that is not in `taken` (then added to it)."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}'{n}"
    taken.add(name)
    return name


class _Context:
    """What a normalizer may look at: static infos, constant values, and the node at hand."""

    def __init__(self, infos: dict[str, TensorInfo], constants: dict[str, np.ndarray], model: str,
                 taken: set[str] | None = None):
        self.infos = infos
        self.constants = constants
        self.model = model
        self.taken = set(infos) | set(taken or ())
        self.added: dict[str, np.ndarray] = {}     # constants the normalizers made

    def fresh(self, base: str, info: TensorInfo) -> str:
        """A value name no tensor of the model uses (the model's names are arbitrary strings)."""
        name = fresh_name(base, self.taken)
        self.infos[name] = info
        return name

    def new_constant(self, base: str, value: np.ndarray) -> str:
        """A constant of the normalized graph that the model does not hold (a reshaped scale)."""
        name = self.fresh(base, TensorInfo(tuple(value.shape), value.dtype.name))
        self.constants[name] = self.added[name] = value
        return name

    def info(self, value: str) -> TensorInfo:
        return self.infos[value]

    def rank(self, value: str) -> int:
        return len(self.infos[value].shape)

    def constant(self, node: onnx.NodeProto, position: int, what: str) -> np.ndarray | None:
        """The compile-time value of input `position`, None when omitted; refuses a run-time one."""
        if position >= len(node.input) or node.input[position] == "":
            return None
        value = node.input[position]
        if value not in self.constants:
            raise _Unsupported(f"its {what} input {value!r} is computed at run time")
        return self.constants[value]


class _Unsupported(Exception):
    """This node's form is outside the covered subset; it becomes an Opaque kernel."""


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _axes(axes, rank: int) -> list[int]:
    return sorted(_axis(int(a), rank) for a in axes)


def _auto_pads(auto_pad: str, in_spatial, kernel, strides, dilations, explicit) -> list[int]:
    """Explicit [begins..., ends...] pads for Conv/pooling from ONNX's auto_pad rule."""
    rank = len(kernel)
    if auto_pad in ("NOTSET", ""):
        return [int(p) for p in explicit] if explicit else [0] * (2 * rank)
    if auto_pad == "VALID":
        return [0] * (2 * rank)
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _window(node, ctx: _Context) -> tuple[dict, list[int], list[int], list[int]]:
    """A Conv's or ConvTranspose's attributes, kernel shape (from the weights when not given),
    strides and dilations (ONNX defaults filled in)."""
    a = _attrs(node)
    kernel = list(a.get("kernel_shape", ctx.info(node.input[1]).shape[2:]))
    rank = len(kernel)
    return (a, kernel, list(a.get("strides", [1] * rank)),
            list(a.get("dilations", [1] * rank)))


def _norm_conv(node, ctx: _Context):
    """Conv, and ConvInteger (its zero points where Conv has its bias, and after it)."""
    a, kernel, strides, dilations = _window(node, ctx)
    x = ctx.info(node.input[0]).shape
    pads = _auto_pads(_str(a.get("auto_pad", "NOTSET")), x[2:], kernel, strides, dilations,
                      a.get("pads"))
    extra = [_opt(node, 2), _opt(node, 3)] if node.op_type == "ConvInteger" else [_opt(node, 2)]
    return node.op_type, [node.input[0], node.input[1], *extra], dict(
        pads=pads, strides=strides, dilations=dilations, group=int(a.get("group", 1)))


def _norm_conv_transpose(node, ctx: _Context):
    a, kernel, strides, dilations = _window(node, ctx)
    rank = len(kernel)
    output_padding = list(a.get("output_padding", [0] * rank))
    auto_pad = _str(a.get("auto_pad", "NOTSET"))
    x = ctx.info(node.input[0]).shape
    out = ctx.info(node.output[0]).shape
    if "output_shape" in a or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for i in range(rank):
            total = (strides[i] * (x[2 + i] - 1) + output_padding[i]
                     + (kernel[i] - 1) * dilations[i] + 1 - out[2 + i])
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        pads = begins + ends
    elif auto_pad == "VALID":
        pads = [0] * (2 * rank)
    else:
        pads = list(a.get("pads", [0] * (2 * rank)))
    return "ConvTranspose", [node.input[0], node.input[1], _opt(node, 2)], dict(
        pads=pads, strides=strides, dilations=dilations, group=int(a.get("group", 1)),
        output_padding=output_padding)


def _norm_pool(node, ctx: _Context):
    a = _attrs(node)
    kernel = list(a["kernel_shape"])
    rank = len(kernel)
    strides = list(a.get("strides", [1] * rank))
    dilations = list(a.get("dilations", [1] * rank))
    x = ctx.info(node.input[0]).shape
    auto_pad = _str(a.get("auto_pad", "NOTSET"))
    ceil_mode = int(a.get("ceil_mode", 0))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and ceil_mode:
        raise _Unsupported("auto_pad SAME with ceil_mode")
    pads = _auto_pads(auto_pad, x[2:], kernel, strides, dilations, a.get("pads"))
    if len([o for o in node.output if o]) > 1:
        # Its Indices output is used: an Opaque node, run by `max_pool_with_indices`
        # (backends/reference.py), which takes explicit pads: a SAME auto_pad is written out.
        if auto_pad != "NOTSET":
            kept = [attr for attr in node.attribute if attr.name not in ("auto_pad", "pads")]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("pads", pads)])
        raise _Unsupported("its Indices output is used")
    attrs = dict(kernel_shape=kernel, pads=pads, strides=strides, dilations=dilations,
                 ceil_mode=ceil_mode)
    if node.op_type == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0))
    return node.op_type, [node.input[0]], attrs


def _norm_batchnorm(node, ctx: _Context):
    a = _attrs(node)
    if int(a.get("training_mode", 0)) or len([o for o in node.output if o]) > 1:
        raise _Unsupported("training mode")
    return "BatchNormalization", list(node.input[:5]), dict(epsilon=float(a.get("epsilon", 1e-5)))


def _norm_layernorm(node, ctx: _Context):
    a = _attrs(node)
    if len([o for o in node.output if o]) > 1:
        raise _Unsupported("its Mean/InvStdDev outputs are used")
    if int(a.get("stash_type", 1)) != 1:
        raise _Unsupported("stash_type other than float32")
    rank = ctx.rank(node.input[0])
    return "LayerNormalization", [node.input[0], node.input[1], _opt(node, 2)], dict(
        axis=_axis(int(a.get("axis", -1)), rank), epsilon=float(a.get("epsilon", 1e-5)))


def _norm_reduce(node, ctx: _Context):
    a = _attrs(node)
    rank = ctx.rank(node.input[0])
    axes = ctx.constant(node, 1, "axes")
    if axes is None:
        axes = a.get("axes")
    axes = [] if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]
    if not axes:
        if int(a.get("noop_with_empty_axes", 0)):
            return "Identity", [node.input[0]], {}
        axes = list(range(rank))
    return node.op_type, [node.input[0]], dict(axes=_axes(axes, rank),
                                               keepdims=int(a.get("keepdims", 1)))


def _norm_softmax(node, ctx: _Context):
    a = _attrs(node)
    return "Softmax", [node.input[0]], dict(axis=_axis(int(a.get("axis", -1)),
                                                       ctx.rank(node.input[0])))


def _norm_gemm(node, ctx: _Context):
    a = _attrs(node)
    return "Gemm", [node.input[0], node.input[1], _opt(node, 2)], dict(
        alpha=float(a.get("alpha", 1.0)), beta=float(a.get("beta", 1.0)),
        trans_a=int(a.get("transA", 0)), trans_b=int(a.get("transB", 0)))


def _norm_clip(node, ctx: _Context):
    return "Clip", [node.input[0], _opt(node, 1), _opt(node, 2)], {}


def _norm_dropout(node, ctx: _Context):
    if len([o for o in node.output if o]) > 1:
        raise _Unsupported("its mask output is used")
    training = ctx.constant(node, 2, "training_mode")
    if training is not None and bool(training):
        raise _Unsupported("training mode")
    if len(node.input) > 2 and node.input[2] and training is None:
        raise _Unsupported("training_mode computed at run time")
    return "Dropout", [node.input[0]], {}


def _norm_unary_attrs(defaults: dict[str, Any]) -> Callable:
    def normalize(node, ctx: _Context):
        a = _attrs(node)
        attrs = {}
        for key, default in defaults.items():
            value = a.get(key, default)
            attrs[key] = _str(value) if isinstance(default, str) else float(value)
        return node.op_type, [node.input[0]], attrs
    return normalize


# Casts to these types round and saturate by attributes (saturate, round_mode) that the term
# language's Cast does not carry: such a Cast stays Opaque, run by onnx.reference.
_SATURATING_CASTS = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
                     onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ}
_ROUNDING_CASTS = {getattr(onnx.TensorProto, "FLOAT8E8M0", -1)}


def _norm_cast(node, ctx: _Context):
    a = _attrs(node)
    to = int(a["to"])
    if to in _SATURATING_CASTS and int(a.get("saturate", 1)):
        raise _Unsupported("a saturating cast to an 8-bit float")
    if to in _ROUNDING_CASTS:
        raise _Unsupported("a cast to float8e8m0 (rounding mode)")
    if to == onnx.TensorProto.STRING:
        raise _Unsupported("a cast to string")
    return "Cast", [node.input[0]], dict(to=_np_dtype(to))


# the integer dtypes of the covered quantization ops (int4 and the float8 types stay Opaque)
_QUANT_INTS = ("int8", "uint8", "int16", "uint16")


def _norm_quantization(node, ctx: _Context):
    """QuantizeLinear and DequantizeLinear, per tensor or per axis: the zero point always given
    (zeros of the integer dtype when omitted), and a per-axis scale and zero point reshaped to
    broadcast against x along `axis` ([C] -> [C, 1, 1] for axis 1 of a rank-4 x)."""
    a = _attrs(node)
    if int(a.get("block_size", 0)):
        raise _Unsupported("blocked quantization")
    quantize = node.op_type == "QuantizeLinear"
    x, scale = ctx.info(node.input[0]), ctx.info(node.input[1])
    integer = ctx.info(node.output[0]).dtype if quantize else x.dtype
    if integer not in _QUANT_INTS + (() if quantize else ("int32",)):
        raise _Unsupported(f"quantization to {integer}")
    if scale.dtype not in ("float32", "float16", "float64") or \
            (not quantize and ctx.info(node.output[0]).dtype != scale.dtype):
        raise _Unsupported("a scale of another dtype than the float side")
    zero = _opt(node, 2)
    if zero is not None and ctx.info(zero).dtype != integer:
        raise _Unsupported("a zero point of another dtype")
    inputs = [node.input[0], node.input[1], zero]
    rank = len(x.shape)
    if len(scale.shape) == 1 and rank > 0:
        axis = _axis(int(a.get("axis", 1)), rank)
        trailing = (1,) * (rank - axis - 1)
        for slot in (1, 2):
            if slot == 2 and zero is None:
                continue
            value = ctx.constant(node, slot, "per-axis scale or zero point")
            inputs[slot] = ctx.new_constant(f"{node.input[slot]}::axis{axis}",
                                            np.asarray(value).reshape(value.shape + trailing))
    if zero is None:
        shape = ctx.info(inputs[1]).shape
        inputs[2] = ctx.new_constant(f"{node.output[0]}::zero_point",
                                     np.zeros(shape, dtype=integer))
    return node.op_type, inputs, {}


def _norm_transpose(node, ctx: _Context):
    rank = ctx.rank(node.input[0])
    perm = _attrs(node).get("perm", list(range(rank))[::-1])
    return "Transpose", [node.input[0]], dict(perm=[_axis(int(p), rank) for p in perm])


def _norm_static_shape(op: str) -> Callable:
    def normalize(node, ctx: _Context):
        # The output shape comes from shape inference, but only a compile-time shape input makes
        # it the shape at every run: a shape fed at run time keeps the node Opaque.
        ctx.constant(node, 1, "shape")
        shape = list(ctx.info(node.output[0]).shape)
        before = list(ctx.info(node.input[0]).shape)
        if op == "Reshape" and not has_dims([before, shape]) and \
                math.prod(before) != math.prod(shape):
            # onnx's shape inference lets a constant target shape through unchecked
            raise ModelError(f"{ctx.model}: node {node.name or node.op_type!r} (Reshape) cannot "
                             f"reshape {before} ({math.prod(before)} elements) to {shape} "
                             f"({math.prod(shape)} elements)")
        return op, [node.input[0]], dict(shape=shape)
    return normalize


def _norm_flatten(node, ctx: _Context):
    rank = ctx.rank(node.input[0])
    return "Flatten", [node.input[0]], dict(axis=_axis(int(_attrs(node).get("axis", 1)), rank))


def _norm_squeeze(node, ctx: _Context):
    shape = ctx.info(node.input[0]).shape
    axes = ctx.constant(node, 1, "axes")
    if axes is None:
        axes = _attrs(node).get("axes")
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    return "Squeeze", [node.input[0]], dict(axes=_axes(np.asarray(axes).reshape(-1), len(shape)))


def _norm_unsqueeze(node, ctx: _Context):
    axes = ctx.constant(node, 1, "axes")
    if axes is None:
        axes = _attrs(node)["axes"]
    out_rank = ctx.rank(node.output[0])
    return "Unsqueeze", [node.input[0]], dict(axes=_axes(np.asarray(axes).reshape(-1), out_rank))


def _norm_concat(node, ctx: _Context):
    rank = ctx.rank(node.output[0])
    return "Concat", list(node.input), dict(axis=_axis(int(_attrs(node)["axis"]), rank))


def _norm_split(node, ctx: _Context):
    a = _attrs(node)
    rank = ctx.rank(node.input[0])
    axis = _axis(int(a.get("axis", 0)), rank)
    ctx.constant(node, 1, "split")      # sizes fed at run time: Opaque
    sizes = [ctx.info(o).shape[axis] for o in node.output]
    return "Split", [node.input[0]], dict(split=sizes, axis=axis)


def _norm_slice(node, ctx: _Context):
    rank = ctx.rank(node.input[0])
    starts = ctx.constant(node, 1, "starts")
    ends = ctx.constant(node, 2, "ends")
    axes = ctx.constant(node, 3, "axes")
    steps = ctx.constant(node, 4, "steps")
    if starts is None or ends is None:   # opset < 10 form, converted by the version converter
        raise _Unsupported("starts/ends missing")
    n = len(starts)
    axes = list(range(n)) if axes is None else [_axis(int(v), rank) for v in axes]
    steps = [1] * n if steps is None else [int(v) for v in steps]
    return "Slice", [node.input[0]], dict(starts=[dim(v) for v in starts],
                                          ends=[dim(v) for v in ends], axes=axes, steps=steps)


def _norm_gather(node, ctx: _Context):
    rank = ctx.rank(node.input[0])
    return "Gather", [node.input[0], node.input[1]], dict(
        axis=_axis(int(_attrs(node).get("axis", 0)), rank))


def _norm_pad(node, ctx: _Context):
    a = _attrs(node)
    rank = ctx.rank(node.input[0])
    pads = ctx.constant(node, 1, "pads")
    if pads is None:
        pads = a.get("pads", [0] * 2 * rank)
    pads = [int(v) for v in np.asarray(pads).reshape(-1)]
    value = ctx.constant(node, 2, "constant_value")
    value = float(a.get("value", 0.0)) if value is None else float(np.asarray(value).reshape(()))
    axes = ctx.constant(node, 3, "axes")
    if axes is not None:
        axes = [_axis(int(v), rank) for v in axes]
        full = [0] * (2 * rank)
        for i, ax in enumerate(axes):
            full[ax], full[rank + ax] = pads[i], pads[len(axes) + i]
        pads = full
    return "Pad", [node.input[0]], dict(pads=pads, mode=_str(a.get("mode", "constant")),
                                        value=value)


def _norm_lrn(node, ctx: _Context):
    a = _attrs(node)
    return "LRN", [node.input[0]], dict(size=int(a["size"]), alpha=float(a.get("alpha", 1e-4)),
                                        beta=float(a.get("beta", 0.75)),
                                        bias=float(a.get("bias", 1.0)))


def _norm_plain(node, ctx: _Context):
    """The inputs as they are, omitted optional ones (trailing or "") as absent."""
    slots = len(OPS[node.op_type].inputs)
    return node.op_type, [_opt(node, i) for i in range(max(slots, len(node.input)))], {}


def _opt(node: onnx.NodeProto, position: int) -> str | None:
    return node.input[position] if position < len(node.input) and node.input[position] else None


# The ops with a normalizer of their own; the rest of those ONNX writes one to one are read
# off the operator table (`_normalizer`).
_NORMALIZERS: dict[str, Callable] = {
    "Conv": _norm_conv, "ConvInteger": _norm_conv, "ConvTranspose": _norm_conv_transpose,
    "MaxPool": _norm_pool, "AveragePool": _norm_pool,
    "BatchNormalization": _norm_batchnorm, "LayerNormalization": _norm_layernorm,
    "ReduceMean": _norm_reduce, "ReduceSum": _norm_reduce, "ReduceMax": _norm_reduce,
    "ReduceMin": _norm_reduce, "Softmax": _norm_softmax,
    "Gemm": _norm_gemm, "Clip": _norm_clip, "Dropout": _norm_dropout,
    "Cast": _norm_cast, "Transpose": _norm_transpose,
    "Reshape": _norm_static_shape("Reshape"), "Expand": _norm_static_shape("Expand"),
    "Flatten": _norm_flatten, "Squeeze": _norm_squeeze, "Unsqueeze": _norm_unsqueeze,
    "Concat": _norm_concat, "Split": _norm_split, "Slice": _norm_slice, "Gather": _norm_gather,
    "Pad": _norm_pad, "LRN": _norm_lrn,
    "QuantizeLinear": _norm_quantization, "DequantizeLinear": _norm_quantization,
}


def _normalizer(op_type: str) -> Callable | None:
    """The normalizer of an ONNX op type: its own, or, for an op the operator table marks
    `onnx_plain`, its inputs as they are with its attribute `defaults` filled in."""
    own = _NORMALIZERS.get(op_type)
    if own is not None:
        return own
    spec = OPS.get(op_type)
    if spec is None or not spec.onnx_plain:
        return None
    return _norm_unary_attrs(dict(spec.defaults)) if spec.defaults else _norm_plain


# String attributes the term language carries, and the values ONNX defines for them.
_ENUM_ATTRS = {"Pad": {"mode": ("constant", "reflect", "edge", "wrap")},
               "Gelu": {"approximate": ("none", "tanh")}}


# A node reading more tensors than this is split into a tree of nodes (Concat, Max, Min) or
# refused: the term language holds a node's inputs as a nested list, and egglog overflows its
# stack on a term nested some thousands deep (a crash of the whole process, not an error).
FAN_IN = 256
MAX_INPUTS = 1024


def _split_wide(node: onnx.NodeProto, ctx: _Context) -> list[onnx.NodeProto]:
    """A node with more than FAN_IN inputs as a tree of nodes of the same op, when associative."""
    inputs = list(node.input)
    if len(inputs) <= FAN_IN:
        return [node]
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Concat", "Max", "Min", "Sum") \
            or "" in inputs:
        if len(inputs) > MAX_INPUTS:
            raise ModelError(f"{ctx.model}: node {node.name or node.op_type!r} "
                             f"({node.op_type}) reads {len(inputs)} tensors; eqsat-fuse takes "
                             f"at most {MAX_INPUTS} inputs per node")
        return [node]
    if node.op_type == "Sum":
        return [node]          # becomes a chain of Adds, one input at a time
    out_info = ctx.info(node.output[0])
    axis = _axis(int(_attrs(node).get("axis", 0)), len(out_info.shape))
    parts: list[onnx.NodeProto] = []
    level = 0
    while len(inputs) > FAN_IN:
        level += 1
        grouped = []
        for start in range(0, len(inputs), FAN_IN):
            chunk = inputs[start:start + FAN_IN]
            if len(chunk) == 1:
                grouped.append(chunk[0])
                continue
            shapes = [ctx.info(v).shape for v in chunk]
            if node.op_type == "Concat":
                shape = list(shapes[0])
                shape[axis] = sum(s[axis] for s in shapes)
            else:
                shape = np.broadcast_shapes(*shapes)
            out = ctx.fresh(f"{node.output[0]}::{node.op_type.lower()}{level}.{start}",
                            TensorInfo(tuple(shape), ctx.info(chunk[0]).dtype))
            part = onnx.NodeProto()
            part.CopyFrom(node)
            part.name = f"{node.name or node.op_type}::{level}.{start}"
            del part.input[:], part.output[:]
            part.input.extend(chunk)
            part.output.append(out)
            parts.append(part)
            grouped.append(out)
        inputs = grouped
    last = onnx.NodeProto()
    last.CopyFrom(node)
    del last.input[:]
    last.input.extend(inputs)
    return [*parts, last]


def _dynamic_quantize(node: onnx.NodeProto, ctx: _Context, label: str) -> list[Node]:
    """DynamicQuantizeLinear as the spec defines it, in covered ops: with m = max(0, max x) and
    r = -min(0, min x), the scale is (m + r) / 255, the zero point saturate(round(r / scale))
    (a QuantizeLinear of r by it, zero point 0) and y = QuantizeLinear(x, scale, zero point)."""
    x = node.input[0]
    info = ctx.info(x)
    if info.dtype != "float32" or len([o for o in node.output if o]) != 3:
        raise _Unsupported("DynamicQuantizeLinear of another dtype, or an output unused")
    y, scale, zero = node.output
    axes = dict(axes=list(range(len(info.shape))), keepdims=0)
    scalar = lambda tag: ctx.fresh(f"{y}::{tag}", TensorInfo((), "float32"))
    top, low, neg, m, r = (scalar(t) for t in ("max", "min", "negmin", "m", "r"))
    span = scalar("span")
    levels = ctx.new_constant(f"{y}::255", np.array(255.0, np.float32))
    none = ctx.new_constant(f"{y}::zero", np.array(0, np.uint8))
    steps = [("ReduceMax", [x], top, axes), ("Relu", [top], m, {}),
             ("ReduceMin", [x], low, axes), ("Neg", [low], neg, {}), ("Relu", [neg], r, {}),
             ("Add", [m, r], span, {}), ("Div", [span, levels], scale, {}),
             ("QuantizeLinear", [r, scale, none], zero, {}),
             ("QuantizeLinear", [x, scale, zero], y, {})]
    return [Node(op, inputs, [out], attrs, f"{label}::{i}")
            for i, (op, inputs, out, attrs) in enumerate(steps)]


def _normalize(node: onnx.NodeProto, ctx: _Context) -> list[Node]:
    """One ONNX node -> IR nodes (Sum becomes a chain of Add, DynamicQuantizeLinear the
    arithmetic it stands for; the rest map one to one)."""
    label = node.name or node.op_type
    if node.domain in ("", "ai.onnx") and node.op_type == "DynamicQuantizeLinear":
        try:
            return _dynamic_quantize(node, ctx, label)
        except _Unsupported:
            pass
    if node.domain in ("", "ai.onnx") and node.op_type == "Sum":
        inputs = list(node.input)
        if len(inputs) == 1:
            return [Node("Identity", inputs, list(node.output), {}, label)]
        nodes, acc = [], inputs[0]
        for i, other in enumerate(inputs[1:], start=1):
            if i == len(inputs) - 1:
                out = node.output[0]
            else:
                shape = np.broadcast_shapes(ctx.info(acc).shape, ctx.info(other).shape)
                out = ctx.fresh(f"{node.output[0]}::sum{i}",
                                TensorInfo(tuple(shape), ctx.info(acc).dtype))
            nodes.append(Node("Add", [acc, other], [out], {}, f"{label}::{i}"))
            acc = out
        return nodes
    normalizer = _normalizer(node.op_type) if node.domain in ("", "ai.onnx") else None
    if normalizer is not None:
        try:
            op, inputs, attrs = normalizer(node, ctx)
            assert op in OPS, op
            for key, allowed in _ENUM_ATTRS.get(op, {}).items():
                if attrs[key] not in allowed:
                    raise ModelError(f"{ctx.model}: node {label!r} ({node.op_type}): {key} "
                                     f"{attrs[key]!r} is not one of {', '.join(allowed)}")
            return [Node(op, inputs, [o for o in node.output][:1] if op != "Split"
                         else list(node.output), attrs, label)]
        except _Unsupported:
            pass
    return [Node("Opaque", [i or None for i in node.input], list(node.output), {}, label,
                 onnx_node=node)]
