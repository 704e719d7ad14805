"""Step 1 of import: read the file (external data only from inside the model's folder; never
for a model given in memory), hold the big tensors aside (the checker, the version converter
and shape inference then run on a weightless copy: see `protos`), inline eqsat-fuse's own
exported kernels (local functions of domain `eqsat_fuse`), and refuse cycles, undefined values
and nodes that overwrite inputs, putting the nodes in topological order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, inliner, numpy_helper

from ..errors import ModelError
from .protos import HELD_BYTES, all_tensors, copy_fields, declaration

EXPORT_DOMAIN = "eqsat_fuse"     # the domain of the fused kernels `Compiled.to_onnx` writes

# Element types whose data is a plain array of fixed-size elements, so that its byte size
# follows from its dims (packed 4-bit and 2-bit types, strings and float8s stay in the copy,
# where the checker judges them).
_PLAIN = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
          onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8, onnx.TensorProto.INT16,
          onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8,
          onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
          onnx.TensorProto.BOOL, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}


def _read(model: str | Path | onnx.ModelProto
          ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], str]:
    """The model without its big tensors, their values by name, and the model's name for
    messages. External data only from the model's folder; the caller's ModelProto is not
    modified (the weightless copy is the import's own)."""
    if isinstance(model, onnx.ModelProto):
        name = model.graph.name or "<model>"
        for tensor in all_tensors(model):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                raise ModelError(f"{name}: tensor {tensor.name!r} keeps its data in an external "
                                 f"file, and a model given in memory has no folder to read it "
                                 f"from; pass the model's path instead (its data is then read "
                                 f"from its folder only)")
        skeleton, held = _weightless(model, "", name)
        return inline_functions(skeleton), held, name
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
    del data
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph in the file)")
    _check_external_data(proto, path)
    skeleton, held = _weightless(proto, str(path.resolve().parent), str(path))
    return inline_functions(skeleton), held, str(path)


def _weightless(proto: onnx.ModelProto, base_dir: str, name: str
                ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of `proto` whose tensors of more than `HELD_BYTES` (initializers and Constant
    values) are declarations, and their values: by initializer name, or by the output of the
    Constant node. Initializers are never deep-copied as protos: each big one is read once,
    into its array (a view of its bytes); nodes are copied whole, then a big Constant value is
    replaced by its declaration. Small tensors stored externally are loaded into the copy."""
    held: dict[str, np.ndarray] = {}
    skeleton = onnx.ModelProto()
    try:
        copy_fields(proto, skeleton, skip=("graph",))
        copy_fields(proto.graph, skeleton.graph, skip=("initializer",))
    except UnicodeDecodeError as exc:
        raise ModelError(f"{name}: a text field of the model is not valid UTF-8 ({exc.reason})"
                         ) from None
    for tensor in proto.graph.initializer:
        skeleton.graph.initializer.append(_held_or_kept(tensor, tensor.name, held, base_dir,
                                                        name))
    for node, copy in zip(proto.graph.node, skeleton.graph.node):  # Constant values, mostly
        for attr, kept in zip(node.attribute, copy.attribute):
            if attr.type != onnx.AttributeProto.TENSOR:
                continue
            if node.op_type == "Constant" and node.output:
                tensor = _held_or_kept(attr.t, node.output[0], held, base_dir, name)
            else:            # another node's tensor attribute: its data stays with the node
                tensor = _loaded(attr.t, base_dir, name)
            if tensor is not attr.t:
                kept.t.CopyFrom(tensor)
    return skeleton, held


def _held_or_kept(tensor: onnx.TensorProto, key: str, held: dict[str, np.ndarray],
                  base_dir: str, name: str) -> onnx.TensorProto:
    """The tensor for the weightless copy: a declaration with its value put in `held[key]`,
    or (small, or of a type whose size the dims do not give) the tensor with its data."""
    external = tensor.data_location == onnx.TensorProto.EXTERNAL
    if tensor.data_type in _PLAIN and (external or tensor.HasField("raw_data")):
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
        if min(tensor.dims, default=1) >= 0 and count * dtype.itemsize > HELD_BYTES:
            held[key] = _value(tensor, base_dir, count, dtype, name)
            return declaration(tensor.name, tensor.data_type, tensor.dims)
    return _loaded(tensor, base_dir, name)


def _value(tensor: onnx.TensorProto, base_dir: str, count: int, dtype: np.dtype,
           name: str) -> np.ndarray:
    """The array of a tensor held aside, a view of its bytes, checked against its dims (the
    checker, which sees only the declaration, no longer can)."""
    expected = count * dtype.itemsize
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        try:
            return numpy_helper.to_array(tensor, base_dir)
        except Exception as exc:   # bounds (OSError, ValueError) or a size that is not its dims'
            raise ModelError(f"{name}: could not load external tensor data: {exc} (tensor "
                             f"{tensor.name!r}, shape {list(tensor.dims)}, {dtype.name}, "
                             f"{expected} bytes)") from None
    data = tensor.raw_data
    if len(data) != expected:
        raise ModelError(f"{name}: tensor {tensor.name!r}: raw_data size ({len(data)} bytes) is "
                         f"too {'small' if len(data) < expected else 'large'} for its shape "
                         f"{list(tensor.dims)} ({dtype.name}, {expected} bytes)")
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).reshape(tuple(tensor.dims))


def _loaded(tensor: onnx.TensorProto, base_dir: str, name: str) -> onnx.TensorProto:
    """`tensor` itself, or, stored externally, a copy with its data read in."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return tensor
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    try:
        onnx.external_data_helper.load_external_data_for_tensor(copy, base_dir)
    except Exception as exc:
        raise ModelError(f"{name}: could not load external tensor data: {exc}") from None
    return copy


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


def _check_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Refuse external data whose location is outside the model's folder, or missing there
    (`_weightless` reads it)."""
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
