"""Steps 3 and 4 of import, the shapes: fix the input shapes (declared, or given with
`input_shapes=`, re-sizing as onnxsim does), run ONNX shape inference (with ceil-mode pooling
made explicit), read the static shapes it found, and refuse dynamic or too-big values."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import helper, shape_inference

from ..backends.numpy.pooling import _pool_out_size
from ..errors import ModelError
from ..ir import TensorInfo
from .protos import _attrs, _copy, _np_dtype, _str


def _physical_memory() -> int:
    try:
        import os
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


# A tensor bigger than this is refused before anything is allocated: 8 GiB, or half the
# machine's memory when it has less than 16 GiB.
MAX_TENSOR_BYTES = min(8 << 30, _physical_memory() // 2)


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


def _set_input_shapes(proto: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None,
                      name: str) -> list[tuple[str, list, list[int]]]:
    """Give the inputs their shapes (declared, or from `input_shapes`); dims left open stay
    open (symbolic import, `symbolic`). An input given a size other than a static one it
    declares is re-sized, as onnxsim's --overwrite-input-shape does: the shapes inferred from
    the old size (value_info, output dims) are dropped, to be inferred again. Returns the
    re-sized inputs as (name, declared dims, new dims)."""
    initializers = {t.name for t in proto.graph.initializer}
    given = dict(input_shapes or {})
    real_inputs = [vi for vi in proto.graph.input if vi.name not in initializers]
    unknown = set(given) - {vi.name for vi in real_inputs}
    if unknown:
        raise ModelError(f"{name}: input_shapes names {sorted(unknown)}, which are not inputs of "
                         f"the model (its inputs: {[vi.name for vi in real_inputs]})")
    resized = []
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
    if resized:
        del proto.graph.value_info[:]
        for vo in proto.graph.output:
            if vo.type.HasField("tensor_type") and vo.type.tensor_type.HasField("shape"):
                for d in vo.type.tensor_type.shape.dim:
                    d.Clear()                   # the rank stays; the sizes are inferred again
    _outputs_as_inputs(proto, real_inputs)
    return resized


def _outputs_as_inputs(proto: onnx.ModelProto, inputs: list[onnx.ValueInfoProto]) -> None:
    """A graph input that is also a graph output: the output declaration takes the input's
    static shape where it leaves dims unknown. ONNX's shape inference would otherwise read the
    value's shape from the output declaration, unknown dims and all, and give them to every
    node reading it; onnxruntime runs such a model."""
    static = {vi.name: vi for vi in inputs
              if all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)}
    for vo in proto.graph.output:
        vi = static.get(vo.name)
        if vi is None or not vo.type.HasField("tensor_type"):
            continue
        declared = vo.type.tensor_type
        dims = vi.type.tensor_type.shape.dim
        if declared.HasField("shape") and (
                len(declared.shape.dim) != len(dims)
                or any(o.HasField("dim_value") and o.dim_value != i.dim_value
                       for o, i in zip(declared.shape.dim, dims))):
            continue                    # a conflicting declaration: the checker's to refuse
        declared.shape.CopyFrom(vi.type.tensor_type.shape)


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

    A pool's input shape is read wherever loose inference put it: value_info, or the graph's
    inputs and outputs (a value that is also a graph output has no value_info entry). A pool
    below another one reads the size its upstream pool has in the copy, so the copy is
    re-inferred until no pool's explicit pads change (once per level of pools in a chain).
    """
    pools = [i for i, n in enumerate(proto.graph.node)
             if n.op_type in ("MaxPool", "AveragePool") and n.domain in ("", "ai.onnx")
             and int(_attrs(n).get("ceil_mode", 0)) and "kernel_shape" in _attrs(n)
             and _str(_attrs(n).get("auto_pad", "NOTSET")) in ("NOTSET", "VALID")]
    if not pools:
        return None
    shadow = _copy(proto)
    explicit: dict[int, list[int]] = {}
    for _ in range(len(pools) + 1):
        try:
            loose = shape_inference.infer_shapes(shadow, strict_mode=False)
        except Exception:
            return None
        graph = loose.graph
        shapes = {vi.name: vi.type.tensor_type.shape
                  for vi in [*graph.output, *graph.input, *graph.value_info]}
        changed = False
        for index in pools:
            node = proto.graph.node[index]
            pads = _floor_pads(node, shapes.get(node.input[0]))
            if pads is None or explicit.get(index) == pads:
                continue
            explicit[index] = pads
            changed = True
            copy = shadow.graph.node[index]
            kept = [attr for attr in node.attribute if attr.name not in ("ceil_mode", "pads",
                                                                         "auto_pad")]
            del copy.attribute[:]
            copy.attribute.extend(kept)
            copy.attribute.extend([helper.make_attribute("ceil_mode", 0),
                                   helper.make_attribute("pads", pads)])
        if not changed:
            break
    return shadow if explicit else None


def _floor_pads(node: onnx.NodeProto, shape) -> list[int] | None:
    """The pads under which a ceil-mode pool of input `shape` gives, with floor rounding, the
    size onnxruntime gives it (`_pool_out_size`); None when the shape is not known or the node
    is malformed (then strict inference on the model as it is says what is wrong)."""
    if shape is None:
        return None
    dims = shape.dim
    a = _attrs(node)
    kernel = list(a["kernel_shape"])
    rank = len(kernel)
    if len(dims) != rank + 2 or not all(d.HasField("dim_value") for d in dims[2:]):
        return None
    sizes = [int(d.dim_value) for d in dims[2:]]
    strides = list(a.get("strides", [1] * rank))
    dilations = list(a.get("dilations", [1] * rank))
    pads = [0] * (2 * rank) if _str(a.get("auto_pad", "NOTSET")) == "VALID" else \
        list(a.get("pads", [0] * (2 * rank)))
    if (len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank
            or min(kernel + strides + dilations) <= 0 or min(pads) < 0):
        return None
    ends = []
    for n, k, pb, pe, st, d in zip(sizes, kernel, pads[:rank], pads[rank:], strides, dilations):
        out = _pool_out_size(n, k, pb, pe, st, d, True)
        ends.append(max((out - 1) * st + (k - 1) * d + 1 - n - pb, 0))
    return pads[:rank] + ends


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


def _limit_text() -> str:
    return f"{MAX_TENSOR_BYTES / (1 << 30):g} GiB"


def _require_static(value: str, infos: dict[str, TensorInfo], name: str,
                    node: onnx.NodeProto | None = None) -> None:
    if value in infos:
        return
    where = f" (output of node {node.name or node.op_type!r}, {node.op_type})" if node else ""
    raise ModelError(f"{name}: value {value!r}{where} has no static shape after ONNX shape "
                     f"inference and constant folding (it depends on the input data); eqsat-fuse "
                     f"compiles values whose shape is known before a run")


def _refuse_huge(infos: dict[str, TensorInfo], name: str) -> None:
    for value, info in infos.items():
        if any(d < 0 for d in info.shape):
            raise ModelError(f"{name}: value {value!r} has shape {list(info.shape)}, with a "
                             f"negative dim")
        if math.prod(info.shape) * np.dtype(info.dtype).itemsize > MAX_TENSOR_BYTES:
            raise ModelError(f"{name}: value {value!r} has shape {list(info.shape)} "
                             f"({info.dtype}), more than {_limit_text()}; refused "
                             f"before allocating")
