"""Step 4 of import, the folding: nodes whose inputs are all constant (or `Shape` of a value
whose shape is static) are evaluated once with `onnx.reference`, until ONNX shape inference can
give every value a static shape; nothing too big is allocated. The model is the weightless
copy (`protos`): the values of the tensors held aside are in `held`, and a big folded value
joins them there."""

from __future__ import annotations

import math
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..backends.reference import run_node
from ..errors import ModelError
from ..ir import TensorInfo
from .protos import _attrs, held_or_tensor, is_held
from .shapes import _infer, _static_shapes

# Nodes that must never be evaluated at import even when their inputs are constant.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}
# A value computed at import time from constants becomes an initializer of the model, which ONNX's
# shape inference must then read whole; protobuf caps a model at 2 GiB.
MAX_FOLDED_BYTES = 1 << 30


def _constant_node_value(node: onnx.NodeProto, held: dict[str, np.ndarray]) -> np.ndarray:
    attr = node.attribute[0]
    kind = attr.name
    if kind == "value":
        return held[node.output[0]] if is_held(attr.t) else numpy_helper.to_array(attr.t)
    if kind == "value_float":
        return np.array(attr.f, dtype=np.float32)
    if kind == "value_floats":
        return np.array(list(attr.floats), dtype=np.float32)
    if kind == "value_int":
        return np.array(attr.i, dtype=np.int64)
    if kind == "value_ints":
        return np.array(list(attr.ints), dtype=np.int64)
    raise ModelError(f"Constant node {node.name!r}: attribute {kind!r} is not supported")


def _fold_shape_computations(proto: onnx.ModelProto, name: str, held: dict[str, np.ndarray],
                             seconds: dict[str, float]) -> onnx.ModelProto:
    """Evaluate, once, every node whose inputs are all known at compile time, until shapes settle.

    Constant nodes become initializers; `Shape` of a statically shaped value becomes its shape.
    The evaluation runs the original ONNX nodes through `onnx.reference`. The time spent in
    shape inference is added to `seconds["infer"]`.
    """
    for _ in range(20):
        proto = _timed_infer(proto, name, seconds)
        graph = proto.graph
        infos = _static_shapes(proto)
        known: dict[str, np.ndarray] = {
            t.name: held[t.name] if is_held(t) else numpy_helper.to_array(t)
            for t in graph.initializer}
        graph_outputs = {o.name for o in graph.output}
        folded: set[int] = set()                 # indices of the nodes folded away
        new_values: dict[str, np.ndarray] = {}
        for index, node in enumerate(graph.node):
            if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC:
                continue
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for a in node.attribute):
                continue
            if node.op_type == "Constant":
                if node.output[0] in graph_outputs:
                    continue   # an output computed from constants alone: kept as a node
                new_values[node.output[0]] = _constant_node_value(node, held)
            elif node.op_type == "Shape" and node.input[0] in infos:
                dims = np.array(infos[node.input[0]].shape, dtype=np.int64)
                attrs = {a.name: a.i for a in node.attribute}
                new_values[node.output[0]] = _shape_slice(dims, attrs.get("start", 0),
                                                          attrs.get("end"))
            elif _kept_weight(node, known):
                continue
            elif node.input and all(i == "" or i in known or i in new_values for i in node.input):
                values = {**known, **new_values}
                inputs = [values[i] if i else None for i in node.input]
                outputs = fold_node(node, inputs, infos, name, proto.opset_import)
                new_values.update((o, v) for o, v in zip(node.output, outputs) if o)
            else:
                continue
            folded.add(index)
        if not folded:
            return proto
        keep = [n for i, n in enumerate(graph.node) if i not in folded]
        del graph.node[:]
        graph.node.extend(keep)
        for value_name, array in new_values.items():
            if value_name in graph_outputs:
                # An output computed from constants alone stays an output: keep it as a node.
                tensor = held_or_tensor(array, value_name, held)
                graph.node.append(helper.make_node("Constant", [], [value_name], value=tensor))
                continue
            graph.initializer.append(held_or_tensor(array, value_name, held))
        # value_info from the last inference may be stale for the folded values: drop it all
        del graph.value_info[:]
    return _timed_infer(proto, name, seconds)


def _kept_weight(node: onnx.NodeProto, known: dict[str, np.ndarray]) -> bool:
    """A DequantizeLinear of 8-bit integer weights (a constant of two dims or more) is kept:
    the integer contraction rules (`rules/quant.egg`) read the integers, and lowering folds it
    to floats where the float contraction is chosen instead."""
    if node.op_type != "DequantizeLinear" or node.input[0] not in known:
        return False
    weights = known[node.input[0]]
    return weights.dtype in (np.int8, np.uint8) and weights.ndim >= 2


def fold_node(node: onnx.NodeProto, inputs: list, infos: dict[str, TensorInfo], name: str,
              opsets) -> list:
    """The outputs of a node whose inputs are all known (`inputs`), evaluated once, or a
    `ModelError` naming it: when it would fold to more than `MAX_FOLDED_BYTES` (refused before
    it runs where `infos` or its inputs tell the size, else after), or when it fails."""
    _refuse_huge_fold(node, inputs, infos, name)
    label = f"{name}: node {node.name or node.op_type!r} ({node.op_type})"
    try:
        outputs = run_node(node, inputs, opsets)
    except (Exception, MemoryError) as exc:
        raise ModelError(f"{label} has constant inputs but could not be evaluated: "
                         f"{type(exc).__name__}: {exc}") from None
    for output, value in zip(node.output, outputs):
        if output and value is not None and np.asarray(value).nbytes > MAX_FOLDED_BYTES:
            raise ModelError(f"{label} folds to {np.asarray(value).nbytes} bytes, more than the "
                             f"{MAX_FOLDED_BYTES >> 30} GiB a value computed at import may "
                             f"take; refused")
    return outputs


def _timed_infer(proto: onnx.ModelProto, name: str, seconds: dict[str, float]
                 ) -> onnx.ModelProto:
    start = time.perf_counter()
    try:
        return _infer(proto, name)
    finally:
        seconds["infer"] = seconds.get("infer", 0.0) + time.perf_counter() - start


def _refuse_huge_fold(node: onnx.NodeProto, inputs: list, infos: dict[str, TensorInfo],
                      name: str) -> None:
    """Refuse to evaluate a constant node whose output would be too big, before allocating it.

    The size comes from shape inference, or, for the ops whose output size is a function of
    their input values (which inference may not propagate), from those values.
    """
    def size() -> int | None:
        out = [infos[o] for o in node.output if o and o in infos]
        if out and len(out) == len([o for o in node.output if o]):
            return max(i.nbytes for i in out)
        try:
            op, x = node.op_type, inputs
            if op == "ConstantOfShape":
                value = _attrs(node).get("value")
                item = numpy_helper.to_array(value).itemsize if value is not None else 4
                return math.prod(int(d) for d in np.asarray(x[0]).reshape(-1)) * item
            if op == "Range":
                start, limit, delta = (float(np.asarray(v).reshape(())) for v in x[:3])
                count = max(math.ceil((limit - start) / delta), 0) if delta else 0
                return count * np.asarray(x[0]).itemsize
            if op == "Expand":
                shape = np.broadcast_shapes(np.shape(x[0]),
                                            tuple(int(d) for d in np.asarray(x[1]).reshape(-1)))
                return math.prod(shape) * np.asarray(x[0]).itemsize
            if op == "Tile":
                return math.prod(int(d) * int(r) for d, r in zip(
                    np.shape(x[0]), np.asarray(x[1]).reshape(-1))) * np.asarray(x[0]).itemsize
            if op == "OneHot":
                depth = int(np.asarray(x[1]).reshape(-1)[0])
                return math.prod(np.shape(x[0])) * depth * np.asarray(x[2]).itemsize
        except (ValueError, TypeError, IndexError, OverflowError):
            return None
        return None

    nbytes = size()
    if nbytes is not None and nbytes > MAX_FOLDED_BYTES:
        raise ModelError(f"{name}: node {node.name or node.op_type!r} ({node.op_type}) has "
                         f"constant inputs, but its output would take {nbytes} bytes, more "
                         f"than the {MAX_FOLDED_BYTES >> 30} GiB a value computed at import may "
                         f"take; refused before allocating")


def _shape_slice(dims: np.ndarray, start: int, end: int | None) -> np.ndarray:
    rank = len(dims)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return dims[start:end]
