"""Stage 1, import: an ONNX model (path or ModelProto) -> `ir.Graph` with static shapes.

What happens, in order:
1. read the file (external data only from inside the model's folder; never for a model given
   in memory), hold its big tensors aside, refuse cycles, undefined values and nodes that
   overwrite inputs, run the checker;
2. write the nodes of a QOperator-format quantized model (QLinearConv, com.microsoft's
   QLinearAdd...) as the QDQ graphs they define (`qoperator`), then upgrade the
   default-domain opset to `CANONICAL_OPSET` with onnx's version converter;
3. fix the input shapes (from the file or from `input_shapes=`) and refuse symbolic dims;
4. fold the shape computations: nodes whose inputs are all constant (or `Shape` of a value whose
   shape is static) are evaluated once with `onnx.reference`, so that ONNX shape inference can
   give every value a static shape;
5. normalize each node into the term language's form (defaults filled in, negative axes
   resolved, auto_pad turned into pads, attribute-like inputs such as Unsqueeze's axes turned
   into attributes, very wide Concat/Max/Min split into trees); a node outside the covered set
   becomes `Opaque`;
6. drop the nodes no graph output depends on, and refuse a remaining Opaque node that
   `onnx.reference` cannot run alone (other domains, control flow).

Steps 1 to 4 run ONNX's checker, version converter and shape inference on a weightless copy
of the model, each of which would otherwise serialize every weight (`protos` says how the
tensors are held aside); the weights join the graph again, by name, in step 5. The time of
each step is kept in `Graph.import_seconds`.

Nothing big is allocated before its size is checked: declared shapes (`MAX_TENSOR_BYTES`) and
values folded at import (`MAX_FOLDED_BYTES`). docs/reliability.md lists every refusal.

The steps live in reading.py (1), shapes.py (3, and the shape inference of 4), folding.py (4)
and normalize.py (5); this module is the stage: it runs them in order (step 2 and 6 are here).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError
from ..ir import CANONICAL_OPSET, Graph, Node, TensorInfo
from ..signature import Signature
from .folding import MAX_FOLDED_BYTES, _constant_node_value, _fold_shape_computations
from .normalize import FAN_IN, MAX_INPUTS, _Context, _normalize, _split_wide
from .protos import is_held
from .qoperator import as_qdq
from .reading import _check_topology, _read
from .symbolic import has_open_dims, infer_symbolic
from .shapes import (MAX_TENSOR_BYTES, _refuse_huge, _require_static, _resize_error,
                     _set_input_shapes, _static_shapes, with_input_shapes)

__all__ = ["CANONICAL_OPSET", "import_model", "with_input_shapes", "MAX_TENSOR_BYTES",
           "MAX_FOLDED_BYTES", "FAN_IN", "MAX_INPUTS"]


def _default_opset(proto: onnx.ModelProto, name: str) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise ModelError(f"{name}: the model imports no version of the default ONNX domain")
    version = versions[0]
    newest = onnx.defs.onnx_opset_version()
    if version < 7 or version > newest:
        raise ModelError(f"{name}: opset {version} is not supported (this installation knows "
                         f"opsets 7 to {newest})")
    return version


def _to_canonical(proto: onnx.ModelProto, version: int, name: str) -> onnx.ModelProto:
    if version == CANONICAL_OPSET:
        return proto
    try:
        converted = onnx.version_converter.convert_version(proto, CANONICAL_OPSET)
    except Exception as exc:
        if version > CANONICAL_OPSET:
            # The covered ops kept their form from opset 21 on; a model that cannot be taken down
            # is read as it is.
            return proto
        raise ModelError(f"{name}: could not upgrade opset {version} to {CANONICAL_OPSET}: "
                         f"{exc}") from None
    # The converter runs its own shape inference and writes what it found into the graph's
    # outputs and value_info (e.g. a ceil-mode pool's wrong size, see `_ceil_pool_shadow`):
    # keep the declarations of the file instead, and let `_infer` redo the rest. The inputs
    # too: a graph input that is also an output declared with unknown dims would otherwise
    # take the output's unknown dims in place of its static input declaration.
    for field in ("input", "output", "value_info"):
        target = getattr(converted.graph, field)
        del target[:]
        target.extend(getattr(proto.graph, field))
    return converted


# ---- the stage ----------------------------------------------------------------------------------

def import_model(model: str | Path | onnx.ModelProto,
                 input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """Read an ONNX model into the IR: canonical opset, static shapes, normalized nodes."""
    try:
        return _import_model(model, input_shapes)
    except MemoryError:
        name = model.graph.name if isinstance(model, onnx.ModelProto) else str(model)
        raise ModelError(f"{name or '<model>'}: ran out of memory while reading the model "
                         f"(its tensors or the values folded at import are too big for this "
                         f"machine)") from None


@contextmanager
def _timed(seconds: dict[str, float], step: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[step] = seconds.get(step, 0.0) + time.perf_counter() - start


def _import_model(model: str | Path | onnx.ModelProto,
                  input_shapes: dict[str, tuple[int, ...]] | None) -> Graph:
    seconds: dict[str, float] = {}
    with _timed(seconds, "read"):
        proto, held, name = _read(model)
    with _timed(seconds, "check"):
        source_opset = _default_opset(proto, name)
        _check_topology(proto, name)
        resized = _set_input_shapes(proto, input_shapes, name)  # before the checker wants shapes
        _check(proto, name)
    file_nodes = len(proto.graph.node)
    with _timed(seconds, "convert"):
        as_qdq(proto, held)             # QOperator nodes as their DequantizeLinear ... forms
        proto = _to_canonical(proto, source_opset, name)
    # The opset the nodes now follow: CANONICAL_OPSET, or a newer one that could not be taken
    # down (Opaque nodes must then run under it, e.g. Cast's round_mode exists from opset 24).
    opset = max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    try:
        if has_open_dims(proto):
            graph = _symbolic_graph(proto, held, name, opset, source_opset, file_nodes, seconds)
        else:
            graph = _static_graph(proto, held, name, opset, source_opset, file_nodes, seconds)
    except ModelError as exc:
        if not resized:
            raise
        raise _resize_error(resized, exc, name) from None
    graph.nodes_added_by_conversion = len(proto.graph.node) - file_nodes
    graph.import_seconds = seconds
    return graph


def _check(proto: onnx.ModelProto, name: str) -> None:
    """The ONNX checker, on the weightless model (`reading` checked the held tensors' sizes)."""
    for vo in proto.graph.output:
        if vo.type.HasField("tensor_type") and not vo.type.tensor_type.HasField("shape"):
            raise ModelError(f"{name}: graph output {vo.name!r} declares no shape, not even "
                             f"its rank (ONNX requires one; its dims may be unknown)")
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"{name}: the ONNX checker rejects the model: "
                         f"{str(exc).strip().splitlines()[0]}") from None


def _static_graph(proto: onnx.ModelProto, held: dict[str, np.ndarray], name: str, opset: int,
                  source_opset: int, onnx_nodes: int, seconds: dict[str, float]) -> Graph:
    """Steps 4 to 6 on a model whose input shapes are set: fold, normalize, drop dead nodes.
    The values of the tensors held aside come back here, from `held`, by name."""
    start = time.perf_counter()
    proto = _fold_shape_computations(proto, name, held, seconds)
    seconds["fold"] = time.perf_counter() - start - seconds.get("infer", 0.0)
    graph = proto.graph

    infos = _static_shapes(proto)
    initializers = {t.name: held[t.name] if is_held(t) else numpy_helper.to_array(t)
                    for t in graph.initializer}
    for node in graph.node:   # outputs folded to Constant nodes
        if node.op_type == "Constant":
            initializers[node.output[0]] = _constant_node_value(node, held)
            infos[node.output[0]] = TensorInfo(initializers[node.output[0]].shape,
                                               initializers[node.output[0]].dtype.name)
    inputs = [vi.name for vi in graph.input if vi.name not in initializers]
    outputs = [vo.name for vo in graph.output]
    for value in [*inputs, *outputs]:
        _require_static(value, infos, name)
    _refuse_huge(infos, name)

    ctx = _Context(infos, initializers, name,
                   {v for n in graph.node for v in [*n.input, *n.output]} | set(inputs))
    nodes: list[Node] = []
    for onnx_node in graph.node:
        if onnx_node.op_type == "Constant":
            continue
        for out in onnx_node.output:
            if out:
                _require_static(out, infos, name, onnx_node)
        for part in _split_wide(onnx_node, ctx):
            nodes.extend(_normalize(part, ctx))
    nodes = _live_nodes(nodes, outputs)
    for node in nodes:
        if node.op == "Opaque":
            _check_runnable(node.onnx_node, name)
    used = {i for n in nodes for i in n.inputs if i} | set(outputs)
    seconds["normalize"] = time.perf_counter() - start - seconds["fold"] - seconds["infer"]
    return Graph(
        name=name, nodes=nodes,
        values={v: infos[v] for v in used | set(inputs) | {o for n in nodes for o in n.outputs}
                if v in infos},
        initializers={k: v for k, v in initializers.items() if k in used},
        inputs=inputs, outputs=outputs, opset=opset, source_opset=source_opset,
        opaque_ops=sorted({n.onnx_node.op_type for n in nodes if n.op == "Opaque"}),
        onnx_nodes=onnx_nodes)


def _symbolic_graph(proto: onnx.ModelProto, held: dict[str, np.ndarray], name: str, opset: int,
                    source_opset: int, onnx_nodes: int, seconds: dict[str, float]) -> Graph:
    """Steps 4 to 6 on a model with open input dims: symbolic shape inference (`symbolic`), the
    shape subgraphs folded into dim expressions, normalize the data nodes, drop dead nodes.
    Values the program reads that depend on the symbols alone become derived inputs, which a
    run computes once per concrete shape (`signature.Signature.derive`)."""
    start = time.perf_counter()
    found = infer_symbolic(proto, held, name)
    seconds["infer"] = time.perf_counter() - start
    graph = proto.graph
    infos = found.infos
    real_inputs = [vi.name for vi in graph.input if vi.name not in found.constants]
    outputs = [vo.name for vo in graph.output]
    compile_time = {**found.constants, **found.shape_values}
    ctx = _Context(infos, compile_time, name,
                   {v for n in graph.node for v in [*n.input, *n.output]} | set(real_inputs))
    nodes: list[Node] = []
    for onnx_node in found.data_nodes:
        for part in _split_wide(onnx_node, ctx):
            nodes.extend(_normalize(part, ctx))
    # an output computed from symbols alone is computed per shape, like a derived input
    nodes = _live_nodes(nodes, outputs)
    used = {i for n in nodes for i in n.inputs if i} | set(outputs)
    for node in nodes:
        if node.op == "Opaque":
            _check_runnable(node.onnx_node, name)
            used.update(i for i in node.onnx_node.input if i)
    derived = sorted(v for v in used if v in found.shape_values or v in found.derived)
    recipe = _recipe(found, derived)
    signature = Signature(
        inputs={v: infos[v].shape for v in real_inputs}, derived=derived,
        shape_values=found.shape_values, recipe=recipe,
        constants={i: found.constants[i] for n in recipe for i in n.input
                   if i in found.constants},
        constraints=found.constraints, opset_imports=list(proto.opset_import),
        symbols=found.symbols)
    constant_outputs = [o for o in outputs if o in found.constants]
    if constant_outputs:
        raise ModelError(f"{name}: outputs {constant_outputs} are constants; a model with open "
                         f"dims must compute its outputs from its inputs")
    seconds["normalize"] = time.perf_counter() - start - seconds["infer"]
    return Graph(
        name=name, nodes=nodes,
        values={v: infos[v] for v in used | set(real_inputs) | {o for n in nodes
                                                                 for o in n.outputs}
                if v in infos},
        initializers={k: v for k, v in {**found.constants, **ctx.added}.items() if k in used},
        inputs=real_inputs + derived, outputs=outputs, opset=opset, source_opset=source_opset,
        opaque_ops=sorted({n.onnx_node.op_type for n in nodes if n.op == "Opaque"}),
        onnx_nodes=onnx_nodes, signature=signature)


def _recipe(found, derived: list[str]) -> list[onnx.NodeProto]:
    """The nodes that compute the derived inputs from symbols alone, in order."""
    needed = {v for v in derived if v in found.derived}
    recipe = []
    for node in reversed(found.derived_order):
        if any(o in needed for o in node.output):
            recipe.append(node)
            needed.update(i for i in node.input if i in found.derived)
    return recipe[::-1]


def _check_runnable(node: onnx.NodeProto, name: str) -> None:
    """Refuse, at compile time, an uncovered node that `onnx.reference` cannot run on its own."""
    label = f"node {node.name or node.op_type!r} ({node.op_type}"
    if node.domain not in ("", "ai.onnx"):
        raise ModelError(f"{name}: {label}) is an operator of domain {node.domain!r}; "
                         f"eqsat-fuse runs operators of the default ONNX domain only")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for a in node.attribute):
        raise ModelError(f"{name}: {label}) holds a subgraph; control flow (If, Loop, Scan) is "
                         f"outside what eqsat-fuse compiles")


def _live_nodes(nodes: list[Node], outputs: list[str]) -> list[Node]:
    needed = set(outputs)
    live: list[Node] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs):
            live.append(node)
            needed.update(i for i in node.inputs if i)
            if node.op == "Opaque":
                needed.update(i for i in node.onnx_node.input if i)
    return live[::-1]
