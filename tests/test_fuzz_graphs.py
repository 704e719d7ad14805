"""Random valid ONNX models (eqsat_fuse.testing) compiled by eqsat-fuse and checked against
onnxruntime, plus checks of the generator itself and the regressions the fuzzing found."""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.errors import InvalidArgument
from onnx import TensorProto, helper

from eqsat_fuse.testing import (GENERATED_OPS, GraphCase, check_case, conv_blocks,
                                elementwise_chains, matmul_blocks, model_text, onnx_graphs)

from conftest import ort_outputs

ort.set_default_logger_severity(3)

FUZZ = settings(max_examples=40, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = settings(FUZZ, max_examples=15)


# ---- the generator itself: valid models that onnxruntime runs, finite moderate outputs ----------

@settings(FUZZ, max_examples=60)
@given(onnx_graphs(max_nodes=16, opset=(13, 15, 17, 18, 20, 21)))
def test_generated_models_are_valid(case):
    onnx.checker.check_model(case.model, full_check=True)
    assert set(case.feeds) == {i.name for i in case.model.graph.input}
    outputs = ort_outputs(case.model, case.feeds)
    for value, declared in zip(outputs, case.model.graph.output):
        shape = tuple(d.dim_value for d in declared.type.tensor_type.shape.dim)
        assert value.shape == shape, (declared.name, case.text())
        assert np.all(np.isfinite(value)), (declared.name, case.text())
        assert np.abs(value).max(initial=0.0) < 1e4, (declared.name, case.text())
    assert {n.op_type for n in case.model.graph.node} <= GENERATED_OPS


@settings(SMALL, max_examples=25)
@given(onnx_graphs(ops={"Add", "Mul", "Relu", "Sqrt", "Div", "Conv"}))
def test_ops_restricts_the_generated_ops(case):
    assert {n.op_type for n in case.model.graph.node} <= {"Add", "Mul", "Relu", "Sqrt", "Div",
                                                          "Conv"}
    outputs = ort_outputs(case.model, case.feeds)
    assert all(np.all(np.isfinite(o)) for o in outputs), case.text()


def test_strategy_arguments_are_checked():
    with pytest.raises(InvalidArgument, match="Foo"):
        onnx_graphs(ops={"Relu", "Foo"})
    with pytest.raises(InvalidArgument, match="opset"):
        onnx_graphs(opset=11)
    with pytest.raises(InvalidArgument, match="activation"):
        conv_blocks(activation="Softmax")


def test_check_case_reports_a_wrong_rule(tmp_path):
    """A rule file that drops Relu is caught, with the model printed in the message."""
    rule = tmp_path / "wrong.egg"
    rule.write_text('(rewrite (Relu x) x :ruleset canon :name "wrong-relu-removal")\n')
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    case = GraphCase(model, {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}, "Relu")
    check_case(case)   # the shipped rules are right
    # (should eqsat-fuse one day refuse an unsound rule file, that is a failure to compile)
    with pytest.raises(AssertionError, match="differs|failed to compile") as info:
        check_case(case, rules=[str(rule)])
    assert "y = Relu (x)" in str(info.value)


# ---- compiled models against onnxruntime ---------------------------------------------------------

# Failures of bugs that a strict xfail in REGRESSIONS (below) already records. The fuzz tests
# let them pass (counted as a Hypothesis event), so that they keep looking for new bugs. When a
# bug is fixed its xfail turns into XPASS(strict): delete both its entry here and its marks.
# None open today.
KNOWN_BUGS: dict[str, Callable[[GraphCase, str, str], bool]] = {}


def check(case: GraphCase, backend: str = "numpy", **compile_kwargs):
    """`check_case`, except for the failures of a known bug (then None)."""
    try:
        return check_case(case, backend=backend, **compile_kwargs)
    except AssertionError as exc:
        for name, matches in KNOWN_BUGS.items():
            if matches(case, str(exc), backend):
                event(f"known bug: {name}")
                return None
        raise


@FUZZ
@given(onnx_graphs())
def test_fuzz_graphs(case):
    check(case)


@SMALL
@given(onnx_graphs(max_nodes=10, opset=(18, 20, 21)))
def test_fuzz_graphs_newer_opsets(case):
    """Opsets whose forms differ from 17: Gelu, Split num_outputs, ReduceMean axes input, Pad
    axes."""
    check(case)


@settings(FUZZ, max_examples=30)
@given(elementwise_chains(max_nodes=10))
def test_elementwise_chains_with_broadcasting(case):
    check(case)


@SMALL
@given(elementwise_chains(max_nodes=6, broadcast=False))
def test_elementwise_chains_same_shapes(case):
    check(case)


@settings(FUZZ, max_examples=25)
@given(conv_blocks())
def test_conv_blocks(case):
    check(case)


@SMALL
@given(conv_blocks(batchnorm=True, activation="Relu", residual=False,
                   intermediate_outputs=False))
def test_conv_bn_relu_fuses(case):
    compiled = check(case)
    if compiled is None:
        return
    nodes = len(case.model.graph.node)
    assert compiled.report.kernels_out < nodes, (
        f"Conv+BatchNormalization+Relu did not fuse: {compiled.report.kernels_out} kernels for "
        f"{nodes} nodes\n{compiled.report.summary()}\n{case.text()}")


@settings(FUZZ, max_examples=25)
@given(matmul_blocks())
def test_matmul_blocks(case):
    check(case)


# `make fuzz`: thousands of graphs per backend (FUZZ_EXAMPLES, default 2000); `make test-slow`
# runs a shorter sweep through the Numba backend (a JIT compile per new kernel shape: slow).
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "2000"))


@pytest.mark.fuzz
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@settings(FUZZ, max_examples=FUZZ_EXAMPLES)
@given(case=onnx_graphs())
def test_fuzz_graphs_long(backend, case):
    check(case, backend=backend)


@pytest.mark.slow
@settings(FUZZ, max_examples=150)
@given(onnx_graphs())
def test_fuzz_graphs_numba(case):
    """The same graphs through the Numba backend."""
    check(case, backend="numba")


# ---- regressions found by the fuzzing ------------------------------------------------------------

def _case(text: str, seed: int = 0) -> GraphCase:
    """A case from `onnx.printer` text, with feeds ~ U(-3, 3) (integer inputs: zeros)."""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        feeds[vi.name] = (rng.uniform(-3, 3, shape) if dtype.kind == "f"
                          else np.zeros(shape)).astype(dtype)
    return GraphCase(model, feeds, "regression")


_HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _fixed(bug_id: str, text: str, backend: str = "numpy"):
    return pytest.param(_HEADER + text, backend, id=bug_id)


def _bug(bug_id: str, text: str, reason: str, backend: str = "numpy"):
    return pytest.param(_HEADER + text, backend, id=bug_id, marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason=reason))


# Minimal models (as Hypothesis shrank them) of bugs the fuzzing found that are fixed now.
FIXED = [
    # was: KeyError 'x0' in lower.py (plan.buffers[root])
    _fixed("view-of-input-is-output", """
        g (float[2,2] x0) => (float[4] v1) <int64[1] s = {4}> { v1 = Reshape (x0, s) }"""),
    # was: TooHardError from np.shares_memory(max_work=0) in layout.py, then KeyError 'x0'
    _fixed("split-of-input-is-output", """
        g (float[2] x0) => (float[1] v1, float[1] v2) <int64[2] s = {1, 1}> {
            v1, v2 = Split <axis: int = 0> (x0, s) }"""),
    # was: a rank-0 input through Identity/Dropout/Cast/Sum(1 input)/Expand(shape []) to an
    # output came back with shape [1]
    _fixed("scalar-input-alias-shape", """
        g (float x0) => (float v1) { v1 = Identity (x0) }"""),
    # was: a rank-0 graph output computed from initializers only (folded at compile time) came
    # back with shape [1] (np.ascontiguousarray makes 0-d arrays 1-d)
    _fixed("scalar-constant-output-shape", """
        g (float[2] x0) => (float v1) <float c = {0.5}> { v1 = Relu (c) }"""),
    # was: Gather with a scalar index on an axis > 0 failed at run time with "could not
    # broadcast input array from shape (2,1) into shape (2,)" (the same cause)
    _fixed("gather-scalar-index-axis1", """
        g (float[2,2] x0) => (float[2] v1) <int64 i = {1}> {
            v1 = Gather <axis: int = 1> (x0, i) }"""),
    _fixed("gather-scalar-index-axis1-numba", """
        g (float[2,2] x0) => (float[2] v1) <int64 i = {1}> {
            v1 = Gather <axis: int = 1> (x0, i) }""", backend="numba"),
    # was: KeyError in backend_numba.emit_nodes (gen_reduce): a reduction whose epilogue reads
    # the reduction's own prologue value (Softmax written out)
    _fixed("numba-reduce-epilogue-keyerror", """
        g (float[2] x0) => (float[2] v4) <int64[1] axes = {0}> {
            v1 = Exp (x0)
            v3 = ReduceSum <keepdims: int = 1> (v1, axes)
            v4 = Div (v1, v3) }""", backend="numba"),
    # was: ReduceSum(keepdims) fused with an epilogue reading the reduced input (x - sum(x))
    # wrote one element per row (the rest garbage)
    _fixed("numba-reduce-epilogue-values", """
        g (float[3] x0) => (float[3] v4) <int64[1] axes = {0}> {
            v3 = ReduceSum <keepdims: int = 1> (x0, axes)
            v4 = Sub (x0, v3) }""", backend="numba"),
    # was: the elementwise column axis merged dims across a size-1 dim without checking
    # their strides: a Split view along axis 1 was read as contiguous memory
    _fixed("numba-split-view", """
        g (float[2,2,2] x0) => (float[2,1,2] v4) <int64[2] s = {1, 1}> {
            v2, v3 = Split <axis: int = 1> (x0, s)
            v4 = Relu (v3) }""", backend="numba"),
    # was: the same cause: [2,1,1] broadcast against [2,1,3] read c[0] in every row
    _fixed("numba-broadcast-unit-axis", """
        g (float[2,1,3] x0) => (float[2,1,3] v1) <float[2,1,1] c = {10, 20}> {
            v1 = Add (x0, c) }""", backend="numba"),
    # was: a Softmax epilogue reading a boundary operand the prologue also read reused the
    # prologue loop's last loaded value (a stale load cached across the two row loops)
    _fixed("numba-rows-epilogue-reads-input", """
        g (float[7] x0) => (float[7] v3) {
            v2 = Softmax <axis: int = -1> (x0)
            v3 = Mul (v2, x0) }""", backend="numba"),
    # was: KeyError in backend_numba.emit_nodes (gen_rows): the epilogue read a prologue value
    _fixed("numba-rows-epilogue-reads-prologue", """
        g (float[3,7] x0) => (float[3,7] v3) {
            v1 = Exp (x0)
            v2 = Softmax <axis: int = -1> (v1)
            v3 = Mul (v2, v1) }""", backend="numba"),
    # was: Cast to float16 inside a Numba kernel did not round (float16 is computed as float32)
    _fixed("numba-cast-float16-rounds", """
        g (float[2,3] x0) => (float[2,3] v3) {
            v1 = Cast <to: int = 10> (x0)
            v2 = Cast <to: int = 1> (v1)
            v3 = Sub (x0, v2) }""", backend="numba"),
    # was: the constant expression decode built for a shared folded constant held a Mat node
    # (a kernel boundary), and lower.fold_constants failed: "no NumPy evaluation for
    # term-language op 'Mat'" (both backends)
    _fixed("const-expr-holds-mat", """
        g (float[1] x0) => (float[2] v2) <float[2] c = {1.5, -1.5}> {
            v1 = Relu (c)
            v2 = Sum (v1, v1, x0) }"""),
    _fixed("const-expr-holds-mat-numba", """
        g (float[1] x0) => (float[2] v2) <float[2] c = {1.5, -1.5}> {
            v1 = Relu (c)
            v2 = Sum (v1, v1, x0) }""", backend="numba"),
    # was: BatchNormalization fused into a kernel whose output has a higher rank (a Where
    # broadcasting it) took its parameters along the output's axis 1, not the input's
    _fixed("numba-batchnorm-broadcast-to-higher-rank", """
        g (float[3,3] x0, bool[2,1,1] x1) => (float[2,3,3] v2)
          <float[3] s = {1.5, 0.5, 1}, float[3] b = {0.1, -0.2, 0}, float[3] m = {0.3, -0.4, 1},
           float[3] v = {1.2, 0.8, 0.5}> {
            v1 = BatchNormalization (x0, s, b, m, v)
            v2 = Where (x1, v1, v1) }""", backend="numba"),
]

# Minimal models on which eqsat-fuse fails today: strict xfails, so each one fails the suite
# (XPASS(strict)) once it is fixed; then move it to FIXED and drop its KNOWN_BUGS entry.
REGRESSIONS: list = []      # none open today


@pytest.mark.parametrize("text, backend", FIXED + REGRESSIONS)
def test_regression(text, backend):
    case = _case(text)
    onnx.checker.check_model(case.model, full_check=True)
    ort_outputs(case.model, case.feeds)    # the model is valid: onnxruntime runs it
    check_case(case, backend=backend)


def test_regression_text_round_trip():
    case = _case("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) { y = Relu (x) }
    """)
    assert "y = Relu (x)" in model_text(case.model)
    check_case(case)
