"""QOperator-format models read as the QDQ graphs they define.

onnxruntime's quantizer writes a quantized model in one of two formats: QDQ (QuantizeLinear /
DequantizeLinear around the float operators, which `rules/quant.egg` turns into integer
kernels) or QOperator, one quantized operator in place of each float one: ONNX's QLinearConv
and QLinearMatMul, and com.microsoft's QLinearAdd, QLinearMul, QGemm,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSigmoid, QLinearLeakyRelu
and QLinearSoftmax. Each is defined as its float operator between a DequantizeLinear of every
quantized input and a QuantizeLinear of the output; `as_qdq` writes each such node as exactly
that, on the ONNX graph before shape inference (which knows no com.microsoft operator), so the
rest of the import, the rules and the kernels treat both formats alike.

An int32 bias (QLinearConv's B, QGemm's C) is dequantized with the scale x_scale * w_scale in
float32 and zero point 0, as the quantizer's QDQ format writes it. onnxruntime's own kernels add
such a bias to the int32 accumulator and requantize with one float32 multiplier, so they may
give one step more or less than the exact value where it lies at a rounding tie.

A node whose scales are not constants of known rank, a per-axis scale in a model older than
opset 13 (DequantizeLinear has no `axis` there), `channels_last` pooling and an opset-11
QLinearSoftmax over an inner axis are left as they are (they stay opaque, or are refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .normalize import fresh_name
from .protos import is_held

MS = "com.microsoft"


@dataclass(frozen=True)
class _Form:
    """How one QOperator node reads: its float operator, the (value, scale, zero point) input
    slots of each quantized input, the slots of the output's scale and zero point (None: the
    output is float), the slot of an int32 bias, and the attributes the float operator takes."""

    op: str
    quantized: tuple[tuple[int, int, int], ...]
    output: tuple[int, int] | None
    bias: int | None = None
    attrs: tuple[str, ...] = ()


_POOL = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
FORMS = {
    ("", "QLinearConv"): _Form("Conv", ((0, 1, 2), (3, 4, 5)), (6, 7), bias=8,
                               attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads",
                                      "strides")),
    ("", "QLinearMatMul"): _Form("MatMul", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    (MS, "QLinearAdd"): _Form("Add", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    (MS, "QLinearMul"): _Form("Mul", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    (MS, "QGemm"): _Form("Gemm", ((0, 1, 2), (3, 4, 5)), (7, 8), bias=6,
                         attrs=("alpha", "transA", "transB")),
    (MS, "QLinearGlobalAveragePool"): _Form("GlobalAveragePool", ((0, 1, 2),), (3, 4)),
    (MS, "QLinearAveragePool"): _Form("AveragePool", ((0, 1, 2),), (3, 4), attrs=_POOL),
    (MS, "QLinearSigmoid"): _Form("Sigmoid", ((0, 1, 2),), (3, 4)),
    (MS, "QLinearLeakyRelu"): _Form("LeakyRelu", ((0, 1, 2),), (3, 4), attrs=("alpha",)),
    (MS, "QLinearSoftmax"): _Form("Softmax", ((0, 1, 2),), (3, 4), attrs=("axis",)),
}


class _Keep(Exception):
    """This node stays as it is."""


def as_qdq(proto: onnx.ModelProto, held: dict[str, np.ndarray]) -> int:
    """Rewrite every QOperator node of `proto`'s graph as its QDQ form, in place; the number of
    nodes rewritten."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    graph = proto.graph
    if not _has_qoperator(graph):
        return 0
    values = _Values(graph, held)
    nodes, rewritten = [], 0
    for node in graph.node:
        domain = node.domain if node.domain != "ai.onnx" else ""
        try:
            if domain == MS and node.op_type == "QLinearConcat":
                nodes += _concat(node, values, opset)
            elif (domain, node.op_type) in FORMS:
                nodes += _expand(node, FORMS[domain, node.op_type], values, opset)
            else:
                nodes.append(node)
                continue
            rewritten += 1
            values.added += values.pending
        except _Keep:
            nodes.append(node)
        values.pending = []
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(values.added)
    return rewritten


def _has_qoperator(graph: onnx.GraphProto) -> bool:
    return any((n.domain if n.domain != "ai.onnx" else "", n.op_type) in FORMS
               or (n.domain == MS and n.op_type == "QLinearConcat") for n in graph.node)


def qdq_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """An in-memory `model` with its QOperator nodes in QDQ form (`as_qdq`): a copy, or
    `model` itself when it has none (a QDQ model's weights are not copied)."""
    if not _has_qoperator(model.graph):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    as_qdq(copy, {})
    return copy


class _Values:
    """The constants a rewrite reads (scales, their ranks) and the names it may take."""

    def __init__(self, graph: onnx.GraphProto, held: dict[str, np.ndarray]):
        self.inits = {t.name: t for t in graph.initializer}
        self.consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
        self.held = held
        self.taken = {v for n in graph.node for v in [*n.input, *n.output]} | \
            set(self.inits) | {i.name for i in graph.input}
        self.added: list[onnx.TensorProto] = []      # constants of the rewritten nodes
        self.pending: list[onnx.TensorProto] = []    # those of the node being rewritten

    def value(self, name: str) -> np.ndarray:
        if name in self.inits:
            t = self.inits[name]
            return self.held[name] if is_held(t) else numpy_helper.to_array(t)
        if name in self.consts:
            attr = next((a for a in self.consts[name].attribute if a.name == "value"), None)
            if attr is not None:
                return numpy_helper.to_array(attr.t)
        raise _Keep

    def rank(self, name: str) -> int:
        if name in self.inits:
            return len(self.inits[name].dims)
        return self.value(name).ndim

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def constant(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.inits[name] = numpy_helper.from_array(value, name)
        self.pending.append(self.inits[name])
        return name


def _slot(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if i < len(node.input) else ""


def _linear(op: str, node, values: _Values, opset: int, x: str, scale: str, zero: str,
            out: str, axis: int, tag: str) -> onnx.NodeProto:
    """A QuantizeLinear or DequantizeLinear (`op`) of x into `out`: per axis `axis` when its
    scale is 1-D (not before opset 13, where these have no axis)."""
    per_axis = values.rank(scale) == 1
    if per_axis and opset < 13:
        raise _Keep
    return helper.make_node(op, [x, scale] + ([zero] if zero else []), [out],
                            name=f"{node.name or node.op_type}::{tag}",
                            **({"axis": axis} if per_axis else {}))


def _dequantize(node, values: _Values, opset: int, q: str, scale: str, zero: str, axis: int,
                tag: str) -> tuple[str, onnx.NodeProto]:
    """A DequantizeLinear of `q` into a new value (`_linear`)."""
    out = values.fresh(f"{node.output[0]}::{tag}")
    return out, _linear("DequantizeLinear", node, values, opset, q, scale, zero, out, axis, tag)


def _axes(form: _Form, node: onnx.NodeProto) -> list[int]:
    """The axis of a per-axis scale of each quantized input: the weights' output channels
    (Conv: 0; MatMul: the last; Gemm: 0 or 1 by transB), rows otherwise."""
    if form.op == "Conv":
        return [1, 0]
    if form.op == "MatMul":
        return [-2, -1]
    if form.op == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return [0, 0 if trans_b else 1]
    return [1] * len(form.quantized)


def _expand(node: onnx.NodeProto, form: _Form, values: _Values, opset: int
            ) -> list[onnx.NodeProto]:
    attrs = {a.name: a for a in node.attribute}
    if attrs.get("channels_last") is not None and helper.get_attribute_value(
            attrs["channels_last"]):
        raise _Keep
    if form.op == "Softmax":
        version = helper.get_attribute_value(attrs["opset"]) if "opset" in attrs else 13
        axis = helper.get_attribute_value(attrs["axis"]) if "axis" in attrs else -1
        if version < 13 and axis != -1:
            raise _Keep
    out_nodes, floats = [], []
    for k, ((q, s, z), axis) in enumerate(zip(form.quantized, _axes(form, node))):
        f, dq = _dequantize(node, values, opset, _slot(node, q), _slot(node, s),
                            _slot(node, z), axis, f"dq{k}")
        floats.append(f)
        out_nodes.append(dq)
    if form.bias is not None and _slot(node, form.bias):
        floats.append(_bias(node, form, attrs, values, opset, out_nodes))
    kept = [a for name, a in attrs.items() if name in form.attrs]
    if form.op == "Gemm":
        kept.append(helper.make_attribute("beta", 1.0))
    y = node.output[0]
    if form.output is None or not _slot(node, form.output[0]):
        result = y                              # QGemm without y_scale: a float output
    else:
        result = values.fresh(f"{y}::float")
    float_node = helper.make_node(form.op, floats, [result],
                                  name=f"{node.name or node.op_type}::float")
    float_node.attribute.extend(kept)
    out_nodes.append(float_node)
    if result != y:
        s, z = (_slot(node, i) for i in form.output)
        out_nodes.append(_linear("QuantizeLinear", node, values, opset, result, s, z, y,
                                 -2 if form.op == "MatMul" else 1, "q"))
    return out_nodes


def _bias(node, form: _Form, attrs: dict, values: _Values, opset: int, out_nodes: list) -> str:
    """The int32 bias dequantized with scale x_scale * w_scale (float32; QGemm's times alpha,
    as its spec says), zero point 0."""
    (_, xs, _), (_, ws, _) = form.quantized
    scale = (np.asarray(values.value(_slot(node, xs)), np.float32)
             * np.asarray(values.value(_slot(node, ws)), np.float32)).astype(np.float32)
    if "alpha" in attrs:
        scale = (scale * np.float32(helper.get_attribute_value(attrs["alpha"]))).astype(
            np.float32)
    name = values.constant(f"{node.output[0]}::bias_scale", scale)
    f, dq = _dequantize(node, values, opset, _slot(node, form.bias), name, "", 0, "bias")
    out_nodes.append(dq)
    return f


def _concat(node: onnx.NodeProto, values: _Values, opset: int) -> list[onnx.NodeProto]:
    """QLinearConcat(y_scale, y_zero_point, x1, x1_scale, x1_zero_point, ...)."""
    inputs = list(node.input)
    if len(inputs) < 5 or (len(inputs) - 2) % 3:
        raise _Keep
    out_nodes, floats = [], []
    for k in range(2, len(inputs), 3):
        if values.rank(inputs[k + 1]) != 0:
            raise _Keep
        f, dq = _dequantize(node, values, opset, inputs[k], inputs[k + 1], inputs[k + 2], 1,
                            f"dq{k // 3}")
        floats.append(f)
        out_nodes.append(dq)
    y = node.output[0]
    result = values.fresh(f"{y}::float")
    concat = helper.make_node("Concat", floats, [result], name=f"{node.name or 'QLinearConcat'}")
    concat.attribute.extend(a for a in node.attribute if a.name == "axis")
    out_nodes.append(concat)
    if values.rank(inputs[0]) != 0:
        raise _Keep
    out_nodes.append(_linear("QuantizeLinear", node, values, opset, result, inputs[0],
                             inputs[1], y, 1, "q"))
    return out_nodes
