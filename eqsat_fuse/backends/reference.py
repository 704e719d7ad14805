"""Running single ONNX nodes through `onnx.reference`: import-time folding and Opaque kernels.

`onnx` is imported where a node is built, not with this module: loading a saved artifact whose
program has no Opaque kernel imports no `onnx` (0.1 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .numpy.pooling import max_pool_with_indices

if TYPE_CHECKING:
    import onnx


def _own_kernel(node: onnx.NodeProto):
    """The kernel of eqsat-fuse that runs `node` in place of `onnx.reference`, or None.

    MaxPool with its Indices output: onnx.reference (1.23) ignores the pads there and numbers
    ties per channel; `max_pool_with_indices` follows onnxruntime. Its pads must be explicit
    (the importer writes a SAME auto_pad out; SAME with ceil_mode stays with onnx.reference).
    """
    if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx"):
        return None
    from onnx import helper
    a = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if "kernel_shape" not in a or auto_pad not in ("NOTSET", "VALID"):
        return None
    rank = len(a["kernel_shape"])
    attrs = dict(kernel_shape=list(a["kernel_shape"]),
                 pads=[0] * (2 * rank) if auto_pad == "VALID" else
                 list(a.get("pads", [0] * (2 * rank))),
                 strides=list(a.get("strides", [1] * rank)),
                 dilations=list(a.get("dilations", [1] * rank)),
                 ceil_mode=int(a.get("ceil_mode", 0)),
                 storage_order=int(a.get("storage_order", 0)))
    return lambda x: list(max_pool_with_indices(x, **attrs))


class NodeRunner:
    """Runs one ONNX node on NumPy arrays with `onnx.reference`; built once, run many times."""

    def __init__(self, node: onnx.NodeProto, input_types: list[tuple[str, np.dtype, tuple] | None],
                 opset_imports):
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        self.names = [i for i in node.input]
        inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(t[1]), t[2])
                  for name, t in zip(self.names, input_types) if name and t is not None]
        seen, unique_inputs = set(), []
        for vi in inputs:
            if vi.name not in seen:
                seen.add(vi.name)
                unique_inputs.append(vi)
        outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = helper.make_graph([node], "node", unique_inputs, outputs)
        self.model = helper.make_model(graph, opset_imports=list(opset_imports))
        self.evaluator = ReferenceEvaluator(self.model)
        self.session = None
        self.outputs = [o for o in node.output]
        self.own = _own_kernel(node)

    def run(self, values: list[np.ndarray | None]) -> list[np.ndarray | None]:
        if self.own is not None:
            results = self.own(*values[:1])
            return [r if o else None for o, r in zip(self.outputs, results)]
        feeds = {name: v for name, v in zip(self.names, values) if name and v is not None}
        try:
            results = self.evaluator.run(None, feeds)
        except Exception as first:
            # onnx.reference has gaps (GatherElements on wide inputs, OneHot on some dtypes):
            # run the same one-node model in onnxruntime when it is installed.
            try:
                results = self._onnxruntime(feeds)
            except ImportError:
                raise first from None
            except Exception as second:
                node = self.model.graph.node[0]
                raise RuntimeError(
                    f"node {node.name or node.op_type!r} ({node.op_type}) could not be run: "
                    f"onnx.reference: {type(first).__name__}: {first}; onnxruntime: "
                    f"{str(second).strip().splitlines()[-1] if str(second).strip() else second}"
                ) from None
        results = iter(results)
        return [np.asarray(next(results)) if o else None for o in self.outputs]

    def _onnxruntime(self, feeds):
        import onnxruntime as ort

        if self.session is None:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            self.session = ort.InferenceSession(self.model.SerializeToString(), options,
                                                providers=["CPUExecutionProvider"])
        return self.session.run(None, feeds)


def run_node(node: onnx.NodeProto, values: list[np.ndarray | None], opset_imports) -> list:
    """Evaluate one node once (builds a throw-away runner)."""
    types = [None if v is None else (n, v.dtype, v.shape) for n, v in zip(node.input, values)]
    return NodeRunner(node, types, opset_imports).run(values)
