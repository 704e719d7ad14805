"""Stage 1, encode: the term language and the egglog program a model becomes."""

from __future__ import annotations

import numpy as np
from egglog import bindings
from onnx import helper

from eqsat_fuse.frontend.encode import constructor_sorts, encode
from eqsat_fuse.frontend.importer import import_model
from eqsat_fuse.ops import OPS
from eqsat_fuse.resources import data_dir

from conftest import MODELS_DIR, make_model


def test_every_op_has_a_constructor_with_matching_arity():
    sorts = constructor_sorts()
    for name, spec in OPS.items():
        assert name in sorts, f"{name} has no constructor in rules/lang.egg"
        args, result = sorts[name]
        tensors = [s for s in args if s in ("T", "TList")]
        assert len(tensors) == len(spec.inputs), name
        assert len(args) - len(tensors) == len(spec.attrs), name
        assert result == ("TList" if name in ("TNil", "TCons") else "T")


def test_program_has_one_materialized_let_per_node_and_loads_into_egglog():
    graph = import_model(MODELS_DIR / "resnet_tiny_op17.onnx")
    encoding = encode(graph)
    lets = [line for line in encoding.program.splitlines() if line.startswith("(let $v")]
    assert len(lets) == sum(len(n.outputs) for n in graph.nodes)
    assert all("(Mat $i" in line for line in lets)
    egraph = bindings.EGraph()
    language = data_dir("rules") / "lang.egg"
    egraph.parse_and_run_program(language.read_text(), filename=str(language))
    egraph.parse_and_run_program(encoding.program, filename="<model>")


def test_shapes_and_dtypes_are_stated_as_facts():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    encoding = encode(import_model(make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])))
    var = encoding.output_vars["y"]
    assert f"(set (shape {var}) (vec-of 2 3))" in encoding.program
    assert f'(set (dtype {var}) "float32")' in encoding.program


def test_names_from_the_model_never_reach_the_program_text():
    hostile = 'x") (include "/etc/passwd") ("'
    nodes = [helper.make_node("Add", [hostile, "w"], ["y"])]
    model = make_model(nodes, [(hostile, [2])], [("y", [2])], {"w": np.ones(2, np.float32)})
    encoding = encode(import_model(model))
    assert "passwd" not in encoding.program
    assert hostile in encoding.leaf_keys.values()
