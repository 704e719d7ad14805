"""Quantized models: eqsat-fuse (Numba) against onnxruntime on the same int8 file, beside the
float model (issue 18).

    .venv/bin/python bench/int8.py [--threads N | --threads default] [--forms qdq,dynq,qop]
                                   [--out DIR] FLOAT_MODEL.onnx ...

Each float model is quantized by onnxruntime's own tool (tests/models/quantize_models.py:
static QDQ per channel, uint8 activations calibrated on eight seeded inputs; dynamic with
MatMulInteger / ConvInteger; `qop`, on request: the static quantization in QOperator format,
QLinearConv and onnxruntime's com.microsoft QLinear operators) into DIR (default /tmp/eqsat-fuse-int8; reused when there). Then,
timed round-robin in blocks (bench/_common.py `measure`; each runtime alone in its block, after
a pause), medians:

- `ort all` / `ort none`: onnxruntime ORT_ENABLE_ALL / ORT_DISABLE_ALL on the int8 file;
- `ef int8`: eqsat-fuse, Numba backend, on the int8 file; `ef float` and `ort float`: the
  float model;
- `x all` = ef int8 / ort all (lower is better), `int8/float` = ef int8 / ef float.

Accuracy, over 8 seeded inputs: the largest difference of the first output from ORT_DISABLE_ALL
(the QDQ semantics op by op) for eqsat-fuse (`ef-none`) and for ORT_ENABLE_ALL (`all-none`),
the output's magnitude, and how often the top-1 class (argmax) agrees with ORT_DISABLE_ALL.
Memory: bytes of weights (initializers) of each file, the constants eqsat-fuse's compiled int8
program holds (`ef consts`: int8 weights where integer kernels read them, floats where a float
contraction or a Gather reads dequantized ones), and its peak arena for int8 and float.

`--threads N` pins onnxruntime's intra-op threads, eqsat-fuse's `threads=` and the BLAS/OpenMP
pools to N (default 1); `--threads default` leaves every runtime at its own default.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import exit_on_help, pop_option, set_threads  # noqa: E402

exit_on_help(sys.argv)
DEFAULTS = "--threads" in sys.argv and sys.argv[sys.argv.index("--threads") + 1] == "default"
if DEFAULTS:
    pop_option(sys.argv, "--threads", "default")
THREADS = None if DEFAULTS else set_threads(sys.argv)
FORMS = pop_option(sys.argv, "--forms", "qdq,dynq").split(",")
OUT = Path(pop_option(sys.argv, "--out", "/tmp/eqsat-fuse-int8"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from _common import block_size, geomean, measure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "models"))
from quantize_models import quantize_file, sample_inputs  # noqa: E402


def _session(path: Path, optimize: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if THREADS is not None:
        options.intra_op_num_threads = THREADS
        options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _compile(path: Path):
    kwargs = {} if THREADS is None else {"threads": THREADS}
    return ef.compile(path, backend="numba", **kwargs)


def _weight_bytes(path: Path) -> int:
    model = onnx.load(str(path))
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _accuracy(path: Path, float_path: Path, compiled, none, everything) -> dict:
    first = none.get_outputs()[0].name
    worst_ef = worst_all = magnitude = 0.0
    top_ef = top_all = 0
    feeds = sample_inputs(float_path, 8, seed=5)
    for feed in feeds:
        want = none.run([first], feed)[0]
        fused = everything.run([first], feed)[0]
        got = np.asarray(compiled.run(feed)[first])
        worst_ef = max(worst_ef, float(np.max(np.abs(got - want))))
        worst_all = max(worst_all, float(np.max(np.abs(fused - want))))
        magnitude = max(magnitude, float(np.max(np.abs(want))))
        top_ef += int(np.argmax(got) == np.argmax(want))
        top_all += int(np.argmax(fused) == np.argmax(want))
    return dict(ef_none=worst_ef, all_none=worst_all, magnitude=magnitude,
                top_ef=f"{top_ef}/{len(feeds)}", top_all=f"{top_all}/{len(feeds)}")


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip())
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"threads: {'each runtime default' if DEFAULTS else THREADS}; medians of blocks; "
          f"machine: {os.cpu_count()} cores")
    head = (f"{'model':34s} {'ort all':>8s} {'ort none':>8s} {'ef int8':>8s} {'ef float':>8s} "
            f"{'ort float':>9s} | {'x all':>6s} {'int8/float':>10s} | {'ef-none':>8s} "
            f"{'all-none':>8s} {'|out|':>6s} {'top1 ef':>7s} {'top1 all':>8s} | "
            f"{'weights int8/float':>18s} {'ef consts':>9s} {'peak int8/float':>15s} "
            f"{'kernels':>9s}")
    print(head)
    print("-" * len(head))
    ratios: dict[str, list[float]] = {}
    for float_path in map(Path, paths):
        compiled_float = _compile(float_path)
        ort_float = _session(float_path, True)
        feed = sample_inputs(float_path, 1)[0]
        for form in FORMS:
            path = OUT / f"{float_path.stem}_{form}.onnx"
            if not path.exists():
                print(f"  quantizing {float_path.name} ({form}) ...", file=sys.stderr)
                quantize_file(float_path, path, form)
            compiled = _compile(path)
            everything, none = _session(path, True), _session(path, False)
            times = measure({
                "ort all": lambda: everything.run(None, feed),
                "ort none": lambda: none.run(None, feed),
                "ef int8": lambda: compiled.run(feed),
                "ef float": lambda: compiled_float.run(feed),
                "ort float": lambda: ort_float.run(None, feed),
            }, repeat=20, min_time=1.0, max_time=30.0,
                block=block_size(THREADS or os.cpu_count() or 1))
            acc = _accuracy(path, float_path, compiled, none, everything)
            ms = {k: v * 1e3 for k, v in times.items()}
            ratio = ms["ef int8"] / ms["ort all"]
            ratios.setdefault(form, []).append(ratio)
            kernels = sum(k["kind"] != "alias" for k in compiled.report.as_dict()["kernels"])
            float_kernels = sum(k["kind"] != "alias"
                                for k in compiled_float.report.as_dict()["kernels"])
            weights = f"{_weight_bytes(path) / 2**20:.1f}/{_weight_bytes(float_path) / 2**20:.1f}M"
            held = sum(np.asarray(v).nbytes for v in compiled.program.constants.values())
            peak = (f"{compiled.report.peak_bytes / 2**20:.2f}/"
                    f"{compiled_float.report.peak_bytes / 2**20:.2f}M")
            print(f"{path.stem:34s} {ms['ort all']:8.2f} {ms['ort none']:8.2f} "
                  f"{ms['ef int8']:8.2f} {ms['ef float']:8.2f} {ms['ort float']:9.2f} | "
                  f"{ratio:6.2f} {ms['ef int8'] / ms['ef float']:10.2f} | "
                  f"{acc['ef_none']:8.3g} {acc['all_none']:8.3g} {acc['magnitude']:6.3g} "
                  f"{acc['top_ef']:>7s} {acc['top_all']:>8s} | {weights:>18s} "
                  f"{held / 2**20:8.1f}M {peak:>15s} "
                  f"{kernels:>4d}/{float_kernels:<4d}", flush=True)
            opaque = compiled.report.opaque_ops
            if opaque:
                print(f"  {path.stem}: run through onnx.reference: {', '.join(opaque)}")
    for form, values in ratios.items():
        print(f"geometric mean ef int8 / ort all ({form}): {geomean(values):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
