"""The three extractors cross-checked on random e-graphs: every answer is a valid program whose
reported cost is its program cost; the ILP is exact (its objective is the program cost of any
choice it allows, and it allows exactly the valid ones), never worse than greedy-dag and equal to
brute force; tree extraction is optimal on trees."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eqsat_fuse.extraction.costmodel import load_cost_model
from eqsat_fuse.extraction.cost import ExtractionError, Pricing, constant_classes, program_cost
from eqsat_fuse.extraction.registry import EXTRACTORS, extract
from eqsat_fuse.extraction.ilp import IlpExtractor

from random_egraphs import all_choices, random_egraph

TARGETS = {name: load_cost_model(name) for name in ("cpu", "gpu", "edge-npu")}
# cpu and edge-npu without their on-chip thresholds: bytes priced linearly, where tree cost is
# exact
for _name in ("cpu", "edge-npu"):
    TARGETS[f"{_name}-linear"] = dataclasses.replace(TARGETS[_name], onchip_bytes=None,
                                                     onchip_bandwidth_gbs=None)
CASES = [(t, "latency") for t in TARGETS] + [("edge-npu", "energy"), ("gpu", "energy")]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def brute_force(eg, roots, model, objective):
    """The cheapest valid program by enumeration (None if there are too many choices)."""
    pick = constant_classes(eg)
    pricing = Pricing(eg, model, objective, pick)
    best, complete = math.inf, True
    choices = all_choices(eg, roots, pick, limit=20000)
    count = 0
    for choice in choices:
        count += 1
        try:
            cost, _ = program_cost(eg, model, choice, roots, pricing.constant, objective, pricing)
        except ExtractionError:
            continue
        best = min(best, cost)
    if count >= 20000:
        complete = False
    return best if complete else None


def run(eg, roots, model, objective, name):
    try:
        return extract(eg, roots, model, name, objective=objective)
    except ExtractionError:
        return None


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


@FAST
@given(st.randoms(use_true_random=False), st.integers(2, 9), st.sampled_from(CASES))
def test_every_extractor_reports_the_program_cost_of_its_choice(rnd, ops, case):
    target, objective = case
    eg, roots = random_egraph(rnd, ops)
    model = TARGETS[target]
    results = {name: run(eg, roots, model, objective, name) for name in EXTRACTORS}
    if results["ilp"] is None:               # no valid program exists: nobody finds one
        assert all(r is None for r in results.values())
        return
    for name, result in results.items():
        if result is None:
            continue                          # a heuristic may miss every valid program
        cost, kernels = program_cost(eg, model, result.choice, roots, result.constant, objective)
        assert same(cost, result.cost), name
        assert set(kernels) == set(result.kernels)
        assert same(result.latency_us, sum(k.us for k in kernels.values()))


@FAST
@given(st.randoms(use_true_random=False), st.integers(2, 9), st.sampled_from(CASES))
def test_ilp_is_never_worse_than_greedy_dag_or_tree(rnd, ops, case):
    target, objective = case
    eg, roots = random_egraph(rnd, ops)
    model = TARGETS[target]
    ilp = run(eg, roots, model, objective, "ilp")
    for name in ("greedy-dag", "tree"):
        other = run(eg, roots, model, objective, name)
        if other is not None:
            assert ilp is not None
            assert ilp.cost <= other.cost * (1 + 1e-7) + 1e-7, name


@FAST
@given(st.randoms(use_true_random=False), st.integers(2, 9), st.sampled_from(CASES))
def test_ilp_objective_is_the_program_cost_of_every_choice(rnd, ops, case):
    """Random choices, valid or not: the ILP with x fixed to the choice is feasible exactly when
    program_cost accepts it, and then its objective is that cost."""
    target, objective = case
    eg, roots = random_egraph(rnd, ops)
    model = TARGETS[target]
    pick = constant_classes(eg)
    ilp = IlpExtractor(model, objective)
    choices = list(all_choices(eg, roots, pick, limit=400))
    rnd.shuffle(choices)
    for choice in choices[:6]:
        full = dict(choice)
        for c, n in pick.items():
            full.setdefault(c, n)
        try:
            expected, _ = program_cost(eg, model, full, roots, frozenset(pick), objective)
        except ExtractionError:
            expected = None
        got = ilp.objective_of(eg, roots, choice)
        if expected is None:
            assert got is None, "the ILP allows a choice program_cost rejects"
        else:
            assert got is not None, "the ILP rejects a valid choice"
            assert same(got, expected)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.randoms(use_true_random=False), st.integers(2, 8), st.sampled_from(CASES))
def test_ilp_finds_the_brute_force_optimum(rnd, ops, case):
    target, objective = case
    eg, roots = random_egraph(rnd, ops)
    model = TARGETS[target]
    best = brute_force(eg, roots, model, objective)
    assume(best is not None)
    result = run(eg, roots, model, objective, "ilp")
    if best == math.inf:
        assert result is None
        return
    assert result is not None
    assert same(result.cost, best)
    assert result.details["objective"] is None or same(result.details.get("objective",
                                                                          result.cost), best)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.randoms(use_true_random=False), st.integers(2, 9),
       st.sampled_from(["cpu-linear", "gpu", "edge-npu-linear"]))
def test_tree_extraction_is_optimal_on_trees(rnd, ops, target):
    eg, roots = random_egraph(rnd, ops, tree=True)
    roots = roots[:1]
    model = TARGETS[target]
    best = brute_force(eg, roots, model, "latency")
    assume(best is not None)
    result = run(eg, roots, model, "latency", "tree")
    if best == math.inf:
        assert result is None
        return
    assert result is not None
    assert same(result.cost, best)


def test_ilp_reports_a_gap_when_stopped_early():
    rnd = random.Random(7)
    eg, roots = random_egraph(rnd, 9)
    result = IlpExtractor(TARGETS["cpu"], seconds=0.0).extract(eg, roots)
    assert "gap" in result.details
    assert result.details["status"] in ("time limit", "optimal", "infeasible")


def test_extractors_are_tagged_with_their_optimality():
    tags = {name: EXTRACTORS[name].optimality for name in EXTRACTORS}
    assert tags == {"tree": "tree-optimal", "greedy-dag": "heuristic", "ilp": "dag-optimal"}


@pytest.mark.parametrize("name", ["tree", "greedy-dag", "ilp"])
def test_forbidden_nodes_are_never_chosen(name):
    model = TARGETS["cpu"]
    for seed in range(20):
        eg, roots = random_egraph(random.Random(seed), 6, cycles=False)
        first = extract(eg, roots, model, name)
        fused = [n for c, n in first.choice.items()
                 if eg.nodes[n].op not in ("Mat", "Input") and c not in first.constant
                 and len(eg.class_nodes[c]) > 1]
        if not fused:
            continue
        result = extract(eg, roots, model, name, forbid=fused[:1])
        assert fused[0] not in result.choice.values()
        return
    pytest.fail("no random e-graph with a choice to forbid")
