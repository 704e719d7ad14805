"""The extractors on the e-graphs of real models (tests/models): every answer is a valid program
whose reported cost is its program cost, and the ILP is never worse than greedy-dag."""

from __future__ import annotations

import random

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.extraction.costmodel import load_cost_model
from eqsat_fuse.frontend.encode import encode
from eqsat_fuse.extraction.cost import program_cost, roots_of
from eqsat_fuse.extraction.registry import extract
from eqsat_fuse.frontend.importer import import_model
from eqsat_fuse.saturation.saturate import saturate
from eqsat_fuse.saturation.serialized import fill_missing_facts, read_egraph

from conftest import MODELS_DIR, make_model, real_models
from random_egraphs import random_egraph


def egraph_of(path, target):
    encoding = encode(import_model(path))
    egraph, _ = saturate(encoding, target_rules=load_cost_model(target).rule_files)
    eg = read_egraph(egraph)
    fill_missing_facts(eg)
    return eg, roots_of(eg, encoding.output_vars)


def check_model(file, target, objective="latency"):
    eg, roots = egraph_of(MODELS_DIR / file, target)
    model = load_cost_model(target)
    results = {}
    for name in ("tree", "greedy-dag", "ilp"):
        result = extract(eg, roots, model, name, objective=objective, seconds=60)
        cost, _ = program_cost(eg, model, result.choice, roots, result.constant, objective)
        assert cost == pytest.approx(result.cost, rel=1e-9), (file, target, name)
        results[name] = result
    assert results["ilp"].cost <= results["greedy-dag"].cost * (1 + 1e-9)
    return results


@pytest.mark.parametrize("file", ["resnet_tiny_op17.onnx", "bert_tiny_op17.onnx"])
def test_extractors_on_real_models(file):
    results = check_model(file, "cpu")
    assert results["ilp"].details["gap"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "gpu", "edge-npu"])
@pytest.mark.parametrize("file", [m["file"] for m in real_models()])
def test_extractors_on_every_real_model_and_target(file, target):
    check_model(file, target)
    check_model(file, target, "energy")


def test_one_convolution_read_twice_in_a_body_is_one_anchor(rng):
    """SiLU after a convolution, x * sigmoid(x): the body computes the Conv once."""
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    model = make_model(nodes, [("x", [1, 4, 8, 8])], [("y", [1, 8, 8, 8])], {"w": w})
    compiled = ef.compile(model, target="gpu", extractor="ilp")
    assert [k.ops for k in compiled.report.kernels if k.kind == "compute"] == \
        [["Conv", "Sigmoid", "Mul"]]
    assert compiled.verify().ok


@pytest.mark.slow
@pytest.mark.parametrize("block", range(6))
def test_random_egraph_sweep(block):
    """The random cross-checks of test_extractors over 300 seeded e-graphs: every answer's cost
    is its program cost, the ILP equals brute force, and the ILP objective of random choices
    (valid or not) agrees with program_cost."""
    from eqsat_fuse.extraction.cost import ExtractionError, constant_classes
    from eqsat_fuse.extraction.ilp import IlpExtractor
    from random_egraphs import all_choices
    from test_extractors import CASES, TARGETS, brute_force, run, same

    for seed in range(50 * block, 50 * (block + 1)):
        rnd = random.Random(seed)
        target, objective = CASES[seed % len(CASES)]
        model = TARGETS[target]
        eg, roots = random_egraph(rnd, rnd.randint(2, 9))
        best = brute_force(eg, roots, model, objective)
        results = {name: run(eg, roots, model, objective, name)
                   for name in ("tree", "greedy-dag", "ilp")}
        if best is not None:
            assert (results["ilp"] is None) == (best == float("inf")), seed
            if results["ilp"] is not None:
                assert same(results["ilp"].cost, best), seed
        for name, result in results.items():
            if result is not None:
                cost, _ = program_cost(eg, model, result.choice, roots, result.constant,
                                       objective)
                assert same(cost, result.cost), (seed, name)
        pick = constant_classes(eg)
        ilp = IlpExtractor(model, objective)
        choices = list(all_choices(eg, roots, pick, limit=300))
        rnd.shuffle(choices)
        for choice in choices[:4]:
            full = {**pick, **choice}
            try:
                expected, _ = program_cost(eg, model, full, roots, frozenset(pick), objective)
            except ExtractionError:
                expected = None
            got = ilp.objective_of(eg, roots, choice)
            assert (expected is None) == (got is None), seed
            assert expected is None or same(expected, got), seed


@pytest.mark.slow
def test_ilp_equals_program_cost_on_larger_random_egraphs():
    from eqsat_fuse.extraction.ilp import IlpExtractor
    for seed in range(40):
        eg, roots = random_egraph(random.Random(seed), 14)
        for target in ("cpu", "edge-npu"):
            model = load_cost_model(target)
            result = IlpExtractor(model, seconds=30).extract(eg, roots)
            if "objective" in result.details and "kept" not in result.details:
                assert result.details["objective"] == pytest.approx(result.cost, rel=1e-6)
