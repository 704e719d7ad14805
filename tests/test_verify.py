"""verify a user can act on: tolerances from the command line and the API, tie-aware indices of
ArgMax and TopK, and a line per output that says why it passed or failed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.checking.verify import IndexOutput, compare
from eqsat_fuse.cli import main

from conftest import MODELS_DIR, make_model

BERT = str(MODELS_DIR / "bert_tiny_op17.onnx")


def test_tolerance_flags_change_the_verdict_and_the_line_says_why(capsys):
    assert main(["verify", BERT, "--quiet"]) == 0
    assert "every element within atol + rtol x |want| (rtol 0.001, atol 0.0001)" in \
        capsys.readouterr().out
    # exact comparison: float32 rounding of another summation order is now a mismatch
    assert main(["verify", BERT, "--quiet", "--rtol", "0", "--atol", "0"]) == 1
    out = capsys.readouterr().out
    assert "verify against onnxruntime: MISMATCH (2 of 2 outputs)" in out
    assert "last_hidden_state: MISMATCH" in out and "elements differ (compared exactly); " \
        "the worst at (" in out
    # one output given its own tolerance passes again, the other stays exact
    assert main(["verify", BERT, "--quiet", "--rtol", "0", "--atol", "0",
                 "--tol", "pooler_output=1e-3,1e-4"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH (1 of 2 outputs)" in out and "pooler_output: ok  every element" in out


def test_the_api_takes_the_same_tolerances():
    compiled = ef.compile(BERT)
    assert compiled.verify().ok
    exact = compiled.verify(rtol=0, atol=0)
    assert not exact.ok and all(o.mismatched > 0 for o in exact.outputs)
    mixed = compiled.verify(rtol=0, atol=0, tolerances={"last_hidden_state": (1e-3, 1e-4),
                                                        "pooler_output": (1e-3, 1e-4)})
    assert mixed.ok and {(o.rtol, o.atol) for o in mixed.outputs} == {(1e-3, 1e-4)}


@pytest.mark.parametrize("args, message", [
    (["--tol", "logits=1e-3,1e-4"], "a tolerance is given for 'logits', which is not an "
                                    "output; the outputs are last_hidden_state, pooler_output"),
    (["--atol", "-1"], "atol must be a number >= 0, got -1.0"),
])
def test_a_bad_tolerance_is_one_clear_line(capsys, args, message):
    assert main(["verify", BERT, "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err == f"eqsat-fuse: error: {message}\n"


def test_a_malformed_tol_flag_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as info:
        main(["verify", BERT, "--tol", "pooler_output=1e-3"])
    assert info.value.code == 2
    assert "argument --tol: expected NAME=RTOL,ATOL, got 'pooler_output=1e-3'" in \
        capsys.readouterr().err


def _index_model():
    """x -> Relu -> r; ArgMax(r, axis 1) -> am; TopK(r, 2) -> (v, i)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ArgMax", ["r"], ["am"], axis=1, keepdims=0, name="pick"),
             helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=1, name="top")]
    return make_model(nodes, [("x", [2, 4])],
                      [("am", [2], TensorProto.INT64), ("v", [2, 2]),
                       ("i", [2, 2], TensorProto.INT64)],
                      initializers={"k": np.array([2], np.int64)})


def _with_indices(compiled, monkeypatch, **replaced):
    """The compiled program, its index outputs replaced by the given arrays."""
    run = compiled.run

    def swapped(feeds, out=None):
        return {**run(feeds), **{k: np.array(v, np.int64) for k, v in replaced.items()}}
    monkeypatch.setattr(compiled, "run", swapped)


# row 0 has a tie between columns 1 and 2 (both 3.0) at the top; row 1 has none
FEEDS = {"x": np.array([[1.0, 3.0, 3.0, 0.0], [0.5, 2.0, -1.0, 4.0]], np.float32)}


def test_an_argmax_index_swapped_between_tied_values_is_accepted_and_said(monkeypatch):
    compiled = ef.compile(_index_model())
    assert compiled.verify(FEEDS).summary().startswith("verify against onnxruntime: OK\n")
    _with_indices(compiled, monkeypatch, am=[2, 3], i=[[2, 1], [3, 1]])
    result = compiled.verify(FEEDS)
    assert result.ok
    checks = {o.name: o for o in result.outputs}
    assert checks["am"].ties == 1 and checks["i"].ties == 2
    text = result.summary()
    assert text.startswith("verify against onnxruntime: OK (3 tied indices accepted)")
    assert "am: ok  1 of 2 indices differ from the oracle's, each a swap between tied values " \
           "(the values they point at in the input of ArgMax 'pick' are equal within " \
           "rtol 0.001, atol 0.0001" in text


def test_an_index_that_points_at_another_value_still_fails_with_the_reason(monkeypatch):
    compiled = ef.compile(_index_model())
    _with_indices(compiled, monkeypatch, am=[0, 3], i=[[1, 1], [3, 1]])
    result = compiled.verify(FEEDS)
    assert not result.ok
    checks = {o.name: o for o in result.outputs}
    assert not checks["am"].ok and checks["am"].mismatched == 1
    assert "am: MISMATCH  1 of 2 indices differ from the oracle's and are no tie (the values " \
           "they point at in the input of ArgMax 'pick'); the first at (0,): got index 0 -> 1, " \
           "want index 1 -> 3 (not equal within rtol 0.001, atol 0.0001)" in result.summary()
    # TopK's row 0 names column 1 twice: the values are tied, but a repeated index is wrong
    assert not checks["i"].ok and "got index 1, which its row holds twice" in checks["i"].reason


def test_topk_ties_from_its_values_output_when_the_input_cannot_be_read():
    index = IndexOutput("TopK", "top", "", axis=1, keepdims=True, values="v")
    want = {"v": np.array([[3.0, 3.0]], np.float32), "i": np.array([[1, 2]])}
    tied = compare({"v": want["v"], "i": np.array([[2, 1]])}, want, "test",
                   indices={"i": index})
    assert tied.ok and tied.outputs[1].ties == 2
    assert "the values output 'v' of TopK 'top'" in tied.outputs[1].reason
    wrong = compare({"v": np.array([[3.0, 1.0]], np.float32), "i": np.array([[1, 0]])},
                    want, "test", indices={"i": index})
    assert not wrong.ok
    assert "i: MISMATCH  1 of 2 indices differ from the oracle's and are no tie" in \
        wrong.summary()


def test_nan_shape_and_dtype_mismatches_are_named():
    want = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    result = compare({"y": np.array([1.0, 0.0, -np.inf, 2.0], np.float32)}, {"y": want}, "t")
    (check,) = result.outputs
    assert not check.ok and check.nan_mismatched == 2 and check.mismatched == 0
    assert "2 NaN/inf on one side only (or of the other sign); the first at (1,): got 0, " \
           "want nan" in check.reason
    alike = compare({"y": want.copy()}, {"y": want}, "t").outputs[0]
    assert alike.ok and "2 NaN/inf, alike on both sides" in alike.reason
    shape = compare({"y": want[:2]}, {"y": want}, "t").outputs[0]
    assert not shape.ok and shape.reason == "shape (2,), the oracle's (4,)"
    dtype = compare({"y": want.astype(np.float64)}, {"y": want}, "t").outputs[0]
    assert not dtype.ok and dtype.reason == "dtype float64, the oracle's float32"
    ints = compare({"n": np.array([1, 5])}, {"n": np.array([1, 4])}, "t").outputs[0]
    assert not ints.ok and ints.reason.startswith("1 of 2 elements differ (compared exactly); "
                                                  "the worst at (1,): got 5, want 4")
    loose = compare({"n": np.array([1, 5])}, {"n": np.array([1, 4])}, "t",
                    tolerances={"n": (0, 1)}).outputs[0]
    assert loose.ok


def test_inputs_the_original_model_cannot_run_are_a_one_line_run_error():
    """onnxruntime refusing the feeds (an index out of range) is the user's RunError with
    onnxruntime's reason, not onnxruntime's own exception."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    model = make_model([helper.make_node("Gather", ["table", "i"], ["y"])],
                       [("i", [2], TensorProto.INT64)], [("y", [2, 3])], {"table": table})
    compiled = ef.compile(model, backend="numpy")
    with pytest.raises(ef.RunError, match="onnxruntime cannot run the original model.*Gather"):
        compiled.verify({"i": np.array([1, 9], np.int64)})
    assert compiled.verify({"i": np.array([1, 3], np.int64)}).ok
