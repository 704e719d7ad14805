"""`eqsat-fuse calibrate`: measure this machine and write a CPU cost file.

Micro-benchmarks, one thread, each the median (or best) of repeats:

- main-memory bandwidth: a copy of arrays far larger than the caches;
- on-chip bandwidth and size: copies of growing working sets; the largest set that still copies
  at least twice as fast as main memory gives `onchip_bytes` and its rate;
- the fixed cost of one operation of each class, through the NumPy backend's own evaluation
  (`ops.evaluate`) on tiny tensors: elementwise, MatMul, convolution, softmax;
- rates: elementwise (exp over an in-cache array), MatMul (sgemm), convolution (3x3), reductions
  (softmax rows), each after its fixed cost and its bytes are taken off;
- the extra cost of each group of a depthwise convolution;
- the per-kernel launch overhead of the NumPy backend (a one-op program's step, less the op),
  and, when Numba is installed, the call overhead of a compiled kernel (reported in a comment).

What cannot be measured here (FLOPs per element of each op, the fusion rules, the energy
figures) is copied from a base cost file, the shipped `cpu.toml` by default.
"""

from __future__ import annotations

import json
import math
import platform
import re
import sys
import time
from datetime import date
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import EqsatFuseError
from ..extraction.costmodel import load_cost_model
from ..ops import OPS, evaluate

# elementwise ops the calibration does not time: each costs about one Add per element
# (flops_per_element.default)
_ABOUT_ONE_ADD = {"Relu", "Add", "Sub", "Mul", "Neg", "Abs", "Identity", "Dropout"}


def _time(fn: Callable[[], object], repeat: int, number: int = 1) -> float:
    """Seconds per call: the best of `repeat` rounds of `number` calls (after one warm-up).
    The best round, not the median: on a shared machine, other processes only ever add time."""
    fn()
    rounds = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - started) / number)
    return float(min(rounds))


def _copy_bandwidth(nbytes: int, repeat: int) -> float:
    """GB/s of copying an array of `nbytes` (read + write counted)."""
    n = max(nbytes // 4, 16)
    src = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dst = np.empty_like(src)
    number = max(1, int(2e6 // nbytes))
    seconds = _time(lambda: np.copyto(dst, src), repeat, number)
    return 2 * src.nbytes / seconds / 1e9


class Calibration:
    """The measured figures, filled by `run`."""

    def __init__(self, quick: bool = False, progress: Callable[[str], None] | None = None):
        self.quick = quick
        self.progress = progress or (lambda message: None)
        self.repeat = 3 if quick else 9
        self.values: dict[str, float] = {}
        self.notes: dict[str, str] = {}
        self.flops: dict[str, float] = {}        # measured flops_per_element

    def run(self) -> dict[str, float]:
        steps = [("memory bandwidth", self.memory), ("operation overheads", self.overheads),
                 ("elementwise rate", self.elementwise), ("MatMul rate", self.matmul),
                 ("convolution rate", self.conv), ("reduction rates", self.reduction_table),
                 ("launch overhead", self.launch)]
        for number, (name, step) in enumerate(steps, 1):
            self.progress(f"[calibrate] {number}/{len(steps)} {name}...")
            step()
        return self.values

    # ---- memory ----
    def memory(self) -> None:
        big = (16 if self.quick else 128) << 20
        main = _copy_bandwidth(big, self.repeat)
        self.values["bandwidth_gbs"] = main
        self.notes["bandwidth_gbs"] = f"copy of {big >> 20} MiB"
        best_size, rates = None, []
        for size in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20):
            rate = _copy_bandwidth(size // 2, self.repeat)     # working set: read + write
            if rate >= 2 * main:
                best_size = size
                rates.append(rate)
        if best_size is not None:
            self.values["onchip_bytes"] = float(best_size)
            self.values["onchip_bandwidth_gbs"] = float(np.median(rates))
            self.notes["onchip_bytes"] = "largest working set copied at >= 2x main memory"

    # ---- fixed costs ----
    def overheads(self) -> None:
        rng = np.random.default_rng(0)
        a = rng.standard_normal(16).astype(np.float32)
        m = rng.standard_normal((4, 4)).astype(np.float32)
        x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
        w = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
        rows = rng.standard_normal((4, 8)).astype(np.float32)
        conv_attrs = dict(pads=(0, 0, 0, 0), strides=(1, 1), dilations=(1, 1), group=1)
        number = 50 if self.quick else 400
        self.values["elementwise_op_us"] = 1e6 * _time(
            lambda: evaluate("Add", [a, a], {}), self.repeat, number)
        self.values["matmul_op_us"] = 1e6 * _time(
            lambda: evaluate("MatMul", [m, m], {}), self.repeat, number)
        self.values["conv_op_us"] = 1e6 * _time(
            lambda: evaluate("Conv", [x, w, None], conv_attrs), self.repeat, number // 4)
        self.values["reduction_op_us"] = 1e6 * _time(
            lambda: evaluate("Softmax", [rows], {"axis": -1}), self.repeat, number)

    # ---- rates: time = fixed + flops / rate + bytes / bandwidth ----
    def _rate(self, seconds: float, fixed_us: float, flops: float, nbytes: float) -> float:
        bandwidth = self.values.get("onchip_bandwidth_gbs", self.values["bandwidth_gbs"])
        compute = seconds - fixed_us * 1e-6 - nbytes / (bandwidth * 1e9)
        compute = max(compute, 0.25 * seconds)          # never more than 4x the plain rate
        return flops / compute / 1e9

    def elementwise(self) -> None:
        """The rate of Add (1 FLOP per element) and every other elementwise op's cost per
        element relative to it (its `flops_per_element`), on an in-cache array."""
        n = 1 << 12 if self.quick else 1 << 14
        rng = np.random.default_rng(0)
        x = rng.standard_normal(n).astype(np.float32)
        pos = np.abs(x) + np.float32(0.5)
        bandwidth = self.values.get("onchip_bandwidth_gbs", self.values["bandwidth_gbs"])
        fixed = self.values["elementwise_op_us"]

        def per_element_us(op: str, args: list, attrs: dict) -> float:
            seconds = _time(lambda: evaluate(op, args, attrs), self.repeat, 10)
            moved = 4.0 * (len(args) + 1) / (bandwidth * 1e3)        # us per element
            return max((seconds * 1e6 - fixed) / n - moved, 0.05 * seconds * 1e6 / n)

        unit = per_element_us("Add", [x, x], {})
        self.values["elementwise_gflops"] = 1e-3 / unit
        bn = [np.ones(1, np.float32)] * 4
        cases = {
            "Sigmoid": ([x], {}), "Tanh": ([x], {}), "Erf": ([x], {}),
            "Gelu": ([x], {"approximate": "none"}), "Exp": ([x], {}), "Log": ([pos], {}),
            "Sqrt": ([pos], {}), "Pow": ([pos, pos], {}), "Div": ([x, pos], {}),
            "Reciprocal": ([pos], {}), "HardSigmoid": ([x], {"alpha": 0.2, "beta": 0.5}),
            "HardSwish": ([x], {}), "LeakyRelu": ([x], {"alpha": 0.1}),
            "Clip": ([x, np.float32(0), np.float32(6)], {}), "Where": ([x > 0, x, pos], {}),
            "Cast": ([x], {"to": "float16"}),
            "BatchNormalization": ([x.reshape(1, 1, n), *bn], {"epsilon": 1e-5}),
        }
        # every other elementwise op of the operator table but those about as cheap as an Add:
        # its inputs inside its domain, its attributes at their ONNX defaults
        for op, spec in OPS.items():
            if spec.kind == "elementwise" and spec.reference is not None \
                    and op not in cases and op not in _ABOUT_ONE_ADD:
                cases[op] = ([x if spec.domain == "any" else pos] * len(spec.inputs),
                             dict(spec.defaults))
        self.flops = {op: max(1.0, per_element_us(op, args, attrs) / unit)
                      for op, (args, attrs) in cases.items()}

    def reduction_table(self) -> None:
        """The rate of ReduceSum (1 FLOP per input element) and the others relative to it."""
        rows = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
        gamma = np.ones(256, np.float32)
        fixed = self.values["reduction_op_us"]
        bandwidth = self.values.get("onchip_bandwidth_gbs", self.values["bandwidth_gbs"])

        def per_element_us(op: str, args: list, attrs: dict) -> float:
            seconds = _time(lambda: evaluate(op, args, attrs), self.repeat, 10)
            moved = 8.0 / (bandwidth * 1e3)
            return max((seconds * 1e6 - fixed) / rows.size - moved,
                       0.05 * seconds * 1e6 / rows.size)

        unit = per_element_us("ReduceSum", [rows], {"axes": (-1,), "keepdims": 1})
        self.values["reduction_gflops"] = 1e-3 / unit
        for op, args, attrs in (("Softmax", [rows], {"axis": -1}),
                                ("LayerNormalization", [rows, gamma, None],
                                 {"axis": -1, "epsilon": 1e-5}),
                                ("ReduceMean", [rows], {"axes": (-1,), "keepdims": 1})):
            self.flops[op] = max(1.0, per_element_us(op, args, attrs) / unit)

    def matmul(self) -> None:
        rates = []
        for m, k, n in ((64, 256, 256), (128, 512, 512)):
            a = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
            b = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
            seconds = _time(lambda: evaluate("MatMul", [a, b], {}), self.repeat, 5)
            rates.append(self._rate(seconds, self.values["matmul_op_us"], 2.0 * m * k * n,
                                    4.0 * (m * k + k * n + m * n)))
        self.values["matmul_gflops"] = float(np.median(rates))

    def conv(self) -> None:
        rng = np.random.default_rng(0)
        rates = []
        for channels, size in ((16, 16), (32, 16)):
            x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
            w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
            attrs = dict(pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
            seconds = _time(lambda: evaluate("Conv", [x, w, None], attrs), self.repeat, 2)
            flops = 2.0 * channels * size * size * channels * 9
            rates.append(self._rate(seconds, self.values["conv_op_us"], flops,
                                    4.0 * (2 * x.size + w.size)))
        self.values["conv_gflops"] = float(np.median(rates))
        # depthwise: the same convolution in `channels` groups
        channels, size = 64, 8
        x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
        w = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)
        attrs = dict(pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=channels)
        seconds = _time(lambda: evaluate("Conv", [x, w, None], attrs), self.repeat, 2)
        flops = 2.0 * channels * size * size * 9
        rest = (self.values["conv_op_us"] + flops / (self.values["conv_gflops"] * 1e3)
                + 4.0 * (2 * x.size + w.size) / (self.values["bandwidth_gbs"] * 1e3))
        self.values["conv_group_us"] = max(0.0, (seconds * 1e6 - rest) / (channels - 1))

    # ---- per-kernel overhead of the backends ----
    def launch(self) -> None:
        from onnx import TensorProto, helper

        from ..pipeline import compile as compile_model

        def program(ops: list[str]):
            outputs = [f"y{i}" for i in range(len(ops))]
            graph = helper.make_graph(
                [helper.make_node(op, ["x"], [y]) for op, y in zip(ops, outputs)], "ops",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
                [helper.make_tensor_value_info(y, TensorProto.FLOAT, [16]) for y in outputs])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            return compile_model(model, target="cpu", backend="numpy").program

        ops = ["Relu", "Sigmoid", "Tanh", "Neg"]            # one kernel per output
        compiled = program(ops)
        x = np.ones(16, np.float32)
        number = 50 if self.quick else 400
        steps, env = program_steps(compiled, {"x": x})
        step_us = sum(_time(lambda step=step: step(env), self.repeat, number) for step in steps)
        op_us = sum(_time(lambda op=op: evaluate(op, [x], {}), self.repeat, number)
                    for op in ops)
        self.values["launch_us"] = max(0.1, 1e6 * (step_us - op_us) / len(steps))
        self.notes["launch_us"] = "NumPy backend: a kernel's step, less its op"
        try:
            import numba
        except ImportError:
            return

        @numba.njit(cache=False)
        def kernel(a, out):
            for i in range(a.shape[0]):
                out[i] = a[i]

        out = np.empty_like(x)
        kernel(x, out)
        number = 50 if self.quick else 400
        self.notes["numba_launch_us"] = (
            f"{1e6 * _time(lambda: kernel(x, out), self.repeat, number):.2f}")


def program_steps(program, feeds: dict) -> tuple[list, dict]:
    """The steps of a lowered program and the environment they run in, as one run leaves it:
    each step can then be timed alone, `step(env)`."""
    steps = list(program.steps)
    seen: dict = {}

    def watch(step):
        def watched(env):
            seen["env"] = env
            return step(env)
        return watched

    program.steps = [watch(step) for step in steps]
    try:
        program.run(feeds)
    finally:
        program.steps = steps
    return steps, seen.get("env", {})


def target_name(output: str | Path | None) -> str:
    """The [target] name of a calibrated file: the file's stem and the machine,
    "cpu@build-42", so that neither the shipped "cpu" nor another machine's file shares it."""
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", platform.node()).strip("-") or "this-machine"
    stem = Path(output).stem if output else "calibrated"
    return f"{stem}@{host}"


def render(values: dict[str, float], notes: dict[str, str], base_path: Path,
           flops: dict[str, float] | None = None, name: str | None = None) -> str:
    """The cost file text: measured keys from `values`, the rest copied from the base file;
    `name` is its [target] name (default `target_name(None)`)."""
    import tomllib

    base = tomllib.loads(base_path.read_text())
    flops = flops or {}
    v = {k: round(x, 4) if x < 100 else round(x, 1) for k, x in values.items()}
    description = (f"{platform.node() or 'this machine'} ({platform.machine()}), measured by "
                   f"eqsat-fuse calibrate on {date.today().isoformat()}, one thread per kernel")
    lines = [
        "# Cost model of this machine's CPU, measured by `eqsat-fuse calibrate` on "
        f"{date.today().isoformat()}",
        f"# ({platform.machine()}, {platform.processor() or platform.system()}, "
        f"Python {platform.python_version()}, NumPy {np.__version__}; one thread).",
        "# Prices are those of the NumPy backend: each operation of a kernel body is a NumPy call",
        "# with a fixed cost, and a kernel adds the backend's per-step overhead. Keys not",
        f"# measured here are copied from {base_path.name}. Every key: docs/cost-models.md.",
        "",
        "[target]",
        f"name = {_toml_value(name or target_name(None))}",
        f"description = {_toml_value(description)}",
        "",
        "[kernel]",
        f"launch_us = {v['launch_us']}              # {notes.get('launch_us', '')}",
        f"op_us = {v['elementwise_op_us']}                  # any op without a class figure below",
    ]
    if "numba_launch_us" in notes:
        lines.append(f"# a compiled Numba kernel call costs about {notes['numba_launch_us']} us")
    lines += [
        "",
        "[memory]",
        f"bandwidth_gbs = {v['bandwidth_gbs']}          # {notes.get('bandwidth_gbs', '')}",
    ]
    if "onchip_bytes" in v:
        lines += [
            f"onchip_bytes = {int(values['onchip_bytes'])}        # "
            f"{notes.get('onchip_bytes', '')}",
            f"onchip_bandwidth_gbs = {v['onchip_bandwidth_gbs']}",
        ]
    lines += [
        "",
        "[compute]",
        f"elementwise_gflops = {v['elementwise_gflops']}     # Add over an in-cache array",
        f"matmul_gflops = {v['matmul_gflops']}          # sgemm (64x256x256, 128x512x512)",
        f"conv_gflops = {v['conv_gflops']}            # 3x3 convolutions, 16 and 32 channels",
        f"reduction_gflops = {v['reduction_gflops']}       # ReduceSum over rows of 256",
        f"elementwise_op_us = {v['elementwise_op_us']}      # one NumPy call on a tiny tensor",
        f"matmul_op_us = {v['matmul_op_us']}",
        f"conv_op_us = {v['conv_op_us']}",
        f"reduction_op_us = {v['reduction_op_us']}",
        f"conv_group_us = {v['conv_group_us']}          # each group of a depthwise convolution",
        "",
        "# the cost of one element of each op, in Adds (reductions: in ReduceSums), measured",
        "[flops_per_element]",
    ]
    table = dict(base["flops_per_element"])
    table.update({k: round(x, 2) for k, x in flops.items()})
    lines += [f"{k} = {_toml_value(x)}" for k, x in table.items()]
    lines += ["", "[fusion]"]
    lines += [_commented(f"{k} = {_toml_value(x)}", k) for k, x in base["fusion"].items()]
    if "energy" in base:
        lines += ["", "# not measured (no power counters here): estimates copied from the base "
                      "file", "[energy]"]
        lines += [_commented(f"{k} = {_toml_value(x)}", k) for k, x in base["energy"].items()]
    return "\n".join(lines) + "\n"


_COMMENTS = {
    "elementwise": "elementwise chains fuse into one kernel",
    "max_anchors": "one contraction or reduction per kernel, epilogue after it",
    "prologue": "reductions that read a fused elementwise producer",
    "epilogue": "elementwise ops an anchor's kernel may carry",
    "epilogue_anchors": "anchors that may carry an epilogue",
    "launch_nj": "the interpreter's work around one kernel",
    "dram_pj_per_byte": "DDR traffic",
    "onchip_pj_per_byte": "L2/L3 traffic",
    "pj_per_flop": "a float op with its instruction overhead",
    "static_w": "one core's share of static power while a kernel runs",
}


def _commented(line: str, key: str) -> str:
    return f"{line:31s} # {_COMMENTS[key]}" if key in _COMMENTS else line


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)              # a TOML basic string: quotes and \\ escaped
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(x) for x in value) + "]"
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return f"{value:.1f}"
    return str(value)


def calibrate(quick: bool = False, base: str | Path | None = None,
              progress: Callable[[str], None] | None = None,
              output: str | Path | None = None) -> str:
    """Run the micro-benchmarks and return the text of a cost file (checked by loading it),
    named after `output` (the file it is for) and this machine (`target_name`)."""
    from ..resources import cost_model_file

    base_path = Path(base) if base else cost_model_file("cpu")
    if not base_path.is_file():
        raise EqsatFuseError(f"{base_path}: no such cost-model file")
    calibration = Calibration(quick, progress)
    values = calibration.run()
    text = render(values, calibration.notes, base_path, calibration.flops, target_name(output))
    _check(text)
    return text


def _check(text: str) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as handle:
        handle.write(text)
    try:
        load_cost_model(handle.name)
    finally:
        Path(handle.name).unlink(missing_ok=True)


def main(output: str, force: bool, quick: bool = False, base: str | None = None) -> int:
    """The CLI command: measure, then write `output` atomically (only with --force over a file)."""
    from ..files import write_atomically

    path = Path(output)
    if path.exists() and not force:
        raise EqsatFuseError(f"{path}: already exists; pass --force to replace it")

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    text = calibrate(quick, base, progress, output=path)
    write_atomically(path, lambda handle: handle.write(text.encode()), force=force)
    print(f"wrote {path}", file=sys.stderr)
    return 0
