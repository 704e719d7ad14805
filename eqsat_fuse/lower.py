"""Stage 6, lower: fold constants, plan memory and generate the backend's program.

`lower` evaluates every `ConstExpr` once (compile-time constant folding), plans buffer lifetimes
(`memory.plan_memory`), and builds one step per kernel with the chosen backend. The result,
`Program`, checks the feeds and runs the steps in order, dropping each buffer after its last use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .backend_numpy import OpaqueNodes, evaluate_body, make_step
from .errors import EqsatFuseError, FeedError
from .ir import KernelPlan, Operand
from .memory import MemoryPlan, plan_memory

BACKENDS = ("numpy",)


@dataclass
class Program:
    """A lowered kernel plan that runs: `run(feeds) -> {output name: array}`."""

    plan: KernelPlan
    backend: str
    constants: dict[str, np.ndarray]
    steps: list[Callable[[dict], np.ndarray]]
    memory: MemoryPlan
    fold_seconds: float

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        env: dict[str, Any] = dict(self.constants)
        env.update(check_feeds(self.plan, feeds))
        for step, kernel, dead in zip(self.steps, self.plan.kernels, self.memory.free_after):
            env[kernel.output] = step(env)
            for name in dead:
                if name not in self.plan.outputs.values():
                    env.pop(name, None)
        return {name: env[ref] for name, ref in self.plan.outputs.items()}


def check_feeds(plan: KernelPlan, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
    """The feeds as arrays, or a FeedError naming the input that is missing or wrong."""
    if not isinstance(feeds, dict):
        raise FeedError(f"feeds must be a dict of input name -> array, not {type(feeds).__name__}")
    unknown = [name for name in feeds if name not in plan.inputs]
    if unknown:
        raise FeedError(f"unknown input {unknown[0]!r}; the model's inputs are "
                        f"{', '.join(plan.inputs) or '(none)'}")
    arrays = {}
    for name, info in plan.inputs.items():
        if name not in feeds:
            raise FeedError(f"missing input {name!r} (shape {list(info.shape)}, {info.dtype})")
        value = np.asarray(feeds[name])
        if value.dtype != np.dtype(info.dtype):
            raise FeedError(f"input {name!r} has dtype {value.dtype}, the model expects "
                            f"{info.dtype}")
        if tuple(value.shape) != tuple(info.shape):
            raise FeedError(f"input {name!r} has shape {list(value.shape)}, the model was "
                            f"compiled for {list(info.shape)}")
        arrays[name] = value
    return arrays


def fold_constants(plan: KernelPlan, opaque: OpaqueNodes) -> dict[str, np.ndarray]:
    """Evaluate every constant expression of the plan once."""
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
        values[name] = value
    return values


def lower(plan: KernelPlan, backend: str = "numpy", opset: int = 21) -> Program:
    """Fold constants, plan memory, and build the steps of `backend`."""
    if backend not in BACKENDS:
        raise EqsatFuseError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    started = time.perf_counter()
    opaque = OpaqueNodes(plan, opset)
    constants = fold_constants(plan, opaque)
    fold_seconds = time.perf_counter() - started
    steps = [make_step(kernel, opaque) for kernel in plan.kernels]
    return Program(plan=plan, backend=backend, constants=constants, steps=steps,
                   memory=plan_memory(plan), fold_seconds=fold_seconds)
