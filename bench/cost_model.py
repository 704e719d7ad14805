"""How well does the cost model predict the backend? Kernel ranks and the saving of fusion.

    .venv/bin/python bench/cost_model.py [--target cpu] [--backend numba] [--threads 1] [--big]
                                         [--no-fusion-saving] [MODEL.onnx ...]

Each model (default: the realistic exports in /work/bench-models if present, bench/README.md,
else tests/models/*.onnx; --big adds the ~1,500-node synthetic ResNet and BERT of
bench/extract_models.py) is compiled for the target on the backend (default: the one
`ef.compile` uses) at `--threads` (default 1, as `eqsat-fuse calibrate` measures). Then:

- every kernel (every step of the lowered program) is timed alone, median of repeats, in
  `ROUNDS` interleaved rounds (its time: the median of its rounds), on the buffers of one run,
  under the program's thread settings; the rank correlation (Spearman) between the cost
  model's predicted microseconds and the measured ones is printed per model and over all
  kernels, beside the measurement's own ("rounds": the median Spearman between
  two rounds of the kernels' timings, the most any prediction can reach on this machine);
- the model is compiled again with no rewriting (compare's strategy `none`: iterations 0); the
  predicted saving of fusion, 1 - cost(fused) / cost(none), is printed beside two measured
  ones, each with the ratio predicted / measured: over the kernels (the sums of the kernels'
  times, each timed alone as above: what the cost model adds up) and over whole runs (both
  programs timed in alternating blocks, medians: what a user sees, with the cache effects
  between kernels that no per-kernel price has), with a bootstrap 90% interval of the
  median saving over the rounds of blocks, and whether a saving within 1.5x of the predicted
  one lies in it (a saving of 1-2% is within this machine's noise: its interval says so).

BENCH_VERBOSE=-v lists every kernel.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import exit_on_help  # noqa: E402

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from eqsat_fuse.checking.verify import random_feeds  # noqa: E402
from eqsat_fuse.saturation.saturate import Budgets  # noqa: E402
from eqsat_fuse.threads import governed  # noqa: E402
from eqsat_fuse.tools.calibrate import program_steps  # noqa: E402

REAL = Path("/work/bench-models")
ROUNDS = 5               # rounds of kernel timings (see kernel_times)


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


def kernel_times(compiled, rounds: int = ROUNDS) -> tuple[list[tuple[str, str, float, float]],
                                                           float]:
    """(kernel name, ops, predicted us, measured us) for every step of the program, and the
    measurement's own rank agreement: the median Spearman between two rounds' times.

    The kernels are timed in `rounds` rounds, each kernel once a round (the median of its
    repeats), and a kernel's time is the median of its rounds. This host's speed changes over
    seconds (a whole program's block medians 6.2-9.0 ms within 25 s, nothing else running), so
    kernels timed one after another in one pass rank by when they ran as much as by their work;
    across rounds each kernel sees the slow stretches as the others do."""
    # a model with open dims: the program of the representative shape, with its derived inputs
    program, feeds = compiled.program_at(random_feeds(compiled.example_inputs, 0))
    report = compiled.report
    steps, env = program_steps(program, feeds)
    # the steps are the kernels that are not plain views (a view that needs a copy has a step)
    stepped = [k for k in program.plan.kernels
               if k.kind != "alias" or program.layouts[k.output].storage == k.output]
    if len(stepped) != len(steps):
        raise RuntimeError(f"{report.model}: {len(steps)} steps for {len(stepped)} kernels")
    predicted = {k.name: k.predicted_us for k in report.kernels}
    times = np.empty((rounds, len(steps)))
    with governed(program.threads, program.blas_threads, program.numba_threads):
        for r in range(rounds):
            for i, step in enumerate(steps):
                times[r, i] = median_us(lambda: step(env))
    measured = np.median(times, axis=0)
    rows = [(kernel.name, "+".join(kernel.ops), predicted[kernel.name], float(us))
            for kernel, us in zip(stepped, measured)]
    pairs = [spearmanr(times[a], times[b]).statistic
             for a in range(rounds) for b in range(a + 1, rounds)]
    return rows, float(np.median(pairs)) if pairs and len(steps) > 2 else float("nan")


def program_ms(compiled_programs: list, feeds: dict, seconds: float = 8.0
               ) -> tuple[list[float], list[list[float]]]:
    """Median ms of each compiled program's whole run, timed in alternating blocks of 5 after
    a pause (the first run of a block not counted), for about `seconds` in all; and each
    round's block medians (a round: one block of each program, back to back)."""
    times: list[list[float]] = [[] for _ in compiled_programs]
    rounds: list[list[float]] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(rounds) < 10:
        medians = []
        for compiled, bucket in zip(compiled_programs, times):
            time.sleep(0.05)
            compiled.run(feeds)
            block = []
            for _ in range(5):
                t = time.perf_counter()
                compiled.run(feeds)
                block.append((time.perf_counter() - t) * 1e3)
            bucket += block
            medians.append(float(np.median(block)))
        rounds.append(medians)
    return [float(np.median(bucket)) for bucket in times], rounds


def saving_interval(rounds: list[list[float]], level: float = 0.9) -> tuple[float, float]:
    """A bootstrap interval (`level`) of the median saving 1 - fused / none over the rounds
    (each round's two blocks ran back to back, so a slow stretch of the machine slows both)."""
    savings = np.array([1 - fused / none for fused, none in rounds])
    rng = np.random.default_rng(0)
    resampled = np.median(rng.choice(savings, (2000, len(savings))), axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(resampled, tail)), float(np.quantile(resampled, 1 - tail))


def within(predicted: float, interval: tuple[float, float], factor: float = 1.5) -> bool:
    """Whether a saving within `factor` of `predicted` lies in the measured interval."""
    lo, hi = interval
    least, most = sorted((predicted / factor, predicted * factor))
    return least <= hi and most >= lo


def main(argv: list[str]) -> int:
    target, backend, threads, big, saving = "cpu", None, 1, False, True
    paths: list = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--target":
            target = args.pop(0)
        elif arg == "--backend":
            backend = args.pop(0)
        elif arg == "--threads":
            threads = int(args.pop(0))
        elif arg == "--big":
            big = True
        elif arg == "--no-fusion-saving":
            saving = False
        else:
            paths.append(Path(arg))
    if not paths:
        paths = sorted(REAL.glob("*.onnx")) if REAL.is_dir() else []
        paths = paths or sorted((ROOT / "tests" / "models").glob("*.onnx"))
    models = [(p.stem, str(p)) for p in paths]
    if big:
        from extract_models import MODELS
        models += [(name, build()) for name, build in MODELS.items()]

    print(f"target {target}, backend {backend or 'default'}, {threads} thread(s); kernel times: "
          f"median of repeats, us; programs: median of blocks, ms", flush=True)
    print(f"{'model':24s} {'kernels':>7s} {'spearman':>8s} {'rounds':>6s} {'pred ms':>8s}"
          f" {'meas ms':>8s}"
          + (f" | none: {'pred ms':>8s} {'meas ms':>8s} | saving: {'pred':>6s}"
             f" {'kernels':>7s} {'ratio':>5s} {'runs':>6s} {'ratio':>5s} {'runs 90% CI':>15s}"
             f" {'1.5x':>4s} | run ms: {'fused':>7s} {'none':>7s}" if saving else ""))
    everything = []
    for name, model in models:
        compiled = ef.compile(model, target=target, backend=backend, threads=threads)
        try:
            rows, self_rho = kernel_times(compiled)
        except ef.EqsatFuseError as why:     # e.g. open dims whose default binding it can't run
            print(f"{name:24s} skipped: {why}", flush=True)
            continue
        everything += rows
        pred = [r[2] for r in rows]
        meas = [r[3] for r in rows]
        rho = spearmanr(pred, meas).statistic if len(rows) > 2 else float("nan")
        line = (f"{name:24s} {len(rows):7d} {rho:8.3f} {self_rho:6.3f} {sum(pred) / 1e3:8.2f}"
                f" {sum(meas) / 1e3:8.2f}")
        if saving:
            unfused = ef.compile(model, target=target, backend=backend, threads=threads,
                                 budgets=Budgets(iterations=0))
            none_rows, _ = kernel_times(unfused)
            feeds = random_feeds(compiled.example_inputs, 0)
            (fused_ms, none_ms), rounds = program_ms([compiled, unfused], feeds)
            interval = saving_interval(rounds)
            none_pred, none_meas = sum(r[2] for r in none_rows), sum(r[3] for r in none_rows)
            predicted = 1 - sum(pred) / none_pred
            by_kernels = 1 - sum(meas) / none_meas
            by_runs = 1 - fused_ms / none_ms

            def ratio(measured: float) -> float:
                return predicted / measured if measured > 0 else float("nan")

            line += (f" | none: {none_pred / 1e3:8.2f} {none_meas / 1e3:8.2f} | saving: "
                     f"{predicted:6.1%} {by_kernels:7.1%} {ratio(by_kernels):5.2f}"
                     f" {by_runs:6.1%} {ratio(by_runs):5.2f}"
                     f" [{interval[0]:5.1%}, {interval[1]:5.1%}]"
                     f" {'yes' if within(predicted, interval) else 'no':>4s}"
                     f" | run ms: {fused_ms:7.2f} {none_ms:7.2f}")
            del unfused
        print(line, flush=True)
        if "-v" in os.environ.get("BENCH_VERBOSE", ""):
            for row in sorted(rows, key=lambda r: r[3]):
                print(f"  {row[0]:>6s} {row[1][:50]:50s} pred {row[2]:9.2f} meas {row[3]:9.2f}")
        del compiled
    pred = [r[2] for r in everything]
    meas = [r[3] for r in everything]
    rho = spearmanr(pred, meas).statistic
    print(f"{'all kernels':24s} {len(everything):7d} {rho:8.3f} {'':6s} {sum(pred) / 1e3:8.2f}"
          f" {sum(meas) / 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    exit_on_help(sys.argv)
    sys.exit(main(sys.argv[1:]))
