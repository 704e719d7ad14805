"""The three extractors on real models: program cost, seconds, and the ILP's gap, per target.

    .venv/bin/python bench/extractors.py [--targets cpu,gpu,edge-npu] [--ilp-seconds S]
                                         [--objective latency|energy] [--big] [MODEL.onnx ...]

Default models: tests/models/*.onnx; --big adds the ~1,500-node synthetic ResNet and BERT of
bench/extract_models.py. Every answer is a valid program (checked by `program_cost`). The table
gives each extractor's predicted cost (the objective's unit), its wall time, and for the ILP its
status, the gap to the best bound it proved, and the body-depth horizon it kept.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _common import exit_on_help  # noqa: E402

from eqsat_fuse.extraction.costmodel import load_cost_model  # noqa: E402
from eqsat_fuse.frontend.encode import encode  # noqa: E402
from eqsat_fuse.extraction.cost import program_cost, roots_of  # noqa: E402
from eqsat_fuse.extraction.registry import extract  # noqa: E402
from eqsat_fuse.frontend.importer import import_model  # noqa: E402
from eqsat_fuse.saturation.saturate import saturate  # noqa: E402
from eqsat_fuse.saturation.serialized import fill_missing_facts, read_egraph  # noqa: E402


def main(argv: list[str]) -> int:
    targets, seconds, objective, big, paths = ["cpu", "gpu", "edge-npu"], 60.0, "latency", False, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--targets":
            targets = args.pop(0).split(",")
        elif arg == "--ilp-seconds":
            seconds = float(args.pop(0))
        elif arg == "--objective":
            objective = args.pop(0)
        elif arg == "--big":
            big = True
        else:
            paths.append(Path(arg))
    models = [(p.stem, str(p)) for p in (paths or sorted((ROOT / "tests/models").glob("*.onnx")))]
    if big:
        from extract_models import MODELS
        models += [(name, build()) for name, build in MODELS.items()]
    print(f"objective {objective}; ILP time limit {seconds:g} s; costs in "
          f"{'us' if objective == 'latency' else 'uJ'}")
    head = (f"{'model':24s} {'target':8s} {'e-nodes':>7s} {'tree':>10s} {'s':>5s} "
            f"{'greedy-dag':>10s} {'s':>5s} {'ilp':>10s} {'s':>6s} {'status':>10s} {'gap':>7s} "
            f"{'horizon':>7s}")
    print(head)
    print("-" * len(head))
    for name, model in models:
        graph = import_model(model)
        encoding = encode(graph)
        for target in targets:
            cost_model = load_cost_model(target)
            egraph, _ = saturate(encoding, target=target)
            eg = read_egraph(egraph)
            fill_missing_facts(eg)
            roots = roots_of(eg, encoding.output_vars)
            row = [f"{name:24s} {target:8s} {len(eg.nodes):7d}"]
            results = {}
            for extractor in ("tree", "greedy-dag", "ilp"):
                started = time.perf_counter()
                result = extract(eg, roots, cost_model, extractor, objective=objective,
                                 seconds=seconds)
                took = time.perf_counter() - started
                cost, _ = program_cost(eg, cost_model, result.choice, roots, result.constant,
                                       objective)
                assert abs(cost - result.cost) <= 1e-6 * max(1.0, cost), (name, extractor)
                results[extractor] = result
                row.append(f"{result.cost:10.2f} {took:6.2f}" if extractor == "ilp"
                           else f"{result.cost:10.2f} {took:5.3f}")
            d = results["ilp"].details
            gap = d.get("gap")
            horizon = d.get("horizon", float("inf"))
            row.append(f"{d.get('kept', d.get('status', '')):>10s} "
                       f"{'-' if gap is None else f'{100 * gap:6.2f}%':>7s} "
                       f"{'all' if horizon == float('inf') else int(horizon):>7}")
            print(" ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    exit_on_help(sys.argv)
    sys.exit(main(sys.argv[1:]))
