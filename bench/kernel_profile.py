"""Per-kernel profile of a compiled model: the share of each kernel family in a run, at the
thread count given, next to onnxruntime's own profiler output for the same model.

    .venv/bin/python bench/kernel_profile.py [--threads N] [--top K] [--ort] MODEL

Each kernel of the Numba program runs alone (its own step, not inside a segment; the timing is
`eqsat_fuse.tools.profile`'s, as `eqsat-fuse run --profile` prints it per kernel), so the sum
is a little above a segment run; the table groups kernels by their fused ops and prints the
median time of each group per run, its share and its kernel count. `--ort` adds onnxruntime
ENABLE_ALL's profile (its JSON trace, grouped by op type) at the same thread count.
"""

from __future__ import annotations

import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

THREADS = set_threads(sys.argv)

import numpy as np  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from _common import load_model, ort_session, pop_option  # noqa: E402
from eqsat_fuse.checking.verify import random_feeds  # noqa: E402
from eqsat_fuse.tools.profile import group_by_ops, profile_kernels  # noqa: E402


def kernel_profile(compiled, feeds, repeat: int = 10) -> dict[str, tuple[float, int]]:
    """{kernel ops: (median seconds per run over all such kernels, count)}: the package's
    per-kernel profile (`eqsat_fuse.tools.profile`, what `eqsat-fuse run --profile` prints)
    grouped by fused ops, with a 20 ms pause before each timed run."""
    rows = group_by_ops(profile_kernels(compiled, feeds, repeat=repeat, pause=0.02))
    return {row.ops: (row.measured_us * 1e-6, row.count) for row in rows}


def ort_profile(model, feeds, repeat: int = 10) -> dict[str, tuple[float, int]]:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    for _ in range(2):
        session.run(None, feeds)
    for _ in range(repeat):
        session.run(None, feeds)
    path = session.end_profiling()
    with open(path) as f:
        trace = json.load(f)
    os.remove(path)
    per: dict[str, list] = collections.defaultdict(list)
    for ev in trace:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            per[(ev["args"]["op_name"], ev["name"])].append(ev["dur"] * 1e-6)
    groups: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for (op, _), t in per.items():
        groups[op][0] += float(np.median(t[-repeat:]))
        groups[op][1] += 1
    return {k: (v[0], v[1]) for k, v in groups.items()}


def table(title: str, groups: dict[str, tuple[float, int]], top: int) -> None:
    total = sum(t for t, _ in groups.values())
    print(f"\n{title}: {total * 1e3:.2f} ms in {sum(n for _, n in groups.values())} kernels")
    print(f"{'kernel ops':60s} {'ms':>8s} {'share':>6s} {'count':>5s}")
    for label, (t, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{label[:60]:60s} {t * 1e3:8.3f} {100 * t / total:5.1f}% {n:5d}")


def main(argv: list[str]) -> None:
    top = int(pop_option(argv, "--top", "25"))
    with_ort = "--ort" in argv
    names = [a for a in argv if not a.startswith("--")]
    if len(names) != 1:
        print(__doc__.strip())
        sys.exit(2)
    model = load_model(names[0])
    compiled = ef.compile(model, backend="numba", threads=THREADS)
    feeds = random_feeds(compiled.example_inputs, 0)
    print(f"threads: {THREADS}; {os.path.basename(names[0])}; medians of 10 runs")
    table("eqsat-fuse (Numba), each kernel alone", kernel_profile(compiled, feeds), top)
    if with_ort:
        table("onnxruntime ENABLE_ALL (its profiler)", ort_profile(model, feeds), top)


if __name__ == "__main__":
    if "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__.strip())
        sys.exit(0)
    main(sys.argv[1:])
