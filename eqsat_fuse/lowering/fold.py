"""Lowering's compile-time work on the plan itself: constant expressions folded to arrays once,
and buffers that a kernel also recomputes inline read from the inline copy (`reuse_inline`).
"""

from __future__ import annotations

import numpy as np

from ..backends.numpy.backend import OpaqueNodes, evaluate_body
from ..errors import EqsatFuseError
from ..ir import BodyNode, Kernel, KernelPlan, Operand
from .program import contiguous


def fold_constants(plan: KernelPlan, opaque: OpaqueNodes) -> dict[str, np.ndarray]:
    """Evaluate every constant expression of the plan once (as contiguous arrays)."""
    values: dict[str, np.ndarray] = {}

    def operand_value(operand: Operand):
        if operand.kind == "initializer":
            return plan.initializers[operand.ref]
        raise EqsatFuseError(f"constant expression reads {operand.kind} {operand.ref!r}")

    for name, expr in plan.constants.items():
        value = np.asarray(evaluate_body(expr.body, operand_value, opaque))
        if expr.info is not None and tuple(value.shape) != tuple(expr.info.shape):
            raise EqsatFuseError(f"constant {name}: folded to shape {list(value.shape)}, "
                                 f"expected {list(expr.info.shape)}")
        value = contiguous(value)
        value.flags.writeable = False
        values[name] = value
    return values


# ---- reading a buffer that a kernel also recomputes inline ----------------------------------

def _node_keys(body: list[BodyNode]) -> list[str]:
    keys: list[str] = []
    for node in body:
        args = [keys[a.ref] if a.kind == "node" else f"{a.kind}:{a.ref!r}" for a in node.args]
        keys.append(f"{node.op}{sorted(node.attrs.items())!r}({','.join(args)})")
    return keys


def reuse_inline_copies(plan: KernelPlan) -> tuple[KernelPlan, int]:
    """Kernels that read buffer B and also compute B's body inline read the inline value.

    Extraction can leave `x * f(x)` as a kernel that recomputes `x = MatMul+Add` inline for
    `f` and reads the materialized `x` for the product (both copies are equal values). Reading
    the inline value instead is exact, and when nothing else reads B its kernel is dropped
    (one GEMM less). Returns the new plan and how many kernels it removed.
    """
    outputs = set(plan.outputs.values())
    by_key = {}
    for kernel in plan.kernels:
        if kernel.kind == "compute" and len(kernel.body) > 0:
            by_key[_node_keys(kernel.body)[-1]] = kernel.output
    kernels = [Kernel(k.name, k.output, list(k.inputs), list(k.body), k.kind, k.info, k.eclass)
               for k in plan.kernels]
    changed = False
    for kernel in kernels:
        if kernel.kind != "compute":
            continue
        keys = _node_keys(kernel.body)
        inline = {by_key[key]: i for i, key in enumerate(keys[:-1]) if key in by_key}
        inline = {b: i for b, i in inline.items() if b in kernel.inputs and b != kernel.output}
        if not inline:
            continue
        body = []
        for node in kernel.body:
            args = [Operand("node", inline[a.ref]) if a.kind == "buffer" and a.ref in inline
                    and inline[a.ref] < len(body) else a for a in node.args]
            body.append(BodyNode(node.op, args, node.attrs))
        kernel.body = body
        kernel.inputs = list(dict.fromkeys(a.ref for b in body for a in b.args
                                           if a.kind == "buffer"))
        changed = True
    if not changed:
        return plan, 0
    # drop kernels nobody reads any more (repeat: a dropped kernel may free its own inputs)
    removed = 0
    while True:
        read = {name for k in kernels for name in k.inputs} | outputs
        alive = [k for k in kernels if k.output in read]
        if len(alive) == len(kernels):
            break
        removed += len(kernels) - len(alive)
        kernels = alive
    new = KernelPlan(kernels=kernels, buffers={k.output: k.info for k in kernels},
                     inputs=plan.inputs, outputs=plan.outputs, constants=plan.constants,
                     initializers=plan.initializers, opaque_nodes=plan.opaque_nodes)
    return new, removed
