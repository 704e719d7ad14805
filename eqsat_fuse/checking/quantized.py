"""Exactness of integer kernels: each quantized output of a QDQ contraction against its exact
value, integer accumulation and then the requantization in float64, rounded half to even.

A QDQ contraction, as onnxruntime's quantizer writes it, is
``QuantizeLinear(op(DequantizeLinear(xq), DequantizeLinear(wq), b), sy, zy)`` with `op` a Conv,
MatMul or Gemm (alpha = beta = 1, A not transposed) and `wq` 8-bit integer weights, per tensor or
per output channel. Its exact value (issue 18) is

    acc = sum (xq - zx) (wq - zw)                       (integers, exact)
    y   = acc * (sx * sw) + 0 + b                        (float64, in this order)
    q   = saturate(round_half_even(y / sy) + zy)         (float64 quotient)

`exactness` makes every QuantizeLinear output of a model a graph output, runs a compiled
program of it, recomputes each QDQ contraction's output from the program's own input integers
(so a difference upstream does not travel) and counts the elements that differ; where they
differ it says whether y / sy lay within a float32 rounding of a tie (a compiled program that
rounds y to float32 before it quantizes, as the float32 contraction of the model does, may
round such an element the other way).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import helper, numpy_helper, shape_inference

from ..frontend.qoperator import qdq_model


@dataclass
class Contraction:
    """One QDQ contraction of a model, by the names of its tensors."""

    op: str
    x: str                   # the integers the activations' DequantizeLinear reads
    output: str              # the QuantizeLinear's output
    params: dict = field(default_factory=dict)     # arrays: sx zx wq sw zw b sy zy; attrs


@dataclass
class Exactness:
    """What `exactness` found: per contraction output, elements compared and differing."""

    elements: int = 0
    differing: int = 0
    max_steps: int = 0
    off_tie: int = 0            # differing elements whose exact y / sy was not near a tie
    per_output: dict[str, int] = field(default_factory=dict)


def _axis_param(value: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
    """A DequantizeLinear parameter broadcast over an operand of `rank` dims."""
    if value.ndim == 0 or axis is None:
        return value
    shape = [1] * rank
    shape[axis] = value.size
    return value.reshape(shape)


def find_contractions(model: onnx.ModelProto) -> list[Contraction]:
    """The QDQ contractions of `model` (its initializers give the constants; a QOperator
    node, QLinearConv..., is read in its QDQ form, `frontend.qoperator`)."""
    model = qdq_model(model)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    found = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "MatMul", "Gemm"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Gemm" and (attrs.get("transA", 0) or
                                       attrs.get("alpha", 1.0) != 1.0 or
                                       attrs.get("beta", 1.0) != 1.0):
            continue
        dx, dw = (producer.get(i) for i in node.input[:2])
        users = consumers.get(node.output[0], [])
        if not (dx and dw and dx.op_type == dw.op_type == "DequantizeLinear" and
                len(users) == 1 and users[0].op_type == "QuantizeLinear" and
                dw.input[0] in inits and inits[dw.input[0]].dtype in (np.int8, np.uint8)):
            continue
        q = users[0]
        wq = inits[dw.input[0]]
        waxis = {a.name: a.i for a in dw.attribute}.get("axis")
        params = {"sx": inits[dx.input[1]], "zx": inits[dx.input[2]], "wq": wq,
                  "sw": _axis_param(inits[dw.input[1]], waxis, wq.ndim),
                  "zw": _axis_param(inits[dw.input[2]], waxis, wq.ndim),
                  "sy": inits[q.input[1]], "zy": inits[q.input[2]], "attrs": attrs}
        if len(node.input) > 2 and node.input[2]:
            bias = node.input[2]
            if bias in inits:
                params["b"] = inits[bias].astype(np.float32)
            elif producer.get(bias) is not None and producer[bias].op_type == "DequantizeLinear":
                db = producer[bias]
                zero = inits[db.input[2]] if len(db.input) > 2 and db.input[2] else 0
                params["b"] = ((inits[db.input[0]].astype(np.int64) -
                                np.asarray(zero).astype(np.int64)).astype(np.float32) *
                               inits[db.input[1]])
            else:
                continue
        found.append(Contraction(node.op_type, dx.input[0], q.output[0], params))
    return found


def _conv_sum(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    """The exact integer Conv (int64) of differences x [N, C, H, W] and w [M, C/g, kh, kw]."""
    pads = attrs.get("pads", [0, 0, 0, 0])
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    g = attrs.get("group", 1)
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    m, cg, kh, kw = w.shape
    windows = sliding_window_view(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]          # N, C, OH, OW, kh, kw
    out = []
    for gi in range(g):
        part = windows[:, gi * cg:(gi + 1) * cg]
        wg = w[gi * (m // g):(gi + 1) * (m // g)]
        out.append(np.einsum("ncyxij,mcij->nmyx", part, wg))
    return np.concatenate(out, axis=1)


def exact_output(c: Contraction, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact quantized output of contraction `c` from its input integers `xq`, and the
    exact quotient y / sy it rounds."""
    p = c.params
    x = xq.astype(np.int64) - p["zx"].astype(np.int64)
    w = p["wq"].astype(np.int64) - p["zw"].astype(np.int64)
    scale = np.float64(p["sx"]) * p["sw"].astype(np.float64)
    if c.op == "Conv":
        acc = _conv_sum(x, w, p["attrs"])
        scale = scale.reshape(-1, 1, 1) if scale.ndim else scale
        bias = p["b"].astype(np.float64).reshape(-1, 1, 1) if "b" in p else None
    else:
        if p["attrs"].get("transB", 0):          # B^T [N, K]: its per-row parameters too
            w, scale = w.T, scale.T
        acc = x @ w
        bias = p["b"].astype(np.float64) if "b" in p else None
    y = acc.astype(np.float64) * scale + 0.0
    if bias is not None:
        y = y + bias
    info = np.iinfo(p["zy"].dtype)
    q = np.rint(y / np.float64(p["sy"])) + np.float64(p["zy"])
    return np.clip(q, info.min, info.max).astype(p["zy"].dtype), y / np.float64(p["sy"])


def traced(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """`model` with the tensors `names` made graph outputs too."""
    model = shape_inference.infer_shapes(model)
    types = {vi.name: vi for vi in [*model.graph.value_info, *model.graph.input]}
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have and name in types:
            model.graph.output.append(types[name])
            have.add(name)
    return model


def exactness(model: onnx.ModelProto, compile_fn, feeds: list[dict]) -> Exactness:
    """Compile `model` with every QDQ contraction's input and output integers as outputs
    (`compile_fn(model)` -> a compiled program), run it on `feeds` and compare each
    contraction's output with `exact_output` of its input (a QOperator model in its QDQ
    form)."""
    model = qdq_model(model)
    contractions = find_contractions(model)
    inputs = {i.name for i in model.graph.input}
    names = sorted({c.output for c in contractions} |
                   {c.x for c in contractions if c.x not in inputs})
    compiled = compile_fn(traced(model, names))
    found = Exactness()
    for feed in feeds:
        got = compiled.run(feed)
        for c in contractions:
            xq = feed[c.x] if c.x in feed else np.asarray(got[c.x])
            want, ratio = exact_output(c, xq)
            have = np.asarray(got[c.output])
            diff = np.abs(have.astype(np.int64) - want.astype(np.int64))
            bad = diff != 0
            found.elements += diff.size
            found.differing += int(bad.sum())
            found.per_output[c.output] = found.per_output.get(c.output, 0) + int(bad.sum())
            if bad.any():
                found.max_steps = max(found.max_steps, int(diff.max()))
                distance = np.abs(np.abs(ratio - np.floor(ratio)) - 0.5)
                near = distance <= 2.0 ** -23 * np.maximum(np.abs(ratio), 1.0)
                found.off_tie += int((bad & ~near).sum())
    return found
