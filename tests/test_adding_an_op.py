"""docs/adding-an-op.md, followed for a real ONNX op eqsat-fuse does not cover (Softplus).

The document's path is four files: rules/lang.egg (the constructor), eqsat_fuse/ops.py (the
table entry, its reference kernel and Numba scalar form included), rules/generated.egg
(regenerated) and docs/rules.md (a row). The shipped files are not edited here: a copy of
rules/ gets the constructor and the regenerated rules, the entry is monkeypatched into the
table, and the docs check is run on the copy to show that the row is all it asks for. Nothing
else is touched, so the rest of the pipeline (importer, rules, extraction, both backends, the
exporter, the rule checker, the graph fuzzer) must find everything it needs there: the model
compiles with Softplus fused into one kernel with its neighbours and verifies against
onnxruntime on both backends.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse import ops, resources
from eqsat_fuse.backends.numpy import ops as npo
from eqsat_fuse.frontend import encode
from eqsat_fuse.saturation import rulegen
from eqsat_fuse.testing import onnx_graphs

OP = "Softplus"
DOCS = Path(__file__).resolve().parent.parent / "docs"

# the entry a new op adds to the table in eqsat_fuse/ops.py: log(1 + exp(x)) without overflow
ENTRY = ops._spec(OP, ["x"], ref=npo.float_kernel(lambda v: np.logaddexp(v.dtype.type(0), v),
                                                  "log(1 + exp(x))."),
                  scalar="(np.log1p(np.exp(-abs({0}))) + max({0}, {lit[0]}))")


@pytest.fixture
def softplus_added(tmp_path, monkeypatch):
    """The files of docs/adding-an-op.md, in a copy of the shipped data and in memory (the
    fourth, docs/rules.md, is checked by `test_docs_ask_for_one_row_of_docs_rules_md`)."""
    package = tmp_path / "package"
    shutil.copytree(resources.data_dir("rules"), package / "data" / "rules")
    shutil.copytree(resources.data_dir("extract"), package / "data" / "extract")
    rules = package / "data" / "rules"
    # 1. rules/lang.egg: the constructor
    with open(rules / "lang.egg", "a") as f:
        f.write(f"\n(constructor {OP} (T) T)\n")
    # 2. eqsat_fuse/ops.py: the table entry
    monkeypatch.setitem(ops.OPS, OP, ENTRY)
    # 3. rules/generated.egg: regenerated from the table (`make rules`)
    monkeypatch.setattr(resources, "_PACKAGE_DIR", package)
    assert resources.data_dir("rules") == rules
    assert rulegen.main([]) == 0 and rulegen.main(["--check"]) == 0
    generated = (rules / "generated.egg").read_text()
    assert f'"elementwise-{OP.lower()}"' in generated and f'"fuse-{OP.lower()}"' in generated
    encode.constructor_sorts.cache_clear()
    yield rules
    encode.constructor_sorts.cache_clear()


def _model() -> onnx.ModelProto:
    """y = tanh(softplus(x * w + b) * x): Softplus between elementwise neighbours."""
    shape = [2, 3, 8]
    w = helper.make_tensor("w", TensorProto.FLOAT, [8], np.linspace(-2, 2, 8).tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT, [1], [0.25])
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["z"]),
             helper.make_node(OP, ["z"], ["s"]),
             helper.make_node("Mul", ["s", "x"], ["m"]),
             helper.make_node("Tanh", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "softplus", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, shape)], initializer=[w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shipped_table_does_not_cover_the_op():
    assert OP not in ops.OPS, "pick another op: the test adds one eqsat-fuse does not cover"
    compiled = ef.compile(_model())
    assert [k.kind for k in compiled.plan.kernels].count("opaque") == 1


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_new_elementwise_op_fuses_and_verifies(softplus_added, backend):
    if backend == "numba":
        pytest.importorskip("numba")
    compiled = ef.compile(_model(), backend=backend)
    kernels = [k for k in compiled.plan.kernels if k.kind != "alias"]
    assert len(kernels) == 1, [k.ops for k in kernels]
    assert OP in kernels[0].ops and "Tanh" in kernels[0].ops and "Add" in kernels[0].ops
    report = compiled.program.report
    assert not report.fallback_kernels and report.opaque_kernels == 0
    if backend == "numba":
        assert report.compiled_kernels == 1
    result = compiled.verify()
    assert result.ok, result
    # the exporter writes it back as the ONNX op of the same name
    exported = compiled.to_onnx()
    assert OP in {n.op_type for f in exported.functions for n in f.node} | \
        {n.op_type for n in exported.graph.node}


def test_the_generated_rules_of_the_new_op_are_sound(softplus_added):
    from eqsat_fuse.checking.rulecheck import check_rules

    names = {f"elementwise-{OP.lower()}", f"fuse-{OP.lower()}"}
    report = check_rules([softplus_added / "generated.egg"], examples=10, names=names)
    statuses = {r.name: r.status for r in report.results}
    # the generated fact (the new op is elementwise) is checked by what it means, facts.py
    assert statuses == {f"elementwise-{OP.lower()}": "fact-checked",
                        f"fuse-{OP.lower()}": "passed"}, report.summary()


def test_docs_ask_for_one_row_of_docs_rules_md(softplus_added):
    """4. docs/rules.md: tests/test_docs.py asks for the new constructor there, and only it."""
    text = (DOCS / "rules.md").read_text()
    documented = set(re.findall(r"`\(?([A-Z][A-Za-z]+)", text))
    assert set(encode.constructor_sorts()) - documented == {OP}
    assert set(encode.constructor_sorts()) - (documented | {OP}) == set()


@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=onnx_graphs(max_nodes=6, ops={OP, "Add", "Mul", "Relu", "Tanh"}, allow_conv=False,
                        allow_matmul=False, allow_shapes=False))
def test_graphs_the_fuzzer_draws_with_the_new_op_verify(softplus_added, case):
    compiled = ef.compile(case.model)
    assert compiled.verify(case.feeds).ok
