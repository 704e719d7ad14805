"""The research harness: compare fusion strategies across models, targets and rule sets.

    eqsat-fuse compare resnet.onnx bert.onnx -o results/ --targets cpu edge-npu gpu

Every cell of models x strategies x targets x rule sets is compiled, verified against
onnxruntime and written to `DIR/cells/<cell>.json` as soon as the cells of its model are done,
so an interrupted sweep resumes where it stopped (cells already in DIR are skipped). A cell
whose target is this machine (`measures_here`: the `cpu` target or a cost file calibrated on
this host) is also timed: warm-up runs, then `repeats` timed runs in blocks a pause apart,
the blocks of a model's cells taking turns (`compare_stats`: the interleaving, median, IQR,
bootstrap interval of the median, a warning when the spread is large); a cell of any other
target shows its predicted cost only, since this CPU says nothing about a GPU's latency. Each
model also gets onnxruntime rows (ENABLE_ALL and DISABLE_ALL, `BASELINES`), each in its own
session, timed in turn with the model's compiled cells, and every measured row a speedup
against ENABLE_ALL.

At the end `DIR/results.csv`, `DIR/results.md`, `DIR/metadata.json` (versions, CPU, threads,
load average, seed, the project's commit) and the plots in `DIR/plots/` (`compare_plots`) are
written from every cell in DIR that the sweep asked for. Models run one by one, on local
processes (`jobs`), or on a Dask distributed cluster (`scheduler` address). Inputs come from a
fixed seed; the table is sorted, so two sweeps of the same cells write the same rows (measured
times aside).

Strategies:
- ``none``: no rewriting at all: the model as written, one kernel per node.
- ``passes``: the same rules as a fixed-order pass pipeline that commits after each pass
  (`passes.saturate_by_passes`): what phase ordering costs.
- ``eqsat-tree``, ``eqsat-greedy``, ``eqsat-ilp``: equality saturation, then the tree,
  greedy DAG or ILP extractor.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ..backends import resolve_backend
from ..errors import EqsatFuseError
from . import compare_stats as stats

STRATEGIES: dict[str, dict[str, Any]] = {
    "none": {"strategy": "eqsat", "extractor": "greedy-dag", "iterations": 0},
    "passes": {"strategy": "passes", "extractor": "greedy-dag"},
    "eqsat-tree": {"strategy": "eqsat", "extractor": "tree"},
    "eqsat-greedy": {"strategy": "eqsat", "extractor": "greedy-dag"},
    "eqsat-ilp": {"strategy": "eqsat", "extractor": "ilp"},
}
# onnxruntime as a baseline, one row per model and level, timed on this machine like the cells
BASELINES = {"ort-enable-all": "ORT_ENABLE_ALL", "ort-disable-all": "ORT_DISABLE_ALL"}
BASELINE_TARGET, BASELINE_RULES = "cpu", "-"
SPEEDUP_BASE = "ort-enable-all"
STAGES = ("import", "encode", "saturate", "extract", "decode", "lower")
TIMING = ["measured_ms", "measured_p25_ms", "measured_p75_ms", "measured_iqr_ms",
          "measured_ci_low_ms", "measured_ci_high_ms", "runs"]
COLUMNS = ["model", "strategy", "target", "rules", "status", "latency", "kernels", "views",
           "predicted_us", "predicted_energy_uj", *TIMING, "noisy", "speedup_vs_ort", "threads",
           "bytes_moved", "peak_bytes", "lower_bound_bytes", "egraph_nodes", "stop_reason",
           "iterations", "verified", "max_abs_diff", *[f"t_{s}" for s in STAGES], "t_compile",
           "error"]


@dataclass(frozen=True)
class Cell:
    """One point of the sweep (a baseline's strategy is a key of `BASELINES`)."""

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


def measures_here(target: str) -> bool:
    """Whether `target` describes this machine, so that its cells are timed here: the shipped
    `cpu` target, or a cost file that `eqsat-fuse calibrate` wrote on this host (its [target]
    name ends in "@<host>"). Any other target's cells show their predicted cost only."""
    from ..extraction.costmodel import load_cost_model
    from .calibrate import target_name

    name = load_cost_model(target).target
    return name == "cpu" or name.endswith("@" + target_name(None).partition("@")[2])


def run_cells(cells: list[tuple[dict, list[str]]], backend: str | None = None,
              repeats: int = 20, seed: int = 0, ilp_seconds: float = 30.0,
              threads: int | None = None, progress: Callable[[str], None] | None = None
              ) -> list[dict]:
    """Compile and verify each (cell, its rule files) of one model, then time together the
    cells measured on this machine (`compare_stats.time_interleaved`: a block of each a
    round); a row of results per cell (errors are recorded, not raised). A baseline cell
    times onnxruntime instead."""
    say = progress or (lambda _message: None)
    built = []
    for cell, rule_files in cells:
        cell = Cell(**cell)
        if cell.strategy in BASELINES:
            built.append(_build_baseline(cell, seed, threads))
        else:
            built.append(_build_cell(cell, rule_files, backend, seed, ilp_seconds, threads))
        say(f"  built {Path(cell.model).name} {cell.strategy} {cell.target} {cell.rules}")
    timed = [(row, call) for row, call in built if call is not None]
    if timed:
        say(f"  timing {len(timed)} cells of {timed[0][0]['model']}: {repeats} runs each, "
            f"{min(stats.BLOCKS, repeats)} rounds of a block per cell")
    for (row, _), times in zip(timed, stats.time_interleaved([c for _, c in timed], repeats)):
        row.update(**stats.spread(times), times_ms=[round(t, 5) for t in times])
    return [row for row, _ in built]


def _build_cell(cell: Cell, rule_files: list[str], backend: str | None, seed: int,
                ilp_seconds: float, threads: int | None) -> tuple[dict, Callable | None]:
    """A compiled cell's row (no timing yet) and the run to time (None: not this machine's
    target, or an error)."""
    from ..checking.verify import random_feeds
    from ..pipeline import compile as compile_model
    from ..saturation.saturate import Budgets

    row: dict[str, Any] = {"model": Path(cell.model).name, "strategy": cell.strategy,
                           "target": cell.target, "rules": cell.rules}
    spec = STRATEGIES[cell.strategy]
    budgets = Budgets(iterations=spec["iterations"]) if "iterations" in spec else Budgets()
    try:
        started = time.perf_counter()
        extra = {"ilp_seconds": ilp_seconds} if spec["extractor"] == "ilp" else {}
        compiled = compile_model(cell.model, target=cell.target, backend=backend,
                                 extractor=spec["extractor"], rules=rule_files or None,
                                 budgets=budgets, strategy=spec["strategy"], threads=threads,
                                 **extra)
        compile_seconds = time.perf_counter() - started
        feeds = random_feeds(compiled.example_inputs, seed)
        result = compiled.verify(feeds)
    except EqsatFuseError as exc:
        row.update(status="error", error=str(exc))
        return row, None
    measured = measures_here(cell.target)
    report = compiled.report
    row.update(
        status="ok", error="", latency="measured" if measured else "predicted",
        kernels=report.kernels_out, views=report.views, predicted_us=round(report.cost, 3),
        predicted_energy_uj=(round(report.energy_uj, 3)
                             if getattr(report, "energy_uj", None) is not None else None),
        times_ms=[], threads=compiled.program.threads,
        bytes_moved=int(sum(k.read_bytes + k.write_bytes for k in report.kernels)),
        peak_bytes=report.peak_bytes, lower_bound_bytes=report.lower_bound_bytes,
        egraph_nodes=report.egraph_nodes, stop_reason=str(report.stop_reason),
        iterations=report.iterations, verified=result.ok,
        max_abs_diff=max((o.max_abs_diff for o in result.outputs), default=0.0),
        t_compile=round(compile_seconds, 4), notes=list(report.notes),
        **{f"t_{s}": round(report.timings.get(s, 0.0), 4) for s in STAGES})
    return row, (lambda: compiled.run(feeds)) if measured else None


def _build_baseline(cell: Cell, seed: int, threads: int | None
                    ) -> tuple[dict, Callable | None]:
    """onnxruntime at one optimization level, on `threads` intra-op threads (the compiled
    programs' default count), verified against the model as written: its row and the run to
    time (None after an error). Its thread pool waits between its blocks: each block of every
    runtime follows a pause, so no runtime's spinning workers run beside another's."""
    import onnx
    import onnxruntime as ort

    from ..checking.verify import compare as compare_outputs, oracle_outputs, random_feeds
    from ..frontend.importer import import_model
    from ..signature import model_inputs
    from ..threads import resolve

    row: dict[str, Any] = {"model": Path(cell.model).name, "strategy": cell.strategy,
                           "target": cell.target, "rules": cell.rules}
    try:
        feeds = random_feeds(model_inputs(import_model(cell.model)), seed)
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                   BASELINES[cell.strategy])
        options.intra_op_num_threads = resolve(threads)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        started = time.perf_counter()
        session = ort.InferenceSession(cell.model, options, providers=["CPUExecutionProvider"])
        compile_seconds = time.perf_counter() - started
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        expected, oracle = oracle_outputs(onnx.load(cell.model), feeds)
        result = compare_outputs(outputs, expected, oracle)
    except EqsatFuseError as exc:
        row.update(status="error", error=str(exc))
        return row, None
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors: recorded in the row
        row.update(status="error", error=f"onnxruntime: {exc}".splitlines()[0])
        return row, None
    row.update(status="ok", error="", latency="measured", times_ms=[], threads=resolve(threads),
               verified=result.ok,
               max_abs_diff=max((o.max_abs_diff for o in result.outputs), default=0.0),
               t_compile=round(compile_seconds, 4))
    return row, lambda: session.run(None, feeds)


def plan_cells(models: Iterable[str], strategies: Iterable[str], targets: Iterable[str],
               rule_sets: dict[str, list[str]], baselines: bool = True) -> list[Cell]:
    """Every cell of the sweep, checking names first (a typo fails before any work); with
    `baselines`, the onnxruntime cells of each model after its own."""
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
        if baselines:
            cells += [Cell(str(model), b, BASELINE_TARGET, BASELINE_RULES) for b in BASELINES]
    return cells


def compare(models: Iterable[str], out_dir: str | Path, strategies: Iterable[str] = STRATEGIES,
            targets: Iterable[str] = ("cpu",), rule_sets: dict[str, list[str]] | None = None,
            jobs: int = 1, scheduler: str | None = None, backend: str | None = None,
            repeats: int = 20, seed: int = 0, ilp_seconds: float = 30.0,
            threads: int | None = None, spread_limit: float = stats.SPREAD_LIMIT,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run the sweep into `out_dir` (resuming), then write the CSV, the table, the plots and
    `metadata.json`. Rows whose IQR exceeds `spread_limit` x their median are marked noisy."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise EqsatFuseError(f"repeats must be a whole number >= 1, got {repeats!r}")
    if not 0 < spread_limit:
        raise EqsatFuseError(f"the spread limit must be a fraction > 0, got {spread_limit!r}")
    say = progress or (lambda _message: None)
    backend = resolve_backend(backend)    # one name for every cell, wherever it runs
    rule_sets = rule_sets or {"shipped": []}
    baselines = _onnxruntime_version() is not None
    if not baselines:
        say("onnxruntime is not installed: no onnxruntime rows (pip install onnxruntime)")
    cells = plan_cells(models, strategies, targets, rule_sets, baselines)
    out = Path(out_dir)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    started = _now_and_load()
    pending = [c for c in cells if not (out / "cells" / f"{c.key}.json").exists()]
    say(f"{len(cells)} cells, {len(cells) - len(pending)} already in {out}, {len(pending)} to run")
    options = dict(backend=backend, repeats=repeats, seed=seed, ilp_seconds=ilp_seconds,
                   threads=threads)
    done = len(cells) - len(pending)
    for cell, row in _execute(pending, rule_sets, options, jobs, scheduler, say):
        _write_json(out / "cells" / f"{cell.key}.json", {"cell": asdict(cell), "row": row})
        done += 1
        say(f"[{done}/{len(cells)}] {row['model']} {cell.strategy} {cell.target} {cell.rules}: "
            + _progress_line(row))
        for note in row.get("notes", []):
            say(f"    note: {note}")
        if _noisy(row, spread_limit):
            say(f"    warning: the IQR is {stats.relative_spread(row):.0%} of the median "
                f"(limit {spread_limit:.0%}): the machine is busy or the runs too short; "
                f"rerun on a quiet machine or with more --repeats")
    rows = [json.loads((out / "cells" / f"{c.key}.json").read_text())["row"] for c in cells]
    order = list(STRATEGIES) + list(BASELINES)
    rows.sort(key=lambda r: (r["model"], r["target"], r["strategy"] in BASELINES, r["rules"],
                             order.index(r["strategy"])))
    _add_speedups(rows)
    for row in rows:
        row["noisy"] = _noisy(row, spread_limit) if row.get("measured_ms") is not None else None
    from .compare_plots import write_plots

    write_tables(rows, out, spread_limit)
    write_plots(rows, out / "plots")
    _write_json(out / "metadata.json", metadata(
        started, _now_and_load(), seed=seed, repeats=repeats, backend=backend, threads=threads,
        spread_limit=spread_limit, cells=len(cells), cells_run=len(pending)))
    return rows


def _progress_line(row: dict) -> str:
    if row["status"] != "ok":
        return f"error: {row['error']}"
    measured = (f"{row['measured_ms']:.3f} ms measured (IQR {row['measured_iqr_ms']:.3f} ms, "
                f"{row['runs']} runs)" if row.get("measured_ms") is not None
                else "predicted only (not this machine)")
    if row["strategy"] in BASELINES:
        return f"onnxruntime {BASELINES[row['strategy']]}, {measured}"
    return f"{row['kernels']} kernels, {row['predicted_us']:.1f} us predicted, {measured}"


def _noisy(row: dict, spread_limit: float) -> bool:
    relative = stats.relative_spread(row)
    return relative is not None and relative > spread_limit


def _add_speedups(rows: list[dict]) -> None:
    """speedup_vs_ort: onnxruntime ENABLE_ALL's median / the row's median, same model (> 1 is
    faster than onnxruntime); measured rows only."""
    base = {r["model"]: r["measured_ms"] for r in rows
            if r["strategy"] == SPEEDUP_BASE and r.get("measured_ms")}
    for row in rows:
        if row.get("measured_ms") and row["model"] in base:
            row["speedup_vs_ort"] = round(base[row["model"]] / row["measured_ms"], 3)


def _execute(cells: list[Cell], rule_sets, options, jobs: int, scheduler: str | None,
             say: Callable[[str], None]):
    """Yield (cell, row) as the cells of each model finish (`run_cells`: a model's cells are
    timed together): one model after another, models on local processes, or on Dask."""
    if not cells:
        return
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.model, []).append(cell)
    work = [[(asdict(c), rule_sets.get(c.rules, [])) for c in group]   # baselines: no rules
            for group in groups.values()]
    if scheduler:
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise EqsatFuseError("a Dask scheduler was given but dask.distributed is not "
                                 "installed: pip install 'eqsat-fuse[cluster]'") from None
        with Client(scheduler) as client:
            futures = {client.submit(run_cells, group, pure=False, **options): model_cells
                       for group, model_cells in zip(work, groups.values())}
            for future in as_completed(futures):
                yield from zip(futures[future], future.result())
        return
    if jobs <= 1:
        for group, model_cells in zip(work, groups.values()):
            yield from zip(model_cells, run_cells(group, progress=say, **options))
        return
    import concurrent.futures as cf
    import multiprocessing

    with cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_cells, group, **options): model_cells
                   for group, model_cells in zip(work, groups.values())}
        for future in cf.as_completed(futures):
            yield from zip(futures[future], future.result())


def _write_json(path: Path, data: dict) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(temp, path)


# ---- what was measured, where ------------------------------------------------------------------

def _now_and_load() -> dict:
    return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average": [round(v, 2) for v in os.getloadavg()]}


def _onnxruntime_version() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime.__version__


def _version(package: str) -> str:
    from importlib import metadata as importlib_metadata

    try:
        return importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _git_commit() -> tuple[str, bool | None]:
    """The project's commit and whether its tracked files differ from it; ("unknown", None)
    outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return "unknown", None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], check=True, capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, bool(dirty)


def metadata(started: dict, finished: dict, **settings) -> dict:
    """What a reader of the results needs to reproduce or judge them: versions, the CPU, the
    thread count, the load average when the sweep started and ended, the seed and settings,
    and the project's git commit."""
    from .. import __version__
    from ..threads import available_cores, resolve

    commit, dirty = _git_commit()
    return {
        "versions": {"eqsat-fuse": __version__, "egglog": _version("egglog"),
                     "numba": _version("numba"), "numpy": _version("numpy"),
                     "onnxruntime": _onnxruntime_version() or "not installed",
                     "onnx": _version("onnx"), "python": platform.python_version()},
        "cpu": _cpu_model(), "platform": platform.platform(), "cores": os.cpu_count(),
        "cores_available": available_cores(), "threads": resolve(settings.pop("threads")),
        "load_average_start": started["load_average"],
        "load_average_end": finished["load_average"],
        "started": started["time"], "finished": finished["time"],
        "git_commit": commit, "git_dirty": dirty,
        "warmup_runs": stats.WARMUP_RUNS, "blocks": stats.BLOCKS,
        "block_pause_s": stats.BLOCK_PAUSE_S, "bootstrap_resamples": stats.BOOTSTRAP_RESAMPLES,
        **settings}


# ---- the tables --------------------------------------------------------------------------------

def write_tables(rows: list[dict], out: Path, spread_limit: float = stats.SPREAD_LIMIT) -> None:
    """results.csv (every column) and results.md (the columns people compare, then the noisy
    cells and Spearman's rho of the cost model per measured target)."""
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})
    header = ["model", "target", "rules", "strategy", "kernels", "predicted_us",
              "measured_ms (median)", "IQR ms", "median 95% CI ms", "vs ORT", "bytes_moved",
              "peak_bytes", "egraph_nodes", "stop_reason", "t_compile", "verified"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(_table_cells(row)) + " |")
    lines += _table_notes(rows, spread_limit)
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _table_cells(row: dict) -> list[str]:
    error = row["status"] != "ok"
    measured = row.get("measured_ms") is not None
    if measured:
        timing = [_fmt(row["measured_ms"]) + (" (noisy)" if row.get("noisy") else ""),
                  _fmt(row["measured_iqr_ms"]),
                  f"{_fmt(row['measured_ci_low_ms'])}-{_fmt(row['measured_ci_high_ms'])}",
                  _fmt(row.get("speedup_vs_ort"))]
    else:
        timing = ["predicted only" if not error else "", "", "", ""]
    strategy = (f"onnxruntime {BASELINES[row['strategy']]}" if row["strategy"] in BASELINES
                else row["strategy"])
    kernels = f"error: {row['error'][:60]}" if error else _fmt(row.get("kernels"))
    return [_fmt(row["model"]), _fmt(row["target"]), _fmt(row["rules"]), strategy, kernels,
            _fmt(row.get("predicted_us")), *timing,
            *[_fmt(row.get(k)) for k in ("bytes_moved", "peak_bytes", "egraph_nodes",
                                        "stop_reason", "t_compile", "verified")]]


def _table_notes(rows: list[dict], spread_limit: float) -> list[str]:
    notes = ["", "measured_ms is the median of the timed runs on this machine (IQR: p75 - p25; "
             "CI: bootstrap 95% interval of the median); \"vs ORT\" is onnxruntime ENABLE_ALL's "
             "median over the row's (> 1: faster). Targets other than this machine show "
             "\"predicted only\": their cost is the cost model's, not a measurement."]
    noisy = [r for r in rows if r.get("noisy")]
    if noisy:
        notes.append("")
        notes.append(f"Warning: {len(noisy)} measured cells have an IQR above "
                     f"{spread_limit:.0%} of their median (marked noisy); their medians may "
                     f"not reproduce:")
        notes += [f"- {r['model']} {r['strategy']} {r['target']} {r['rules']}: IQR "
                  f"{stats.relative_spread(r):.0%} of the median" for r in noisy]
    for target, points in sorted(stats.prediction_points(rows).items()):
        rho = stats.spearman([(p, m) for p, m, _ in points])
        notes.append("")
        notes.append(f"Spearman's rho of predicted against measured, target {target}: "
                     + (f"{rho:.3f}" if rho is not None else "undefined")
                     + f" over {len(points)} cells")
    return notes


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "\\|")


def print_progress(message: str) -> None:
    print(f"[eqsat-fuse compare] {message}", file=sys.stderr, flush=True)
