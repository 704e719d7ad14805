"""Import time per model (stage 1 alone: read, opset conversion, checker, shape inference,
folding, normalization), with the split `ir.Graph.import_seconds` records.

    .venv/bin/python bench/import_time.py [--repeat N] [MODEL ...]

Without MODEL it imports every `.onnx` file of /work/bench-models (the realistic exports of
`export_real_models.py`). Each model is imported `--repeat` times (default 3) and the fastest
run is printed: import is single-threaded and dominated by ONNX's C++ passes, so the minimum
is the figure least disturbed by other processes on a shared machine. The first import of a
file may also pay for reading it from disk; later ones read it from the page cache.
"""

from __future__ import annotations

import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import exit_on_help  # noqa: E402

from eqsat_fuse.frontend.importer import import_model  # noqa: E402

MODELS = "/work/bench-models"
STEPS = ("read", "check", "convert", "infer", "fold", "normalize")


def _import_once(path: str) -> tuple[float, dict[str, float], int]:
    start = time.perf_counter()
    graph = import_model(path)
    seconds = time.perf_counter() - start
    return seconds, dict(getattr(graph, "import_seconds", {}) or {}), graph.onnx_nodes


def main(argv: list[str]) -> None:
    exit_on_help(argv)
    repeat = 3
    if "--repeat" in argv:
        i = argv.index("--repeat")
        repeat = int(argv[i + 1])
        del argv[i:i + 2]
    paths = argv or sorted(glob.glob(os.path.join(MODELS, "*.onnx")))
    head = f"{'model':28s} {'MB':>7s} {'nodes':>6s} {'seconds':>8s}  " + " ".join(
        f"{s:>9s}" for s in STEPS)
    print(f"import time, fastest of {repeat}")
    print(head)
    print("-" * len(head))
    for path in paths:
        size = os.path.getsize(path) / 1e6
        best: tuple[float, dict[str, float], int] | None = None
        for _ in range(repeat):
            run = _import_once(path)
            if best is None or run[0] < best[0]:
                best = run
        seconds, split, nodes = best
        steps = " ".join(f"{split[s]:9.2f}" if s in split else f"{'-':>9s}" for s in STEPS)
        label = os.path.basename(path).removesuffix(".onnx")
        print(f"{label:28s} {size:7.1f} {nodes:6d} {seconds:8.2f}  {steps}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
