"""The NumPy backend: each kernel body evaluated node by node with `ops.evaluate`.

It is the readable reference: a fused kernel is still computed one NumPy call per node (with the
intermediates kept only inside the kernel), so it shows what is computed, not how fast fusion
can be; the Numba backend generates one loop nest per kernel.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...ir import BodyNode, Kernel, KernelPlan, Operand
from ...ops import evaluate
from ..reference import NodeRunner


def evaluate_body(body: list[BodyNode], operand_value: Callable[[Operand], Any],
                  opaque: Callable[[BodyNode, list], np.ndarray]) -> np.ndarray:
    """Evaluate a body in order and return its last node's value."""
    values: list[Any] = []
    for node in body:
        args = [values[a.ref] if a.kind == "node" else operand_value(a) for a in node.args]
        if node.op == "Opaque":
            values.append(opaque(node, args))
        elif node.op == "Concat":
            values.append(evaluate("Concat", [args], node.attrs))
        elif node.op == "Const":
            values.append(operand_value(Operand("initializer", node.attrs["name"])))
        elif node.op == "Input":
            values.append(operand_value(Operand("buffer", node.attrs["name"])))
        else:
            values.append(evaluate(node.op, args, node.attrs))
    return values[-1]


# Opaque ONNX ops whose semantics are exactly one NumPy function of broadcast inputs (no
# attributes): run directly instead of through onnx.reference's graph machinery.
_DIRECT_OPAQUE: dict[str, Callable] = {
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor, "Not": np.logical_not,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "IsNaN": np.isnan,
}


class OpaqueNodes:
    """Runs the plan's Opaque nodes through onnx.reference, one runner per node (a few plain
    logical/comparison ops directly through NumPy)."""

    def __init__(self, plan: KernelPlan, opset: int):
        self.plan = plan
        self.opset = opset
        self.runners: dict[int, NodeRunner] = {}

    def __call__(self, node: BodyNode, args: list) -> np.ndarray:
        index = node.attrs["node"]
        direct = self._direct(index)
        if direct is not None and node.attrs["index"] == 0 and all(a is not None for a in args):
            return direct(*args)
        if index not in self.runners:
            ir_node = self.plan.opaque_nodes[index]
            types = [None if a is None else (name, a.dtype, a.shape)
                     for name, a in zip(ir_node.onnx_node.input, args)]
            from onnx import helper
            self.runners[index] = NodeRunner(ir_node.onnx_node, types,
                                             [helper.make_opsetid("", self.opset)])
        return self.runners[index].run(args)[node.attrs["index"]]

    def _direct(self, index: int):
        onnx_node = self.plan.opaque_nodes[index].onnx_node
        fn = _DIRECT_OPAQUE.get(onnx_node.op_type)
        if fn is None or onnx_node.attribute or onnx_node.domain not in ("", "ai.onnx"):
            return None
        return fn


def make_step(kernel: Kernel, opaque: OpaqueNodes) -> Callable[[dict], np.ndarray]:
    """A callable that computes `kernel` from the environment of live arrays."""
    body = kernel.body

    def operand_value(operand: Operand, env: dict) -> Any:
        if operand.kind == "absent":
            return None
        return env[operand.ref]

    def step(env: dict) -> np.ndarray:
        return evaluate_body(body, lambda o: operand_value(o, env), opaque)

    return step
