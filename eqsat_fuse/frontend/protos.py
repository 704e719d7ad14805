"""Small readers of ONNX protos that the frontend's modules share (and export reuses): every
tensor a model holds, a deep copy, a copy of a message without some fields, the declaration
of a tensor held aside, a node's attributes, strings and element types.

Held aside: import runs ONNX's checker, version converter and shape inference on a weightless
copy of the model (`reading._weightless`), because each of them serializes the whole model
(a 470 MB GPT-2 spent some 40 s there, weights included). A tensor held aside keeps its
element type and dims in that copy, stored "externally" at `HELD_LOCATION`, and its value sits
in a dict by name beside the model. Every ONNX pass reads such a declaration as it reads an
initializer whose data lives in another file: its type and shape count, its data is not read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper


def all_tensors(proto: onnx.ModelProto):
    """The initializers and the tensors held in node attributes (Constant values)."""
    yield from proto.graph.initializer
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t


# Tensors bigger than this are held aside; smaller ones (shapes, axes, scales, the values shape
# inference and the converter's adapters read) stay in the weightless copy with their data.
HELD_BYTES = 1024
# The checker skips the file check of a location starting with '#', and no file read by import
# can name it: `reading` refuses external data outside the model's folder or missing there.
HELD_LOCATION = "#held-aside-by-eqsat-fuse"


def declaration(name: str, data_type: int, dims) -> onnx.TensorProto:
    """A tensor with its element type and dims but no data, held aside (see the docstring)."""
    tensor = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", HELD_LOCATION
    return tensor


def is_held(tensor: onnx.TensorProto) -> bool:
    return (tensor.data_location == onnx.TensorProto.EXTERNAL
            and any(e.key == "location" and e.value == HELD_LOCATION
                    for e in tensor.external_data))


def held_or_tensor(array: np.ndarray, name: str, held: dict[str, np.ndarray]) -> onnx.TensorProto:
    """`array` as a tensor of the weightless model: a declaration if big (its value put in
    `held`), else the tensor with its data."""
    array = np.asarray(array)
    if array.nbytes > HELD_BYTES:
        held[name] = array
        return declaration(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
    return numpy_helper.from_array(array, name)


def copy_fields(source, target, skip: tuple[str, ...] = ()) -> None:
    """Copy every set field of the message `source` into `target`, but those named in `skip`
    (which may hold weights the caller copies its own way)."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if isinstance(value, (bool, int, float, str, bytes)):
            setattr(target, field.name, value)
        elif hasattr(value, "CopyFrom"):
            getattr(target, field.name).CopyFrom(value)
        else:                                               # a repeated field
            getattr(target, field.name).extend(value)


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _np_dtype(elem_type: int) -> str:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
