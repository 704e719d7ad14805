"""Target cost models: read `extract/<target>.toml` and price kernels under it.

The file holds numbers (rates, launch overhead, which fusions the target can run); this module
holds the arithmetic that turns them into microseconds. The one program-cost formula that every
extractor and every report uses lives in `extract.program_cost`; the per-node prices it adds up
come from here.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CostModelError
from .ops import OPS
from .resources import cost_model_file, targets

# Every key a cost file has, by table: key -> (type, required, description). docs/cost-models.md
# documents the same keys.
SCHEMA: dict[str, dict[str, tuple[type, bool, str]]] = {
    "target": {
        "name": (str, True, "the target's name"),
        "description": (str, False, "one line on what hardware this describes"),
    },
    "kernel": {
        "launch_us": (float, True, "fixed cost of starting one kernel, microseconds"),
    },
    "memory": {
        "bandwidth_gbs": (float, True, "main-memory bandwidth, GB/s, for reads and writes"),
    },
    "compute": {
        "elementwise_gflops": (float, True, "arithmetic rate of elementwise loops, GFLOP/s"),
        "matmul_gflops": (float, True, "MatMul and Gemm rate, GFLOP/s"),
        "conv_gflops": (float, True, "convolution rate, GFLOP/s"),
        "reduction_gflops": (float, True, "rate of row/window kernels (softmax, norms, pools)"),
    },
    "flops_per_element": {
        "default": (float, True, "FLOPs per output element of an elementwise op not listed"),
    },
    "fusion": {
        "elementwise": (bool, True, "whether elementwise ops may fuse with each other"),
        "max_anchors": (int, True, "contractions/reductions one kernel body may hold"),
        "prologue": (list, True, "reductions that may read inline elementwise inputs"),
    },
}


@dataclass(frozen=True)
class CostModel:
    """A target's prices, in microseconds, FLOPs and bytes."""

    target: str
    description: str
    launch_us: float
    bandwidth_gbs: float
    rates_gflops: dict[str, float]          # by op kind / class: elementwise, matmul, conv, reduction
    flops_per_element: dict[str, float]
    elementwise_fusion: bool
    max_anchors: int
    prologue: frozenset[str]
    path: str = ""

    # ---- prices ----
    def bytes_us(self, nbytes: float) -> float:
        """Time to move `nbytes` to or from main memory."""
        return nbytes / (self.bandwidth_gbs * 1e3)

    def flops_us(self, flops: float, op: str) -> float:
        return flops / (self.rates_gflops[_rate_class(op)] * 1e3)

    def element_flops(self, op: str) -> float:
        return self.flops_per_element.get(op, self.flops_per_element["default"])


def _rate_class(op: str) -> str:
    if op in ("MatMul", "Gemm"):
        return "matmul"
    if op in ("Conv", "ConvTranspose"):
        return "conv"
    if OPS[op].kind == "reduction":
        return "reduction"
    return "elementwise"


def node_flops(model: CostModel, op: str, attrs: tuple, out_shape: tuple[int, ...] | None,
               in_shapes: list[tuple[int, ...] | None]) -> float:
    """FLOPs of one operation with the given output and input shapes."""
    kind = OPS[op].kind
    if kind in ("leaf", "structure", "view", "movement", "opaque") or out_shape is None:
        return 0.0
    out = float(math.prod(out_shape))
    first = in_shapes[0] if in_shapes else None
    if op == "Conv" and in_shapes[1] is not None:
        w = in_shapes[1]
        return 2.0 * out * math.prod(w[1:])
    if op == "ConvTranspose" and first is not None and in_shapes[1] is not None:
        w = in_shapes[1]
        return 2.0 * math.prod(first) * math.prod(w[1:])
    if op in ("MatMul", "Gemm") and first is not None:
        trans_a = op == "Gemm" and attrs[2]
        k = first[-2] if trans_a and len(first) >= 2 else first[-1]
        return 2.0 * out * k
    if kind == "reduction":
        size = float(math.prod(first)) if first is not None else out
        if op in ("MaxPool", "AveragePool"):
            return out * math.prod(attrs[0])
        if op == "LRN":
            return size * attrs[0]
        return size * model.element_flops(op)
    return out * model.element_flops(op)


def load_cost_model(target: str | Path) -> CostModel:
    """Load a target by name ("cpu") or from a TOML file, checking every key."""
    path = Path(target) if str(target).endswith(".toml") else cost_model_file(str(target))
    if not path.is_file():
        if not str(target).endswith(".toml"):
            raise CostModelError(f"unknown target {target!r}; the shipped targets are "
                                 f"{', '.join(targets())}, or give a path to a .toml cost file")
        raise CostModelError(f"{path}: no such cost-model file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CostModelError(f"{path}: not valid TOML: {exc}") from None
    return _validate(data, str(path))


def _validate(data: dict[str, Any], where: str) -> CostModel:
    for table in data:
        if table not in SCHEMA:
            raise CostModelError(f"{where}: unknown table [{table}] (known: "
                                 f"{', '.join(SCHEMA)})")
    values: dict[str, dict[str, Any]] = {}
    for table, keys in SCHEMA.items():
        section = data.get(table)
        if section is None:
            raise CostModelError(f"{where}: missing table [{table}]")
        if not isinstance(section, dict):
            raise CostModelError(f"{where}: [{table}] must be a table")
        for key, value in section.items():
            if key not in keys and table != "flops_per_element":
                raise CostModelError(f"{where}: unknown key {table}.{key}")
        values[table] = {}
        for key, (kind, required, _) in keys.items():
            if key not in section:
                if required:
                    raise CostModelError(f"{where}: missing key {table}.{key}")
                continue
            values[table][key] = _check_value(section[key], kind, f"{table}.{key}", where)
        if table == "flops_per_element":
            for key, value in section.items():
                if key != "default" and key not in OPS:
                    raise CostModelError(f"{where}: flops_per_element.{key} names no operator")
                values[table][key] = _check_value(value, float, f"{table}.{key}", where)
    for op in values["fusion"]["prologue"]:
        if op not in OPS or OPS[op].kind != "reduction":
            raise CostModelError(f"{where}: fusion.prologue lists {op!r}, which is not a reduction")
    rates = {k.removesuffix("_gflops"): v for k, v in values["compute"].items()}
    for key, rate in [("memory.bandwidth_gbs", values["memory"]["bandwidth_gbs"]),
                      *[(f"compute.{k}_gflops", v) for k, v in rates.items()]]:
        if rate == 0:
            raise CostModelError(f"{where}: {key} must be greater than zero")
    return CostModel(
        target=values["target"]["name"], description=values["target"].get("description", ""),
        launch_us=values["kernel"]["launch_us"], bandwidth_gbs=values["memory"]["bandwidth_gbs"],
        rates_gflops=rates, flops_per_element=dict(values["flops_per_element"]),
        elementwise_fusion=values["fusion"]["elementwise"],
        max_anchors=values["fusion"]["max_anchors"],
        prologue=frozenset(values["fusion"]["prologue"]), path=where)


def _check_value(value: Any, kind: type, key: str, where: str) -> Any:
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CostModelError(f"{where}: {key} must be a number, not {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise CostModelError(f"{where}: {key} must be a finite number >= 0, not {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CostModelError(f"{where}: {key} must be a whole number >= 0, not {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise CostModelError(f"{where}: {key} must be true or false, not {value!r}")
        return value
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise CostModelError(f"{where}: {key} must be a list of operator names")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise CostModelError(f"{where}: {key} must be a string")
        return value
    raise AssertionError(kind)


def nbytes(shape: tuple[int, ...] | None, dtype: str | None) -> float:
    """Bytes of a tensor; 0 for an unknown one (a TList or an absent input)."""
    if shape is None:
        return 0.0
    return float(math.prod(shape)) * (np.dtype(dtype).itemsize if dtype else 4)
