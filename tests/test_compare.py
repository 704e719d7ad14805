"""The research harness: eqsat-fuse compare writes the table, the CSV and the plots, resumes,
and runs its cells on local processes or a Dask cluster."""

from __future__ import annotations

import csv
import json

import pytest

import eqsat_fuse as ef
from eqsat_fuse.cli import main
from eqsat_fuse.tools.compare import BASELINES, STRATEGIES, TIMING, compare
from eqsat_fuse.resources import targets

from conftest import MODELS_DIR

TWO_MODELS = [str(MODELS_DIR / "resnet_tiny_op17.onnx"), str(MODELS_DIR / "bert_tiny_op17.onnx")]


def test_every_strategy_and_target_on_two_models_then_resume(tmp_path, capsys):
    out = tmp_path / "results"
    args = ["compare", *TWO_MODELS, "-o", str(out), "--targets", *targets(), "--repeats", "2",
            "--ilp-seconds", "10"]
    assert main(args) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 * len(STRATEGIES) * len(targets()) + 2 * len(BASELINES)
    assert {r["strategy"] for r in rows} == set(STRATEGIES) | set(BASELINES)
    assert all(r["status"] == "ok" and r["verified"] == "True" for r in rows)
    table = (out / "results.md").read_text()
    assert table.split("\n\n")[0].count("\n") == len(rows) + 1 and "eqsat-ilp" in table
    for plot in ("predicted_cost.png", "kernels.png", "compile_time.png", "measured_time.png",
                 "predicted_vs_measured.png"):
        assert (out / "plots" / plot).read_bytes()[:4] == b"\x89PNG"
    # latency is measured on this machine's target only; the others are predicted, and say so
    for r in rows:
        if r["target"] == "cpu":
            assert r["latency"] == "measured" and r["runs"] == "2" and r["speedup_vs_ort"]
            assert float(r["measured_p25_ms"]) <= float(r["measured_ms"]) \
                <= float(r["measured_p75_ms"])
            assert float(r["measured_ci_low_ms"]) <= float(r["measured_ms"]) \
                <= float(r["measured_ci_high_ms"])
        else:
            assert r["latency"] == "predicted" and r["measured_ms"] == r["runs"] == ""
    assert table.count("| predicted only |") == 2 * len(STRATEGIES) * (len(targets()) - 1)
    # onnxruntime, both levels, once per model; the speedup is against ENABLE_ALL
    ort = [r for r in rows if r["strategy"] in BASELINES]
    assert sorted((r["model"], r["strategy"]) for r in ort) == sorted(
        (m.rsplit("/", 1)[1], b) for m in TWO_MODELS for b in BASELINES)
    assert {r["speedup_vs_ort"] for r in ort if r["strategy"] == "ort-enable-all"} == {"1.0"}
    assert "| onnxruntime ORT_ENABLE_ALL |" in table
    assert {r["stop_reason"] for r in rows if r["strategy"] == "none"} == {"not run"}
    # per target: DAG extraction never predicts a costlier program than no rewriting (tree
    # extraction prices a shared class once per use, so on a DAG it may: BERT's on cpu does)
    for r in rows:
        if r["strategy"] in ("eqsat-greedy", "eqsat-ilp"):
            base = next(b for b in rows if b["strategy"] == "none" and b["model"] == r["model"]
                        and b["target"] == r["target"])
            assert float(r["predicted_us"]) <= float(base["predicted_us"]) * (1 + 1e-9)
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    capsys.readouterr()
    assert main(args) == 0
    assert f"{len(rows)} already in" in capsys.readouterr().err
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}


def test_cells_run_on_a_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        rows = compare(TWO_MODELS, tmp_path, strategies=["none", "eqsat-greedy"],
                       targets=["cpu"], scheduler=cluster.scheduler_address, repeats=1)
    assert len(rows) == 8 and all(r["status"] == "ok" and r["verified"] for r in rows)
    assert len(list((tmp_path / "cells").glob("*.json"))) == 8


def test_local_processes_give_the_same_rows_as_one_process(tmp_path):
    serial = compare(TWO_MODELS[:1], tmp_path / "a", strategies=["none", "eqsat-greedy"],
                     repeats=1)
    parallel = compare(TWO_MODELS[:1], tmp_path / "b", strategies=["none", "eqsat-greedy"],
                       repeats=1, jobs=2)
    drop = {*TIMING, "times_ms", "noisy", "speedup_vs_ort", "max_abs_diff"} | {
        k for k in serial[0] if k.startswith("t_")}
    assert [{k: v for k, v in r.items() if k not in drop} for r in serial] == \
           [{k: v for k, v in r.items() if k not in drop} for r in parallel]


def test_a_cell_that_fails_is_recorded_and_the_sweep_goes_on(tmp_path):
    bad = tmp_path / "bad.egg"
    bad.write_text('(rewrite (Relu x) (Nope x) :ruleset fuse :name "broken")\n')
    rows = compare(TWO_MODELS[:1], tmp_path / "out", strategies=["eqsat-greedy"],
                   rule_sets={"shipped": [], "broken": [str(bad)]}, repeats=1)
    by_rules = {r["rules"]: r for r in rows}
    assert by_rules["shipped"]["status"] == "ok"
    assert by_rules["broken"]["status"] == "error" and "Nope" in by_rules["broken"]["error"]
    cell = json.loads(next((tmp_path / "out" / "cells").glob("*broken.json")).read_text())
    assert cell["row"]["status"] == "error"


@pytest.mark.parametrize("kwargs, message", [
    ({"strategies": ["magic"]}, "unknown strategy 'magic'"),
    ({"targets": ["tpu"]}, "unknown target 'tpu'"),
])
def test_bad_sweep_names_fail_before_any_work(tmp_path, kwargs, message):
    with pytest.raises(ef.EqsatFuseError, match=message):
        compare(TWO_MODELS, tmp_path, **kwargs)
    assert not (tmp_path / "cells").exists() or not any((tmp_path / "cells").iterdir())


def test_the_passes_strategy_says_which_user_rules_cannot_fire_and_why(tmp_path):
    from onnx import helper

    from conftest import make_model

    rules = tmp_path / "inline.egg"
    rules.write_text('; Relu of an inline Relu is one Relu (needs the two fused first)\n'
                     '(rewrite (Relu (Relu x)) (Relu x) :ruleset fold :name "relu-relu-inline")\n')
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Exp", ["b"], ["y"])]
    model = make_model(nodes, [("x", [4, 4])], [("y", [4, 4])])
    # edge-npu runs no elementwise fusion, so no pass ever commits (Relu (Relu x)) ...
    passes = ef.compile(model, rules=[rules], strategy="passes", target="edge-npu").report
    assert "relu-relu-inline" not in passes.matches_per_rule
    assert len(passes.notes) == 1
    note = passes.notes[0]
    assert f"rule 'relu-relu-inline' ({rules}:2, ruleset fold) cannot fire under the passes " \
           f"strategy" in note and "the fused term (Relu (Relu x))" in note
    assert f"note          {note}" in passes.summary()
    # ... while equality saturation keeps the alternative and the rule fires, with no note
    eqsat = ef.compile(model, rules=[rules], target="edge-npu").report
    assert eqsat.matches_per_rule["relu-relu-inline"] >= 1 and not eqsat.notes
    assert eqsat.kernels_out < passes.kernels_out


def test_timed_runs_take_turns_in_blocks_a_pause_apart(monkeypatch):
    """A shared machine's speed changes over seconds, so the runs of the cells being compared
    are taken in rounds, a block of each cell a round, each block after a pause and an untimed
    run, the cells taking turns at going first: every cell sees the same slow stretches."""
    from eqsat_fuse.tools import compare_stats

    events = []
    monkeypatch.setattr(compare_stats.time, "sleep", lambda s: events.append(f"pause {s}"))
    times = compare_stats.time_interleaved([lambda: events.append("a"),
                                            lambda: events.append("b")],
                                           5, warmup=1, blocks=2, pause_s=0.05)
    assert [len(t) for t in times] == [5, 5]
    # 1 warm-up each; round 1: a block of 3 of a, then of b; round 2: blocks of 2, b first
    assert events == ["a", "b"] + ["pause 0.05", "a"] + ["a"] * 3 \
        + ["pause 0.05", "b"] + ["b"] * 3 + ["pause 0.05", "b"] + ["b"] * 2 \
        + ["pause 0.05", "a"] + ["a"] * 2
    assert [len(t) for t in compare_stats.time_interleaved([lambda: None], 2, blocks=5,
                                                            pause_s=0.0)] == [2]


def test_the_cells_of_a_model_are_timed_together(tmp_path, monkeypatch):
    """Each model's measured cells, onnxruntime's included, are timed in one interleaved
    schedule (so a slow stretch of the machine reaches all of them), one model at a time."""
    from eqsat_fuse.tools import compare_stats

    schedules = []
    original = compare_stats.time_interleaved

    def recorded(calls, repeats, **kwargs):
        schedules.append(len(calls))
        return original(calls, repeats, pause_s=0.0, **kwargs)

    monkeypatch.setattr(compare_stats, "time_interleaved", recorded)
    rows = compare(TWO_MODELS, tmp_path, strategies=["none", "eqsat-greedy"],
                   targets=["cpu", "gpu"], repeats=2)
    assert schedules == [4, 4]          # per model: 2 strategies on cpu and 2 onnxruntime rows
    measured = [r for r in rows if r.get("measured_ms") is not None]
    assert len(measured) == 8 and all(r["runs"] == 2 for r in measured)


def test_a_noisy_cell_is_warned_about_and_the_sweep_is_described_in_metadata(tmp_path):
    said = []
    rows = compare(TWO_MODELS[:1], tmp_path, strategies=["none"], targets=["cpu", "gpu"],
                   repeats=3, spread_limit=1e-9, progress=said.append)
    measured = [r for r in rows if r.get("measured_ms") is not None]
    assert len(measured) == 3 and all(r["noisy"] for r in measured)   # none on cpu, ORT x2
    assert all(len(r["times_ms"]) == 3 for r in measured)             # the raw times are kept
    assert any("warning: the IQR is" in line and "of the median (limit 0%)" in line
               for line in said)
    assert "Warning: 3 measured cells have an IQR above 0% of their median" in \
        (tmp_path / "results.md").read_text()
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert set(meta["versions"]) >= {"eqsat-fuse", "egglog", "numba", "numpy", "onnxruntime"}
    assert meta["versions"]["eqsat-fuse"] == ef.__version__
    assert meta["cpu"] and meta["threads"] >= 1 and meta["seed"] == 0 and meta["repeats"] == 3
    assert len(meta["load_average_start"]) == len(meta["load_average_end"]) == 3
    assert meta["git_commit"] == "unknown" or len(meta["git_commit"]) == 40
    assert (meta["cells"], meta["cells_run"]) == (4, 4)


def _rows(**by_rules):
    """Rows of two models, strategies none and eqsat-greedy, rule sets given as
    {rules: (predicted us of none, of eqsat-greedy)} on the cpu target, measured at 2x."""
    rows = []
    for model in ("a.onnx", "b.onnx"):
        for rules, costs in by_rules.items():
            for strategy, cost in zip(("none", "eqsat-greedy"), costs):
                cost *= 2 if model == "b.onnx" else 1
                rows.append({"model": model, "strategy": strategy, "target": "cpu",
                             "rules": rules, "status": "ok", "predicted_us": cost,
                             "kernels": 3, "measured_ms": cost * 2e-3,
                             "measured_p25_ms": cost * 1.9e-3, "measured_p75_ms": cost * 2.1e-3})
    return rows


def test_bar_plots_keep_every_rule_set_on_linear_axes_from_zero():
    from eqsat_fuse.tools.compare_plots import bar_figure

    fig = bar_figure(_rows(shipped=(100.0, 60.0), mine=(100.0, 40.0)), "predicted_us",
                     "predicted cost", "us")
    (ax,) = fig.axes
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["none [shipped]", "eqsat-greedy [shipped]", "none [mine]",
                      "eqsat-greedy [mine]"]
    heights = {c.get_label(): [bar.get_height() for bar in c] for c in ax.containers}
    assert heights["eqsat-greedy [shipped]"] == [60.0, 120.0]
    assert heights["eqsat-greedy [mine]"] == [40.0, 80.0]      # its own rows, not shipped's
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0


def test_the_scatter_has_y_equals_x_spearman_per_target_and_tells_models_apart():
    from eqsat_fuse.tools.compare_plots import scatter_figure

    rows = _rows(shipped=(100.0, 60.0))
    rows += [dict(r, target="gpu", measured_ms=None) for r in rows]   # predicted only
    fig = scatter_figure(rows)
    (ax,) = fig.axes                                   # gpu was not measured: no panel
    assert ax.get_title() == "cpu: Spearman's ρ = 1.00 (n = 4)"
    (line,) = [l for l in ax.get_lines() if l.get_label() == "y = x"]
    assert list(line.get_xdata()) == list(line.get_ydata())
    assert ax.get_xlim()[0] == ax.get_ylim()[0] == 0 and ax.get_xscale() == "linear"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["y = x", "a", "b", "none", "eqsat-greedy"]


def test_only_this_machines_targets_are_measured(tmp_path):
    from eqsat_fuse.tools.calibrate import target_name
    from eqsat_fuse.tools.compare import measures_here

    shipped = (MODELS_DIR.parent.parent / "extract" / "cpu.toml").read_text()
    here, elsewhere = tmp_path / "here.toml", tmp_path / "elsewhere.toml"
    here.write_text(shipped.replace('name = "cpu"', f'name = "{target_name(here)}"'))
    elsewhere.write_text(shipped.replace('name = "cpu"', 'name = "cpu@another-host"'))
    assert measures_here("cpu") and measures_here(str(here))
    assert not measures_here("gpu") and not measures_here("edge-npu")
    assert not measures_here(str(elsewhere))
