"""The research harness: compare fusion strategies across models, targets and rule sets.

    eqsat-fuse compare resnet.onnx bert.onnx -o results/ --targets cpu edge-npu gpu

Every cell of models x strategies x targets x rule sets is compiled, verified against
onnxruntime, run on this machine, and written to `DIR/cells/<cell>.json` as soon as it is done,
so an interrupted sweep resumes where it stopped (cells already in DIR are skipped). At the end
`DIR/results.csv`, `DIR/results.md` and plots in `DIR/plots/` are written from every cell in DIR
that the sweep asked for. Cells run one by one, on local processes (`jobs`), or on a Dask
distributed cluster (`scheduler` address). Inputs come from a fixed seed; the table is sorted,
so two sweeps of the same cells write the same rows (measured times aside).

Strategies:
- ``none``: no rewriting at all: the model as written, one kernel per node.
- ``passes``: the same rules as a fixed-order pass pipeline that commits after each pass
  (`passes.saturate_by_passes`): what phase ordering costs.
- ``eqsat-tree``, ``eqsat-greedy``, ``eqsat-ilp``: equality saturation, then the tree,
  greedy DAG or ILP extractor.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import EqsatFuseError

STRATEGIES: dict[str, dict[str, Any]] = {
    "none": {"strategy": "eqsat", "extractor": "greedy-dag", "iterations": 0},
    "passes": {"strategy": "passes", "extractor": "greedy-dag"},
    "eqsat-tree": {"strategy": "eqsat", "extractor": "tree"},
    "eqsat-greedy": {"strategy": "eqsat", "extractor": "greedy-dag"},
    "eqsat-ilp": {"strategy": "eqsat", "extractor": "ilp"},
}
STAGES = ("import", "encode", "saturate", "extract", "decode", "lower")
COLUMNS = ["model", "strategy", "target", "rules", "status", "kernels", "views", "predicted_us",
           "predicted_energy_uj", "measured_ms", "bytes_moved", "peak_bytes",
           "lower_bound_bytes", "egraph_nodes", "stop_reason", "iterations", "verified",
           "max_abs_diff", *[f"t_{s}" for s in STAGES], "t_compile", "error"]


@dataclass(frozen=True)
class Cell:
    """One point of the sweep."""

    model: str              # path of the ONNX file
    strategy: str
    target: str
    rules: str              # name of the rule set ("shipped" or a user-given name)

    @property
    def key(self) -> str:
        """A stable file-name-safe id: model stem, a hash of its path, strategy, target, rules."""
        digest = hashlib.sha256(str(Path(self.model).resolve()).encode()).hexdigest()[:8]
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(self.model).stem)
        rules = re.sub(r"[^A-Za-z0-9_.-]", "_", self.rules)
        return f"{stem}-{digest}__{self.strategy}__{self.target}__{rules}"


def run_cell(cell: dict, rule_files: list[str], backend: str = "numpy", repeats: int = 10,
             seed: int = 0, ilp_seconds: float = 30.0) -> dict:
    """Compile, verify and time one cell; a row of results (errors are recorded, not raised)."""
    from ..pipeline import compile as compile_model
    from ..saturation.saturate import Budgets
    from ..checking.verify import random_feeds

    cell = Cell(**cell)
    row: dict[str, Any] = {"model": Path(cell.model).name, "strategy": cell.strategy,
                           "target": cell.target, "rules": cell.rules}
    spec = STRATEGIES[cell.strategy]
    budgets = Budgets(iterations=spec["iterations"]) if "iterations" in spec else Budgets()
    try:
        started = time.perf_counter()
        extra = {"ilp_seconds": ilp_seconds} if spec["extractor"] == "ilp" else {}
        compiled = compile_model(cell.model, target=cell.target, backend=backend,
                                 extractor=spec["extractor"], rules=rule_files or None,
                                 budgets=budgets, strategy=spec["strategy"], **extra)
        compile_seconds = time.perf_counter() - started
        feeds = random_feeds(compiled.plan.inputs, seed)
        result = compiled.verify(feeds)
        times = []
        compiled.run(feeds)                                   # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            compiled.run(feeds)
            times.append(time.perf_counter() - start)
    except EqsatFuseError as exc:
        row.update(status="error", error=str(exc))
        return row
    report = compiled.report
    row.update(
        status="ok", error="", kernels=report.kernels_out, views=report.views,
        predicted_us=round(report.cost, 3),
        predicted_energy_uj=(round(report.energy_uj, 3)
                             if getattr(report, "energy_uj", None) is not None else None),
        measured_ms=round(float(np.median(times)) * 1e3, 4),
        bytes_moved=int(sum(k.read_bytes + k.write_bytes for k in report.kernels)),
        peak_bytes=report.peak_bytes, lower_bound_bytes=report.lower_bound_bytes,
        egraph_nodes=report.egraph_nodes, stop_reason=report.stop_reason,
        iterations=report.iterations, verified=result.ok,
        max_abs_diff=max((o.max_abs_diff for o in result.outputs), default=0.0),
        t_compile=round(compile_seconds, 4), notes=list(report.notes),
        **{f"t_{s}": round(report.timings.get(s, 0.0), 4) for s in STAGES})
    return row


def plan_cells(models: Iterable[str], strategies: Iterable[str], targets: Iterable[str],
               rule_sets: dict[str, list[str]]) -> list[Cell]:
    """Every cell of the sweep, checking names first (a typo fails before any work)."""
    from ..extraction.costmodel import load_cost_model

    strategies, targets = list(strategies), list(targets)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise EqsatFuseError(f"unknown strategy {unknown[0]!r}; choose from "
                             f"{', '.join(STRATEGIES)}")
    for target in targets:
        load_cost_model(target)
    cells = []
    for model in models:
        if not Path(model).is_file():
            raise EqsatFuseError(f"{model}: no such file")
        for strategy in strategies:
            for target in targets:
                for rules in rule_sets:
                    cells.append(Cell(str(model), strategy, target, rules))
    return cells


def compare(models: Iterable[str], out_dir: str | Path, strategies: Iterable[str] = STRATEGIES,
            targets: Iterable[str] = ("cpu",), rule_sets: dict[str, list[str]] | None = None,
            jobs: int = 1, scheduler: str | None = None, backend: str = "numpy",
            repeats: int = 10, seed: int = 0, ilp_seconds: float = 30.0,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run the sweep into `out_dir` (resuming), then write the CSV, the table and the plots."""
    rule_sets = rule_sets or {"shipped": []}
    cells = plan_cells(models, strategies, targets, rule_sets)
    out = Path(out_dir)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    pending = [c for c in cells if not (out / "cells" / f"{c.key}.json").exists()]
    say = progress or (lambda _message: None)
    say(f"{len(cells)} cells, {len(cells) - len(pending)} already in {out}, {len(pending)} to run")
    options = dict(backend=backend, repeats=repeats, seed=seed, ilp_seconds=ilp_seconds)
    done = len(cells) - len(pending)
    for cell, row in _execute(pending, rule_sets, options, jobs, scheduler):
        _write_json(out / "cells" / f"{cell.key}.json", {"cell": asdict(cell), "row": row})
        done += 1
        say(f"[{done}/{len(cells)}] {row['model']} {cell.strategy} {cell.target} {cell.rules}: "
            + (f"{row['kernels']} kernels, {row['predicted_us']:.1f} us predicted, "
               f"{row['measured_ms']:.3f} ms measured" if row["status"] == "ok"
               else f"error: {row['error']}"))
        for note in row.get("notes", []):
            say(f"    note: {note}")
    rows = [json.loads((out / "cells" / f"{c.key}.json").read_text())["row"] for c in cells]
    rows.sort(key=lambda r: (r["model"], r["target"], r["rules"],
                             list(STRATEGIES).index(r["strategy"])))
    write_tables(rows, out)
    write_plots(rows, out / "plots")
    return rows


def _execute(cells: list[Cell], rule_sets, options, jobs: int, scheduler: str | None):
    """Yield (cell, row) as cells finish: serially, on local processes, or on Dask."""
    if not cells:
        return
    if scheduler:
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise EqsatFuseError("a Dask scheduler was given but dask.distributed is not "
                                 "installed: pip install 'eqsat-fuse[cluster]'") from None
        with Client(scheduler) as client:
            futures = {client.submit(run_cell, asdict(c), rule_sets[c.rules], pure=False,
                                     **options): c for c in cells}
            for future in as_completed(futures):
                yield futures[future], future.result()
        return
    if jobs <= 1:
        for cell in cells:
            yield cell, run_cell(asdict(cell), rule_sets[cell.rules], **options)
        return
    import concurrent.futures as cf
    import multiprocessing

    with cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_cell, asdict(c), rule_sets[c.rules], **options): c
                   for c in cells}
        for future in cf.as_completed(futures):
            yield futures[future], future.result()


def _write_json(path: Path, data: dict) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(temp, path)


def write_tables(rows: list[dict], out: Path) -> None:
    """results.csv (every column) and results.md (the columns people compare)."""
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in COLUMNS})
    shown = ["model", "target", "rules", "strategy", "kernels", "predicted_us", "measured_ms",
             "bytes_moved", "peak_bytes", "egraph_nodes", "stop_reason", "t_compile",
             "verified"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for row in rows:
        cells = []
        for key in shown:
            value = row.get(key, "")
            if row["status"] != "ok" and key == "kernels":
                value = f"error: {row['error'][:60]}"
            cells.append(_fmt(value))
        lines.append("| " + " | ".join(cells) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "\\|")


def write_plots(rows: list[dict], plots: Path) -> list[Path]:
    """Bar charts of predicted cost and kernels, predicted against measured, compile time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if r["status"] == "ok"]
    written = []
    strategies = [s for s in STRATEGIES if any(r["strategy"] == s for r in ok)]
    models = sorted({r["model"] for r in ok})
    targets = sorted({r["target"] for r in ok})

    def grouped_bars(metric: str, title: str, ylabel: str, name: str, log: bool) -> None:
        fig, axes = plt.subplots(1, max(1, len(targets)), figsize=(5 * max(1, len(targets)), 4),
                                 squeeze=False)
        width = 0.8 / max(1, len(strategies))
        for ax, target in zip(axes[0], targets):
            for i, strategy in enumerate(strategies):
                values = [_first(ok, model, strategy, target, metric) for model in models]
                ax.bar(np.arange(len(models)) + i * width, values, width, label=strategy)
            ax.set_xticks(np.arange(len(models)) + width * (len(strategies) - 1) / 2)
            ax.set_xticklabels([m.removesuffix(".onnx") for m in models], rotation=30,
                               ha="right", fontsize=8)
            ax.set_title(f"{title}: {target}")
            ax.set_ylabel(ylabel)
            if log:
                ax.set_yscale("log")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plots / name, dpi=100)
        plt.close(fig)
        written.append(plots / name)

    if ok:
        grouped_bars("predicted_us", "predicted cost", "microseconds", "predicted_cost.png", True)
        grouped_bars("kernels", "kernels", "kernels that run", "kernels.png", False)
        grouped_bars("t_compile", "compile time", "seconds", "compile_time.png", True)
        fig, ax = plt.subplots(figsize=(5, 4))
        for strategy in strategies:
            points = [(r["predicted_us"], r["measured_ms"] * 1e3) for r in ok
                      if r["strategy"] == strategy and r["target"] == "cpu"]
            if points:
                ax.scatter(*zip(*points), label=strategy, s=18)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("predicted (us, cpu cost model)")
        ax.set_ylabel("measured on this machine (us)")
        ax.set_title("does the cost model predict reality?")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plots / "predicted_vs_measured.png", dpi=100)
        plt.close(fig)
        written.append(plots / "predicted_vs_measured.png")
    return written


def _first(rows, model, strategy, target, metric) -> float:
    for r in rows:
        if (r["model"], r["strategy"], r["target"]) == (model, strategy, target):
            value = r.get(metric)
            return float(value) if value is not None else math.nan
    return math.nan


def print_progress(message: str) -> None:
    print(f"[eqsat-fuse compare] {message}", file=sys.stderr, flush=True)
