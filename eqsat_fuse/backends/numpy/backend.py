"""The NumPy backend: each kernel body evaluated node by node with `ops.evaluate`.

It is the readable reference: a fused kernel is still computed one NumPy call per node (with the
intermediates kept only inside the kernel), so it shows what is computed, not how fast fusion
can be; the Numba backend generates one loop nest per kernel.

`NumpyBackend` is this evaluation behind the backend interface (`backends.base`): every kernel
prepares as a `NumpyKernel`, which is also what any other backend's unsupported kernels run as.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ...ir import BodyNode, Kernel, KernelPlan, Operand
from ...ops import OPS, evaluate
from ..base import BackendContext, Prepared, Steps
from ..reference import NodeRunner

if TYPE_CHECKING:
    from ...lowering.arena import Arena
    from ...lowering.layout import Layout
    from ...lowering.program import BackendReport


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
# attributes): run directly instead of through onnx.reference's graph machinery. (And, Or,
# Xor and Not are covered ops, `ops.OPS`.)
_DIRECT_OPAQUE: dict[str, Callable] = {
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


# ---- the backend interface ------------------------------------------------------------------

class NumpyKernel:
    """A kernel run as its NumPy evaluation, written into its slot (an implementation)."""

    workspace_bytes = 0

    def __init__(self, kernel: Kernel, context: BackendContext):
        storage = context.storage
        self.kernel = kernel
        self.context = context
        self.inplace_inputs = dense_elementwise_inputs(kernel, storage.layouts,
                                                       storage.stored_dtype)

    def reads(self) -> set[str]:
        """The values its step reads from a run's environment by name."""
        return {self.kernel.output} | {a.ref for n in self.kernel.body for a in n.args
                                       if a.kind == "buffer"}

    def bind(self, arena: "Arena") -> Callable[[dict], None]:
        return numpy_step(self.kernel, self.context.opaque, arena.value_of, self.context.plan)


class NumpyBackend:
    """The NumPy backend: each kernel a NumPy step; BLAS runs with the program's threads."""

    name = "numpy"
    numba_threads = False

    def __init__(self, context: BackendContext):
        self.context = context
        self.blas_threads = context.threads

    def prepare(self, kernel: Kernel) -> NumpyKernel:
        return NumpyKernel(kernel, self.context)

    def bind(self, arena: "Arena", prepared: list[Prepared]) -> Steps:
        steps = [p.impl.bind(arena) for p in prepared]
        reads: set[str] = set()
        for p in prepared:
            reads |= p.impl.reads()
        return Steps(kernel_steps=steps, run_steps=steps, reads=reads)

    def fill_report(self, report: "BackendReport") -> None:
        pass              # nothing compiled: nothing to add


def numpy_step(kernel: Kernel, opaque: Callable[[BodyNode, list], np.ndarray], value_of,
               plan: KernelPlan) -> Callable[[dict], None]:
    """The NumPy evaluation of a kernel, written into its slot (float16 slots widened on read).

    `value_of(name, dyn)` is the array of a value in a run whose per-run arrays are `dyn`."""
    body = kernel.body
    logical = {name: np.dtype(info.dtype) for name, info in plan.buffers.items()}
    output = kernel.output

    def operand_value(operand: Operand, dyn: dict):
        if operand.kind == "absent":
            return None
        value = value_of(operand.ref, dyn)
        dtype = logical.get(operand.ref)
        if dtype is not None and value.dtype != dtype:
            return value.astype(dtype)
        return value

    def step(dyn: dict) -> None:
        result = evaluate_body(body, lambda o: operand_value(o, dyn), opaque)
        with np.errstate(over="ignore"):      # float16 storage: beyond 65504 becomes inf
            np.copyto(value_of(output, dyn), result, casting="unsafe")

    step.label = "+".join(kernel.ops)
    return step


def dense_elementwise_inputs(kernel: Kernel, layouts: dict[str, "Layout"],
                             stored: Callable[[str], str]) -> set[str]:
    """Inputs an elementwise kernel reads at the index it writes (it may overwrite them)."""
    if any(OPS.get(n.op) is None or OPS[n.op].kind != "elementwise" for n in kernel.body):
        return set()
    out = []
    shape = tuple(kernel.info.shape)
    for name in kernel.inputs:
        lay = layouts.get(name)
        if lay is None or lay.shape != shape or not lay.contiguous or lay.offset != 0:
            continue
        if stored(lay.storage) != stored(kernel.output):
            continue
        if any(n.op == "BatchNormalization" and any(a.kind == "buffer" and a.ref == name
                                                     for a in n.args[1:]) for n in kernel.body):
            continue
        out.append(name)
    return set(out)
