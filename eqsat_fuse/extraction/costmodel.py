"""Target cost models: read `extract/<target>.toml` and price kernels under it.

The file holds numbers (rates, launch overhead, which fusions the target can run); this module
holds the arithmetic that turns them into microseconds. The one program-cost formula that every
extractor and every report uses lives in `cost.program_cost`; the per-node prices it adds up
come from here.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import CostModelError
from ..ops import OPS
from ..resources import cost_model_file, targets

# Every key a cost file has, by table: key -> (type, required, description). A table listed in
# OPTIONAL_TABLES may be left out; when it is present, its required keys are required.
# docs/cost-models.md documents the same keys, with their units.
SCHEMA: dict[str, dict[str, tuple[type, bool, str]]] = {
    "target": {
        "name": (str, True, "the target's name"),
        "description": (str, False, "one line on what hardware this describes"),
        "rules": (list, False, "rule files only this target loads, relative to this file"),
        "backend": (str, False, "the backend whose prices these are (numpy, numba), where "
                                "they were measured"),
    },
    "kernel": {
        "launch_us": (float, True, "fixed cost of starting one kernel, microseconds"),
        "op_us": (float, False, "fixed cost of each operation inside a kernel body, microseconds "
                                "(default 0)"),
    },
    "memory": {
        "bandwidth_gbs": (float, True, "main-memory bandwidth, GB/s, for reads and writes"),
        "onchip_bytes": (float, False, "on-chip memory (SRAM, cache) a kernel's working set may "
                                       "fit in, bytes"),
        "onchip_bandwidth_gbs": (float, False, "bandwidth of a kernel whose working set fits "
                                               "on chip, GB/s"),
        "storage_dtype": (str, False, "dtype activations are stored in (float32, float16, "
                                      "bfloat16); weights keep their own"),
        "epilogue_pass_gbs": (float, False, "bandwidth of the pass a contraction's epilogue "
                                            "makes over its output after the product, GB/s "
                                            "(default: none, the epilogue runs in registers)"),
    },
    "compute": {
        "elementwise_gflops": (float, True, "arithmetic rate of elementwise loops, GFLOP/s"),
        "matmul_gflops": (float, True, "MatMul and Gemm rate, GFLOP/s"),
        "conv_gflops": (float, True, "convolution rate, GFLOP/s"),
        "int8_matmul_gflops": (float, False, "MatMulInteger rate (8-bit products summed in "
                                             "int32), GOP/s (default matmul_gflops)"),
        "int8_conv_gflops": (float, False, "ConvInteger rate, GOP/s (default conv_gflops)"),
        "attention_gflops": (float, False, "FusedAttention rate, GFLOP/s counting 2 (D + Dv) "
                                           "FLOPs per score (default matmul_gflops)"),
        "reduction_gflops": (float, True, "rate of row/window kernels (softmax, norms, pools)"),
        "elementwise_op_us": (float, False, "fixed cost of one elementwise (or data movement, "
                                            "view) operation, microseconds (default op_us)"),
        "matmul_op_us": (float, False, "fixed cost of one MatMul/Gemm (default op_us)"),
        "attention_op_us": (float, False, "fixed cost of one FusedAttention (default "
                                          "matmul_op_us)"),
        "conv_op_us": (float, False, "fixed cost of one convolution (default op_us)"),
        "reduction_op_us": (float, False, "fixed cost of one row/window operation "
                                          "(default op_us)"),
        "conv_group_us": (float, False, "extra cost of each group of a grouped convolution "
                                        "beyond the first, microseconds (default 0)"),
        "depthwise_gflops": (float, False, "rate of a depthwise convolution's taps (one input "
                                           "channel per group), GFLOP/s (default conv_gflops)"),
        "depthwise_input_gbs": (float, False, "rate at which a depthwise convolution reorders "
                                              "its input, GB/s of input (default: no charge)"),
    },
    "flops_per_element": {
        "default": (float, True, "FLOPs per output element of an elementwise op not listed"),
    },
    "fusion": {
        "elementwise": (bool, True, "whether elementwise ops may fuse with each other"),
        "max_anchors": (int, True, "contractions/reductions one kernel body may hold"),
        "prologue": (list, True, "reductions that may read inline elementwise inputs"),
        "epilogue": (list, False, "elementwise ops that may follow a contraction or reduction "
                                  "inside its kernel (default: all)"),
        "epilogue_anchors": (list, False, "contractions/reductions that may carry an epilogue "
                                          "(default: all)"),
    },
    "energy": {
        "launch_nj": (float, True, "energy of starting one kernel, nanojoules"),
        "dram_pj_per_byte": (float, True, "energy of moving one byte to/from main memory, pJ"),
        "onchip_pj_per_byte": (float, False, "energy of moving one byte on chip, pJ "
                                             "(required with memory.onchip_bytes)"),
        "pj_per_flop": (float, True, "energy of one floating-point operation, pJ"),
        "static_w": (float, True, "power drawn while a kernel runs, watts (charged per "
                                  "microsecond of predicted latency)"),
    },
}
OPTIONAL_TABLES = frozenset({"energy"})
OBJECTIVES = ("latency", "energy")
STORAGE_DTYPES = ("float32", "float16", "bfloat16")
RATE_CLASSES = ("elementwise", "matmul", "conv", "reduction", "int8_matmul", "int8_conv",
                "attention")
# a rate class a cost file may leave out, and the class whose rate it then has
RATE_DEFAULTS = {"int8_matmul": "matmul", "int8_conv": "conv", "attention": "matmul"}
BACKENDS_PRICED = ("numpy", "numba")         # what target.backend may say


@dataclass(frozen=True)
class Prices:
    """What each resource costs under one objective: microseconds (latency) or microjoules
    (energy). Both objectives charge the same things, so one kernel formula serves both:

        kernel = launch + bytes_cost(read + write) + sum over body ops of (op + flops * flop)
    """

    objective: str
    launch: float                    # per kernel
    op: dict[str, float]             # per operation in a kernel body, by rate class
    byte: float                      # per byte moved to or from main memory
    onchip_byte: float               # per byte, when the kernel's working set fits on chip
    onchip_bytes: float              # math.inf: no on-chip limit (every kernel pays `byte`)
    flop: dict[str, float]           # per FLOP, by rate class (elementwise, matmul, conv,
                                     # reduction)
    group: float = 0.0               # per group of a grouped convolution, beyond the first
    depthwise_flop: float = 0.0      # per FLOP of a depthwise convolution's taps
    depthwise_byte: float = 0.0      # per byte of a depthwise convolution's input, reordered
    epilogue_byte: float = 0.0       # per byte of a contraction's output passed by its epilogue

    def bytes_cost(self, nbytes: float) -> float:
        """Price of a kernel that reads and writes `nbytes` in all."""
        if nbytes <= self.onchip_bytes:
            return nbytes * self.onchip_byte
        return nbytes * self.byte

    def work(self, flops: float, op: str, groups: int = 1,
             depthwise_input: float | None = None) -> float:
        """Price of one operation of `flops` FLOPs inside a kernel body (without the tie-break).
        `depthwise_input`: the bytes of a depthwise convolution's input (`is_depthwise`), which
        is priced by its own rates: its taps at depthwise_gflops, its input's reordering at
        depthwise_input_gbs, and conv_group_us per group."""
        if depthwise_input is not None:
            return (self.op["conv"] + flops * self.depthwise_flop
                    + depthwise_input * self.depthwise_byte + (groups - 1) * self.group)
        rate_class = _rate_class(op)
        return self.op[rate_class] + flops * self.flop[rate_class] + (groups - 1) * self.group

    def epilogue_pass(self, nbytes: float) -> float:
        """Price of the pass an epilogue makes over a contraction's output of `nbytes`."""
        return 2.0 * nbytes * self.epilogue_byte


@dataclass(frozen=True)
class CostModel:
    """A target's prices, in microseconds, FLOPs and bytes (and nanojoules, if it says)."""

    target: str
    description: str
    launch_us: float
    bandwidth_gbs: float
    rates_gflops: dict[str, float]          # by op kind / class: elementwise, matmul, conv,
                                            # reduction
    # (op_us_by_class below: the fixed cost of one operation of each class)
    flops_per_element: dict[str, float]
    elementwise_fusion: bool
    max_anchors: int
    prologue: frozenset[str]
    path: str = ""
    op_us: float = 0.0
    onchip_bytes: float | None = None        # None: no on-chip memory modelled
    onchip_bandwidth_gbs: float | None = None
    storage_dtype: str = "float32"
    epilogue: frozenset[str] | None = None   # None: every elementwise op
    epilogue_anchors: frozenset[str] | None = None   # None: every contraction and reduction
    energy: dict[str, float] | None = None   # the [energy] table, if the file has one
    op_us_by_class: dict[str, float] | None = None   # None: op_us for every class
    conv_group_us: float = 0.0
    depthwise_input_gbs: float | None = None   # None: a depthwise input costs no reordering
    epilogue_pass_gbs: float | None = None     # None: an epilogue makes no pass of its own
    rule_files: tuple[str, ...] = ()         # [target] rules: files only this target loads
    backend: str | None = None               # [target] backend: whose prices these are

    # ---- prices ----
    def bytes_us(self, nbytes: float) -> float:
        """Time to move `nbytes` to or from main memory."""
        return nbytes / (self.bandwidth_gbs * 1e3)

    def rate(self, rate_class: str) -> float:
        """GFLOP/s of a rate class: its own key, or the one `RATE_DEFAULTS` names."""
        if rate_class in self.rates_gflops:
            return self.rates_gflops[rate_class]
        return self.rates_gflops[RATE_DEFAULTS[rate_class]]

    def flops_us(self, flops: float, op: str) -> float:
        return flops / (self.rate(_rate_class(op)) * 1e3)

    def element_flops(self, op: str, attrs: tuple = ()) -> float:
        """An element of `op` in Adds: the `Op(attr=value)` entry that its attributes match,
        else the `Op` entry, else `default`."""
        table = self.flops_per_element
        for name, value in zip(OPS[op].attrs, attrs) if attrs else ():
            key = f"{op}({name}={value})"
            if key in table:
                return table[key]
        return table.get(op, table["default"])

    def tensor_bytes(self, shape: tuple[int, ...] | None, dtype: str | None,
                     activation: bool = True) -> float:
        """Bytes of a tensor as this target stores it: activations in `storage_dtype` when that
        is narrower than their float dtype; weights (activation=False) as they are."""
        size = nbytes(shape, dtype)
        if not activation or self.storage_dtype == "float32" or size == 0:
            return size
        kind, itemsize = _dtype_info(dtype) if dtype else ("f", 4)
        narrow = 2                                       # float16 and bfloat16
        if kind == "f" and itemsize > narrow:
            return size * narrow / itemsize
        return size

    def has_energy(self) -> bool:
        return self.energy is not None

    def prices(self, objective: str = "latency") -> Prices:
        """The prices extraction minimizes under `objective` ("latency" or "energy")."""
        if objective not in OBJECTIVES:
            raise CostModelError(f"unknown objective {objective!r}; choose one of "
                                 f"{', '.join(OBJECTIVES)}")
        onchip = math.inf if self.onchip_bytes is None else self.onchip_bytes
        onchip_bw = self.onchip_bandwidth_gbs or self.bandwidth_gbs
        by_class = self.op_us_by_class or {}
        op_us = {k: by_class.get(k, by_class.get(RATE_DEFAULTS.get(k, k), self.op_us))
                 for k in RATE_CLASSES}
        depthwise_rate = self.rates_gflops.get("depthwise", self.rates_gflops["conv"])
        latency = Prices("latency", self.launch_us, op_us, 1 / (self.bandwidth_gbs * 1e3),
                         1 / (onchip_bw * 1e3), onchip,
                         {k: 1 / (self.rate(k) * 1e3) for k in RATE_CLASSES},
                         self.conv_group_us, 1 / (depthwise_rate * 1e3),
                         _per_byte(self.depthwise_input_gbs), _per_byte(self.epilogue_pass_gbs))
        if objective == "latency":
            return latency
        if self.energy is None:
            raise CostModelError(f"{self.path or self.target}: the objective 'energy' needs an "
                                 f"[energy] table in the cost file")
        e, watts = self.energy, self.energy["static_w"]     # W * us = uJ
        onchip_pj = e.get("onchip_pj_per_byte", e["dram_pj_per_byte"])
        return Prices("energy", e["launch_nj"] * 1e-3 + watts * latency.launch,
                      {k: watts * v for k, v in latency.op.items()},
                      e["dram_pj_per_byte"] * 1e-6 + watts * latency.byte,
                      onchip_pj * 1e-6 + watts * latency.onchip_byte, onchip,
                      {k: e["pj_per_flop"] * 1e-6 + watts * v for k, v in latency.flop.items()},
                      watts * latency.group,
                      e["pj_per_flop"] * 1e-6 + watts * latency.depthwise_flop,
                      (onchip_pj * 1e-6 + watts * latency.depthwise_byte
                       if latency.depthwise_byte else 0.0),
                      (onchip_pj * 1e-6 + watts * latency.epilogue_byte
                       if latency.epilogue_byte else 0.0))


def _per_byte(gbs: float | None) -> float:
    """Microseconds a byte at `gbs` GB/s (0 for None: no such charge)."""
    return 1 / (gbs * 1e3) if gbs else 0.0


def is_depthwise(op: str, groups: int, weight_shape: tuple[int, ...] | None) -> bool:
    """A convolution with one input channel per group, over more than one group."""
    return (op in ("Conv", "ConvInteger") and groups > 1 and weight_shape is not None and len(weight_shape) > 1
            and weight_shape[1] == 1)


def _rate_class(op: str) -> str:
    if op == "MatMulInteger":
        return "int8_matmul"
    if op == "ConvInteger":
        return "int8_conv"
    if op in ("MatMul", "Gemm"):
        return "matmul"
    if op == "FusedAttention":
        return "attention"
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
    if op in ("Conv", "ConvInteger") and in_shapes[1] is not None:
        w = in_shapes[1]
        return 2.0 * out * math.prod(w[1:])
    if op == "ConvTranspose" and first is not None and in_shapes[1] is not None:
        w = in_shapes[1]
        return 2.0 * math.prod(first) * math.prod(w[1:])
    if op == "FusedAttention" and first is not None and in_shapes[1] is not None:
        # a score per query row and key: q @ kt (2 D FLOPs) and its share of p @ v (2 Dv)
        scores = math.prod(first[:-1]) * in_shapes[1][-1]
        return 2.0 * scores * (first[-1] + out_shape[-1])
    if op in ("MatMul", "Gemm", "MatMulInteger") and first is not None:
        trans_a = op == "Gemm" and attrs[2]
        k = first[-2] if trans_a and len(first) >= 2 else first[-1]
        return 2.0 * out * k
    if kind == "reduction":
        size = float(math.prod(first)) if first is not None else out
        if op in ("MaxPool", "AveragePool"):
            # a window reads at most the input's extent along each axis (HF EfficientNet's
            # pooler has a 640x640 window on a 3x3 input: 9 taps, not 409,600)
            kernel = tuple(attrs[0])
            spatial = tuple(first[-len(kernel):]) if first is not None and kernel else kernel
            return out * math.prod(min(k, d) for k, d in zip(kernel, spatial))
        if op == "LRN":
            return size * attrs[0]
        return size * model.element_flops(op, attrs)
    return out * model.element_flops(op, attrs)


_QUALIFIED = re.compile(r"(\w+)\((\w+)=([^()=]+)\)")


def _check_price_key(key: str, where: str) -> None:
    """A `[flops_per_element]` key: `default`, an operator, or `Op(attr=value)`."""
    if key == "default" or key in OPS:
        return
    match = _QUALIFIED.fullmatch(key)
    if match is None:
        raise CostModelError(f"{where}: flops_per_element.{key} names no operator (keys are "
                             f"`default`, an operator, or `Op(attribute=value)`)")
    op, attr = match.group(1), match.group(2)
    if op not in OPS:
        raise CostModelError(f"{where}: flops_per_element.{key} names no operator ({op})")
    if attr not in OPS[op].attrs:
        raise CostModelError(f"{where}: flops_per_element.{key}: {op} has no attribute {attr} "
                             f"(its attributes: {', '.join(OPS[op].attrs) or 'none'})")


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
        spot = re.search(r"\s*\(at line (\d+), column (\d+)\)", str(exc))
        if spot:          # file:line:column first, as every other error in a file is named
            reason = str(exc)[:spot.start()] + str(exc)[spot.end():]
            raise CostModelError(f"{path}:{spot[1]}:{spot[2]}: not valid TOML: {reason}") from None
        raise CostModelError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise CostModelError(f"{path}: not a text file (a cost model is UTF-8 TOML)") from None
    return _validate(data, str(path), _key_lines(path.read_text()))


_HEADER = re.compile(r"\s*\[\s*([^\[\]]+?)\s*\]\s*$")
_KEY = re.compile(r"""\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-. ])+?)\s*=""")
_STRING = re.compile(r""""[^"]*"|'[^']*'""")


def _key_lines(text: str) -> dict[str, int]:
    """Line of each table header ("memory") and key ("memory.bandwidth_gbs") in a TOML text, for
    messages (tomllib keeps no positions); the lines inside a multi-line value are skipped."""
    lines: dict[str, int] = {}
    table, depth = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        if depth == 0:
            key = _KEY.match(code)
            header = None if key else _HEADER.match(code)
            if header:
                table = re.sub(r"[\"' ]", "", header.group(1))
                lines.setdefault(table, number)
                continue
            if key:
                name = re.sub(r"[\"' ]", "", key.group(1))
                lines.setdefault(f"{table}.{name}" if table else name, number)
                if not table and "." in name:           # a dotted key names its table too
                    lines.setdefault(name.split(".")[0], number)
        code = _STRING.sub("", code)                    # brackets in a string or quoted key
        depth = max(0, depth + code.count("[") + code.count("{") - code.count("]")
                    - code.count("}"))
    return lines


def _validate(data: dict[str, Any], path: str, lines: dict[str, int] | None = None) -> CostModel:
    lines = lines or {}

    def at(*keys: str) -> str:
        """`file:line` of the first of `keys` (a "table.key" or a "table") found in the file."""
        for key in keys:
            if key in lines:
                return f"{path}:{lines[key]}"
        return path

    for table in data:
        if table not in SCHEMA:
            raise CostModelError(f"{at(table)}: unknown table [{table}] (known: "
                                 f"{', '.join(SCHEMA)})")
    values: dict[str, dict[str, Any]] = {}
    for table, keys in SCHEMA.items():
        section = data.get(table)
        if section is None:
            if table in OPTIONAL_TABLES:
                continue
            raise CostModelError(f"{path}: missing table [{table}]")
        if not isinstance(section, dict):
            raise CostModelError(f"{at(table)}: [{table}] must be a table")
        for key, value in section.items():
            if key not in keys and table != "flops_per_element":
                raise CostModelError(f"{at(f'{table}.{key}', table)}: unknown key {table}.{key}")
        values[table] = {}
        for key, (kind, required, _) in keys.items():
            if key not in section:
                if required:
                    raise CostModelError(f"{at(table)}: missing key {table}.{key} (in [{table}])")
                continue
            values[table][key] = _check_value(section[key], kind, f"{table}.{key}",
                                              at(f"{table}.{key}", table))
        if table == "flops_per_element":
            for key, value in section.items():
                where = at(f"{table}.{key}", table)
                _check_price_key(key, where)
                values[table][key] = _check_value(value, float, f"{table}.{key}", where)
    fusion, memory, energy = values["fusion"], values["memory"], values.get("energy")
    _check_ops(fusion["prologue"], ("reduction",), "fusion.prologue", "a reduction",
               at("fusion.prologue"))
    if "epilogue" in fusion:
        _check_ops(fusion["epilogue"], ("elementwise",), "fusion.epilogue", "elementwise",
                   at("fusion.epilogue"))
    if "epilogue_anchors" in fusion:
        _check_ops(fusion["epilogue_anchors"], ("anchor", "reduction"), "fusion.epilogue_anchors",
                   "a contraction or reduction", at("fusion.epilogue_anchors"))
    compute = values["compute"]
    rates = {k.removesuffix("_gflops"): v for k, v in compute.items() if k.endswith("_gflops")}
    op_us_by_class = {k.removesuffix("_op_us"): v for k, v in compute.items()
                      if k.endswith("_op_us")}
    positive = [("memory.bandwidth_gbs", memory["bandwidth_gbs"]),
                *[(f"compute.{k}_gflops", v) for k, v in rates.items()]]
    if "depthwise_input_gbs" in compute:
        positive.append(("compute.depthwise_input_gbs", compute["depthwise_input_gbs"]))
    if "epilogue_pass_gbs" in memory:
        positive.append(("memory.epilogue_pass_gbs", memory["epilogue_pass_gbs"]))
    if "onchip_bandwidth_gbs" in memory:
        positive.append(("memory.onchip_bandwidth_gbs", memory["onchip_bandwidth_gbs"]))
    for key, rate in positive:
        if rate == 0:
            raise CostModelError(f"{at(key)}: {key} must be greater than zero")
    _check_memory(memory, energy, at)

    def optional_set(key: str) -> frozenset[str] | None:
        return frozenset(fusion[key]) if key in fusion else None

    return CostModel(
        target=values["target"]["name"], description=values["target"].get("description", ""),
        launch_us=values["kernel"]["launch_us"], bandwidth_gbs=memory["bandwidth_gbs"],
        rates_gflops=rates, flops_per_element=dict(values["flops_per_element"]),
        elementwise_fusion=fusion["elementwise"], max_anchors=fusion["max_anchors"],
        prologue=frozenset(fusion["prologue"]), path=path,
        op_us=values["kernel"].get("op_us", 0.0),
        onchip_bytes=memory.get("onchip_bytes"),
        onchip_bandwidth_gbs=memory.get("onchip_bandwidth_gbs"),
        storage_dtype=memory.get("storage_dtype", "float32"),
        epilogue=optional_set("epilogue"), epilogue_anchors=optional_set("epilogue_anchors"),
        energy=energy, op_us_by_class=op_us_by_class or None,
        conv_group_us=compute.get("conv_group_us", 0.0),
        depthwise_input_gbs=compute.get("depthwise_input_gbs"),
        epilogue_pass_gbs=memory.get("epilogue_pass_gbs"),
        rule_files=_target_rules(values["target"].get("rules", []), path, at("target.rules")),
        backend=_backend(values["target"].get("backend"), at("target.backend")))


def _check_memory(memory: dict[str, Any], energy: dict[str, Any] | None,
                  at: Callable[..., str]) -> None:
    """The [memory] and [energy] keys that only make sense together."""
    if ("onchip_bytes" in memory) != ("onchip_bandwidth_gbs" in memory):
        given, needed = (("onchip_bytes", "onchip_bandwidth_gbs") if "onchip_bytes" in memory
                         else ("onchip_bandwidth_gbs", "onchip_bytes"))
        raise CostModelError(f"{at(f'memory.{given}')}: memory.{given} needs memory.{needed}: "
                             f"missing key memory.{needed}")
    if memory.get("onchip_bandwidth_gbs", math.inf) < memory["bandwidth_gbs"]:
        raise CostModelError(f"{at('memory.onchip_bandwidth_gbs')}: memory.onchip_bandwidth_gbs "
                             f"must be at least memory.bandwidth_gbs (on chip is not slower than "
                             f"main memory)")
    if memory.get("storage_dtype", "float32") not in STORAGE_DTYPES:
        raise CostModelError(f"{at('memory.storage_dtype')}: memory.storage_dtype must be one "
                             f"of {', '.join(STORAGE_DTYPES)}, not {memory['storage_dtype']!r}")
    if energy is not None and "onchip_bytes" in memory:
        if "onchip_pj_per_byte" not in energy:
            raise CostModelError(f"{at('energy')}: missing key energy.onchip_pj_per_byte (the "
                                 f"target has memory.onchip_bytes)")
        if energy["onchip_pj_per_byte"] > energy["dram_pj_per_byte"]:
            raise CostModelError(f"{at('energy.onchip_pj_per_byte')}: energy.onchip_pj_per_byte "
                                 f"must not exceed energy.dram_pj_per_byte")


def _backend(backend: str | None, where: str) -> str | None:
    """[target] backend, one of `BACKENDS_PRICED` when it is given."""
    if backend is not None and backend not in BACKENDS_PRICED:
        raise CostModelError(f"{where}: target.backend must be one of "
                             f"{', '.join(BACKENDS_PRICED)}, not {backend!r}")
    return backend


def _target_rules(names: list[str], path: str, where: str) -> tuple[str, ...]:
    """The target's own rule files, resolved against the cost file's folder; each must exist."""
    files = []
    for name in names:
        file = (Path(path).parent / name).resolve()
        if file.suffix != ".egg" or not file.is_file():
            raise CostModelError(f"{where}: target.rules names {name!r}, which is not a rule "
                                 f"file (.egg) next to this cost file (looked for {file})")
        files.append(str(file))
    return tuple(files)


def _check_ops(ops: list[str], kinds: tuple[str, ...], key: str, what: str, where: str) -> None:
    for op in ops:
        if op not in OPS or OPS[op].kind not in kinds:
            raise CostModelError(f"{where}: {key} lists {op!r}, which is not {what}")


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
            raise CostModelError(f"{where}: {key} must be a list of "
                                 f"{'file names' if key == 'target.rules' else 'operator names'}")
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
    return float(math.prod(shape)) * (_dtype_info(dtype)[1] if dtype else 4)


@functools.cache
def _dtype_info(dtype: str) -> tuple[str, int]:
    """(kind, itemsize) of a NumPy dtype name."""
    info = np.dtype(dtype)
    return info.kind, info.itemsize
