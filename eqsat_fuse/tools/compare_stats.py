"""The statistics of `compare`: repeated timings and their spread, and how well the cost model
ranks programs (Spearman's rho of predicted against measured).

A single timed run on a shared machine says little (the same program measured 158 ms, 11 ms
and 2 ms in three cells), so every measured cell is timed repeatedly: warm-up runs, then
`repeats` timed runs in blocks a pause apart, reported as the median with its interquartile
range and a bootstrap 95% interval of the median. The speed of a shared machine changes over
seconds, for every runtime alike (MobileNetV2's blocks of ten runs a few tenths of a second
apart had medians from 6.2 to 9.0 ms over 25 s, each block's IQR a few %; stretches of a
couple of seconds ran at the slow end), so a cell timed in one stretch reports a spread that
the next sweep falls outside. So the cells of one model are timed together, in rounds, one
block of each cell a round (`time_interleaved`): every cell's runs are spread over the whole
timing of its model and see the same slow and fast stretches, its spread is the one to expect
from a rerun, and ratios between cells (the speedup against onnxruntime) compare runs of the
same stretches. A spread larger than a stated fraction of the median marks the cell noisy.
The bootstrap draws from a fixed seed, so the same times give the same interval.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

WARMUP_RUNS = 2            # untimed runs before the first block: caches, lazy JIT, thread pools
BLOCKS = 10                # rounds: the timed runs of a cell split into this many blocks
BLOCK_PAUSE_S = 0.3        # before each block; one untimed run follows each pause
BOOTSTRAP_RESAMPLES = 2000
SPREAD_LIMIT = 0.10        # IQR / median above this marks a measurement noisy


def time_interleaved(calls: list[Callable[[], Any]], repeats: int, warmup: int = WARMUP_RUNS,
                     blocks: int = BLOCKS, pause_s: float = BLOCK_PAUSE_S) -> list[list[float]]:
    """Milliseconds of `repeats` timed runs of each call, after `warmup` untimed ones, in
    `blocks` rounds (fewer when there are fewer runs): a round is one block of every call, each
    block after a pause of `pause_s` and an untimed run (a runtime's threads may have slept, or
    another runtime's may still spin), the calls taking turns at going first."""
    for call in calls:
        for _ in range(warmup):
            call()
    blocks = max(1, min(blocks, repeats))
    sizes = [repeats // blocks + (b < repeats % blocks) for b in range(blocks)]
    times: list[list[float]] = [[] for _ in calls]
    for b, size in enumerate(sizes):
        for i in [(b + k) % len(calls) for k in range(len(calls))]:
            time.sleep(pause_s)
            calls[i]()
            for _ in range(size):
                start = time.perf_counter()
                calls[i]()
                times[i].append((time.perf_counter() - start) * 1e3)
    return times


def spread(times_ms: list[float]) -> dict[str, float]:
    """Median, quartiles, IQR and the bootstrap 95% interval of the median, in ms."""
    times = np.asarray(times_ms, dtype=np.float64)
    p25, median, p75 = np.percentile(times, [25, 50, 75])
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(times, size=(BOOTSTRAP_RESAMPLES, times.size)), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return {"measured_ms": round(float(median), 4), "measured_p25_ms": round(float(p25), 4),
            "measured_p75_ms": round(float(p75), 4), "measured_iqr_ms": round(float(p75 - p25), 4),
            "measured_ci_low_ms": round(float(low), 4),
            "measured_ci_high_ms": round(float(high), 4), "runs": int(times.size)}


def relative_spread(row: dict) -> float | None:
    """IQR / median of a measured row (None when it was not measured)."""
    median, iqr = row.get("measured_ms"), row.get("measured_iqr_ms")
    if median is None or iqr is None or median <= 0:
        return None
    return iqr / median


def spearman(points: list[tuple[float, float]]) -> float | None:
    """Spearman's rho of (predicted, measured) points; None with fewer than three points or
    when either side is constant (rho is then undefined)."""
    from scipy.stats import spearmanr

    if len(points) < 3:
        return None
    xs, ys = zip(*points)
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    rho = float(spearmanr(xs, ys).statistic)
    return None if math.isnan(rho) else rho


def prediction_points(rows: list[dict]) -> dict[str, list[tuple[float, float, dict]]]:
    """(predicted us, measured us, row) of every compiled, measured row, by target."""
    points: dict[str, list[tuple[float, float, dict]]] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("measured_ms") is not None \
                and row.get("predicted_us") is not None:
            points.setdefault(row["target"], []).append(
                (float(row["predicted_us"]), float(row["measured_ms"]) * 1e3, row))
    return points
