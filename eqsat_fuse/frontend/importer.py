"""Stage 1, import: an ONNX model (path or ModelProto) -> `ir.Graph` with static shapes.

What happens, in order:
1. read the file (external data only from inside the model's folder; never for a model given
   in memory), refuse cycles, undefined values and nodes that overwrite inputs, run the checker;
2. upgrade the default-domain opset to `CANONICAL_OPSET` with onnx's version converter;
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

Nothing big is allocated before its size is checked: declared shapes (`MAX_TENSOR_BYTES`) and
values folded at import (`MAX_FOLDED_BYTES`). docs/reliability.md lists every refusal.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..errors import ModelError
from ..ir import Graph, Node, TensorInfo
from ..ops import OPS
from ..backends.numpy.ops import _pool_out_size
from ..backends.reference import run_node

CANONICAL_OPSET = 21

# Nodes that must never be evaluated at import even when their inputs are constant.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}

def _physical_memory() -> int:
    try:
        import os
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


# A tensor bigger than this is refused before anything is allocated: 8 GiB, or half the
# machine's memory when it has less than 16 GiB.
MAX_TENSOR_BYTES = min(8 << 30, _physical_memory() // 2)
# A value computed at import time from constants becomes an initializer of the model, which ONNX's
# shape inference must then read whole; protobuf caps a model at 2 GiB.
MAX_FOLDED_BYTES = 1 << 30


# ---- reading ------------------------------------------------------------------------------------

def _read(model: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Load the ModelProto and name it for messages; external data only from the model's folder."""
    if isinstance(model, onnx.ModelProto):
        name = model.graph.name or "<model>"
        for tensor in _all_tensors(model):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                raise ModelError(f"{name}: tensor {tensor.name!r} keeps its data in an external "
                                 f"file, and a model given in memory has no folder to read it "
                                 f"from; pass the model's path instead (its data is then read "
                                 f"from its folder only)")
        return model, name
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
        raise ModelError(f"{path}: not an ONNX model (protobuf could not parse it: {exc})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph in the file)")
    _load_external_data(proto, path)
    return proto, str(path)


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Load tensors stored beside the model, refusing any location outside the model's folder."""
    base = path.resolve().parent
    for tensor in _all_tensors(proto):
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


def _all_tensors(proto: onnx.ModelProto):
    yield from proto.graph.initializer
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t


# ---- opset, shapes, folding ---------------------------------------------------------------------

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
    # keep the declarations of the file instead, and let `_infer` redo the rest.
    for field in ("output", "value_info"):
        target = getattr(converted.graph, field)
        del target[:]
        target.extend(getattr(proto.graph, field))
    return converted


def _declared_dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    """An input's declared dims: a number, or the dim's name ('?' when it has none)."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in vi.type.tensor_type.shape.dim]


def _given_dims(value: Any, input_name: str, name: str) -> list[int]:
    """`input_shapes[input_name]` as a list of whole numbers >= 0, or one line saying why not."""
    shown = f"input_shapes[{input_name!r}] = {value!r}"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ModelError(f"{name}: {shown} is not a sequence of dims, e.g. (1, 3, 224, 224)")
    dims = list(value)
    for position, dim in enumerate(dims):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise ModelError(f"{name}: {shown}: dim {position} is {dim!r}, not a whole number; "
                             f"eqsat-fuse compiles for static shapes, so give the size to compile "
                             f"for")
    dims = [int(d) for d in dims]
    if any(d < 0 for d in dims):
        raise ModelError(f"{name}: input_shapes[{input_name!r}] = {dims} has a negative dim")
    return dims


def _shape_hint(dims: list[int | str]) -> list[int]:
    """A static shape of the same rank to suggest for a dynamic input: its static dims as they
    are, 1 for a dynamic first (batch) dim, 128 for any other dynamic dim."""
    return [d if isinstance(d, int) else (1 if axis == 0 else 128) for axis, d in enumerate(dims)]


def _set_input_shapes(proto: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None,
                      name: str) -> list[tuple[str, list, list[int]]]:
    """Give the inputs their shapes (declared, or from `input_shapes`); refuse dynamic dims left
    open, naming every such input. An input given a size other than a static one it declares is
    re-sized, as onnxsim's --overwrite-input-shape does: the shapes inferred from the old size
    (value_info, output dims) are dropped, to be inferred again. Returns the re-sized inputs as
    (name, declared dims, new dims)."""
    initializers = {t.name for t in proto.graph.initializer}
    given = dict(input_shapes or {})
    real_inputs = [vi for vi in proto.graph.input if vi.name not in initializers]
    unknown = set(given) - {vi.name for vi in real_inputs}
    if unknown:
        raise ModelError(f"{name}: input_shapes names {sorted(unknown)}, which are not inputs of "
                         f"the model (its inputs: {[vi.name for vi in real_inputs]})")
    resized, dynamic = [], []
    for vi in real_inputs:
        ttype = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"{name}: input {vi.name!r} is not a tensor")
        if vi.name in given:
            dims = _given_dims(given[vi.name], vi.name, name)
            if ttype.HasField("shape"):
                declared = _declared_dims(vi)
                if len(declared) != len(dims):
                    raise ModelError(f"{name}: input {vi.name!r} has rank {len(declared)} "
                                     f"({declared}); input_shapes gives it {dims}, of rank "
                                     f"{len(dims)}")
                if any(isinstance(d, int) and d != new for d, new in zip(declared, dims)):
                    resized.append((vi.name, declared, dims))
            ttype.shape.ClearField("dim")
            for d in dims:
                ttype.shape.dim.add().dim_value = d
            continue
        if not ttype.HasField("shape"):
            raise ModelError(f"{name}: input {vi.name!r} has no declared shape; give it with "
                             f"input_shapes={{{vi.name!r}: (...)}} (--input-shape on the CLI)")
        if any(not d.HasField("dim_value") for d in ttype.shape.dim):
            dynamic.append((vi.name, _declared_dims(vi)))
    if dynamic:
        which = " and ".join(f"{n!r} {dims}" for n, dims in dynamic)
        hints = {n: _shape_hint(dims) for n, dims in dynamic}
        flags = " ".join(f"{n}={','.join(map(str, dims))}" for n, dims in hints.items())
        python = ", ".join(f"{n!r}: {tuple(dims)}" for n, dims in hints.items())
        raise ModelError(f"{name}: input{'s' if len(dynamic) > 1 else ''} {which} "
                         f"{'have' if len(dynamic) > 1 else 'has'} dynamic shape; eqsat-fuse "
                         f"compiles for static shapes: give them with --input-shape {flags} "
                         f"(input_shapes={{{python}}} in Python)")
    if resized:
        del proto.graph.value_info[:]
        for vo in proto.graph.output:
            if vo.type.HasField("tensor_type") and vo.type.tensor_type.HasField("shape"):
                for d in vo.type.tensor_type.shape.dim:
                    d.Clear()                   # the rank stays; the sizes are inferred again
    return resized


def with_input_shapes(model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None
                      ) -> onnx.ModelProto:
    """A copy of `model` whose inputs have the given shapes (re-sized as `import_model` does),
    for an oracle or an export that must accept inputs of those shapes."""
    if not input_shapes:
        return model
    proto = _copy(model)
    _set_input_shapes(proto, input_shapes, model.graph.name or "<model>")
    return proto


def _resize_error(resized: list, exc: ModelError, name: str) -> ModelError:
    """One line on why the model cannot run at the new input sizes, with onnx's reason."""
    what = ", ".join(f"input {n!r} from {old} to {new}" for n, old, new in resized)
    reason = str(exc).removeprefix(f"{name}: ").removeprefix("ONNX shape inference failed: ")
    reason = reason.replace("[ShapeInferenceError] Inference error(s): ", "")
    return ModelError(f"{name}: cannot re-size {what}: {reason}; the model fixes the old size "
                      f"in its weights or constants (export it again with that dim dynamic, or "
                      f"at the size you need)")


def _infer(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    shadow = _ceil_pool_shadow(proto)
    try:
        inferred = shape_inference.infer_shapes(shadow or proto, check_type=True,
                                                strict_mode=True, data_prop=True)
    except Exception as exc:
        message = str(exc).strip().splitlines()
        raise ModelError(f"{name}: ONNX shape inference failed: {message[-1] if message else exc}"
                         ) from None
    if shadow is not None:   # the shadow differs from the model only in its pooling attributes
        del inferred.graph.node[:]
        inferred.graph.node.extend(proto.graph.node)
    return inferred


def _ceil_pool_shadow(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of the model for shape inference only, with ceil-mode pooling made explicit.

    ONNX's shape inference (1.23) keeps a last ceil-mode window that starts in the end padding,
    which onnxruntime, PyTorch and `numpy_ops` drop: it gives such a pool one output too many
    (and a model declaring the right size fails strict inference). In the copy, each such node
    gets ceil_mode=0 and end pads that give the same output size under floor rounding.
    """
    pools = {i for i, n in enumerate(proto.graph.node)
             if n.op_type in ("MaxPool", "AveragePool") and n.domain in ("", "ai.onnx")
             and int(_attrs(n).get("ceil_mode", 0)) and "kernel_shape" in _attrs(n)
             and _str(_attrs(n).get("auto_pad", "NOTSET")) in ("NOTSET", "VALID")}
    if not pools:
        return None
    try:
        loose = shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:
        return None
    shapes = {vi.name: vi.type.tensor_type.shape for vi in [*loose.graph.input,
                                                           *loose.graph.value_info]}
    shadow = _copy(proto)
    for index, node in enumerate(proto.graph.node):
        if index not in pools or node.input[0] not in shapes:
            continue
        dims = shapes[node.input[0]].dim
        a = _attrs(node)
        kernel = list(a["kernel_shape"])
        rank = len(kernel)
        if len(dims) != rank + 2 or not all(d.HasField("dim_value") for d in dims[2:]):
            continue
        sizes = [int(d.dim_value) for d in dims[2:]]
        strides = list(a.get("strides", [1] * rank))
        dilations = list(a.get("dilations", [1] * rank))
        pads = [0] * (2 * rank) if _str(a.get("auto_pad", "NOTSET")) == "VALID" else \
            list(a.get("pads", [0] * (2 * rank)))
        if (len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank
                or min(kernel + strides + dilations) <= 0 or min(pads) < 0):
            continue   # malformed: strict inference on the model as it is will say what is wrong
        ends = []
        for n, k, pb, pe, st, d in zip(sizes, kernel, pads[:rank], pads[rank:], strides,
                                       dilations):
            out = _pool_out_size(n, k, pb, pe, st, d, True)
            ends.append(max((out - 1) * st + (k - 1) * d + 1 - n - pb, 0))
        copy = shadow.graph.node[index]
        kept = [attr for attr in copy.attribute if attr.name not in ("ceil_mode", "pads",
                                                                     "auto_pad")]
        del copy.attribute[:]
        copy.attribute.extend(kept)
        copy.attribute.extend([helper.make_attribute("ceil_mode", 0),
                               helper.make_attribute("pads", pads[:rank] + ends)])
    return shadow


def _static_shapes(proto: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Values whose shape and element type are fully known."""
    out: dict[str, TensorInfo] = {}
    graph = proto.graph
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if not vi.type.HasField("tensor_type"):
            continue
        ttype = vi.type.tensor_type
        if not ttype.HasField("shape") or ttype.elem_type == 0:
            continue
        if not all(d.HasField("dim_value") for d in ttype.shape.dim):
            continue
        out[vi.name] = TensorInfo(tuple(int(d.dim_value) for d in ttype.shape.dim),
                                  _np_dtype(ttype.elem_type))
    for t in graph.initializer:
        out[t.name] = TensorInfo(tuple(int(d) for d in t.dims), _np_dtype(t.data_type))
    return out


def _np_dtype(elem_type: int) -> str:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray:
    attr = node.attribute[0]
    kind = attr.name
    if kind == "value":
        return numpy_helper.to_array(attr.t)
    if kind == "value_float":
        return np.array(attr.f, dtype=np.float32)
    if kind == "value_floats":
        return np.array(list(attr.floats), dtype=np.float32)
    if kind == "value_int":
        return np.array(attr.i, dtype=np.int64)
    if kind == "value_ints":
        return np.array(list(attr.ints), dtype=np.int64)
    raise ModelError(f"Constant node {node.name!r}: attribute {kind!r} is not supported")


def _fold_shape_computations(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """Evaluate, once, every node whose inputs are all known at compile time, until shapes settle.

    Constant nodes become initializers; `Shape` of a statically shaped value becomes its shape.
    The evaluation runs the original ONNX nodes through `onnx.reference`.
    """
    for _ in range(20):
        proto = _infer(proto, name)
        graph = proto.graph
        infos = _static_shapes(proto)
        known: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        graph_outputs = {o.name for o in graph.output}
        folded_nodes: list[onnx.NodeProto] = []
        new_values: dict[str, np.ndarray] = {}
        for node in graph.node:
            if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC:
                continue
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for a in node.attribute):
                continue
            if node.op_type == "Constant":
                if node.output[0] in graph_outputs:
                    continue   # an output computed from constants alone: kept as a node
                new_values[node.output[0]] = _constant_node_value(node)
            elif node.op_type == "Shape" and node.input[0] in infos:
                dims = np.array(infos[node.input[0]].shape, dtype=np.int64)
                attrs = {a.name: a.i for a in node.attribute}
                new_values[node.output[0]] = _shape_slice(dims, attrs.get("start", 0),
                                                          attrs.get("end"))
            elif node.input and all(i == "" or i in known or i in new_values for i in node.input):
                values = {**known, **new_values}
                inputs = [values[i] if i else None for i in node.input]
                _refuse_huge_fold(node, inputs, infos, name)
                try:
                    outputs = run_node(node, inputs, proto.opset_import)
                except (Exception, MemoryError) as exc:
                    raise ModelError(f"{name}: node {node.name or node.op_type!r} "
                                     f"({node.op_type}) has constant inputs but could not be "
                                     f"evaluated: {type(exc).__name__}: {exc}") from None
                for output, value in zip(node.output, outputs):
                    if output and value is not None and np.asarray(value).nbytes > MAX_FOLDED_BYTES:
                        raise ModelError(f"{name}: node {node.name or node.op_type!r} "
                                         f"({node.op_type}) folds to {np.asarray(value).nbytes} "
                                         f"bytes, more than the {MAX_FOLDED_BYTES >> 30} GiB a "
                                         f"value computed at import may take; refused")
                new_values.update((o, v) for o, v in zip(node.output, outputs) if o)
            else:
                continue
            folded_nodes.append(node)
        if not folded_nodes:
            return proto
        keep = [n for n in graph.node if all(n is not f for f in folded_nodes)]
        del graph.node[:]
        graph.node.extend(keep)
        for value_name, array in new_values.items():
            if value_name in graph_outputs:
                # An output computed from constants alone stays an output: keep it as a node.
                graph.node.append(helper.make_node("Constant", [], [value_name],
                                                   value=numpy_helper.from_array(np.asarray(array))))
                continue
            graph.initializer.append(numpy_helper.from_array(np.asarray(array), value_name))
        # value_info from the last inference may be stale for the folded values: drop it all
        del graph.value_info[:]
    return _infer(proto, name)


def _limit_text() -> str:
    return f"{MAX_TENSOR_BYTES / (1 << 30):g} GiB"


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


# ---- normalization of each node -----------------------------------------------------------------

class _Context:
    """What a normalizer may look at: static infos, constant values, and the node at hand."""

    def __init__(self, infos: dict[str, TensorInfo], constants: dict[str, np.ndarray], model: str,
                 taken: set[str] | None = None):
        self.infos = infos
        self.constants = constants
        self.model = model
        self.taken = set(infos) | set(taken or ())

    def fresh(self, base: str, info: TensorInfo) -> str:
        """A value name no tensor of the model uses (the model's names are arbitrary strings)."""
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}'{n}"
        self.taken.add(name)
        self.infos[name] = info
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


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _axes(axes, rank: int) -> list[int]:
    return sorted(_axis(int(a), rank) for a in axes)


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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


def _norm_conv(node, ctx: _Context):
    a = _attrs(node)
    w = ctx.info(node.input[1]).shape
    kernel = list(a.get("kernel_shape", w[2:]))
    rank = len(kernel)
    strides = list(a.get("strides", [1] * rank))
    dilations = list(a.get("dilations", [1] * rank))
    x = ctx.info(node.input[0]).shape
    pads = _auto_pads(_str(a.get("auto_pad", "NOTSET")), x[2:], kernel, strides, dilations,
                      a.get("pads"))
    return "Conv", [node.input[0], node.input[1], _opt(node, 2)], dict(
        pads=pads, strides=strides, dilations=dilations, group=int(a.get("group", 1)))


def _norm_conv_transpose(node, ctx: _Context):
    a = _attrs(node)
    w = ctx.info(node.input[1]).shape
    kernel = list(a.get("kernel_shape", w[2:]))
    rank = len(kernel)
    strides = list(a.get("strides", [1] * rank))
    dilations = list(a.get("dilations", [1] * rank))
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
    if len([o for o in node.output if o]) > 1:
        raise _Unsupported("its Indices output is used")
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
        if op == "Reshape" and math.prod(before) != math.prod(shape):
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
    return "Slice", [node.input[0]], dict(starts=[int(v) for v in starts],
                                          ends=[int(v) for v in ends], axes=axes, steps=steps)


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
    return node.op_type, list(node.input), {}


def _opt(node: onnx.NodeProto, position: int) -> str | None:
    return node.input[position] if position < len(node.input) and node.input[position] else None


_NORMALIZERS: dict[str, Callable] = {
    "Conv": _norm_conv, "ConvTranspose": _norm_conv_transpose,
    "MaxPool": _norm_pool, "AveragePool": _norm_pool,
    "BatchNormalization": _norm_batchnorm, "LayerNormalization": _norm_layernorm,
    "ReduceMean": _norm_reduce, "ReduceSum": _norm_reduce, "Softmax": _norm_softmax,
    "Gemm": _norm_gemm, "Clip": _norm_clip, "Dropout": _norm_dropout,
    "LeakyRelu": _norm_unary_attrs({"alpha": 0.01}),
    "HardSigmoid": _norm_unary_attrs({"alpha": 0.2, "beta": 0.5}),
    "Gelu": _norm_unary_attrs({"approximate": "none"}),
    "Cast": _norm_cast, "Transpose": _norm_transpose,
    "Reshape": _norm_static_shape("Reshape"), "Expand": _norm_static_shape("Expand"),
    "Flatten": _norm_flatten, "Squeeze": _norm_squeeze, "Unsqueeze": _norm_unsqueeze,
    "Concat": _norm_concat, "Split": _norm_split, "Slice": _norm_slice, "Gather": _norm_gather,
    "Pad": _norm_pad, "LRN": _norm_lrn,
}
for _op in ("Relu", "Sigmoid", "HardSwish", "Tanh", "Erf", "Add", "Sub", "Mul", "Div", "Pow",
            "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Where", "Identity", "MatMul",
            "GlobalAveragePool"):
    _NORMALIZERS[_op] = _norm_plain


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


def _normalize(node: onnx.NodeProto, ctx: _Context) -> list[Node]:
    """One ONNX node -> IR nodes (Sum becomes a chain of Add; the rest map one to one)."""
    label = node.name or node.op_type
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
    normalizer = _NORMALIZERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
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


def _import_model(model: str | Path | onnx.ModelProto,
                  input_shapes: dict[str, tuple[int, ...]] | None) -> Graph:
    proto, name = _read(model)
    proto = _copy(proto)
    source_opset = _default_opset(proto, name)
    _check_topology(proto, name)
    resized = _set_input_shapes(proto, input_shapes, name)    # before the checker wants shapes
    for vo in proto.graph.output:
        if vo.type.HasField("tensor_type") and not vo.type.tensor_type.HasField("shape"):
            raise ModelError(f"{name}: graph output {vo.name!r} declares no shape, not even "
                             f"its rank (ONNX requires one; its dims may be unknown)")
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"{name}: the ONNX checker rejects the model: "
                         f"{str(exc).strip().splitlines()[0]}") from None
    file_nodes = len(proto.graph.node)
    proto = _to_canonical(proto, source_opset, name)
    # The opset the nodes now follow: CANONICAL_OPSET, or a newer one that could not be taken
    # down (Opaque nodes must then run under it, e.g. Cast's round_mode exists from opset 24).
    opset = max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    try:
        graph = _static_graph(proto, name, opset, source_opset, file_nodes)
    except ModelError as exc:
        if not resized:
            raise
        raise _resize_error(resized, exc, name) from None
    graph.nodes_added_by_conversion = len(proto.graph.node) - file_nodes
    return graph


def _static_graph(proto: onnx.ModelProto, name: str, opset: int, source_opset: int,
                  onnx_nodes: int) -> Graph:
    """Steps 4 to 6 on a model whose input shapes are set: fold, normalize, drop dead nodes."""
    proto = _fold_shape_computations(proto, name)
    graph = proto.graph

    infos = _static_shapes(proto)
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:   # outputs folded to Constant nodes
        if node.op_type == "Constant":
            initializers[node.output[0]] = _constant_node_value(node)
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
    return Graph(
        name=name, nodes=nodes,
        values={v: infos[v] for v in used | set(inputs) | {o for n in nodes for o in n.outputs}
                if v in infos},
        initializers={k: v for k, v in initializers.items() if k in used},
        inputs=inputs, outputs=outputs, opset=opset, source_opset=source_opset,
        opaque_ops=sorted({n.onnx_node.op_type for n in nodes if n.op == "Opaque"}),
        onnx_nodes=onnx_nodes)


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


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
                                 f"which is neither a graph input, an initializer nor a node output")
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


def _require_static(value: str, infos: dict[str, TensorInfo], name: str,
                    node: onnx.NodeProto | None = None) -> None:
    if value in infos:
        return
    where = f" (output of node {node.name or node.op_type!r}, {node.op_type})" if node else ""
    raise ModelError(f"{name}: value {value!r}{where} has no static shape after ONNX shape "
                     f"inference and constant folding; eqsat-fuse compiles static shapes only")


def _refuse_huge(infos: dict[str, TensorInfo], name: str) -> None:
    for value, info in infos.items():
        if any(d < 0 for d in info.shape):
            raise ModelError(f"{name}: value {value!r} has shape {list(info.shape)}, with a "
                             f"negative dim")
        if math.prod(info.shape) * np.dtype(info.dtype).itemsize > MAX_TENSOR_BYTES:
            raise ModelError(f"{name}: value {value!r} has shape {list(info.shape)} "
                             f"({info.dtype}), more than {_limit_text()}; refused "
                             f"before allocating")


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
