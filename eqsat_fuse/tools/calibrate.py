"""`eqsat-fuse calibrate`: measure this machine and write a CPU cost file.

Micro-benchmarks, one thread, each the median (or best) of repeats:

- main-memory bandwidth: a copy of arrays far larger than the caches;
- on-chip bandwidth and size: copies of growing working sets; the largest set that still copies
  at least twice as fast as main memory gives `onchip_bytes` and its rate;
- the fixed cost of one operation of each class, through the NumPy backend's own evaluation
  (`ops.evaluate`) on tiny tensors: elementwise, MatMul, convolution, softmax;
- rates: elementwise (exp over an in-cache array), MatMul (sgemm), convolution (3x3), reductions
  (softmax rows), each after its fixed cost and its bytes are taken off;
- the extra cost of each group of a depthwise convolution (with two cases or more, fitted
  together with a cost per byte of its input, `depthwise_input_gbs`);
- on the Numba backend, the pass a contraction's epilogue makes over its output
  (`epilogue_pass_gbs`: a 1x1 convolution with and without a Relu);
- the per-kernel launch overhead of the NumPy backend (a one-op program's step, less the op),
  and, when Numba is installed, the call overhead of a compiled kernel (reported in a comment).

What cannot be measured here (FLOPs per element of each op, the fusion rules, the energy
figures) is copied from a base cost file, the shipped `cpu.toml` by default.

That is the NumPy backend's calibration (`Calibration`). `--backend numba` runs the same steps
through the Numba backend (`NumbaCalibration`, at the end of this file): each op a compiled
one-node program, at the sizes deployed models run.
"""

from __future__ import annotations

import functools

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
    """The measured figures, filled by `run`: the NumPy backend's prices. `seconds` times one
    operation and `fixed` says what of that time is not its work; `NumbaCalibration`
    replaces the two and the fixed-cost steps."""

    backend = "numpy"
    # MatMul (m, k, n) and 3x3 convolution (channels, size) whose rates are measured
    MATMUL_SIZES = ((64, 256, 256), (128, 512, 512))
    CONV_SIZES = ((16, 16), (32, 16))
    DEPTHWISE_CASES = ((64, 8, 1),)          # (channels, size, stride)
    ELEMENTWISE_SIZE = 1 << 14               # elements of the array elementwise ops run over

    def __init__(self, quick: bool = False, progress: Callable[[str], None] | None = None):
        self.quick = quick
        self.progress = progress or (lambda message: None)
        self.repeat = 3 if quick else 9
        self.values: dict[str, float] = {}
        self.notes: dict[str, str] = {}
        self.flops: dict[str, float] = {}        # measured flops_per_element

    # ops this backend computes as the inline loop body of a chain of others: price key ->
    # (the chain's one dear op, its other ops, each about an Add); never priced above that
    # chain, since what the two measure apart is noise and it would decide extraction
    COMPOSITES: dict[str, tuple[str, int]] = {}

    def steps(self) -> list[tuple[str, Callable[[], None]]]:
        return [("memory bandwidth", self.memory), ("operation overheads", self.overheads),
                ("elementwise rate", self.elementwise), ("MatMul rate", self.matmul),
                ("convolution rate", self.conv), ("reduction rates", self.reduction_table),
                ("launch overhead", self.launch)]

    def run(self) -> dict[str, float]:
        steps = self.steps()
        for number, (name, step) in enumerate(steps, 1):
            self.progress(f"[calibrate] {number}/{len(steps)} {name}...")
            step()
        return self.values

    def seconds(self, op: str, args: list, attrs: dict, number: int,
                constants: tuple[int, ...] = ()) -> float:
        """Seconds of one `op` over `args` (`constants`: the indices of the arguments that are
        weights of the model, not inputs; the NumPy backend makes no difference)."""
        return _time(lambda: evaluate(op, args, attrs), self.repeat, number)

    def fixed(self, rate_class: str) -> float:
        """Microseconds of a `seconds` figure that are not the operation's work."""
        return self.values[f"{rate_class}_op_us"]

    def sizes(self) -> dict[str, str]:
        """What the rates were measured on, for the cost file's comments."""
        def listed(sizes, form):
            return ", ".join(form.format(*size) for size in sizes)
        return {"matmul_gflops": "MatMul " + listed(self.MATMUL_SIZES, "{}x{}x{}"),
                "conv_gflops": "3x3 convolutions " + listed(self.CONV_SIZES, "{0} ch {1}x{1}"),
                "conv_group_us": "depthwise 3x3 " + listed(self.DEPTHWISE_CASES,
                                                           "{0} ch {1}x{1} stride {2}")}

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
        cases = {"elementwise": ("Add", [a, a], {}, (), number),
                 "matmul": ("MatMul", [m, m], {}, (1,), number),
                 "conv": ("Conv", [x, w, None], conv_attrs, (1,), number // 4),
                 "reduction": ("Softmax", [rows], {"axis": -1}, (), number)}
        for rate_class, (op, args, attrs, constants, times) in cases.items():
            self.values[f"{rate_class}_op_us"] = 0.0        # `fixed` before this one is known
            self.values[f"{rate_class}_op_us"] = max(
                0.0, 1e6 * self.seconds(op, args, attrs, times, constants)
                - self.fixed(rate_class))

    # ---- rates: time = fixed + flops / rate + bytes / bandwidth ----
    def _rate(self, seconds: float, fixed_us: float, flops: float, nbytes: float) -> float:
        bandwidth = self.values.get("onchip_bandwidth_gbs", self.values["bandwidth_gbs"])
        compute = seconds - fixed_us * 1e-6 - nbytes / (bandwidth * 1e9)
        compute = max(compute, 0.25 * seconds)          # never more than 4x the plain rate
        return flops / compute / 1e9

    def elementwise(self) -> None:
        """The rate of Add (1 FLOP per element) and every other elementwise op's cost per
        element relative to it (its `flops_per_element`), on an in-cache array."""
        n = self.ELEMENTWISE_SIZE >> (2 if self.quick else 0)
        rng = np.random.default_rng(0)
        x = rng.standard_normal(n).astype(np.float32)
        pos = np.abs(x) + np.float32(0.5)
        bandwidth = self.values.get("onchip_bandwidth_gbs", self.values["bandwidth_gbs"])
        fixed = self.fixed("elementwise")

        def per_element_us(key: str, args: list, attrs: dict, constants=()) -> float:
            seconds = self.seconds(key.split("(", 1)[0], args, attrs, 10, constants)
            moved = 4.0 * (len(args) + 1) / (bandwidth * 1e3)        # us per element
            return max((seconds * 1e6 - fixed) / n - moved, 0.05 * seconds * 1e6 / n)

        unit = per_element_us("Add", [x, x], {})
        self.values["elementwise_gflops"] = 1e-3 / unit
        bn = [np.ones(1, np.float32)] * 4
        # price key (an op, or `Op(attr=value)`: a form priced apart, see
        # docs/cost-models.md): (arguments, attributes, the arguments that are model weights)
        cases = {
            "Sigmoid": ([x], {}, ()), "Tanh": ([x], {}, ()), "Erf": ([x], {}, ()),
            # both Gelu forms: each must cost less than its own chain where it runs faster
            "Gelu": ([x], {"approximate": "none"}, ()),
            "Gelu(approximate=tanh)": ([x], {"approximate": "tanh"}, ()), "Exp": ([x], {}, ()),
            "Log": ([pos], {}, ()), "Sqrt": ([pos], {}, ()),
            # Pow by a constant 3, as models raise (GELU's x^3; x^2 of norms is as cheap): the
            # Numba backend writes small constant exponents as products, a general one is 10x
            "Pow": ([pos, np.float32(3.0)], {}, (1,)),
            "Div": ([x, pos], {}, ()), "Reciprocal": ([pos], {}, ()),
            "HardSigmoid": ([x], {"alpha": 0.2, "beta": 0.5}, ()), "HardSwish": ([x], {}, ()),
            "LeakyRelu": ([x], {"alpha": 0.1}, ()),
            "Clip": ([x, np.float32(0), np.float32(6)], {}, (1, 2)),
            "Where": ([x > 0, x, pos], {}, ()), "Cast": ([x], {"to": "float16"}, ()),
            "BatchNormalization": ([x.reshape(1, 1, n), *bn], {"epsilon": 1e-5}, (1, 2, 3, 4)),
            # per-tensor uint8 quantization and back, the scale and zero point constants
            "QuantizeLinear": ([x, np.float32(0.02), np.uint8(128)], {}, (1, 2)),
            "DequantizeLinear": ([(x * 40 + 128).clip(0, 255).astype(np.uint8), np.float32(0.02),
                                  np.uint8(128)], {}, (1, 2)),
        }
        # every other elementwise op of the operator table but those about as cheap as an Add:
        # its inputs inside its domain, its attributes at their ONNX defaults
        for op, spec in OPS.items():
            if spec.kind == "elementwise" and spec.reference is not None \
                    and op not in cases and op not in _ABOUT_ONE_ADD:
                cases[op] = ([{"any": x, "bool": x > 0}.get(spec.domain, pos)] * len(spec.inputs),
                             dict(spec.defaults), ())
        self.flops = {key: max(1.0, per_element_us(key, *case) / unit)
                      for key, case in self.elementwise_cases(cases).items()}
        for key, (inner, adds) in self.COMPOSITES.items():
            if key in self.flops and inner in self.flops:
                self.flops[key] = min(self.flops[key], self.flops[inner] + adds)

    def elementwise_cases(self, cases: dict) -> dict:
        """The elementwise ops whose cost per element is measured (all of them)."""
        return cases

    def reduction_table(self) -> None:
        """The rate of ReduceSum (1 FLOP per input element) and the others relative to it."""
        rows = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
        gamma = np.ones(256, np.float32)
        fixed = self.fixed("reduction")
        bandwidth = self.values.get("onchip_bandwidth_gbs", self.values["bandwidth_gbs"])

        def per_element_us(op: str, args: list, attrs: dict) -> float:
            constants = (1, 2) if op == "LayerNormalization" else ()
            seconds = self.seconds(op, args, attrs, 10, constants)
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
        for m, k, n in self.MATMUL_SIZES:
            a = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
            b = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
            seconds = self.seconds("MatMul", [a, b], {}, 5, (1,))
            rates.append(self._rate(seconds, self.fixed("matmul"), 2.0 * m * k * n,
                                    4.0 * (m * k + k * n + m * n)))
        self.values["matmul_gflops"] = float(np.median(rates))

    def conv(self) -> None:
        rng = np.random.default_rng(0)
        rates = []
        for channels, size in self.CONV_SIZES:
            x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
            w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
            attrs = dict(pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
            seconds = self.seconds("Conv", [x, w, None], attrs, 2, (1,))
            flops = 2.0 * channels * size * size * channels * 9
            rates.append(self._rate(seconds, self.fixed("conv"), flops,
                                    4.0 * (2 * x.size + w.size)))
        self.values["conv_gflops"] = float(np.median(rates))
        self.depthwise()

    def depthwise(self) -> None:
        """Depthwise 3x3 convolutions (a group per channel): the time beyond the fixed cost,
        the bytes and the taps at the convolution rate, fitted over the cases (non-negative
        least squares) as a cost per group (conv_group_us) and per byte of the input, which the
        kernel reorders into blocks of channels (depthwise_input_gbs). On the Numba backend
        (Zen 4) the convolution rate with a cost per group alone priced MobileNetV2's 17
        depthwise layers at 0.6x what they took; a stride-2 layer reads four input elements
        an output. Fewer than two cases: the cost per group alone, the least over them."""
        rng = np.random.default_rng(0)
        rows, extra = [], []
        for channels, size, stride in self.DEPTHWISE_CASES:
            x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
            w = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)
            attrs = dict(pads=(1, 1, 1, 1), strides=(stride, stride), dilations=(1, 1),
                         group=channels)
            seconds = self.seconds("Conv", [x, w, None], attrs, 2, (1,))
            out = channels * math.ceil(size / stride) ** 2
            rest = (self.fixed("conv") + 18.0 * out / (self.values["conv_gflops"] * 1e3)
                    + self._bytes_us(4.0 * (x.size + out + w.size)))
            rows.append(([channels - 1, 4.0 * x.size], seconds * 1e6 - rest))
            extra.append((seconds * 1e6 - rest) / (channels - 1))
        if len(rows) < 2:
            self.values["conv_group_us"] = max(0.0, float(min(extra)))
            return
        from scipy.optimize import nnls
        (group, byte), _ = nnls(np.array([r for r, _ in rows]), np.array([t for _, t in rows]))
        self.values["conv_group_us"] = float(group)
        if byte > 0:
            self.values["depthwise_input_gbs"] = float(1.0 / (byte * 1e3))

    def _bytes_us(self, nbytes: float) -> float:
        """Microseconds the cost model charges a kernel that moves `nbytes`."""
        onchip = self.values.get("onchip_bytes", 0.0)
        if nbytes <= onchip:
            return nbytes / (self.values["onchip_bandwidth_gbs"] * 1e3)
        return nbytes / (self.values["bandwidth_gbs"] * 1e3)

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


_PRICES = {
    "numpy": ["# Prices are those of the NumPy backend: each operation of a kernel body is a "
              "NumPy call", "# with a fixed cost, and a kernel adds the backend's per-step "
              "overhead."],
    "numba": ["# Prices are those of the Numba backend: a kernel is one compiled loop nest, so an",
              "# operation fused into it has no call of its own; one more kernel in a run costs",
              "# launch_us."],
}


def render(values: dict[str, float], notes: dict[str, str], base_path: Path,
           flops: dict[str, float] | None = None, name: str | None = None,
           backend: str = "numpy", sizes: dict[str, str] | None = None) -> str:
    """The cost file text: measured keys from `values`, the rest copied from the base file;
    `name` is its [target] name (default `target_name(None)`), `backend` the backend measured
    and `sizes` what each rate was measured on (by key)."""
    import tomllib

    base = tomllib.loads(base_path.read_text())
    flops = flops or {}
    sizes = {"matmul_gflops": "sgemm", "conv_gflops": "3x3 convolutions",
             "conv_group_us": "depthwise 3x3", "attention_gflops": "FusedAttention",
             **(sizes or {})}
    v = {k: round(x, 4) if x < 100 else round(x, 1) for k, x in values.items()}
    description = (f"{platform.node() or 'this machine'} ({platform.machine()}), measured by "
                   f"eqsat-fuse calibrate on {date.today().isoformat()}, one thread per kernel")
    lines = [
        "# Cost model of this machine's CPU, measured by `eqsat-fuse calibrate` on "
        f"{date.today().isoformat()}",
        f"# ({platform.machine()}, {platform.processor() or platform.system()}, "
        f"Python {platform.python_version()}, NumPy {np.__version__}; one thread).",
        *_PRICES[backend],
        f"# Keys not measured here are copied from {base_path.name}. Every key: "
        "docs/cost-models.md.",
        "",
        "[target]",
        f"name = {_toml_value(name or target_name(None))}",
        f"description = {_toml_value(description)}",
        f"backend = {_toml_value(backend)}",
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
    if "epilogue_pass_gbs" in v:
        lines.append(f"epilogue_pass_gbs = {v['epilogue_pass_gbs']}       # a contraction's "
                     f"epilogue: its pass over the output (1x1 convolution + Relu)")
    lines += [
        "",
        "[compute]",
        f"elementwise_gflops = {v['elementwise_gflops']}     # Add over an in-cache array",
        f"matmul_gflops = {v['matmul_gflops']}          # {sizes['matmul_gflops']}",
        f"conv_gflops = {v['conv_gflops']}            # {sizes['conv_gflops']}",
        *([f"int8_matmul_gflops = {v['int8_matmul_gflops']}     # MatMulInteger, the same "
           "sizes", f"int8_conv_gflops = {v['int8_conv_gflops']}       # ConvInteger, the same "
           "sizes"] if "int8_matmul_gflops" in v else []),
        *([f"attention_gflops = {v['attention_gflops']}       # {sizes['attention_gflops']}",
           f"attention_op_us = {v['attention_op_us']}        # its fixed cost: packing each "
           "head's k and v"] if "attention_gflops" in v else []),
        f"reduction_gflops = {v['reduction_gflops']}       # ReduceSum over rows of 256",
        f"elementwise_op_us = {v['elementwise_op_us']}      # "
        f"{notes.get('elementwise_op_us', 'one Add on a tiny tensor')}",
        f"matmul_op_us = {v['matmul_op_us']}",
        f"conv_op_us = {v['conv_op_us']}",
        f"reduction_op_us = {v['reduction_op_us']}",
        f"conv_group_us = {v['conv_group_us']}          # each group of a depthwise convolution"
        f" ({sizes['conv_group_us']})",
        *([f"depthwise_input_gbs = {v['depthwise_input_gbs']}    # its input, reordered into "
           "blocks of channels (the same cases)"] if "depthwise_input_gbs" in v else []),
        "",
        "# the cost of one element of each op, in Adds (reductions: in ReduceSums), measured",
        "[flops_per_element]",
    ]
    table = dict(base["flops_per_element"])
    table.update({k: round(x, 2) for k, x in flops.items()})
    lines += [f"{_toml_key(k)} = {_toml_value(x)}" for k, x in table.items()]
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


def _toml_key(key: str) -> str:
    """A bare TOML key, or a quoted one (`"Gelu(approximate=tanh)"`)."""
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


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
              output: str | Path | None = None, backend: str | None = None) -> str:
    """Run the micro-benchmarks of `backend` (default: the one `ef.compile` uses) and return
    the text of a cost file (checked by loading it), named after `output` (the file it is for)
    and this machine (`target_name`)."""
    from ..backends import resolve_backend
    from ..resources import cost_model_file

    base_path = Path(base) if base else cost_model_file("cpu")
    if not base_path.is_file():
        raise EqsatFuseError(f"{base_path}: no such cost-model file")
    backend = resolve_backend(backend)
    kind = NumbaCalibration if backend == "numba" else Calibration
    calibration = kind(quick, progress)
    values = calibration.run()
    text = render(values, calibration.notes, base_path, calibration.flops, target_name(output),
                  backend, calibration.sizes())
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


def main(output: str, force: bool, quick: bool = False, base: str | None = None,
         backend: str | None = None) -> int:
    """The CLI command: measure, then write `output` atomically (only with --force over a file)."""
    from ..files import write_atomically

    path = Path(output)
    if path.exists() and not force:
        raise EqsatFuseError(f"{path}: already exists; pass --force to replace it")

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    text = calibrate(quick, base, progress, output=path, backend=backend)
    write_atomically(path, lambda handle: handle.write(text.encode()), force=force)
    print(f"wrote {path}", file=sys.stderr)
    return 0


# ---- the Numba backend ----------------------------------------------------------------------
#
# The same micro-benchmarks as the NumPy backend's (`Calibration`), each run the way a model
# runs: the operation is a one-node ONNX model (weights as initializers, so that MatMul and
# Conv get their packed panels), compiled by the Numba backend for one thread, and its program's
# steps are timed under the program's own thread settings. What that changes:
#
# - `launch_us` is a whole kernel's step on a tiny tensor (the Python step, the call into the
#   compiled kernel and its loop set-up); a fused body has no per-operation call, so
#   `elementwise_op_us` is what a second op fused into a one-op kernel adds, about zero;
# - the fixed cost of a MatMul, convolution or softmax is its tiny kernel less `launch_us`;
# - rates come from sizes that deployed models run (MatMuls of transformer layers, ResNet-like
#   3x3 convolutions, a MobileNet-like depthwise one), since the backend takes other paths for
#   tiny ones.
#
# Every kernel is compiled once; the kernel cache keeps the machine code for the next
# calibration, so the first one on a machine takes about a minute and later ones seconds.


class NumbaCalibration(Calibration):
    """The Numba backend's figures: `seconds` runs a compiled one-node program."""

    backend = "numba"
    MATMUL_SIZES = ((128, 768, 768), (128, 768, 3072), (196, 512, 512))
    CONV_SIZES = ((64, 56), (128, 28), (256, 14))
    DEPTHWISE_CASES = ((144, 56, 1), (96, 112, 2), (144, 56, 2), (384, 14, 1), (960, 7, 1))
    EPILOGUE_CASE = (8, 64, 56)              # a 1x1 convolution: in, out channels, size
    ATTENTION_SEQS = (128, 1024)              # queries = keys, 12 heads of 64
    # 1 MiB a tensor: on chip, the regime of onchip_bandwidth_gbs, so that what an op costs
    # beyond its bytes is the arithmetic its loop cannot hide behind them
    ELEMENTWISE_SIZE = 1 << 18
    # elementwise ops timed in --quick (the others keep the base file's figures)
    QUICK_OPS = ("Sigmoid", "Exp", "Erf")
    run_us = 0.0             # a run's own cost (feeds' addresses, the dispatch): `launch`
    # approx.gelu_f32 is 0.5 x (1 + erf_f32(x / sqrt 2)); gelu_tanh_f32 is
    # 0.5 x (1 + tanh_f32(sqrt(2/pi) (x + 0.044715 x^3)))
    COMPOSITES = {"Gelu": ("Erf", 4), "Gelu(approximate=tanh)": ("Tanh", 7)}

    def __init__(self, quick: bool = False, progress=None):
        super().__init__(quick, progress)
        if quick:
            self.CONV_SIZES = ((32, 28),)
            self.MATMUL_SIZES = ((64, 256, 256),)
            self.DEPTHWISE_CASES = ((32, 28, 1),)
            self.EPILOGUE_CASE = (16, 32, 28)
            self.ATTENTION_SEQS = (64, 256)

    def sizes(self) -> dict[str, str]:
        return {**super().sizes(), "attention_gflops": "FusedAttention, 12 heads of 64, fitted "
                f"at {' and '.join(map(str, self.ATTENTION_SEQS))} queries with attention_op_us"}

    def steps(self):
        return [("memory bandwidth", self.memory), ("launch overhead", self.launch),
                ("operation overheads", self.overheads), ("elementwise rate", self.elementwise),
                ("MatMul rate", self.matmul), ("convolution rate", self.conv),
                ("int8 rates", self.int8), ("epilogue pass", self.epilogue),
                ("attention rate", self.attention), ("reduction rates", self.reduction_table)]

    def int8(self) -> None:
        """MatMulInteger and ConvInteger (uint8 activations by constant int8 weights, the
        integer kernels), on the sizes of the float rates."""
        rng = np.random.default_rng(0)
        rates = []
        for m, k, n in self.MATMUL_SIZES:
            a = rng.integers(0, 256, (m, k)).astype(np.uint8)
            b = rng.integers(-128, 128, (k, n)).astype(np.int8)
            seconds = self.seconds("MatMulInteger", [a, b, None, None], {}, 5, (1,))
            rates.append(self._rate(seconds, self.fixed("matmul"), 2.0 * m * k * n,
                                    m * k + k * n + 4.0 * m * n))
        self.values["int8_matmul_gflops"] = float(np.median(rates))
        rates = []
        for channels, size in self.CONV_SIZES:
            x = rng.integers(0, 256, (1, channels, size, size)).astype(np.uint8)
            w = rng.integers(-128, 128, (channels, channels, 3, 3)).astype(np.int8)
            attrs = dict(pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
            seconds = self.seconds("ConvInteger", [x, w, None, None], attrs, 2, (1,))
            rates.append(self._rate(seconds, self.fixed("conv"),
                                    2.0 * channels * size * size * channels * 9,
                                    2 * x.size + w.size + 4.0 * x.size))
        self.values["int8_conv_gflops"] = float(np.median(rates))

    def attention(self) -> None:
        """FusedAttention: softmax(q @ kt * 0.125) @ v of 12 heads of 64 at the two sizes of
        `ATTENTION_SEQS` (queries = keys), the exported pattern fused by the attention rules
        into the kernel. Its time is fitted as a fixed cost (attention_op_us: the packing of
        every head's k and v, which a short sequence does not amortize) plus a rate
        (attention_gflops, counting 2 (D + Dv) FLOPs per score; the softmax's work is in it)."""
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(0)
        heads, depth = 12, 64
        points = []
        for seq in self.ATTENTION_SEQS:
            shapes = {"q": (1, heads, seq, depth), "kt": (1, heads, depth, seq),
                      "v": (1, heads, seq, depth)}
            graph = helper.make_graph(
                [helper.make_node("MatMul", ["q", "kt"], ["s"]),
                 helper.make_node("Mul", ["s", "c"], ["z"]),
                 helper.make_node("Softmax", ["z"], ["p"], axis=-1),
                 helper.make_node("MatMul", ["p", "v"], ["y"])], "attention",
                [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                 for n, s in shapes.items()],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, shapes["q"])],
                [numpy_helper.from_array(np.array(0.125, np.float32), "c")])
            program = _compile(helper.make_model(graph, opset_imports=[
                helper.make_opsetid("", 17)]), target=attention_target())
            if [k.ops for k in program.plan.kernels] != [["FusedAttention"]]:
                return            # not formed (no attention rules): not measured
            feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
            overhead = (self.run_us + self.values["launch_us"]) * 1e-6     # the run's, a kernel's
            seconds = self._program_seconds(program, feeds, 1) - overhead
            points.append((4.0 * heads * seq * seq * depth, seconds))
        (f0, t0), (f1, t1) = points
        rate = (f1 - f0) / max(t1 - t0, 1e-9) / 1e9
        self.values["attention_gflops"] = float(rate)
        self.values["attention_op_us"] = float(max(0.0, t0 - f0 / (rate * 1e9)) * 1e6)

    def epilogue(self) -> None:
        """What an epilogue costs beyond its ops: the pass the kernel makes over a
        contraction's output block after the product (read and written again, in cache). A 1x1
        convolution (`EPILOGUE_CASE`) timed with and without a Relu after it; the difference,
        less the Relu's own work, over twice the output's bytes is epilogue_pass_gbs."""
        cin, cout, size = self.EPILOGUE_CASE
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, cin, size, size)).astype(np.float32)
        w = rng.standard_normal((cout, cin, 1, 1)).astype(np.float32)
        attrs = dict(pads=(0, 0, 0, 0), strides=(1, 1), dilations=(1, 1), group=1)
        bare = self.seconds("Conv", [x, w, None], attrs, 20, (1,))
        fused = self.seconds("Conv", [x, w, None], attrs, 20, (1,), epilogue=("Relu",))
        out = cout * size * size
        relu = self.values["elementwise_op_us"] + out / (self.values["elementwise_gflops"] * 1e3)
        extra = (fused - bare) * 1e6 - relu
        if extra > 0:
            self.values["epilogue_pass_gbs"] = 8.0 * out / (extra * 1e3)

    def seconds(self, op: str, args: list, attrs: dict, number: int,
                constants: tuple[int, ...] = (), epilogue: tuple[str, ...] = ()) -> float:
        program = _program(op, args, attrs, constants, epilogue)
        feeds = {f"a{i}": a for i, a in enumerate(args) if a is not None and i not in constants}
        return self._program_seconds(program, feeds, number)

    def fixed(self, rate_class: str) -> float:
        return (self.run_us + self.values["launch_us"]
                + self.values.get(f"{rate_class}_op_us", 0.0))

    def _program_seconds(self, program, feeds: dict, number: int) -> float:
        """Seconds of one run of what the program's runs execute (its segments of compiled
        kernels; no feeding or output copies), under its thread settings."""
        from ..threads import governed

        _, env = program_steps(program, feeds)
        steps = program.run_steps

        def run():
            for step in steps:
                step(env)

        with governed(program.threads, program.blas_threads, program.numba_threads):
            return _time(run, self.repeat, number)

    def launch(self) -> None:
        """What one more kernel adds to a run: programs of 4 and of 32 one-op kernels on 16
        elements, the difference per kernel (with a 16-element Softmax's work); what is left
        of the 4 is the run's own cost (`run_us`, subtracted from every figure below, never
        charged per kernel)."""
        from onnx import TensorProto, helper

        number = 50 if self.quick else 400
        seconds = {}
        for count in (4, 32):
            # a chain of Softmaxes: a kernel each (one reduction a kernel), every value but the
            # last one in the arena, as a model's are (a run's feeds and outputs cost more)
            names = ["a0", *[f"t{i}" for i in range(count - 1)], "y"]
            graph = helper.make_graph(
                [helper.make_node("Softmax", [names[i]], [names[i + 1]], axis=-1)
                 for i in range(count)], "chain",
                [helper.make_tensor_value_info("a0", TensorProto.FLOAT, [16])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
            program = _compile(helper.make_model(graph,
                                                 opset_imports=[helper.make_opsetid("", 21)]))
            if len(program.steps) != count:     # the slope would not be per kernel
                raise EqsatFuseError(f"calibrate: a chain of {count} Softmaxes compiled to "
                                     f"{len(program.steps)} kernels, not one each")
            seconds[count] = 1e6 * self._program_seconds(
                program, {"a0": np.ones(16, np.float32)}, number)
        self.values["launch_us"] = max(0.01, (seconds[32] - seconds[4]) / 28)
        self.run_us = max(0.0, seconds[4] - 4 * self.values["launch_us"])
        self.notes["launch_us"] = (f"Numba backend: one more kernel in a run (a run's own "
                                   f"{self.run_us:.1f} us not charged)")

    def overheads(self) -> None:
        """The class figures as tiny one-node programs less `fixed`; an elementwise op's
        as what a second op fused into a one-op kernel adds (a one-node Add would count the
        passing of its second input, which the cost model does not charge per op)."""
        super().overheads()
        from onnx import TensorProto, helper

        x = np.ones(16, np.float32)
        number = 50 if self.quick else 400
        seconds = []
        for chain in (["Relu"], ["Neg", "Relu"]):
            names = ["a0", *[f"t{i}" for i in range(len(chain) - 1)], "y"]
            graph = helper.make_graph(
                [helper.make_node(op, [names[i]], [names[i + 1]]) for i, op in enumerate(chain)],
                "chain", [helper.make_tensor_value_info("a0", TensorProto.FLOAT, [16])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
            program = _compile(helper.make_model(graph,
                                                 opset_imports=[helper.make_opsetid("", 21)]))
            seconds.append(self._program_seconds(program, {"a0": x}, number))
        self.values["elementwise_op_us"] = max(0.0, 1e6 * (seconds[1] - seconds[0]))
        self.notes["elementwise_op_us"] = "a second op fused into a one-op kernel"

    def elementwise_cases(self, cases: dict) -> dict:
        if not self.quick:
            return cases
        return {op: case for op, case in cases.items() if op in self.QUICK_OPS}


def _program(op: str, args: list, attrs: dict, constants: tuple[int, ...],
             epilogue: tuple[str, ...] = ()):
    """The Numba program of one `op` node: argument i is graph input `a{i}`, or an initializer
    when i is in `constants`; None is an absent input. `epilogue`: one-input elementwise ops
    applied to its output, one after the other."""
    from onnx import helper, numpy_helper, shape_inference

    attrs = dict(attrs)
    if op in ("ReduceSum", "ReduceMean") and "axes" in attrs:     # an input since opset 18
        args = [args[0], np.asarray(attrs.pop("axes"), np.int64)]
        constants = (*constants, 1)
    inputs, initializers, names = [], [], []
    for i, arg in enumerate(args):
        if arg is None:
            names.append("")
            continue
        name, value = f"a{i}", np.asarray(arg)
        names.append(name)
        if i in constants:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
    if op == "Cast":                          # the operator table's dtype name, ONNX's number
        attrs["to"] = helper.np_dtype_to_tensor_dtype(np.dtype(attrs["to"]))
    outs = [f"e{i}" for i in range(len(epilogue))] + ["y"]
    nodes = [helper.make_node(op, names, [outs[0]], **attrs)]
    nodes += [helper.make_node(e, [outs[i]], [outs[i + 1]]) for i, e in enumerate(epilogue)]
    graph = helper.make_graph(nodes, op, inputs, [helper.make_empty_tensor_value_info("y")],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return _compile(shape_inference.infer_shapes(model, strict_mode=True))


@functools.lru_cache(maxsize=None)
def attention_priced(gflops: float, op_us: float, name: str) -> str:
    """A copy of the shipped cpu cost file with FusedAttention priced at `gflops` and `op_us`
    instead, named `name`, written once per process to a temporary folder: where it always
    pays (`attention_target`) or never (bench/attention.py's unfused program)."""
    import tempfile

    from ..extraction.costmodel import load_cost_model

    lines = [line for line in Path(load_cost_model("cpu").path).read_text().splitlines()
             if not line.startswith(("attention_gflops", "attention_op_us"))]
    at = next(i for i, line in enumerate(lines) if line.startswith("matmul_gflops"))
    lines[at + 1:at + 1] = [f"attention_gflops = {gflops!r}", f"attention_op_us = {op_us!r}"]
    path = Path(tempfile.mkdtemp(prefix="eqsat-fuse-cost-")) / f"{name}.toml"
    path.write_text("\n".join(lines).replace('name = "cpu"', f'name = "{name}"') + "\n")
    return str(path)


def attention_target() -> str:
    """The cpu cost file in which FusedAttention always pays, so that the attention step
    measures the kernel at sizes where the shipped prices keep the unfused form."""
    return attention_priced(1e6, 0.0, "cpu-attention")


def _compile(model, target: str | None = None):
    from ..pipeline import compile as compile_model

    return compile_model(model, target=target or "cpu", backend="numba", threads=1).program
