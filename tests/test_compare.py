"""The research harness: eqsat-fuse compare writes the table, the CSV and the plots, resumes,
and runs its cells on local processes or a Dask cluster."""

from __future__ import annotations

import csv
import json

import pytest

import eqsat_fuse as ef
from eqsat_fuse.cli import main
from eqsat_fuse.tools.compare import STRATEGIES, compare
from eqsat_fuse.resources import targets

from conftest import MODELS_DIR

TWO_MODELS = [str(MODELS_DIR / "resnet_tiny_op17.onnx"), str(MODELS_DIR / "bert_tiny_op17.onnx")]


def test_every_strategy_and_target_on_two_models_then_resume(tmp_path, capsys):
    out = tmp_path / "results"
    args = ["compare", *TWO_MODELS, "-o", str(out), "--targets", *targets(), "--repeats", "2",
            "--ilp-seconds", "10"]
    assert main(args) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 * len(STRATEGIES) * len(targets())
    assert {r["strategy"] for r in rows} == set(STRATEGIES)
    assert all(r["status"] == "ok" and r["verified"] == "True" for r in rows)
    table = (out / "results.md").read_text()
    assert table.count("\n") == len(rows) + 2 and "eqsat-ilp" in table
    for plot in ("predicted_cost.png", "kernels.png", "compile_time.png",
                 "predicted_vs_measured.png"):
        assert (out / "plots" / plot).read_bytes()[:4] == b"\x89PNG"
    # per target: equality saturation never predicts a costlier program than no rewriting
    for r in rows:
        if r["strategy"].startswith("eqsat"):
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
    assert len(rows) == 4 and all(r["status"] == "ok" and r["verified"] for r in rows)
    assert len(list((tmp_path / "cells").glob("*.json"))) == 4


def test_local_processes_give_the_same_rows_as_one_process(tmp_path):
    serial = compare(TWO_MODELS[:1], tmp_path / "a", strategies=["none", "eqsat-greedy"],
                     repeats=1)
    parallel = compare(TWO_MODELS[:1], tmp_path / "b", strategies=["none", "eqsat-greedy"],
                       repeats=1, jobs=2)
    drop = {"measured_ms", "max_abs_diff"} | {k for k in serial[0] if k.startswith("t_")}
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
