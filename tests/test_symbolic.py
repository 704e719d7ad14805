"""Symbolic dims (issue 16): dim expressions, symbolic import, one compile run at many shapes.

The two models are real exports with open dims (tests/models/export_dynamic.py): a BERT encoder
with inputs [batch, seq], and one GPT-2 decode step with a KV cache (past_* [batch, heads,
past, head_dim]). Each is compiled once, with no input_shapes, and run at shapes it was not
compiled for, against onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.dims import (DimCodes, SymbolicError, dmax, dmin, floordiv, from_json, symbol,
                             to_json)
from eqsat_fuse.errors import EqsatFuseError, FeedError
from eqsat_fuse.frontend.importer import import_model

MODELS = Path(__file__).parent / "models"
BERT = MODELS / "bert_dyn_tiny.onnx"
GPT2 = MODELS / "gpt2_kv_tiny.onnx"

seq, past, batch = symbol("seq"), symbol("past"), symbol("batch")


# ---- dims --------------------------------------------------------------------------------------

def test_a_dim_is_one_canonical_expression():
    assert (seq + past) * batch == batch * past + seq * batch
    assert hash((seq + past) * 2) == hash(2 * past + seq * 2)
    assert seq - seq == 0 and isinstance(seq - seq, int)
    assert (seq * 768 * batch) // 768 == seq * batch
    assert floordiv(seq * batch * 64, batch * 64) == seq
    assert str(floordiv(seq + past, 2)) == "((past + seq) // 2)"
    assert (seq + 1) - seq == 1


def test_min_and_max_simplify_only_when_they_hold_for_every_value():
    assert dmin(seq + past, seq) == seq          # past >= 0
    assert dmax(batch, 0) == batch
    assert str(dmin(seq, 1024)) == "min(1024, seq)"      # depends on seq: stays opaque
    assert dmin(seq, 1024).evaluate({"seq": 2000}) == 1024
    assert dmin(seq, 1024).evaluate({"seq": 7}) == 7


def test_an_undecidable_comparison_raises_instead_of_guessing():
    assert seq + 1 > seq
    with pytest.raises(SymbolicError, match="cannot tell"):
        bool(seq < 8)
    with pytest.raises(SymbolicError, match="symbolic"):
        int(seq)


def test_dims_round_trip_through_json_and_junk_is_refused():
    d = dmin(seq, 1024) * batch + floordiv(past, 3) + 7
    assert from_json(to_json(d)) == d
    assert from_json(to_json(5)) == 5
    for junk in ({"dim": [[["os.system(1)", 1], 1]]}, {"dim": "seq"}, True, {"x": 1},
                 {"dim": [[[["eval", 1, 2], 1], 1]]}):
        with pytest.raises(ValueError):
            from_json(junk)


def test_codes_stand_for_dims_and_are_never_small_numbers():
    codes = DimCodes()
    a, b = codes.code(seq * batch), codes.code(batch * seq)
    assert a == b and a < -(1 << 50) and codes.code(5) == 5
    assert codes.dim(a) == seq * batch and codes.dim(5) == 5


# ---- import --------------------------------------------------------------------------------------

def test_symbolic_import_folds_the_shape_subgraphs_into_dim_expressions():
    graph = import_model(GPT2)
    sig = graph.signature
    assert set(sig.symbols) == {"batch", "seq", "total", "past"}
    ops = [n.op if n.op != "Opaque" else n.onnx_node.op_type for n in graph.nodes]
    # Shape -> Gather -> Unsqueeze -> Concat chains are dims now, not kernels
    for op in ("Shape", "Gather", "Unsqueeze", "ConstantOfShape", "Range", "Equal"):
        assert ops.count(op) <= (2 if op == "Gather" else 0), (op, ops.count(op))
    present = graph.values["present_key_0"].shape
    assert present == (batch, 4, past + seq, 8)
    reshapes = [n.attrs["shape"] for n in graph.nodes if n.op == "Reshape"]
    assert [batch * seq, 32] in reshapes and [batch, seq, 4, 8] in reshapes


def test_an_unknown_dim_without_a_name_becomes_its_own_symbol():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    graph = import_model(model)
    assert graph.signature.symbols == {"x_0": "input 'x' dim 0"}


# ---- one compile, many shapes --------------------------------------------------------------------

def _bert_feeds(b, s, seed):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int64)
    mask[0, s // 2:] = 0
    return {"input_ids": rng.integers(0, 128, (b, s)), "attention_mask": mask}


def _gpt2_feeds(b, s, p, seed):
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 128, (b, s)),
             "attention_mask": np.ones((b, p + s), np.int64)}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((b, 4, p, 8)).astype(np.float32)
    return feeds


def _check_against_ort(compiled, path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    got = compiled.run(feeds)
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.fixture(scope="module", params=["numpy", "numba"])
def gpt2(request):
    return ef.compile(GPT2, backend=request.param)


@pytest.fixture(scope="module", params=["numpy", "numba"])
def bert(request):
    return ef.compile(BERT, backend=request.param)


def test_bert_compiles_once_and_runs_at_every_shape(bert):
    assert bert.report.symbolic["representative"] == {"batch": 1, "seq": 128}
    for b, s in ((1, 128), (1, 8), (2, 16), (3, 5), (1, 1), (4, 33)):
        _check_against_ort(bert, BERT, _bert_feeds(b, s, seed=b * 100 + s))


def test_gpt2_decode_step_runs_at_every_past_length_including_zero(gpt2):
    for b, s, p in ((1, 1, 5), (1, 1, 0), (2, 3, 4), (1, 7, 9), (3, 1, 20)):
        _check_against_ort(gpt2, GPT2, _gpt2_feeds(b, s, p, seed=p))


def test_a_decode_loop_feeds_present_back_as_past_and_matches_onnxruntime(gpt2):
    session = ort.InferenceSession(str(GPT2), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feeds = _gpt2_feeds(1, 4, 0, seed=1)          # a 4-token prompt, empty cache
    ours = dict(feeds)
    for step in range(6):
        want = dict(zip(names, session.run(None, feeds)))
        got = gpt2.run(ours)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-3, atol=1e-4,
                                   err_msg=f"step {step}")
        token = np.argmax(want["logits"][:, -1:], axis=-1)
        total = want["present_key_0"].shape[2] + 1
        feeds = {"input_ids": token, "attention_mask": np.ones((1, total), np.int64)}
        ours = dict(feeds)
        for i in range(2):
            for kind in ("key", "value"):
                feeds[f"past_{kind}_{i}"] = want[f"present_{kind}_{i}"]
                ours[f"past_{kind}_{i}"] = got[f"present_{kind}_{i}"]


def test_the_signature_shows_the_symbols(gpt2):
    assert gpt2.inputs["past_key_0"].shape == (batch, 4, past, 8)
    assert gpt2.outputs["present_key_0"].shape == (batch, 4, past + seq, 8)
    assert "/" not in "".join(gpt2.inputs)      # the derived inputs are not the user's to feed


def test_feeds_that_disagree_on_a_shared_symbol_name_both_inputs(gpt2):
    feeds = _gpt2_feeds(1, 1, 5, seed=0)
    feeds["past_value_1"] = feeds["past_value_1"][:, :, :3]
    with pytest.raises(FeedError, match=r"'past_key_0' \(dim 2\) and 'past_value_1' \(dim 2\) "
                                        r"share the symbol 'past'.* 5 and 3"):
        gpt2.run(feeds)


def test_extraction_prices_the_binding_the_user_gives():
    compiled = ef.compile(BERT, backend="numpy", dims={"seq": 16})
    assert compiled.report.symbolic["representative"] == {"batch": 1, "seq": 16}
    assert ("symbolic: input_ids [batch, seq], attention_mask [batch, seq]; one program for "
            "every value, priced (and the figures above given) at batch=1, seq=16"
            in compiled.report.summary())
    assert compiled.report.kernels[0].shape[:2] in ([1, 16], [16, 32], [16])
    with pytest.raises(EqsatFuseError, match="not symbols of the model"):
        ef.compile(BERT, backend="numpy", dims={"sequence": 16})


def test_input_shapes_still_give_a_static_program():
    compiled = ef.compile(BERT, backend="numpy",
                          input_shapes={"input_ids": (1, 8), "attention_mask": (1, 8)})
    assert compiled.generic is None and not compiled.report.symbolic
    with pytest.raises(FeedError):
        compiled.run(_bert_feeds(1, 9, seed=0))


def test_a_broadcast_against_a_number_is_checked_at_run_time():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.arange(16, dtype=np.float32))
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["a", "w"], ["y"])],
                                                "g", [a], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    compiled = ef.compile(model, backend="numpy")
    for n in (1, 4):
        x = np.ones((n, 4), np.float32)
        np.testing.assert_array_equal(compiled.run({"a": x})["y"],
                                      x + np.arange(16, dtype=np.float32).reshape(4, 4))
    with pytest.raises(FeedError, match="must be 1 or 4"):
        compiled.run({"a": np.ones((3, 4), np.float32)})


def test_a_rule_that_needs_a_dim_to_be_one_does_not_fire_on_a_symbol():
    # Reshape [n, 8] -> [1, 8] is the identity only where n is 1: at the representative binding
    # (n = 1 for a leading dim) the shapes are equal, but the rule must not remove the Reshape.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [1, 8])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
        "g", [x], [y], [shape]), opset_imports=[helper.make_opsetid("", 17)])
    compiled = ef.compile(model, backend="numpy")
    assert "Reshape" in [op for k in compiled.report.kernels for op in k.ops]
    np.testing.assert_array_equal(compiled.run({"x": -np.ones((1, 8), np.float32)})["y"],
                                  np.zeros((1, 8), np.float32))
    with pytest.raises(FeedError, match="must be 8"):
        compiled.run({"x": np.ones((2, 8), np.float32)})
    onnx.checker.check_model(model)


_LOAD = """
import sys
sys.path.insert(0, sys.argv[2])
import eqsat_fuse as ef
from test_symbolic import GPT2, _check_against_ort, _gpt2_feeds
loaded = ef.load(sys.argv[1])
assert str(loaded.inputs["past_key_0"].shape[2]) == "past"
for b, s, p in ((1, 1, 5), (2, 3, 0), (1, 7, 9)):
    _check_against_ort(loaded, GPT2, _gpt2_feeds(b, s, p, seed=p))
print("ok", loaded.report.symbolic["representative"])
"""


def test_a_shape_generic_program_saves_and_loads_in_a_fresh_process(gpt2, tmp_path):
    import subprocess
    import sys
    gpt2.save(tmp_path / "decoder")
    result = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path / "decoder"),
                             str(Path(__file__).parent)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1].startswith("ok {'batch': 1")


def test_a_stored_dim_that_is_not_one_is_refused():
    from eqsat_fuse.artifacts.codec import decode_value, encode_value
    from eqsat_fuse.errors import ArtifactError
    assert decode_value(encode_value(seq * 2 + past, "x")) == seq * 2 + past
    for junk in ({"$dim": "seq"}, {"$dim": [[["os.system('x')", 1], 1]]}, {"$dim": [[1.5]]}):
        with pytest.raises(ArtifactError, match="symbolic dim"):
            decode_value(junk)


@pytest.mark.parametrize("path", [BERT, GPT2], ids=["bert", "gpt2_kv"])
def test_the_exported_model_keeps_the_open_dims_and_runs_at_every_shape(path, tmp_path):
    compiled = ef.compile(path, backend="numpy")
    model = compiled.to_onnx(tmp_path / "fused.onnx")
    onnx.checker.check_model(model)
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]
    fused = ort.InferenceSession(str(tmp_path / "fused.onnx"),
                                 providers=["CPUExecutionProvider"])
    source = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cases = ([_bert_feeds(b, s, seed=s) for b, s in ((1, 8), (2, 16), (3, 5))] if path == BERT
             else [_gpt2_feeds(b, s, p, seed=p) for b, s, p in ((1, 1, 5), (2, 3, 0), (1, 7, 9))])
    for feeds in cases:
        for got, want in zip(fused.run(None, feeds), source.run(None, feeds)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_verify_draws_the_users_inputs_at_the_representative_shape(bert):
    assert bert.verify().ok


def test_a_representative_shape_the_model_cannot_run_at_says_how_to_bind_the_dims():
    # past = seq = total = 128: positions past..past+seq-1 run off GPT-2's 128 positions
    with pytest.raises(ef.RunError, match=r"representative binding batch=1, seq=128, "
                                          r"total=128, past=128.*dims=\{\.\.\.\}"):
        ef.compile(GPT2, backend="numpy").verify()
    assert ef.compile(GPT2, backend="numpy", dims={"seq": 1, "past": 7, "total": 8}).verify().ok


_BACKGROUND = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
import eqsat_fuse as ef
from test_symbolic import GPT2, _check_against_ort, _gpt2_feeds
compiled = ef.compile(GPT2, backend="numba", cache_dir=sys.argv[1])
generic = compiled.generic
feeds = _gpt2_feeds(2, 3, 0, seed=3)      # batch 2, an empty cache: loops of other sizes
reports = []
for _ in range(2):
    _check_against_ort(compiled, GPT2, feeds)
    program, _ = generic.programs[generic.key(generic.bind(feeds))]
    reports.append(program.report.as_dict())
    generic.wait()
print(json.dumps(reports))
"""


def test_a_new_shape_waits_for_no_jit_its_new_kernels_compile_in_the_background(tmp_path):
    # in a fresh process with an empty kernel cache, so that nothing is compiled yet
    import json
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-c", _BACKGROUND, str(tmp_path),
                             str(Path(__file__).parent)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    first, again = json.loads(result.stdout.strip().splitlines()[-1])
    assert first["jit_compiled"] == 0 and first["jit_deferred"] > 0   # NumPy ran those
    # (a deferred copy kernel runs as NumPy's copy, counted among the copies)
    assert len(first["fallback_kernels"]) + first["copy_kernels"] >= first["jit_deferred"]
    # lowered again once the worker was done: every kernel compiled, none compiled here
    assert again["jit_deferred"] == 0 and again["jit_compiled"] == 0
    assert not again["fallback_kernels"]


def test_shapes_share_the_folded_constants_and_the_kernels_whose_geometry_stays(gpt2):
    generic = gpt2.generic
    first, _ = generic.program_for({"batch": 1, "seq": 1, "total": 12, "past": 11})
    second, _ = generic.program_for({"batch": 1, "seq": 1, "total": 13, "past": 12})
    assert first is not second
    shared = [name for name, value in first.constants.items()
              if second.constants[name] is value]
    assert shared == list(first.constants)


def test_a_kernel_is_specialized_again_only_when_a_symbol_it_names_changes(gpt2):
    # kernels whose dims name only `batch` stay the same objects when the past grows (the
    # backend then finds what it kept of them by identity); the others are specialized anew,
    # and every kernel is the one a specialization from scratch gives
    from eqsat_fuse.lowering.generic import Template, specialize
    plan = gpt2.generic.plan
    template = Template(plan)
    bindings = [{"batch": 1, "seq": 1, "total": 8, "past": 7},
                {"batch": 1, "seq": 1, "total": 9, "past": 8},
                {"batch": 2, "seq": 1, "total": 9, "past": 8}]
    first, second, third = (specialize(plan, b, template) for b in bindings)
    kept = [a is b for a, b in zip(first.kernels, second.kernels)]
    assert any(kept) and not all(kept)
    for symbols, is_kept in zip(template.symbols, kept):
        assert is_kept == (not {"past", "total"} & set(symbols))
    assert not any(a is b for a, b, symbols in zip(second.kernels, third.kernels,
                                                    template.symbols) if "batch" in symbols)
    for binding, got in zip(bindings, (first, second, third)):
        want = specialize(plan, binding)
        for a, b in zip(got.kernels, want.kernels):
            assert a.info == b.info and repr([n.attrs for n in a.body]) == \
                repr([n.attrs for n in b.body]), a.name


def test_a_shape_lowered_with_what_shapes_share_is_the_one_lowered_alone(gpt2):
    # a new shape reuses the views' layouts, the placement order and the unchanged kernels of
    # the shapes before it (`shared`): its layouts must be the ones its own lowering gives,
    # and its memory plan must keep every two buffers alive at once apart
    from eqsat_fuse.lowering.generic import specialize
    from eqsat_fuse.lowering.lower import lower
    from test_memory import _assert_no_overlap
    generic = gpt2.generic
    for past_len in (3, 7, 4):
        generic.program_for({"batch": 1, "seq": 1, "total": past_len + 1, "past": past_len})
    binding = {"batch": 2, "seq": 3, "total": 12, "past": 9}
    program, derived = generic.program_for(binding)
    alone = lower(specialize(generic.plan, binding), **generic.lower_options)
    assert program.layouts == alone.layouts
    _assert_no_overlap(program.memory)
    assert program.memory.arena_bytes <= 1.25 * alone.memory.arena_bytes
    feeds = _gpt2_feeds(2, 3, 9, seed=5)
    got, want = program.run({**feeds, **derived}), alone.run({**feeds, **derived})
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_the_cli_runs_a_model_with_open_dims_at_the_fed_shape_and_takes_dim(tmp_path):
    import subprocess
    import sys
    feeds = _bert_feeds(2, 11, seed=5)
    np.savez(tmp_path / "feeds.npz", **feeds)
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "run", str(BERT), "--inputs",
                           str(tmp_path / "feeds.npz"), "-o", str(tmp_path / "out.npz"),
                           "--backend", "numpy", "--dim", "seq=16,32,batch=2", "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "out.npz")
    session = ort.InferenceSession(str(BERT), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    np.testing.assert_allclose(got["last_hidden_state"], want[0], rtol=1e-3, atol=1e-4)
    timed = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "run", str(BERT),
                            "--inputs", str(tmp_path / "feeds.npz"), "--backend", "numpy",
                            "--repeat", "3", "--profile", "--quiet"],
                           capture_output=True, text=True, timeout=300)
    assert timed.returncode == 0, timed.stderr       # the fed shape's program, timed
    assert "median" in timed.stdout and "profile" in timed.stdout
    bad = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "run", str(BERT), "--inputs",
                          str(tmp_path / "feeds.npz"), "--dim", "seq", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "expected NAME=VALUE" in bad.stderr


@pytest.mark.parametrize("path, shapes, dims", [
    (BERT, {"input_ids": (1, 128), "attention_mask": (1, 128)}, None),
    (GPT2, {"input_ids": (1, 128), "attention_mask": (1, 256),
            **{f"past_{k}_{i}": (1, 4, 128, 8) for i in range(2) for k in ("key", "value")}},
     {"total": 256})],
    ids=["bert", "gpt2_kv"])
def test_at_the_representative_shape_the_program_is_the_static_one(path, shapes, dims):
    # extraction over symbolic dims prices what a static compile at that binding prices, and
    # chooses the same kernels (rules that need a dim to be a number aside: none here)
    generic = ef.compile(path, backend="numpy", dims=dims)
    static = ef.compile(path, backend="numpy", input_shapes=shapes)
    assert generic.report.cost == pytest.approx(static.report.cost, rel=1e-9)
    assert [k.ops for k in generic.report.kernels] == [k.ops for k in static.report.kernels]


def _open_image_dims(name: str) -> onnx.ModelProto:
    model = onnx.load(str(MODELS / name))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for axis, param in ((0, "N"), (2, "H"), (3, "W")):
        dims[axis].Clear()
        dims[axis].dim_param = param
    out = model.graph.output[0].type.tensor_type.shape.dim[0]
    out.Clear()
    out.dim_param = "N"
    return model


@pytest.mark.parametrize("name", ["efficientnet_tiny_op17.onnx", "mobilenetv2_tfpad_op13.onnx"])
def test_a_cnn_with_open_batch_height_and_width_runs_at_every_size(name):
    # EfficientNet's head is a ceil-mode AveragePool (its size a min of two floor divisions of
    # H); the TF-padding MobileNet computes its Pad widths from the input's shape
    model = _open_image_dims(name)
    compiled = ef.compile(model, backend="numpy")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((1, 3, 64, 64), (2, 3, 48, 80), (1, 3, 33, 47)):
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        want = session.run(None, {"pixel_values": x})[0]
        got = compiled.run({"pixel_values": x})["logits"]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=str(shape))


def test_an_opaque_factor_of_either_sign_decides_nothing():
    h = symbol("h")
    maybe_negative = floordiv(h - 5, 3)         # negative for h < 5
    assert dmax(maybe_negative, 0) != maybe_negative
    assert dmax(maybe_negative, 0).evaluate({"h": 2}) == 0
    assert dmax(floordiv(h, 3), 0) == floordiv(h, 3)


def test_a_constant_of_symbolic_shape_is_specialized_and_nothing_is_shared():
    from eqsat_fuse.ir import BodyNode, ConstExpr, KernelPlan, Operand, TensorInfo
    from eqsat_fuse.lowering.generic import ShapeGeneric, Template, specialize
    from eqsat_fuse.signature import Signature
    body = [BodyNode("Expand", [Operand("initializer", "w")], {"shape": [seq, 4]})]
    plan = KernelPlan(kernels=[], buffers={}, inputs={}, outputs={},
                      constants={"c": ConstExpr("c", body, TensorInfo((seq, 4), "float32"))},
                      initializers={"w": np.ones(4, np.float32)})
    assert Template(plan).constants == ["c"]
    concrete = specialize(plan, {"seq": 3})
    assert concrete.constants["c"].info.shape == (3, 4)
    assert concrete.constants["c"].body[0].attrs["shape"] == [3, 4]
    assert plan.constants["c"].info.shape == (seq, 4)          # the symbolic plan is kept
    assert ShapeGeneric(plan, Signature(inputs={}), {}).shared is None


def test_shape_buckets_compile_a_program_each_and_a_run_takes_the_nearest(tmp_path):
    compiled = ef.compile(BERT, backend="numpy", dims={"seq": [8, 64]})
    generic = compiled.generic
    buckets = compiled.report.symbolic["buckets"]
    assert [b["binding"] for b in buckets] == [{"batch": 1, "seq": 8}, {"batch": 1, "seq": 64}]
    assert buckets[0]["cost"] < buckets[1]["cost"]
    families = [generic, generic.buckets[0][1]]
    for (b, s), bucket in (((1, 5), 0), ((2, 8), 0), ((1, 9), 1), ((3, 64), 1), ((1, 100), 1)):
        feeds = _bert_feeds(b, s, seed=s)
        _check_against_ort(compiled, BERT, feeds)
        assert generic.serving(generic.bind(feeds)) is families[bucket], (b, s)
    compiled.save(tmp_path / "buckets")
    loaded = ef.load(tmp_path / "buckets")
    assert [b for b, _, _ in loaded.generic.buckets] == [{"batch": 1, "seq": 64}]
    _check_against_ort(loaded, BERT, _bert_feeds(1, 40, seed=40))
    with pytest.raises(EqsatFuseError, match="at most 8"):
        ef.compile(BERT, backend="numpy", dims={"seq": [1, 2, 3], "batch": [1, 2, 3]})


def test_a_shape_the_model_cannot_run_at_is_refused_at_run_and_compile_time(bert):
    # bert_dyn_tiny has 128 positions: its position ids cannot be taken for 200 tokens
    with pytest.raises(FeedError, match=r"the dim min\(128, seq\) is 128 for these inputs, but "
                                        r"must be 200 \(node .*Expand"):
        bert.run(_bert_feeds(1, 200, seed=0))
    with pytest.raises(EqsatFuseError, match=r"is 128 at batch=1, seq=256 \(the binding "
                                             r"extraction would price"):
        ef.compile(BERT, backend="numpy", dims={"seq": [8, 256]})


def test_a_huge_value_folded_at_a_symbolic_import_is_refused_before_allocating():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [1 << 20, 1 << 12])
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["big"]),
             helper.make_node("ReduceSum", ["big"], ["r"], keepdims=0),
             helper.make_node("Add", ["x", "r"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [shape]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ef.ModelError, match="17179869184 bytes, more than the 1 GiB .* refused "
                                            "before allocating"):
        ef.compile(model, backend="numpy")


def test_compare_measures_a_model_with_open_dims_at_its_representative_shape(tmp_path):
    import csv

    from eqsat_fuse.cli import main
    out = tmp_path / "results"
    assert main(["compare", str(BERT), "-o", str(out), "--strategies", "eqsat-greedy",
                 "--repeats", "2", "--backend", "numpy", "--quiet"]) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {r["strategy"] for r in rows} == {"eqsat-greedy", "ort-enable-all", "ort-disable-all"}
    assert all(r["status"] == "ok" and r["verified"] == "True" for r in rows), rows


def test_the_dynamo_exporters_decode_step_runs_at_every_past_length():
    path = MODELS / "gpt2_kv_dynamo_tiny.onnx"      # torch.export's shape plumbing (sym_size)
    compiled = ef.compile(path, backend="numpy")
    assert set(compiled.report.symbolic["symbols"]) == {"batch", "seq", "total", "past"}
    for b, s, p in ((1, 1, 5), (2, 3, 0), (1, 7, 9)):
        _check_against_ort(compiled, path, _gpt2_feeds(b, s, p, seed=p))


def test_symbols_merged_by_broadcasting_bind_from_either_input():
    # Add(Concat(x, y), z): z's open dim t must be p + q; a and b's m and k must be equal
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["p", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["q", 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["t", 4])
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, "m"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["k"])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 4])
    out2 = helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2, None])
    nodes = [helper.make_node("Concat", ["x", "y"], ["c"], axis=0),
             helper.make_node("Add", ["c", "z"], ["out"]),
             helper.make_node("Mul", ["a", "b"], ["out2"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, y, z, a, b], [out, out2]),
                              opset_imports=[helper.make_opsetid("", 17)])
    compiled = ef.compile(model, backend="numpy")
    assert set(compiled.report.symbolic["symbols"]) == {"p", "q", "m"} or \
        set(compiled.report.symbolic["symbols"]) == {"p", "q", "k"}
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32),
             "y": rng.standard_normal((3, 4)).astype(np.float32),
             "z": rng.standard_normal((5, 4)).astype(np.float32),
             "a": rng.standard_normal((2, 6)).astype(np.float32),
             "b": rng.standard_normal(6).astype(np.float32)}
    got = compiled.run(feeds)
    np.testing.assert_allclose(got["out"], np.concatenate([feeds["x"], feeds["y"]]) + feeds["z"],
                               rtol=1e-6)
    np.testing.assert_allclose(got["out2"], feeds["a"] * feeds["b"], rtol=1e-6)
    with pytest.raises(FeedError, match=r"input 'z' dim 0 must be p \+ q = 5, but is fed 4"):
        compiled.run({**feeds, "z": feeds["z"][:4]})
    with pytest.raises(FeedError, match="share the symbol"):
        compiled.run({**feeds, "b": feeds["b"][:5]})


def test_the_passes_strategy_prices_a_model_with_open_dims_at_the_representative_shape():
    generic = ef.compile(BERT, backend="numpy", strategy="passes")
    static = ef.compile(BERT, backend="numpy", strategy="passes",
                        input_shapes={"input_ids": (1, 128), "attention_mask": (1, 128)})
    assert generic.report.cost == pytest.approx(static.report.cost, rel=1e-9)
    for b, s in ((1, 8), (3, 5)):
        _check_against_ort(generic, BERT, _bert_feeds(b, s, seed=s))
