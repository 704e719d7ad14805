"""How fast is extraction on a big e-graph? (the bar: greedy-dag on 60,000 e-nodes under 2 s)

    .venv/bin/python bench/extract_speed.py [--blocks N] [--layers N] [--repeat N]

Builds two synthetic ONNX models of about 5,000 operators with residuals (bench/extract_models.py:
a ResNet of N bottleneck blocks, a BERT of N layers), saturates them with the shipped rules,
reads the e-graph, and times each extractor on it (median of repeats; the ILP is not run, its
model alone is too big at this size). Prints e-graph size and seconds.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract_models import bert, resnet  # noqa: E402
from _common import exit_on_help  # noqa: E402

from eqsat_fuse.extraction.costmodel import load_cost_model  # noqa: E402
from eqsat_fuse.frontend.encode import encode  # noqa: E402
from eqsat_fuse.extraction.cost import roots_of  # noqa: E402
from eqsat_fuse.extraction.registry import extract  # noqa: E402
from eqsat_fuse.frontend.importer import import_model  # noqa: E402
from eqsat_fuse.saturation.saturate import saturate  # noqa: E402
from eqsat_fuse.saturation.serialized import fill_missing_facts, read_egraph  # noqa: E402


def option(argv: list[str], name: str, default: int) -> int:
    return int(argv[argv.index(name) + 1]) if name in argv else default


def main(argv: list[str]) -> int:
    blocks, layers = option(argv, "--blocks", 500), option(argv, "--layers", 66)
    repeat = option(argv, "--repeat", 5)
    model = load_cost_model("cpu")
    print(f"{'model':14s} {'ONNX ops':>8s} {'e-nodes':>8s} {'classes':>8s} {'extractor':>10s} "
          f"{'median s':>8s} {'min s':>6s} {'cost us':>10s}")
    for name, onnx_model in ((f"resnet{blocks}", resnet(blocks)), (f"bert{layers}", bert(layers))):
        encoding = encode(import_model(onnx_model))
        egraph, _ = saturate(encoding, target="cpu")
        eg = read_egraph(egraph)
        fill_missing_facts(eg)
        roots = roots_of(eg, encoding.output_vars)
        for extractor in ("greedy-dag", "tree"):
            times, cost = [], None
            for _ in range(repeat):
                started = time.perf_counter()
                cost = extract(eg, roots, model, extractor).cost
                times.append(time.perf_counter() - started)
            print(f"{name:14s} {len(onnx_model.graph.node):8d} {len(eg.nodes):8d} "
                  f"{eg.num_classes:8d} {extractor:>10s} {statistics.median(times):8.3f} "
                  f"{min(times):6.3f} {cost:10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    exit_on_help(sys.argv)
    sys.exit(main(sys.argv[1:]))
