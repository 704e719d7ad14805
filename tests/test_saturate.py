"""Stage 2, saturate: rule files, budgets, stop reasons and what fired."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.frontend.encode import encode
from eqsat_fuse.frontend.importer import import_model
from eqsat_fuse.saturation.saturate import Budgets, RuleProgram, StopReason, saturate

from conftest import MODELS_DIR, conv_bn_relu_model, make_model


def chain_model(length=6):
    nodes, last = [], "x"
    for i in range(length):
        op = ["Relu", "Sigmoid", "Tanh", "Neg"][i % 4]
        nodes.append(helper.make_node(op, [last], [f"t{i}"]))
        last = f"t{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make_model(nodes, [("x", [4, 8])], [("y", [4, 8])])


def test_small_model_saturates_and_reports_what_fired(rng):
    _, report = saturate(encode(import_model(conv_bn_relu_model(rng))), numerics="fast")
    assert report.stop_reason == "saturated"
    assert report.matches_per_rule["conv2d-bn-fold"] == 1
    assert report.matches_per_rule["fuse-relu"] >= 1
    assert report.egraph_nodes > 0 and report.iterations >= 1
    assert report.rules["fuse-relu"].file.endswith("generated.egg")


def test_iteration_budget_stops_the_run_and_the_program_is_still_correct():
    compiled = ef.compile(chain_model(8), budgets=Budgets(iterations=1))
    assert compiled.report.stop_reason == "iteration budget"
    assert compiled.verify().ok


def test_node_budget_stops_the_run_and_the_program_is_still_correct():
    compiled = ef.compile(MODELS_DIR / "resnet_tiny_op17.onnx", budgets=Budgets(nodes=200))
    assert compiled.report.stop_reason == "node budget"
    assert compiled.verify().ok


def test_time_budget_stops_the_run():
    compiled = ef.compile(chain_model(4), budgets=Budgets(seconds=1e-9))
    assert compiled.report.stop_reason == "time budget"
    assert compiled.report.iterations == 0
    assert compiled.verify().ok


def test_a_user_rule_is_loaded_scheduled_and_reported(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text('; Neg of Neg is the input\n'
                     '(rewrite (Neg (Neg x)) x :ruleset canon :name "double-negation")\n'
                     '(rewrite (Neg (Mat (Neg x))) x :ruleset canon :name "double-negation-mat")\n')
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    model = make_model(nodes, [("x", [3, 3])], [("y", [3, 3])])
    compiled = ef.compile(model, rules=[rules])
    assert compiled.report.matches_per_rule.get("double-negation-mat", 0) >= 1
    assert [k.ops for k in compiled.report.kernels if k.kind == "compute"] == [["Relu"]]
    assert compiled.verify().ok


@pytest.mark.parametrize("text, line, column, message", [
    ('(rewrite (Relu x) x :ruleset fuse :name "a"\n', 1, 1, "never closed"),
    ('(ruleset mine)\n(rewrite (Relu (Mat x))\n  (Relu x) :ruleset mine :name "a"\n\n', 2, 1,
     "never closed"),
    ('(rewrite (Relu x) (Abs x) :ruleset fuse :name "a;(")\n(rewrite (Neg x) x\n', 2, 1,
     "never closed"),
    ('\n(rewrite (Frobnicate x) x :ruleset fuse :name "a")\n', 2, 10, "Unbound function Frobnicate"),
    ('(rewrite (Relu x y) x :ruleset fuse :name "a")\n', 1, 10, "Arity mismatch"),
    ('(rewrite (Relu x) y :ruleset fuse :name "a")\n', 1, 19, "Unbound symbol y"),
    ('(rewrite (Relu x) x :ruleset fuse)\n', 1, 1, "needs a :name"),
    ('(include "/etc/passwd")\n', 1, 1, "'Include' is not allowed"),
    ('(rewrite (Relu x) x :ruleset fuse :name "a")\n(input fusable "/etc/passwd")\n', 2, 1,
     "'Input' is not allowed"),
    ('(output "/tmp/stolen.txt" (Relu (Input "x")))\n', 1, 1, "'Output' is not allowed"),
    ('(run-schedule (run fuse))\n', 1, 1, "not allowed"),
    ('(rewrite (Relu x) x :ruleset fuse :name "fuse-relu")\n', 1, 1, "already used"),
])
def test_rule_file_mistakes_name_file_line_and_column(tmp_path, text, line, column, message):
    path = tmp_path / "bad.egg"
    path.write_text(text)
    with pytest.raises(ef.RuleFileError, match=message) as info:
        RuleProgram([path])
    assert str(info.value).startswith(f"{path}:{line}:{column}: ")
    assert "\n" not in str(info.value)                     # one line, as the CLI prints it
    assert (info.value.file, info.value.line, info.value.column) == (str(path), line, column)


def test_forbidden_commands_are_refused_before_anything_runs(tmp_path):
    stolen = tmp_path / "stolen.txt"
    path = tmp_path / "bad.egg"
    path.write_text(f'(ruleset mine)\n(output "{stolen}" (Relu (Input "x")))\n')
    with pytest.raises(ef.RuleFileError):
        RuleProgram([path])
    assert not stolen.exists()


def test_missing_rule_file_is_reported(tmp_path):
    with pytest.raises(ef.RuleFileError, match="cannot read"):
        RuleProgram([tmp_path / "nope.egg"])


def test_each_iteration_is_recorded_like_eggs_runner(rng):
    compiled = ef.compile(conv_bn_relu_model(rng))
    report = compiled.report
    records = report.saturation_iterations
    assert [r["iteration"] for r in records] == list(range(1, report.iterations + 1))
    # the per-iteration matches add up to the per-rule totals, the last size is the e-graph's
    assert sum(r["matches"] for r in records) == sum(report.matches_per_rule.values())
    assert records[-1]["egraph_nodes"] == report.egraph_nodes
    assert records[0]["rules_matched"] > 0 and all(r["seconds"] >= 0 for r in records)
    # saturated: the last iteration added nothing to the e-graph
    assert report.stop_reason is StopReason.SATURATED
    assert len(records) >= 2 and records[-1]["egraph_nodes"] == records[-2]["egraph_nodes"]
    assert json.loads(json.dumps(report.as_dict()))["stop_reason"] == "saturated"


def test_no_iteration_budget_says_not_run():
    compiled = ef.compile(chain_model(4), budgets=Budgets(iterations=0))
    assert compiled.report.stop_reason == StopReason.NOT_RUN == "not run"
    assert compiled.report.saturation_iterations == [] and compiled.report.iterations == 0
    assert compiled.verify().ok


def test_the_passes_strategy_records_one_entry_per_round(rng):
    report = ef.compile(conv_bn_relu_model(rng), strategy="passes").report
    assert report.stop_reason in (StopReason.PASSES_CONVERGED, StopReason.ITERATION_BUDGET)
    assert [r["iteration"] for r in report.saturation_iterations] == \
        list(range(1, report.iterations + 1))
    assert sum(r["matches"] for r in report.saturation_iterations) == \
        sum(report.matches_per_rule.values())
