"""Step 1 of import: read the file (external data only from inside the model's folder; never
for a model given in memory), inline eqsat-fuse's own exported kernels (local functions of
domain `eqsat_fuse`), and refuse cycles, undefined values and nodes that overwrite inputs,
putting the nodes in topological order."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import inliner

from ..errors import ModelError
from .protos import all_tensors

EXPORT_DOMAIN = "eqsat_fuse"     # the domain of the fused kernels `Compiled.to_onnx` writes


def _read(model: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Load the ModelProto and name it for messages; external data only from the model's folder."""
    if isinstance(model, onnx.ModelProto):
        name = model.graph.name or "<model>"
        for tensor in all_tensors(model):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                raise ModelError(f"{name}: tensor {tensor.name!r} keeps its data in an external "
                                 f"file, and a model given in memory has no folder to read it "
                                 f"from; pass the model's path instead (its data is then read "
                                 f"from its folder only)")
        return inline_functions(model), name
    path = Path(model)
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if path.is_dir():
        raise ModelError(f"{path}: is a folder, not an ONNX file")
    data = path.read_bytes()
    if not data:
        raise ModelError(f"{path}: the file is empty")
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelError(f"{path}: not an ONNX model (protobuf could not parse it: {exc})"
                         ) from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph in the file)")
    _load_external_data(proto, path)
    return inline_functions(proto), str(path)


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as plain ONNX: every call of a local function of domain `eqsat_fuse` replaced by
    the function's body (`onnx.inliner`), those functions and their opset import dropped. Other
    local functions stay as they are. `Compiled.to_onnx(inline=True)` writes through this, and
    every model is read through it, so eqsat-fuse compiles its own exports."""
    ours = [(f.domain, f.name) for f in model.functions if f.domain == EXPORT_DOMAIN]
    if not ours:
        return model
    name = model.graph.name or "<model>"
    try:
        inlined = inliner.inline_selected_functions(model, ours, exclude=False)
    except Exception as exc:  # onnx's C++ inliner raises its own error types
        raise ModelError(f"{name}: could not inline its {EXPORT_DOMAIN!r} functions: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                         ) from None
    used = {n.domain for n in inlined.graph.node} | {
        n.domain for f in inlined.functions for n in f.node}
    if EXPORT_DOMAIN not in used:
        kept = [o for o in inlined.opset_import if o.domain != EXPORT_DOMAIN]
        del inlined.opset_import[:]
        inlined.opset_import.extend(kept)
    return inlined


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Load tensors stored beside the model, refusing any location outside the model's folder."""
    base = path.resolve().parent
    for tensor in all_tensors(proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        try:
            if "\0" in location or not location:
                raise ValueError
            target = (base / location).resolve()
        except (ValueError, OSError):
            raise ModelError(f"{path}: tensor {tensor.name!r} keeps its data at {location!r}, "
                             f"which is not a file name; refused") from None
        if not target.is_relative_to(base) or Path(location).is_absolute():
            raise ModelError(f"{path}: tensor {tensor.name!r} keeps its data at {location!r}, "
                             f"outside the model's folder; refused")
        if not target.is_file():
            raise ModelError(f"{path}: tensor {tensor.name!r}: external data file {location!r} "
                             f"is missing")
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(base))
    except Exception as exc:
        raise ModelError(f"{path}: could not load external tensor data: {exc}") from None


def _check_topology(proto: onnx.ModelProto, name: str) -> None:
    """Refuse a node reading an undefined value or a cycle; put the nodes in topological order."""
    graph = proto.graph
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer} | {""}
    producers = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    for node in graph.node:
        for value in node.output:
            if value and value in defined:
                raise ModelError(f"{name}: node {node.name or node.op_type!r} writes {value!r}, "
                                 f"which is already a graph input or an initializer")
    for node in graph.node:
        for value in node.input:
            if value not in defined and value not in producers:
                raise ModelError(f"{name}: node {node.name or node.op_type!r} reads {value!r}, "
                                 f"which is neither a graph input, an initializer nor a node "
                                 f"output")
    for out in graph.output:
        if out.name not in defined and out.name not in producers:
            raise ModelError(f"{name}: graph output {out.name!r} is computed by no node")
    # Kahn's algorithm: whatever is left unordered sits on a cycle.
    waiting = [len({producers[v] for v in n.input if v in producers}) for n in graph.node]
    readers: dict[int, set[int]] = {}
    for i, n in enumerate(graph.node):
        for p in {producers[v] for v in n.input if v in producers}:
            readers.setdefault(p, set()).add(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for r in sorted(readers.get(i, ())):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
    if len(order) < len(graph.node):
        stuck = next(graph.node[i] for i in range(len(graph.node)) if i not in set(order))
        raise ModelError(f"{name}: the graph has a cycle through node "
                         f"{stuck.name or stuck.op_type!r}")
    if order != list(range(len(graph.node))):
        nodes = [graph.node[i] for i in order]
        del graph.node[:]
        graph.node.extend(nodes)
