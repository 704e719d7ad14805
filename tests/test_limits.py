"""Hard limits: saturation in a child process with a memory cap and a deadline
(eqsat_fuse.saturation.limits).

A pathological rule set must end with a clear outcome — the program of the last completed
iteration, or a `LimitError` naming the limit — never with this process killed for memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.saturation.limits import HardLimits, parse_hard_limits

from conftest import conv_bn_relu_model, make_model

# Commutativity and associativity of Add: on a long sum chain the e-graph grows without end.
EXPLOSIVE_RULES = """\
(rewrite (Add a b) (Add b a) :ruleset fuse :name "user-add-comm")
(rewrite (Add (Add a b) c) (Add a (Add b c)) :ruleset fuse :name "user-add-assoc")
(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset fuse :name "user-add-assoc-r")
"""


def sum_chain(n=20):
    nodes, last = [], "x0"
    for i in range(1, n):
        nodes.append(helper.make_node("Add", [last, f"x{i}"], [f"s{i}"]))
        last = f"s{i}"
    return make_model(nodes, [(f"x{i}", [4]) for i in range(n)], [(last, [4])])


@pytest.fixture
def explosive(tmp_path):
    path = tmp_path / "explosive.egg"
    path.write_text(EXPLOSIVE_RULES)
    return path


UNBOUNDED = ef.Budgets(iterations=1000, nodes=10**9, seconds=1e9)


def test_hard_limits_give_the_same_program_as_in_process(rng):
    model = conv_bn_relu_model(rng)
    plain = ef.compile(model)
    limited = ef.compile(model, hard_limits=HardLimits(memory_mb=1024, seconds=120))
    assert [k.ops for k in limited.report.kernels] == [k.ops for k in plain.report.kernels]
    assert limited.report.stop_reason == plain.report.stop_reason == "saturated"
    assert limited.report.matches_per_rule == plain.report.matches_per_rule
    assert limited.report.egraph_nodes == plain.report.egraph_nodes
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(limited.run({"x": x})["y"], plain.run({"x": x})["y"])


def test_memory_limit_ends_with_the_last_completed_iteration(explosive):
    model = sum_chain()
    compiled = ef.compile(model, rules=[explosive], budgets=UNBOUNDED,
                          hard_limits=HardLimits(memory_mb=100, seconds=600))
    report = compiled.report
    assert report.stop_reason == "hard memory limit"
    assert report.iterations >= 1 and report.egraph_nodes > 0
    assert report.matches_per_rule.get("user-add-comm", 0) > 0
    # the iterations the child finished are recorded one by one, up to the one extracted
    assert [r["iteration"] for r in report.saturation_iterations] == \
        list(range(1, report.iterations + 1))
    assert compiled.verify().ok


def test_time_limit_ends_with_the_last_completed_iteration(explosive):
    compiled = ef.compile(sum_chain(), rules=[explosive], budgets=UNBOUNDED,
                          hard_limits=HardLimits(memory_mb=None, seconds=2))
    assert compiled.report.stop_reason == "hard time limit"
    assert compiled.verify().ok


def test_a_limit_hit_before_the_model_is_loaded_is_a_clear_error():
    with pytest.raises(ef.LimitError, match=r"hard time limit \(0.01 s\) before the model was "
                                            r"loaded.*--hard-limits"):
        ef.compile(sum_chain(4), hard_limits=HardLimits(seconds=0.01))


def test_an_iteration_that_overshoots_the_node_budget_is_not_extracted(explosive):
    # in process, the iteration that crosses the budget is kept (and can be huge); with hard
    # limits the e-graph handed to extraction stays within the budget
    budgets = ef.Budgets(iterations=1000, nodes=5000, seconds=1e9)
    compiled = ef.compile(sum_chain(12), rules=[explosive], budgets=budgets,
                          hard_limits=HardLimits(memory_mb=2048, seconds=600))
    assert compiled.report.stop_reason == "node budget"
    assert compiled.report.egraph_nodes <= 5000
    records = compiled.report.saturation_iterations
    assert len(records) == compiled.report.iterations
    assert records[-1]["egraph_nodes"] == compiled.report.egraph_nodes
    assert compiled.verify().ok


def test_rule_file_errors_come_back_from_the_child_unchanged(tmp_path):
    rules = tmp_path / "bad.egg"
    rules.write_text('\n(rewrite (Relu x) (Nope x) :ruleset fuse :name "oops")\n')
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    with pytest.raises(ef.RuleFileError) as in_process:
        ef.compile(model, rules=[rules])
    with pytest.raises(ef.RuleFileError) as in_child:
        ef.compile(model, rules=[rules], hard_limits=HardLimits())
    assert str(in_child.value) == str(in_process.value)
    assert (in_child.value.file, in_child.value.line, in_child.value.column) == \
        (in_process.value.file, in_process.value.line, in_process.value.column)


def test_forbidden_rule_commands_are_refused_in_the_child_too(tmp_path):
    stolen = tmp_path / "stolen.txt"
    rules = tmp_path / "bad.egg"
    rules.write_text(f'(output "{stolen}" (Relu (Input "x")))\n')
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    with pytest.raises(ef.RuleFileError, match="'Output' is not allowed"):
        ef.compile(model, rules=[rules], hard_limits=HardLimits())
    assert not stolen.exists()


@pytest.mark.parametrize("text, expected", [
    ("default", HardLimits()),
    ("memory_mb=512,seconds=30", HardLimits(512, 30.0)),
    ("seconds=5", HardLimits(seconds=5.0)),
    ("memory-mb=256", HardLimits(memory_mb=256)),
    ("memory_mb=off", HardLimits(memory_mb=None)),
])
def test_hard_limits_spec_on_the_command_line(text, expected):
    assert parse_hard_limits(text) == expected


@pytest.mark.parametrize("text, message", [
    ("memory=5", "expected memory_mb=N,seconds=S"),
    ("memory_mb=lots", "memory_mb must be a number"),
    ("memory_mb=-1", "whole number of MB > 0"),
    ("seconds=0", "seconds > 0"),
])
def test_bad_hard_limits_spec_is_refused(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_hard_limits(text)


def test_cli_hard_limits_end_to_end(tmp_path, rng):
    path = tmp_path / "model.onnx"
    path.write_bytes(conv_bn_relu_model(rng).SerializeToString())
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "optimize", str(path),
                           "--hard-limits", "--quiet", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stop_reason"] == "saturated"
    bad = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "optimize", str(path),
                          "--hard-limits", "memory_mb=-3"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "whole number of MB > 0" in bad.stderr
    assert "Traceback" not in bad.stderr
