"""Fused attention: the exported softmax(q @ kt * scale + mask) @ v becomes one FusedAttention
kernel (rules/fuse.egg: attention-*), which computes what onnxruntime computes on both backends,
for every spelling, layout and size that takes more than one block of queries or keys, and whose
scores never reach memory."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import attention as numba_attention
from eqsat_fuse.tools.calibrate import attention_target

# the shipped cpu prices with FusedAttention always paying: the kernel tests run it at sizes
# where the shipped prices keep the exported kernels
PAYS = attention_target()

F = np.float32


def _fallbacks(compiled) -> list:
    return compiled.report.as_dict()["backend_report"]["fallback_kernels"]


def projected(S: int, H: int = 4, D: int = 16, scale: str | None = "Div", mask: bool = True,
              seed: int = 0) -> onnx.ModelProto:
    """An attention block as exporters write it: x -> q, k, v projections, reshaped to heads
    (q and v as Transpose views, kt as a Transpose to [1, H, D, S]), scores scaled by Mul or
    Div (or not), a padding mask added (or not), Softmax, @ v, heads merged."""
    rng = np.random.default_rng(seed)
    E = H * D
    inits = {f"w{n}": (rng.standard_normal((E, E)) * 0.3).astype(F) for n in "qkv"}
    inits["heads"] = np.array([1, S, H, D], np.int64)
    inits["merged"] = np.array([1, S, E], np.int64)
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
                  helper.make_node("Reshape", [f"{n}0", "heads"], [f"{n}1"])]
    nodes += [helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"])]
    last = "s0"
    if scale:
        inits["c"] = np.array(np.sqrt(D) if scale == "Div" else 1 / np.sqrt(D), F)
        nodes.append(helper.make_node(scale, [last, "c"], ["s1"]))
        last = "s1"
    if mask:
        inits["m"] = np.where(np.arange(S) < max(S - 3, 1), 0.0, -1e4).astype(F) \
            .reshape(1, 1, 1, S)
        nodes.append(helper.make_node("Add", [last, "m"], ["s2"]))
        last = "s2"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merged"], ["y"])]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, S, E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, S, E])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def direct(q_shape, kt_shape, v_shape, mask_shape=None) -> onnx.ModelProto:
    """softmax(q @ kt * 0.25 (+ mask)) @ v of graph inputs, batch dims broadcast."""
    out = list(np.broadcast_shapes(q_shape[:-2], kt_shape[:-2], v_shape[:-2])) \
        + [q_shape[-2], v_shape[-1]]
    names = ["q", "kt", "v"] + (["m"] if mask_shape else [])
    shapes = [q_shape, kt_shape, v_shape] + ([mask_shape] if mask_shape else [])
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["z"])]
    if mask_shape:
        nodes.append(helper.make_node("Add", ["z", "m"], ["y"]))
    nodes += [helper.make_node("Softmax", ["y" if mask_shape else "z"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"])]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
         for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, out)],
        [numpy_helper.from_array(np.array(0.25, F), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def onnxruntime_outputs(model, feeds) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


# sizes around the Numba kernel's blocks: one query block and one key block, several of each
SIZES = (5, numba_attention.BLOCK_QUERIES + 10, numba_attention.BLOCK_KEYS + 88)


@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("scale, mask", [("Div", True), ("Mul", False), (None, True),
                                         (None, False)])
def test_every_spelling_is_one_kernel_that_matches_onnxruntime(scale, mask, S):
    model = projected(S, scale=scale, mask=mask)
    x = np.random.default_rng(1).standard_normal((1, S, 64)).astype(F)
    want = onnxruntime_outputs(model, {"x": x})[0]
    for backend, threads in (("numpy", 1), ("numba", 1), ("numba", 2)):
        compiled = ef.compile(model, backend=backend, threads=threads, target=PAYS)
        fused = [k for k in compiled.report.kernels if "FusedAttention" in k.ops]
        assert len(fused) == 1 and fused[0].ops == ["FusedAttention"], \
            [k.ops for k in compiled.report.kernels]
        if backend == "numba":
            assert _fallbacks(compiled) == []
        got = compiled.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{backend}, {threads} thread(s)")


@pytest.mark.parametrize("shapes", [
    # grouped heads: one key/value head for four query heads (broadcast), a per-query mask
    ((1, 4, 130, 8), (1, 1, 8, 600), (1, 1, 600, 8), (1, 1, 130, 600)),
    # a mask that differs per head, over two batches of three heads
    ((2, 3, 40, 8), (2, 3, 8, 70), (2, 3, 70, 8), (2, 3, 40, 70)),
    # rank 3 (heads as the batch), v of another width, a mask over the keys only
    ((3, 17, 8), (3, 8, 9), (3, 9, 5), (9,)),
    # a single matrix, no mask
    ((6, 4), (4, 7), (7, 3), None),
])
def test_broadcast_heads_ranks_and_masks_match_onnxruntime(shapes):
    model = direct(*shapes)
    rng = np.random.default_rng(2)
    names = ["q", "kt", "v", "m"]
    feeds = {n: rng.standard_normal(s).astype(F) for n, s in zip(names, shapes) if s}
    want = onnxruntime_outputs(model, feeds)[0]
    for backend in ("numpy", "numba"):
        compiled = ef.compile(model, backend=backend, threads=2, target=PAYS)
        assert [k.ops for k in compiled.report.kernels] == [["FusedAttention"]]
        if backend == "numba":
            assert _fallbacks(compiled) == []
        np.testing.assert_allclose(compiled.run(feeds)["o"], want, rtol=1e-4, atol=1e-5,
                                   err_msg=backend)


def test_special_values_are_those_of_the_unfused_program():
    """A row whose mask is -inf everywhere, a query with +inf, a NaN key: the rows Softmax makes
    NaN are NaN, the others finite and equal, on both backends (exact numerics)."""
    S, Sk = 130, 600
    model = direct((1, 2, S, 8), (1, 2, 8, Sk), (1, 2, Sk, 8), (1, 1, S, Sk))
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, S, 8)).astype(F)
    kt = rng.standard_normal((1, 2, 8, Sk)).astype(F)
    v = rng.standard_normal((1, 2, Sk, 8)).astype(F)
    m = np.zeros((1, 1, S, Sk), F)
    m[0, 0, 3] = -np.inf                      # every key of row 3 masked (both heads): 0/0
    q[0, 1, 7, 0] = np.inf                    # +inf and -inf scores in row 7 of head 1
    kt[0, 0, 2, 555] = np.nan                 # a NaN score in every row of head 0
    m[0, 0, 9, :520] = -np.inf                # row 9: only the last block's keys count
    feeds = {"q": q, "kt": kt, "v": v, "m": m}
    want = ef.compile(model, backend="numpy", target=PAYS).run(feeds)["o"]
    assert np.isnan(want[0, 0]).all() and np.isnan(want[0, 1, [3, 7]]).all()
    assert np.isfinite(np.delete(want[0, 1], [3, 7], axis=0)).all()
    got = ef.compile(model, backend="numba", threads=2, target=PAYS).run(feeds)["o"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_the_scores_never_reach_memory_and_the_export_runs_in_onnxruntime():
    S, H = 512, 4
    model = projected(S, H=H)
    compiled = ef.compile(model, target=PAYS)
    assert compiled.report.fusions["FusedAttention"] == 1
    scores = H * S * S * 4
    # the arena holds the projections and the output, not the [H, S, S] scores (4 MiB)
    assert compiled.report.peak_bytes < scores / 4
    exported = compiled.to_onnx()
    onnx.checker.check_model(exported, full_check=True)
    x = np.random.default_rng(4).standard_normal((1, S, 64)).astype(F)
    np.testing.assert_allclose(onnxruntime_outputs(exported, {"x": x})[0],
                               onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_blocks_a_causal_mask_removes_are_skipped_exactly():
    """A causal mask as exporters write it (-3.4e38 above the diagonal, not -inf) over several
    blocks of keys, and a padding row whose every key is masked: the blocks the mask removes
    from a whole block of queries are skipped (their weights are exactly 0), the padding row
    keeps its softmax over the masked keys, as the unfused program computes them."""
    S = numba_attention.BLOCK_KEYS + 200
    model = direct((1, 2, S, 16), (1, 2, 16, S), (1, 2, S, 16), (1, 1, S, S))
    rng = np.random.default_rng(5)
    feeds = {"q": rng.standard_normal((1, 2, S, 16)).astype(F),
             "kt": rng.standard_normal((1, 2, 16, S)).astype(F),
             "v": rng.standard_normal((1, 2, S, 16)).astype(F)}
    lowest = np.finfo(F).min
    mask = np.triu(np.full((S, S), lowest, F), 1)
    mask[5] = lowest                          # a row with no key left
    feeds["m"] = mask.reshape(1, 1, S, S)
    want = onnxruntime_outputs(model, feeds)[0]
    assert np.isfinite(want).all()
    for threads in (1, 2):
        got = ef.compile(model, backend="numba", threads=threads, target=PAYS).run(feeds)["o"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("second", ["rows differ", "padding"])
def test_a_mask_the_heads_share_is_classified_per_batch_element(second):
    """The blocks of a mask the heads share are classified once per batch element (its
    largest value, whether its rows agree), over several blocks of queries and keys: batch 0
    a padding mask whose rows agree, its last keys removed (those blocks skipped); batch 1 a
    mask whose rows differ (the heads then run on smaller blocks of keys), or one that removes
    a small block of keys and keeps the few after it (every row agrees: the small blocks'
    classes merged back). Reading one batch's or one small block's classes for another changes
    the output."""
    S, T = numba_attention.BLOCK_QUERIES + 20, numba_attention.BLOCK_KEYS + 100
    model = direct((2, 3, S, 8), (2, 3, 8, T), (2, 3, T, 8), (2, 1, S, T))
    rng = np.random.default_rng(7)
    feeds = {"q": rng.standard_normal((2, 3, S, 8)).astype(F),
             "kt": rng.standard_normal((2, 3, 8, T)).astype(F),
             "v": rng.standard_normal((2, 3, T, 8)).astype(F)}
    mask = np.zeros((2, 1, S, T), F)
    mask[0, :, :, numba_attention.BLOCK_KEYS - 30:] = np.finfo(F).min
    if second == "rows differ":
        mask[1] = rng.standard_normal((1, S, T)).astype(F)
    else:             # the keys of a small block removed, the few after it kept
        start = numba_attention.BLOCK_KEYS
        mask[1, :, :, start:start + 96] = np.finfo(F).min
    feeds["m"] = mask
    want = onnxruntime_outputs(model, feeds)[0]
    for threads in (1, 2):
        got = ef.compile(model, backend="numba", threads=threads, target=PAYS).run(feeds)["o"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_shipped_cost_model_chooses_per_shape_and_explain_says_what_it_is_worth():
    """12 heads of 64: at 64 tokens the fixed cost of packing every head keeps the exported
    kernels, at 1,024 the scores that FusedAttention keeps out of memory pay for it; `--explain`'s
    fusion values price the best program without it, and the report counts it."""
    short = ef.compile(direct((1, 12, 64, 64), (1, 12, 64, 64), (1, 12, 64, 64)),
                       backend="numpy")
    assert "FusedAttention" not in short.report.fusions
    assert short.report.matches_per_rule.get("attention-mul", 0) >= 1      # formed, not chosen
    long = ef.compile(direct((1, 12, 1024, 64), (1, 12, 64, 1024), (1, 12, 1024, 64)),
                      backend="numpy")
    assert long.report.fusions["FusedAttention"] == 1
    value = next(v for v in long.extraction.fusion_values() if v.ops == ["FusedAttention"])
    assert value.without_cost is not None and value.saving > 0
