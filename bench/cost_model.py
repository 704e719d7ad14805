"""How well does the cost model rank kernels? Predicted vs measured time of every kernel.

    .venv/bin/python bench/cost_model.py [--target cpu] [--backend numpy] [--big] [MODEL.onnx ...]

Each model (default: tests/models/*.onnx; --big adds the ~1,500-node synthetic ResNet and BERT
of bench/extract_models.py) is compiled for the target; the program runs once on random inputs,
then every kernel (every step of the lowered program) is timed in isolation, median of repeats,
on the buffers of that run. The rank correlation (Spearman) between the cost model's predicted
microseconds and the measured ones is printed per model and over all kernels. Threads are left
as the programs run them (as `eqsat-fuse calibrate` measures them). BENCH_VERBOSE=-v lists
every kernel.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import eqsat_fuse as ef  # noqa: E402
from _common import exit_on_help  # noqa: E402
from eqsat_fuse.tools.calibrate import program_steps  # noqa: E402
from eqsat_fuse.checking.verify import random_feeds  # noqa: E402


def median_us(fn, repeat: int = 15, min_seconds: float = 0.02) -> float:
    """Median wall time of fn() in microseconds, over >= `repeat` runs and >= `min_seconds`."""
    fn()
    times = []
    started = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - started < min_seconds:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if len(times) > 2000:
            break
    return float(np.median(times)) * 1e6


def kernel_times(compiled) -> list[tuple[str, str, float, float]]:
    """(kernel name, ops, predicted us, measured us) for every step of the program."""
    program, report = compiled.program, compiled.report
    steps, env = program_steps(program, random_feeds(compiled.plan.inputs, 0))
    # the steps are the kernels that are not plain views (a view that needs a copy has a step)
    stepped = [k for k in program.plan.kernels
               if k.kind != "alias" or program.layouts[k.output].storage == k.output]
    if len(stepped) != len(steps):
        raise RuntimeError(f"{report.model}: {len(steps)} steps for {len(stepped)} kernels")
    predicted = {k.name: k.predicted_us for k in report.kernels}
    rows = []
    for kernel, step in zip(stepped, steps):
        rows.append((kernel.name, "+".join(kernel.ops), predicted[kernel.name],
                     median_us(lambda: step(env))))
    return rows


def main(argv: list[str]) -> int:
    target, backend, big = "cpu", "numpy", False
    paths: list = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--target":
            target = args.pop(0)
        elif arg == "--backend":
            backend = args.pop(0)
        elif arg == "--big":
            big = True
        else:
            paths.append(Path(arg))
    if not paths:
        paths = sorted((ROOT / "tests" / "models").glob("*.onnx"))
    models = [(p.stem, str(p)) for p in paths]
    if big:
        from extract_models import MODELS
        models += [(name, build()) for name, build in MODELS.items()]

    print(f"target {target}, backend {backend}; kernel times: median of repeats, microseconds")
    print(f"{'model':28s} {'kernels':>7s} {'spearman':>8s} {'pred sum':>9s} {'meas sum':>9s}")
    everything = []
    for name, model in models:
        compiled = ef.compile(model, target=target, backend=backend)
        rows = kernel_times(compiled)
        everything += rows
        pred = [r[2] for r in rows]
        meas = [r[3] for r in rows]
        rho = spearmanr(pred, meas).statistic if len(rows) > 2 else float("nan")
        print(f"{name:28s} {len(rows):7d} {rho:8.3f} {sum(pred):9.1f} {sum(meas):9.1f}",
              flush=True)
    pred = [r[2] for r in everything]
    meas = [r[3] for r in everything]
    rho = spearmanr(pred, meas).statistic
    print(f"{'all kernels':28s} {len(everything):7d} {rho:8.3f} {sum(pred):9.1f} {sum(meas):9.1f}")
    if "-v" in os.environ.get("BENCH_VERBOSE", ""):
        for row in sorted(everything, key=lambda r: r[3]):
            print(f"  {row[0]:>6s} {row[1][:50]:50s} pred {row[2]:9.2f} meas {row[3]:9.2f}")
    return 0


if __name__ == "__main__":
    exit_on_help(sys.argv)
    sys.exit(main(sys.argv[1:]))
