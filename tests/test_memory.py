"""Static memory planning: one arena, no two live buffers overlap, in-place reuse, and peaks
close to the liveness lower bound on the real models."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.lowering.memory import lower_bound, place

from conftest import MODELS_DIR, make_model, real_models


def _assert_no_overlap(memory):
    items = list(memory.lifetimes.items())
    for i, (a, (s1, e1)) in enumerate(items):
        for b, (s2, e2) in items[i + 1:]:
            if s1 <= e2 and s2 <= e1:        # alive at the same time
                lo1, hi1 = memory.offsets[a], memory.offsets[a] + memory.sizes[a]
                lo2, hi2 = memory.offsets[b], memory.offsets[b] + memory.sizes[b]
                assert hi1 <= lo2 or hi2 <= lo1, (a, b)


@pytest.mark.parametrize("file", [m["file"] for m in real_models()])
def test_real_model_arena_is_within_10_percent_of_the_lower_bound(file):
    program = ef.compile(MODELS_DIR / file)
    report = program.report
    assert report.lower_bound_bytes <= report.peak_bytes <= 1.1 * report.lower_bound_bytes
    assert report.peak_bytes < report.separate_bytes
    _assert_no_overlap(program.program.memory)


def _chain_model():
    """Concat -> Tanh -> MatMul: the Tanh kernel may write over the Concat buffer, which dies
    with it (same size, read at the index written)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Concat", ["x", "x"], ["c"], axis=0),
             helper.make_node("Tanh", ["c"], ["t"]),
             helper.make_node("MatMul", ["t", "w"], ["y"])]
    inits = {"w": rng.standard_normal((32, 32)).astype(np.float32)}
    return make_model(nodes, [("x", [64, 32])], [("y", [128, 32])], inits)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_runs_write_into_the_arena_and_reuse_dead_inputs(backend, tmp_path):
    program = ef.compile(_chain_model(), backend=backend, cache_dir=tmp_path)
    memory = program.program.memory
    _assert_no_overlap(memory)
    assert memory.inplace, "the Tanh kernel should overwrite the dead Concat output"
    arena = program.program.arena
    before = arena.copy()
    feeds = {"x": np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)}
    out1 = program.run(feeds)["y"]
    assert not np.array_equal(before, arena), "intermediates were not written to the arena"
    assert not np.shares_memory(out1, arena)
    out2 = program.run(feeds)["y"]
    np.testing.assert_array_equal(out1, out2)
    assert program.verify(feeds).ok


def test_best_fit_reuses_space_of_dead_buffers():
    lifetimes = {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (3, 4)}
    sizes = {"a": 1024, "b": 1024, "c": 1024, "d": 1024}
    offsets, arena = place(lifetimes, sizes)
    assert arena == 2048 == lower_bound(lifetimes, sizes, 5)
    assert offsets["a"] != offsets["b"] and offsets["b"] != offsets["c"]


def test_placements_that_share_state_place_in_the_order_that_won_first():
    # the lowerings of one plan at several shapes (lowering.generic) share `placement`: the
    # first records which order gave the smallest arena, later ones place in that order only
    lifetimes = {"a": (0, 2), "b": (1, 3), "c": (2, 4), "d": (0, 4), "e": (3, 4)}
    sizes = {"a": 4096, "b": 1024, "c": 2048, "d": 512, "e": 8192}
    placement: dict = {}
    offsets, arena = place(lifetimes, sizes, placement)
    assert (offsets, arena) == place(lifetimes, sizes)        # the best of every order
    assert "order" in placement
    grown = {name: size * 3 for name, size in sizes.items()}
    offsets, arena = place(lifetimes, grown, placement)
    for a, (s1, e1) in lifetimes.items():
        for b, (s2, e2) in lifetimes.items():
            if a < b and s1 <= e2 and s2 <= e1:
                assert (offsets[a] + grown[a] <= offsets[b]
                        or offsets[b] + grown[b] <= offsets[a]), (a, b)
    assert arena >= lower_bound(lifetimes, grown, 5)
