"""Measured run times of a compiled program: whole runs (`time_runs`) and each kernel alone
next to its predicted cost (`profile_kernels`, grouped by fused ops with `group_by_ops`).

`eqsat-fuse run --repeat N` prints `time_runs`'s median and interquartile range; `--profile`
prints `profile_kernels`' table; `bench/kernel_profile.py` groups the same rows by ops.

A kernel is timed as its own step (`Program.steps`, one per kernel), not inside the backend's
segments, so the kernels' sum is a little above a whole run. Steps are matched to the report's
kernels in plan order by their ops (views that are not copied have no step).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RunTimes:
    """Wall times of `runs` whole runs after `warmup` untimed ones, in milliseconds."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    runs: int
    warmup: int
    threads: int

    @property
    def iqr_ms(self) -> float:
        return self.p75_ms - self.p25_ms

    def summary(self) -> str:
        return (f"timing: median {self.median_ms:.3f} ms, p25-p75 {self.p25_ms:.3f}-"
                f"{self.p75_ms:.3f} ms (IQR {self.iqr_ms:.3f} ms) over {self.runs} runs after "
                f"{self.warmup} warm-up run{'s' if self.warmup != 1 else ''}, "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}")


@dataclass(frozen=True)
class KernelTime:
    """One kernel (or, grouped, every kernel of the same ops): its median measured time per
    run and its predicted cost (`KernelReport.predicted_us`), both in microseconds."""

    name: str                    # the kernel's name (k3), or "N kernels" when grouped
    ops: str                     # its fused ops, "Conv+Add+Relu"
    measured_us: float
    predicted_us: float | None   # None where no report kernel matched the step
    count: int = 1

    @property
    def ratio(self) -> float | None:
        """measured / predicted, or None without a positive prediction."""
        if not self.predicted_us or self.predicted_us <= 0:
            return None
        return self.measured_us / self.predicted_us


def time_runs(compiled, feeds: dict[str, Any], repeat: int, warmup: int = 1) -> RunTimes:
    """Run `compiled` `warmup` times untimed, then `repeat` times timed."""
    program, feeds = compiled.program_at(feeds)       # the feeds' shape's program
    out = program.empty_outputs()               # the timed runs allocate no outputs
    for _ in range(warmup):
        program.run(feeds, out=out)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        program.run(feeds, out=out)
        times.append(time.perf_counter() - start)
    p25, median, p75 = (float(v) * 1e3 for v in np.percentile(times, [25, 50, 75]))
    return RunTimes(median, p25, p75, repeat, warmup, program.threads)


def step_times(program, feeds: dict[str, Any], repeat: int = 10, warmup: int = 2,
               pause: float = 0.0) -> list[list[float]]:
    """Seconds of each kernel step (`program.steps`) in each of `repeat` timed runs; `pause`
    seconds of sleep before each run let the machine settle."""
    steps = list(program.steps)
    times: list[list[float]] = [[] for _ in steps]

    def timed(i, step):
        def run(env):
            start = time.perf_counter()
            step(env)
            times[i].append(time.perf_counter() - start)
        return run

    saved = program.steps
    program.steps = [timed(i, s) for i, s in enumerate(steps)]     # run() takes them one by one
    try:
        for _ in range(warmup):
            program.run(feeds)
        for t in times:
            t.clear()
        for _ in range(repeat):
            if pause:
                time.sleep(pause)
            program.run(feeds)
    finally:
        program.steps = saved
    return times


def profile_kernels(compiled, feeds: dict[str, Any], repeat: int = 10, warmup: int = 2,
                    pause: float = 0.0) -> list[KernelTime]:
    """Each kernel step's median time next to its predicted cost, slowest first."""
    program, feeds = compiled.program_at(feeds)
    times = step_times(program, feeds, repeat, warmup, pause)
    kernels = list(compiled.report.kernels)
    rows, at = [], 0
    for step, t in zip(program.steps, times):
        label = getattr(step, "label", "?")
        match = next((j for j in range(at, len(kernels)) if "+".join(kernels[j].ops) == label),
                     None)
        kernel = kernels[match] if match is not None else None
        if match is not None:
            at = match + 1
        rows.append(KernelTime(kernel.name if kernel else "?", label, float(np.median(t)) * 1e6,
                               kernel.predicted_us if kernel else None))
    return sorted(rows, key=lambda r: -r.measured_us)


def group_by_ops(rows: list[KernelTime]) -> list[KernelTime]:
    """The rows summed per fused-ops pattern (their time per run and their count), slowest
    first."""
    groups: dict[str, list] = collections.defaultdict(lambda: [0.0, 0.0, 0, True])
    for row in rows:
        group = groups[row.ops]
        group[0] += row.measured_us
        group[1] += row.predicted_us or 0.0
        group[2] += 1
        group[3] = group[3] and row.predicted_us is not None
    grouped = [KernelTime(f"{n} kernel{'s' if n != 1 else ''}", ops, measured,
                          predicted if known else None, n)
               for ops, (measured, predicted, n, known) in groups.items()]
    return sorted(grouped, key=lambda r: -r.measured_us)


def profile_table(rows: list[KernelTime], title: str, top: int | None = None) -> str:
    """The rows as a text table: kernel, ops, measured and predicted us, their ratio, share."""
    total = sum(r.measured_us for r in rows)
    predicted = sum(r.predicted_us or 0.0 for r in rows)
    lines = [f"{title}: {total / 1e3:.3f} ms measured, {predicted / 1e3:.3f} ms predicted, "
             f"{sum(r.count for r in rows)} kernels",
             f"{'kernel':>10}  {'ops':40} {'measured us':>12} {'predicted us':>13} "
             f"{'measured/predicted':>19} {'share':>6}"]
    for row in rows[:top]:
        predicted_text = "-" if row.predicted_us is None else f"{row.predicted_us:13.2f}"
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        share = 100 * row.measured_us / total if total else 0.0
        ops = row.ops if len(row.ops) <= 40 else row.ops[:37] + "..."
        lines.append(f"{row.name:>10}  {ops:40} {row.measured_us:12.2f} {predicted_text:>13} "
                     f"{ratio:>19} {share:5.1f}%")
    if top is not None and len(rows) > top:
        lines.append(f"{'':>10}  ({len(rows) - top} more)")
    return "\n".join(lines)
