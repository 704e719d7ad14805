"""Conformance: the ONNX backend node tests of every covered op, compiled and run by eqsat-fuse.

The cases come from the `onnx` package itself (`onnx.backend.test.case.node.collect_testcases`,
the generator of `onnx/backend/test/data/node/test_*`; the wheel does not ship the .pb files).
Each case is compiled with `ef.compile(model)`, run on the case's inputs by every backend in
`eqsat_fuse.lowering.lower.BACKENDS` (a backend added there is picked up here without an edit), and
compared with the case's expected outputs the way onnx's own backend runner compares them
(same shape, same dtype, `assert_allclose` with the case's rtol/atol).

Which cases:

- ``node``: every single-node case whose op is in `ops.COVERED_ONNX_OPS`;
- ``expanded``: the function-expanded form (``*_expanded``) of those cases, and of any other
  op whose expansion uses covered ops only (MVN, GroupNormalization, DepthToSpace...);
- ``frozen``: node tests often feed an attribute-like input (Reshape's shape, Slice's starts,
  ReduceSum's axes, Pad's pads...) as a graph input, or ask for an optional extra output
  (LayerNormalization's Mean, Dropout's mask, MaxPool's Indices). Such a node is outside the
  covered forms and legitimately runs Opaque through onnx.reference — which would leave
  eqsat-fuse's own implementation of the op untested. The ``frozen`` variant of such a case
  turns those inputs into initializers holding the case's values and drops the extra outputs,
  and must then compile with no Opaque node at all.

Cases left out are listed in `EXCLUDED` with the reason; each must still fail with a clear
`EqsatFuseError` (tested below), never a crash. Cases a backend gets wrong today are listed in
`KNOWN_BACKEND_BUGS` and run as strict xfails. On a backend other than numpy the full sweep is
marked slow (one case per op runs by default), and so are the `_expanded_verNN` repeats of an
expansion at an older opset; `make test-slow` runs all of it.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import eqsat_fuse as ef
from eqsat_fuse.lowering.lower import BACKENDS
from eqsat_fuse.ops import COVERED_ONNX_OPS

# Cases left out: name -> (why, what the clear error says). Each is a real limitation.
EXCLUDED: dict[str, tuple[str, str]] = {
    "test_identity_sequence": (
        "a sequence-typed input: eqsat-fuse compiles tensors only",
        r"input 'x' is not a tensor"),
    "test_identity_opt": (
        "an optional-typed input: eqsat-fuse compiles tensors only",
        r"input 'opt_in' is not a tensor"),
    **{f"test_not_{rank}d": (
        "ONNX's Not cases are opset-1 models; the importer upgrades models from opset 7 on",
        r"opset 1 is not supported") for rank in (2, 3, 4)},
    **{f"test_reduce_log_sum_{variant}_expanded": (
        "ReduceSum's axes are a graph input (fed at run time), so the ReduceSum output that "
        "Log reads has no static shape; eqsat-fuse compiles static shapes only",
        r"has no static shape")
       for variant in ("desc_axes", "asc_axes", "default", "negative_axes", "empty_set")},
}

# Cases a backend gets wrong today: bugs to fix in that backend, not limitations. They are
# strict xfails, so the suite says so ("XPASS(strict)") when one is fixed and can leave this list.
# Patterns are regular expressions matched against the whole case name.
KNOWN_BACKEND_BUGS: dict[str, list[tuple[str, str]]] = {
    "numba": [],
}

# Inputs that act as attributes (the term language holds them as attributes), by position.
_ATTRIBUTE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
                     "Slice": (1, 2, 3, 4), "Split": (1,), "Pad": (1, 2, 3),
                     "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
                     "Dropout": (1, 2),
                     "QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2)}
# Forms of a covered op that stay Opaque by design, so have no frozen variant: quantization to
# 8-bit floats, 4- and 2-bit integers, and the blocked form.
_OPAQUE_FORMS = re.compile(r"test_(de)?quantizelinear_.*(e4m3|e5m2|int4|int2|float4|blocked)")
# Ops whose optional extra outputs the term language does not compute.
_EXTRA_OUTPUTS = {"LayerNormalization", "Dropout", "MaxPool"}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str                      # "node" | "expanded" | "frozen"
    op: str                        # the op under test
    model: onnx.ModelProto
    inputs: dict                   # graph input name -> array
    outputs: dict                  # graph output name -> expected array
    rtol: float
    atol: float


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


def _case(test, kind: str, op: str) -> Case:
    inputs, outputs = test.data_sets[0]
    graph = test.model.graph
    return Case(test.name, kind, op, test.model,
                {vi.name: _array(v) for vi, v in zip(graph.input, inputs)},
                {vi.name: _array(v) for vi, v in zip(graph.output, outputs)},
                test.rtol, test.atol)


def _frozen(case: Case) -> Case | None:
    """The case with attribute-like graph inputs made initializers and extra outputs dropped."""
    node = case.model.graph.node[0]
    positions = _ATTRIBUTE_INPUTS.get(node.op_type, ())
    freeze = [node.input[p] for p in positions
              if p < len(node.input) and node.input[p] in case.inputs]
    drop = node.op_type in _EXTRA_OUTPUTS and len([o for o in node.output if o]) > 1
    if (not freeze and not drop) or _OPAQUE_FORMS.match(case.name):
        return None
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    inputs = dict(case.inputs)
    for name in freeze:
        graph.initializer.append(numpy_helper.from_array(inputs.pop(name), name))
    kept_inputs = [vi for vi in graph.input if vi.name in inputs]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    outputs = dict(case.outputs)
    if drop:
        first = graph.node[0].output[0]
        del graph.node[0].output[1:]
        kept_outputs = [vo for vo in graph.output if vo.name == first]
        del graph.output[:]
        graph.output.extend(kept_outputs)
        outputs = {first: outputs[first]}
    return Case(case.name + "_frozen", "frozen", case.op, model, inputs, outputs, case.rtol,
                case.atol)


@cache
def _node_tests():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        state = np.random.get_state()
        try:
            return list(collect_testcases(None))
        finally:
            np.random.set_state(state)


@cache
def all_cases() -> list[Case]:
    tests = _node_tests()
    cases: list[Case] = []
    covered: dict[str, str] = {}
    for test in tests:
        nodes = test.model.graph.node
        if ("_expanded" not in test.name and len(nodes) == 1
                and nodes[0].domain in ("", "ai.onnx") and nodes[0].op_type in COVERED_ONNX_OPS):
            covered[test.name] = nodes[0].op_type
            cases.append(_case(test, "node", nodes[0].op_type))
    for test in tests:
        if "_expanded" not in test.name:
            continue
        base = re.sub(r"_expanded.*$", "", test.name)
        ops = {n.op_type for n in test.model.graph.node}
        if base in covered or (ops <= COVERED_ONNX_OPS and len(test.model.graph.node) > 1):
            # (a one-node expansion, CastLike -> Cast, repeats a node case: left out)
            cases.append(_case(test, "expanded", covered.get(base, base)))
    # (training-mode Dropout and BatchNormalization stay Opaque however they are fed: no
    # frozen form of them)
    cases.extend(f for f in (_frozen(c) for c in cases if c.kind == "node"
                             and "training" not in c.name) if f is not None)
    return cases


def known_bug(backend: str, name: str) -> str | None:
    for pattern, reason in KNOWN_BACKEND_BUGS.get(backend, ()):
        if re.fullmatch(pattern, name):
            return reason
    return None


def _params():
    for backend in BACKENDS:
        # numpy runs every case; another backend runs one case per op by default (the first
        # that is not a known bug of it) and the rest with `make test-slow`
        first_of_op: set[str] = set()
        for case in all_cases():
            if case.name in EXCLUDED:
                continue
            bug = known_bug(backend, case.name)
            marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
            if backend != "numpy":
                if case.kind == "node" and case.op not in first_of_op and not bug:
                    first_of_op.add(case.op)
                else:
                    marks.append(pytest.mark.slow)
            elif re.search(r"_expanded_ver\d+$", case.name):
                marks.append(pytest.mark.slow)   # the same expansion as `_expanded`, older opset
            yield pytest.param(case, backend, id=f"{backend}-{case.name}", marks=marks)


def assert_matches(got: dict, case: Case) -> None:
    """Compare as onnx's backend runner does: shape, dtype, then allclose."""
    assert set(got) == set(case.outputs)
    for name, expected in case.outputs.items():
        actual = np.asarray(got[name])
        assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
        rtol = case.rtol
        if expected.dtype.kind not in "biufc?":        # bfloat16, float8, int4... (ml_dtypes)
            if expected.dtype.name == "bfloat16":
                rtol = max(rtol, 2 ** -6)
            actual, expected = actual.astype(np.float32), expected.astype(np.float32)
        if expected.dtype.kind in "fc":
            np.testing.assert_allclose(actual, expected, rtol=rtol, atol=case.atol,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=name)


@pytest.mark.parametrize("case, backend", list(_params()))
def test_node_case(case: Case, backend: str):
    with np.errstate(all="ignore"):
        compiled = ef.compile(case.model, backend=backend)
        got = compiled.run(case.inputs)
    assert_matches(got, case)
    if case.kind == "frozen":
        assert compiled.report.opaque_ops == [], (
            f"the frozen form of {case.op} should be covered, not run by onnx.reference")


@pytest.mark.parametrize("name", sorted(EXCLUDED))
def test_excluded_case_fails_with_a_clear_error(name):
    reason, message = EXCLUDED[name]
    case = next((c for c in all_cases() if c.name == name), None)
    assert case is not None, f"{name} is excluded but is no longer a node test: drop it"
    with pytest.raises(ef.EqsatFuseError, match=message):
        ef.compile(case.model)


def test_the_selection_covers_every_covered_op():
    """Every covered ONNX op has node cases here, and none of them is left out silently."""
    ops_with_cases = {c.op for c in all_cases() if c.kind == "node"}
    # Constant and Shape are folded away at import; their node tests still run here.
    assert COVERED_ONNX_OPS <= ops_with_cases, sorted(COVERED_ONNX_OPS - ops_with_cases)
    assert len([c for c in all_cases() if c.kind == "frozen"]) >= 50
