"""Small readers of ONNX protos that the frontend's modules share (and export reuses): every
tensor a model holds, a deep copy, a node's attributes, strings and element types."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper


def all_tensors(proto: onnx.ModelProto):
    """The initializers and the tensors held in node attributes (Constant values)."""
    yield from proto.graph.initializer
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t


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
