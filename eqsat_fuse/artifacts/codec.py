"""The kernel plan as JSON, exactly: `plan_to_json` and `plan_from_json` round-trip every value
with its Python type, because the Numba backend writes attribute values into kernel sources
(`repr` of ints and floats) and a source that differs by one character is a different kernel,
compiled again instead of loaded.

JSON holds None, bools, ints, strings, lists and finite floats as they are (`json` writes a
float's shortest exact `repr`); everything else is an object with one `$` key: tuples, dicts,
non-finite floats, NumPy scalars and small arrays (raw bytes in base64), bytes, symbolic dims
(`dims.to_json`: data, never evaluated as code), and the ONNX nodes of opaque kernels (their
protobuf bytes; `ParseFromString` reads data, never code).
Decoding accepts these tags only, and the fields of the plan's dataclasses only, so a plan
from an untrusted file becomes plain data or an `ArtifactError`.

Folded constants do not enter the JSON: each constant is stored as an array file, and in the
decoded plan its expression is one `Const` node reading that array (`constant_plan`).
"""

from __future__ import annotations

import base64
import functools
import math
from typing import Any

import numpy as np
from ..dims import Dim, from_json, to_json
from ..errors import ArtifactError
from ..ir import BodyNode, ConstExpr, Kernel, KernelPlan, Node, Operand, TensorInfo

# the ONNX messages a plan may hold (an Opaque node's attributes); `onnx` is imported only for
# a plan that has one, so loading most artifacts imports no `onnx` (0.1 s)
_PROTO_NAMES = ("NodeProto", "TensorProto", "AttributeProto", "GraphProto")


@functools.cache
def _proto(name: str) -> type:
    import onnx
    return getattr(onnx, name)


# ---- values --------------------------------------------------------------------------------------

def encode_value(value: Any, where: str) -> Any:
    """`value` as JSON-ready data that `decode_value` turns back into an equal value of the
    same type; `where` names it in the error for a value no artifact can hold."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, list):
        return [encode_value(v, where) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v, where) for v in value]}
    if isinstance(value, dict):
        return {"$dict": [[encode_value(k, where), encode_value(v, where)]
                          for k, v in value.items()]}
    if isinstance(value, np.generic):
        _check_dtype(value.dtype, where)
        return {"$scalar": value.dtype.str, "data": _b64(value.tobytes())}
    if isinstance(value, np.ndarray):
        _check_dtype(value.dtype, where)
        return {"$array": value.dtype.str, "shape": list(value.shape),
                "data": _b64(np.ascontiguousarray(value).tobytes())}
    if isinstance(value, bytes):
        return {"$bytes": _b64(value)}
    if isinstance(value, Dim):
        return {"$dim": to_json(value)["dim"]}
    name = type(value).__name__
    if name in _PROTO_NAMES and isinstance(value, _proto(name)):
        return {"$onnx": name, "data": _b64(value.SerializeToString())}
    raise ArtifactError(f"cannot save {where}: it holds a {type(value).__name__}, which an "
                        f"artifact does not store")


def decode_value(data: Any) -> Any:
    """The value `encode_value` encoded; an `ArtifactError` for anything it cannot have written."""
    if data is None or isinstance(data, (bool, int, str)):
        return data
    if isinstance(data, float):
        return data
    if isinstance(data, list):
        return [decode_value(v) for v in data]
    if not isinstance(data, dict):
        raise ArtifactError(f"unreadable value in the stored plan: {str(data)[:60]}")
    tag = next((k for k in data if k.startswith("$")), None)
    if tag == "$tuple":
        return tuple(decode_value(v) for v in _list(data[tag]))
    if tag == "$dict":
        return {decode_value(k): decode_value(v) for k, v in _list(data[tag])}
    if tag == "$float" and data[tag] in ("nan", "inf", "-inf"):
        return float(data[tag])
    if tag == "$scalar":
        return np.frombuffer(_unb64(data["data"]), dtype=_dtype(data[tag]))[0]
    if tag == "$array":
        shape = tuple(int(d) for d in _list(data["shape"]))
        flat = np.frombuffer(_unb64(data["data"]), dtype=_dtype(data[tag]))
        if flat.size != int(np.prod(shape, dtype=np.int64)):
            raise ArtifactError("a stored array's data does not fill its shape")
        return flat.reshape(shape).copy()
    if tag == "$bytes":
        return _unb64(data[tag])
    if tag == "$dim":
        try:
            return from_json({"dim": data[tag]})
        except (ValueError, TypeError) as why:
            raise ArtifactError(f"a stored symbolic dim does not parse: {why}") from None
    if tag == "$onnx" and data[tag] in _PROTO_NAMES:
        proto = _proto(data[tag])()
        try:
            proto.ParseFromString(_unb64(data["data"]))
        except Exception as why:        # protobuf's DecodeError
            raise ArtifactError(f"a stored ONNX {data[tag]} does not parse: {why}") from None
        return proto
    raise ArtifactError(f"unreadable value in the stored plan: {str(data)[:60]}")


def _check_dtype(dtype: np.dtype, where: str) -> None:
    if dtype.hasobject or dtype.kind not in "biufcSUMm":
        raise ArtifactError(f"cannot save {where}: values of dtype {dtype} are not stored")


def _dtype(text: Any) -> np.dtype:
    return _named_dtype(str(text))


@functools.lru_cache(maxsize=None)
def _named_dtype(text: str) -> np.dtype:
    """(a plan names a few dtypes thousands of times: parsed once each)"""
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise ArtifactError(f"unknown dtype {str(text)[:40]!r} in the stored plan") from None
    if dtype.hasobject:
        raise ArtifactError("the stored plan holds an object array, which is refused")
    return dtype


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except ValueError:
        raise ArtifactError("bad base64 data in the stored plan") from None


def _list(data: Any) -> list:
    if not isinstance(data, list):
        raise ArtifactError(f"unreadable value in the stored plan: {str(data)[:60]}")
    return data


# ---- the plan ------------------------------------------------------------------------------------

def plan_to_json(plan: KernelPlan) -> dict[str, Any]:
    """The plan's kernels, buffers, inputs, outputs, constant names and shapes, and opaque
    nodes (the folded constants' values are stored beside it, see the module doc)."""
    return {
        "kernels": [_kernel_to_json(k) for k in plan.kernels],
        "buffers": {name: _info(info) for name, info in plan.buffers.items()},
        "inputs": {name: _info(info) for name, info in plan.inputs.items()},
        "outputs": dict(plan.outputs),
        "constants": {name: None if expr.info is None else _info(expr.info)
                      for name, expr in plan.constants.items()},
        "opaque_nodes": [[index, _node_to_json(node)]
                         for index, node in plan.opaque_nodes.items()],
    }


def plan_from_json(data: Any, constants: dict[str, np.ndarray]) -> KernelPlan:
    """The plan `plan_to_json` wrote, its constants read from `constants` (name -> array)."""
    try:
        kernels = [_kernel_from_json(k) for k in data["kernels"]]
        infos = {name: None if info is None else _info_from(info)
                 for name, info in data["constants"].items()}
        plan = KernelPlan(
            kernels=kernels,
            buffers={str(name): _info_from(info) for name, info in data["buffers"].items()},
            inputs={str(name): _info_from(info) for name, info in data["inputs"].items()},
            outputs={str(k): str(v) for k, v in data["outputs"].items()},
            constants={}, initializers={},
            opaque_nodes={int(index): _node_from_json(node)
                          for index, node in data["opaque_nodes"]})
    except (KeyError, TypeError, ValueError, AttributeError) as why:
        raise ArtifactError(f"the stored plan is not one this eqsat-fuse reads ({why!r})") \
            from None
    missing = sorted(set(infos) - set(constants))
    if missing:
        raise ArtifactError(f"the stored plan reads constant {missing[0]!r}, which the artifact "
                            f"does not hold")
    return constant_plan(plan, infos, constants)


def constant_plan(plan: KernelPlan, infos: dict[str, TensorInfo | None],
                  constants: dict[str, np.ndarray]) -> KernelPlan:
    """`plan` with each constant an already folded array: its expression reads the array as
    an initializer of the same name, so lowering's folding hands it on as it is."""
    plan.constants = {name: ConstExpr(name, [BodyNode("Const", [], {"name": name})], info)
                      for name, info in infos.items()}
    plan.initializers = {name: constants[name] for name in infos}
    return plan


def _info(info: TensorInfo) -> dict[str, Any]:
    return {"shape": [encode_value(d, "a shape") if isinstance(d, Dim) else int(d)
                      for d in info.shape], "dtype": str(info.dtype)}


def _info_from(data: dict) -> TensorInfo:
    shape = data["shape"]
    if not isinstance(shape, list):
        raise ValueError(f"shape {shape!r}")
    dims = [decode_value(d) if isinstance(d, dict) else d for d in shape]
    if not all(isinstance(d, Dim) or (type(d) is int and d >= 0) for d in dims):
        raise ValueError(f"shape {shape!r}")
    return TensorInfo(tuple(dims), str(_dtype(data["dtype"])))


def _kernel_to_json(kernel: Kernel) -> dict[str, Any]:
    where = f"kernel {kernel.name}"
    return {"name": kernel.name, "output": kernel.output, "inputs": list(kernel.inputs),
            "kind": kernel.kind, "info": _info(kernel.info), "eclass": int(kernel.eclass),
            "body": [_body_to_json(n, where) for n in kernel.body]}


def _kernel_from_json(data: dict) -> Kernel:
    return Kernel(name=str(data["name"]), output=str(data["output"]),
                  inputs=[str(i) for i in data["inputs"]],
                  body=[_body_from_json(n) for n in data["body"]], kind=str(data["kind"]),
                  info=_info_from(data["info"]), eclass=int(data["eclass"]))


def _body_to_json(node: BodyNode, where: str) -> dict[str, Any]:
    where = f"{where} ({node.op})"
    return {"op": node.op,
            "args": [[a.kind, encode_value(a.ref, where)] for a in node.args],
            "attrs": _attrs_to_json(node.attrs, where)}


def _body_from_json(data: dict) -> BodyNode:
    args = [Operand(str(kind), decode_value(ref)) for kind, ref in data["args"]]
    return BodyNode(str(data["op"]), args, _attrs_from_json(data["attrs"]))


def _attrs_to_json(attrs: dict[str, Any], where: str) -> dict[str, Any]:
    if not all(isinstance(k, str) for k in attrs):
        raise ArtifactError(f"cannot save {where}: an attribute name is not a string")
    return {k: encode_value(v, f"{where}'s attribute {k!r}") for k, v in attrs.items()}


def _attrs_from_json(data: dict) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError("attributes")
    return {str(k): decode_value(v) for k, v in data.items()}


def _node_to_json(node: Node) -> dict[str, Any]:
    where = f"opaque node {node.name}"
    return {"op": node.op, "inputs": list(node.inputs), "outputs": list(node.outputs),
            "attrs": _attrs_to_json(node.attrs, where), "name": node.name,
            "onnx_node": None if node.onnx_node is None else encode_value(node.onnx_node, where)}


def _node_from_json(data: dict) -> Node:
    onnx_node = None if data["onnx_node"] is None else decode_value(data["onnx_node"])
    if onnx_node is not None and not isinstance(onnx_node, _proto("NodeProto")):
        raise TypeError("an opaque node's ONNX node")
    return Node(op=str(data["op"]), inputs=[None if i is None else str(i) for i in data["inputs"]],
                outputs=[str(o) for o in data["outputs"]], attrs=_attrs_from_json(data["attrs"]),
                name=str(data["name"]), onnx_node=onnx_node)


# ---- the symbolic signature of a shape-generic program -------------------------------------------

def signature_to_json(sig) -> dict[str, Any]:
    """A `signature.Signature` as JSON-ready data (its recipe's constants are stored with the
    program's, as arrays: `signature_constants`)."""
    where = "the symbolic signature"
    return {
        "inputs": {n: encode_value(list(s), where) for n, s in sig.inputs.items()},
        "derived": list(sig.derived),
        "shape_values": {n: {"shape": list(v.shape),
                             "values": encode_value(list(v.reshape(-1)), where)}
                         for n, v in sig.shape_values.items()},
        "recipe": [encode_value(node, where) for node in sig.recipe],
        "constants": sorted(sig.constants),
        "constraints": [[encode_value(d, where), encode_value(list(allowed), where), str(why)]
                        for d, allowed, why in sig.constraints],
        "opset_imports": [[o.domain, int(o.version)] for o in sig.opset_imports],
        "symbols": dict(sig.symbols), "representative": dict(sig.representative),
    }


def signature_from_json(data: Any, constants: dict[str, np.ndarray]):
    """The `Signature` `signature_to_json` wrote; an `ArtifactError` for anything else."""
    from onnx import helper

    from ..signature import Signature
    try:
        shape_values = {}
        for name, entry in data["shape_values"].items():
            values = decode_value(entry["values"])
            array = np.empty(len(values), dtype=object)
            for i, v in enumerate(values):
                if not isinstance(v, (int, Dim)) or isinstance(v, bool):
                    raise ValueError(f"shape value {name!r}")
                array[i] = v
            shape_values[str(name)] = array.reshape([int(d) for d in entry["shape"]])
        recipe = [decode_value(node) for node in data["recipe"]]
        if not all(isinstance(node, _proto("NodeProto")) for node in recipe):
            raise ValueError("a recipe node")
        missing = sorted(set(data["constants"]) - set(constants))
        if missing:
            raise ValueError(f"constant {missing[0]!r} of the recipe")
        return Signature(
            inputs={str(n): tuple(_dims(decode_value(s))) for n, s in data["inputs"].items()},
            derived=[str(n) for n in data["derived"]], shape_values=shape_values,
            recipe=recipe, constants={n: constants[n] for n in data["constants"]},
            constraints=[(_dims([decode_value(d)])[0], tuple(_dims(decode_value(a))), str(why))
                         for d, a, why in data["constraints"]],
            opset_imports=[helper.make_opsetid(str(d), int(v)) for d, v in data["opset_imports"]],
            symbols={str(k): str(v) for k, v in data["symbols"].items()},
            representative={str(k): int(v) for k, v in data["representative"].items()})
    except (KeyError, TypeError, ValueError, AttributeError) as why:
        raise ArtifactError(f"the stored symbolic signature is not one this eqsat-fuse reads "
                            f"({why!r})") from None


def _dims(values: Any) -> list:
    if not isinstance(values, list) or not all(
            isinstance(v, Dim) or (type(v) is int) for v in values):
        raise ValueError(f"dims {str(values)[:60]}")
    return values
