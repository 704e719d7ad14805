"""Hostile and broken input: every case ends with a clear error naming what is wrong, or runs
right — never a raw traceback, a hang, a crash, or text from a model executed as code.

docs/reliability.md lists every case (with those tested in test_importer, test_saturate,
test_costmodel, test_run, test_cli and test_limits) and what happens. Cases that still fail
because of a bug in a module this file's author does not own are strict xfails: each names the
module, and turns into a failure ("XPASS(strict)") when the bug is fixed, so that the marker is
dropped then.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import eqsat_fuse as ef
from eqsat_fuse.cli import main
from eqsat_fuse.files import write_atomically
from eqsat_fuse.extraction.costmodel import load_cost_model
from eqsat_fuse.frontend.importer import MAX_INPUTS, import_model
from eqsat_fuse.lowering.lower import BACKENDS
from eqsat_fuse.resources import cost_model_file
from eqsat_fuse.saturation.saturate import RuleProgram

from conftest import MODELS_DIR, conv_bn_relu_model, make_model

RESNET = MODELS_DIR / "resnet_tiny_op17.onnx"


def relu_model(shape=(2, 3), **kwargs):
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", list(shape))],
                      [("y", list(shape))], **kwargs)


def run_python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (for cases that could crash the process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=str(Path(__file__).parent))


# ---- files that are not ONNX models -------------------------------------------------------------

def test_a_folder_is_not_a_model(tmp_path):
    with pytest.raises(ef.ModelError, match="is a folder, not an ONNX file"):
        ef.compile(tmp_path)


def test_a_protobuf_that_is_not_a_model_is_refused(tmp_path):
    path = tmp_path / "tensor.onnx"
    path.write_bytes(numpy_helper.from_array(np.arange(10, dtype=np.float32), "w")
                     .SerializeToString())
    with pytest.raises(ef.ModelError, match="not an ONNX model"):
        ef.compile(path)


def test_every_truncation_of_a_model_is_refused(tmp_path):
    data = conv_bn_relu_model(np.random.default_rng(0)).SerializeToString()
    path = tmp_path / "cut.onnx"
    for cut in sorted({1, 2, 7, *range(0, len(data), max(1, len(data) // 25))} - {0}):
        path.write_bytes(data[:cut])
        with pytest.raises(ef.ModelError, match="cut.onnx"):
            ef.compile(path)


def test_corrupted_bytes_give_a_clear_error_or_a_model_that_runs(tmp_path):
    # flip random bytes of a valid model: whatever protobuf still parses must be refused
    # cleanly or compile and run; nothing else may escape
    rng = np.random.default_rng(7)
    data = bytearray(conv_bn_relu_model(rng).SerializeToString())
    path = tmp_path / "mutant.onnx"
    outcomes = {"refused": 0, "ran": 0}
    for _ in range(30):
        mutant = bytearray(data)
        for position in rng.integers(0, len(mutant), size=int(rng.integers(1, 6))):
            mutant[position] = int(rng.integers(0, 256))
        path.write_bytes(bytes(mutant))
        try:
            compiled = ef.compile(path)
        except ef.EqsatFuseError:
            outcomes["refused"] += 1
            continue
        feeds = {name: np.zeros(info.shape, info.dtype) for name, info in compiled.inputs.items()}
        with np.errstate(all="ignore"):
            compiled.run(feeds)
        outcomes["ran"] += 1
    assert sum(outcomes.values()) == 30


@pytest.mark.parametrize("content", [b"", b"\x00\xff garbage", b"\x08\x07\x12"])
def test_cli_on_a_broken_file_prints_one_line(tmp_path, capsys, content):
    path = tmp_path / "broken.onnx"
    path.write_bytes(content)
    assert main(["optimize", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eqsat-fuse: error: ") and str(path) in err
    assert len(err.strip().splitlines()) == 1


# ---- external tensor data -----------------------------------------------------------------------

@pytest.fixture
def external_model(tmp_path):
    """model/model.onnx whose weight w (4096 float32) lives in model/w.bin."""
    folder = tmp_path / "model"
    folder.mkdir()
    w = np.arange(4096, dtype=np.float32)
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [4096])],
                       [("y", [4096])], {"w": w})
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    (tmp_path / "secret.bin").write_bytes(np.full(4096, 7, np.float32).tobytes())
    return path


def set_external(path: Path, **fields):
    model = onnx.load(str(path), load_external_data=False)
    tensor = model.graph.initializer[0]
    entries = {e.key: e for e in tensor.external_data}
    for key, value in fields.items():
        if key not in entries:
            entries[key] = tensor.external_data.add()
            entries[key].key = key
        entries[key].value = value
    onnx.save(model, str(path))


def test_external_data_beside_the_model_loads(external_model):
    compiled = ef.compile(external_model)
    y = compiled.run({"x": np.zeros(4096, np.float32)})["y"]
    np.testing.assert_array_equal(y, np.arange(4096, dtype=np.float32))


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "ABSOLUTE"])
def test_external_data_outside_the_models_folder_is_refused(external_model, location):
    if location == "ABSOLUTE":
        location = str(external_model.parent.parent / "secret.bin")
    set_external(external_model, location=location)
    with pytest.raises(ef.ModelError, match="outside the model's folder; refused"):
        ef.compile(external_model)


def test_external_data_through_a_symlink_out_of_the_folder_is_refused(external_model):
    (external_model.parent / "w.bin").unlink()
    (external_model.parent / "w.bin").symlink_to(external_model.parent.parent / "secret.bin")
    with pytest.raises(ef.ModelError, match="outside the model's folder; refused"):
        ef.compile(external_model)


def test_external_data_location_with_a_nul_byte_is_refused(external_model):
    set_external(external_model, location="w.bin\x00../../secret.bin")
    with pytest.raises(ef.ModelError, match="not a file name; refused"):
        ef.compile(external_model)


@pytest.mark.parametrize("fields, message", [
    ({"offset": str(1 << 40)}, "offset .* exceeds file size"),
    ({"length": str(1 << 40)}, "length .* exceeds available data"),
])
def test_external_data_past_the_end_of_its_file_is_refused(external_model, fields, message):
    set_external(external_model, **fields)
    with pytest.raises(ef.ModelError, match=message):
        ef.compile(external_model)


def test_a_missing_external_data_file_is_named(external_model):
    (external_model.parent / "w.bin").unlink()
    with pytest.raises(ef.ModelError, match="external data file 'w.bin' is missing"):
        ef.compile(external_model)


def test_external_data_of_a_model_given_in_memory_is_never_read(tmp_path, monkeypatch):
    # no folder to resolve it against: it must not be read from the working directory
    (tmp_path / "w.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    monkeypatch.chdir(tmp_path)
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "w.bin"
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [4])], [("y", [4])])
    model.graph.initializer.append(tensor)
    with pytest.raises(ef.ModelError, match="external file.*pass the model's path"):
        ef.compile(model)


# ---- graphs that are not valid ------------------------------------------------------------------

def _custom_domain_model():
    graph = helper.make_graph([helper.make_node("Pwn", ["x"], ["y"], domain="evil.domain")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("evil.domain", 1)])


def _if_model():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    return make_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                      [("x", [2]), ("c", [], TensorProto.BOOL)], [("y", [2])])


def _no_default_opset():
    model = relu_model()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    return model


INVALID_GRAPHS = {
    "opset too old": (lambda: relu_model(opset=3), "opset 3 is not supported"),
    "no default-domain opset": (_no_default_opset, "imports no version of the default ONNX"),
    "value written twice": (lambda: make_model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
        [("x", [2])], [("y", [2])]), "single static assignment"),
    "node overwrites a graph input": (lambda: make_model(
        [helper.make_node("Relu", ["x"], ["x"])], [("x", [2])], [("x", [2])]),
        "writes 'x', which is already a graph input"),
    "node overwrites an initializer": (lambda: make_model(
        [helper.make_node("Relu", ["x"], ["w"]), helper.make_node("Add", ["x", "w"], ["y"])],
        [("x", [2])], [("y", [2])], {"w": np.ones(2, np.float32)}),
        "writes 'w', which is already a graph input or an initializer"),
    "graph output computed by no node": (lambda: make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2]), ("z", [2])]),
        "graph output 'z' is computed by no node"),
    "unknown operator": (lambda: make_model([helper.make_node("FooBar", ["x"], ["y"])],
                                            [("x", [2])], [("y", [2])]),
                         "No Op registered for FooBar"),
    "operator of another domain": (_custom_domain_model,
                                   r"\(Pwn\) is an operator of domain 'evil.domain'"),
    "control flow": (_if_model, r"node 'If' \(If\) holds a subgraph"),
    "duplicate input names": (lambda: make_model([helper.make_node("Relu", ["x"], ["y"])],
                                                 [("x", [2]), ("x", [2])], [("y", [2])]),
                              "single static assignment"),
    "too many inputs for one node": (lambda: make_model(
        [helper.make_node("Mean", [f"x{i}" for i in range(MAX_INPUTS + 1)], ["y"])],
        [(f"x{i}", [1]) for i in range(MAX_INPUTS + 1)], [("y", [1])]),
        f"reads {MAX_INPUTS + 1} tensors; eqsat-fuse takes at most {MAX_INPUTS}"),
}


def _short_raw_data_model():
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [1000])],
                       [("y", [1000])])
    model.graph.initializer.append(TensorProto(name="w", data_type=TensorProto.FLOAT,
                                               dims=[1000], raw_data=b"\0" * 8))
    return model


INVALID_GRAPHS["raw data shorter than its dims"] = (_short_raw_data_model,
                                                    "raw_data size .* too small")


@pytest.mark.parametrize("case", sorted(INVALID_GRAPHS))
def test_invalid_graph_is_refused_with_a_clear_error(case):
    build, message = INVALID_GRAPHS[case]
    with pytest.raises(ef.ModelError, match=message):
        ef.compile(build())


def test_a_graph_output_that_is_a_graph_input_is_a_copy():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])],
                       [("y", [2, 3]), ("x", [2, 3])])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    out = ef.compile(model).run({"x": x})
    np.testing.assert_array_equal(out["x"], x)
    out["x"][...] = 42
    assert not np.shares_memory(out["x"], x) and x[0, 0] == -1


@pytest.mark.parametrize("op, n", [("Concat", 9000), ("Max", 3000), ("Sum", 1500)])
def test_a_node_with_thousands_of_inputs_compiles(op, n):
    # egglog overflows its stack (a segfault) on a term nested ~8000 deep: a node's input list
    # is split into a tree before it reaches the e-graph
    names = [f"x{i}" for i in range(n)]
    node = helper.make_node(op, names, ["y"], **({"axis": 0} if op == "Concat" else {}))
    model = make_model([node], [(name, [1]) for name in names], [("y", [n if op == "Concat"
                                                                        else 1])])
    compiled = ef.compile(model)
    feeds = {name: np.full(1, i, np.float32) for i, name in enumerate(names)}
    y = compiled.run(feeds)["y"]
    expected = {"Concat": np.arange(n, dtype=np.float32), "Max": [n - 1],
                "Sum": [n * (n - 1) / 2]}[op]
    np.testing.assert_array_equal(y, expected)


# ---- shapes: missing, dynamic, contradictory, negative, huge ------------------------------------

def _unshaped(which: str):
    shapes = {"input": (None, [2]), "output": ([2], None)}[which]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shapes[0])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shapes[1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_input_without_a_shape_is_named_and_compiles_with_one():
    with pytest.raises(ef.ModelError, match=r"input 'x' has no declared shape.*input_shapes"):
        ef.compile(_unshaped("input"))
    compiled = ef.compile(_unshaped("input"), input_shapes={"x": (2,)})
    np.testing.assert_array_equal(compiled.run({"x": np.array([-1, 1], np.float32)})["y"], [0, 1])


def test_an_output_without_a_shape_is_named():
    with pytest.raises(ef.ModelError, match="graph output 'y' declares no shape"):
        ef.compile(_unshaped("output"))


@pytest.mark.parametrize("build, shapes, message", [
    (lambda: relu_model((-3, 2)), None, r"shape \[-3, 2\], with a negative dim"),
    (lambda: relu_model(("n", 2)), {"x": (-1, 2)}, r"input_shapes\['x'\] = \[-1, 2\] has a "
                                                   r"negative dim"),
    (lambda: make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", ["n", 3])],
                        [("y", ["n", 4])], {"w": np.ones((3, 4), np.float32)}),
     {"x": (2, 5)}, "Incompatible dimensions for matrix multiplication"),
    (lambda: make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])],
                        [("y", [5])]), None, "shape inference failed"),
])
def test_contradictory_shapes_are_refused(build, shapes, message):
    with pytest.raises(ef.ModelError, match=message):
        ef.compile(build(), input_shapes=shapes)


def test_zero_size_dims_compile_and_run():
    compiled = ef.compile(relu_model((0, 3)))
    assert compiled.run({"x": np.zeros((0, 3), np.float32)})["y"].shape == (0, 3)


def test_rank_0_values_keep_rank_0():
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["x", "c"],
                                                                         ["y"])]
    model = make_model(nodes, [("x", [])], [("y", []), ("c", [])],
                       {"a": np.float32(1.5), "b": np.float32(2.0)})
    out = ef.compile(model).run({"x": np.float32(2.0)})
    assert out["c"].shape == () and out["y"].shape == ()


def _folded(op, inputs, initializers, **attrs):
    """x + ReduceSum(op(constants)): op's output is computed at import (constant folding)."""
    nodes = [helper.make_node(op, inputs, ["big"], **attrs),
             helper.make_node("ReduceSum", ["big"], ["r"], keepdims=0),
             helper.make_node("Add", ["x", "r"], ["y"])]
    dtype = TensorProto.INT64 if op == "Range" else TensorProto.FLOAT
    return make_model(nodes, [("x", [], dtype)], [("y", [], dtype)], initializers)


@pytest.mark.parametrize("model", [
    pytest.param(lambda: _folded("ConstantOfShape", ["s"], {"s": np.array([1 << 17, 1 << 17])},
                                 value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
                 id="ConstantOfShape-64GiB"),
    pytest.param(lambda: _folded("ConstantOfShape", ["s"], {"s": np.array([1 << 15, 40000])},
                                 value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
                 id="ConstantOfShape-5GiB"),
    pytest.param(lambda: _folded("Range", ["a", "b", "d"], {"a": np.array(0),
                                                            "b": np.array(1 << 40),
                                                            "d": np.array(1)}),
                 id="Range-8TiB"),
    pytest.param(lambda: _folded("Expand", ["c", "s"], {"c": np.ones(1, np.float32),
                                                        "s": np.array([1 << 16, 1 << 16])}),
                 id="Expand-16GiB"),
    pytest.param(lambda: _folded("Tile", ["c", "s"], {"c": np.ones((1, 1), np.float32),
                                                      "s": np.array([1 << 16, 1 << 16])}),
                 id="Tile-16GiB"),
])
def test_a_huge_constant_is_refused_before_it_is_computed(model):
    with pytest.raises(ef.ModelError, match="refused before allocating"):
        ef.compile(model())


def test_a_huge_initializer_is_refused_before_allocating():
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [1])], [("y", ["n"])])
    model.graph.initializer.append(TensorProto(name="w", data_type=TensorProto.FLOAT,
                                               dims=[1 << 20, 1 << 20], raw_data=b""))
    with pytest.raises(ef.ModelError):
        ef.compile(model)


# ---- attribute values ---------------------------------------------------------------------------

@pytest.mark.parametrize("node, shapes, message", [
    (helper.make_node("Pad", ["x", "p"], ["y"], mode='evil")(run-schedule'), ([2, 3], [4, 5]),
     r"mode 'evil\"\)\(run-schedule' is not one of constant, reflect, edge, wrap"),
    (helper.make_node("Gelu", ["x"], ["y"], approximate='tanh") (panic "x'), ([2, 3], [2, 3]),
     "approximate .* is not one of none, tanh"),
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[0, 0], ceil_mode=1),
     ([1, 1, 6, 6], ["a", "b", "c", "d"]), "strides must only contain positive values"),
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[0, 0]),
     ([1, 1, 6, 6], ["a", "b", "c", "d"]), "kernel_shape must only contain positive values"),
    (helper.make_node("Softmax", ["x"], ["y"], axis=10), ([2, 3], [2, 3]), "'axis' must be in"),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0]), ([2, 3], [2, 3]),
     "repeated value"),
    (helper.make_node("Cast", ["x"], ["y"], to=999), ([2, 3], [2, 3]),
     "does not specify a valid type"),
])
def test_bad_attribute_values_are_refused(node, shapes, message):
    inits = {"p": np.array([1, 1, 1, 1])} if node.op_type == "Pad" else {}
    model = make_model([node], [("x", shapes[0])], [("y", shapes[1])], inits, opset=20)
    with pytest.raises(ef.ModelError, match=message):
        ef.compile(model)


# ---- names are data, never code -----------------------------------------------------------------

CODE_NAMES = [
    "__import__('os').system('touch {marker}')",
    'quote"inside',
    "new\nline",
    "(run-schedule (saturate fuse))",
    '"); (output "{marker}" (Relu (Input "x"))) ("',
    "exec(open('{marker}','w').write('x'))",
    "x" * 5000,
    "\u202eright-to-left \U0001F600",
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_and_node_names_holding_code_are_never_executed(tmp_path, backend):
    marker = tmp_path / "pwned"
    names = [n.format(marker=marker) for n in CODE_NAMES]
    x_name, w_name, y_name = names[0], names[1], names[4]
    nodes, last = [], x_name
    for i, (op, name) in enumerate(zip(["Add", "Relu", "Mul", "Softsign", "Sigmoid"], names[2:])):
        inputs = [last, w_name] if op in ("Add", "Mul") else [last]
        out = y_name if i == 4 else name + f"#{i}"
        nodes.append(helper.make_node(op, inputs, [out], name=names[(i + 3) % len(names)]))
        last = out
    w = np.linspace(0.5, 1.5, 6, dtype=np.float32).reshape(2, 3)
    model = make_model(nodes, [(x_name, [2, 3])], [(y_name, [2, 3])], {w_name: w})
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    compiled = ef.compile(model, backend=backend)
    y = compiled.run({x_name: x})[y_name]
    r = np.maximum(x + w, 0) * w
    s = r / (1 + np.abs(r))
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-s)), rtol=1e-5)
    assert compiled.verify({x_name: x}).ok
    assert not marker.exists()
    assert not any(tmp_path.iterdir())


def test_names_that_look_like_generated_names_do_not_collide():
    # decode names buffers t<class> and constants c<class>, encode keys odd names #<n>,
    # the importer names Sum's partial sums <out>::sum<i>
    names = ["t1", "c0", "#0", "#1", "$v3", "y::sum1", "k0"]
    nodes = [helper.make_node("Sum", names[:4], ["y"]),
             helper.make_node("Relu", ["y"], ["y::sum1"]),
             helper.make_node("Neg", ["y::sum1"], ["k0"])]
    model = make_model(nodes, [(n, [3]) for n in names[:4]], [("k0", [3]), ("y::sum1", [3])])
    feeds = {n: np.full(3, i - 2, np.float32) for i, n in enumerate(names[:4])}
    out = ef.compile(model).run(feeds)
    np.testing.assert_array_equal(out["y::sum1"], np.maximum(sum(feeds.values()), 0))
    np.testing.assert_array_equal(out["k0"], -out["y::sum1"])


# ---- rule files (test_saturate covers include/input/output/run-schedule and parse errors) -------

@pytest.mark.parametrize("text", [
    "(push)\n", "(pop)\n", '(extract (Relu (Input "x")))\n', '(check (Relu (Input "x")))\n',
    "(print-function Relu 10)\n", "(print-size)\n", "(set-option node_limit 10)\n",
    "(datatype Evil (Boom))\n", "(sort MyVec (Vec i64))\n",
    "(function evil (T) i64 :merge old)\n", "(constructor Evil (T) T)\n",
    '(let $z (Relu (Input "x")))\n', '(union (Relu (Input "x")) (Input "x"))\n',
    '(fail (check (Relu (Input "x"))))\n', "(run 1000)\n",
])
def test_every_command_outside_rules_is_refused_before_the_file_runs(tmp_path, text):
    path = tmp_path / "evil.egg"
    path.write_text('(ruleset mine)\n' + text)
    with pytest.raises(ef.RuleFileError, match="not allowed in a rule file") as info:
        RuleProgram([path])
    assert str(info.value).startswith(str(path))


def test_a_rule_file_that_is_not_text_or_not_a_file(tmp_path):
    binary = tmp_path / "binary.egg"
    binary.write_bytes(b"\xff\xfe\x00(rule")
    with pytest.raises(ef.RuleFileError, match="not a text file"):
        RuleProgram([binary])
    with pytest.raises(ef.RuleFileError, match="cannot read the rule file"):
        RuleProgram([tmp_path])


def test_a_rule_that_panics_is_named(tmp_path):
    path = tmp_path / "panic.egg"
    path.write_text('(rule ((= e (Relu x))) ((panic "boom")) :ruleset fuse :name "user-panic")\n')
    with pytest.raises(ef.RuleFileError, match="user-panic"):
        ef.compile(relu_model(), rules=[path])


def test_a_rule_naming_an_input_the_model_does_not_have(tmp_path):
    path = tmp_path / "ghost.egg"
    path.write_text('(rule ((= e (Relu x))) ((union e (Input "ghost"))) :ruleset fuse '
                    ':name "user-ghost")\n')
    with pytest.raises(ef.EqsatFuseError):
        ef.compile(relu_model(), rules=[path])


def test_a_rule_nested_absurdly_deep_is_refused_without_a_crash(tmp_path):
    path = tmp_path / "deep.egg"
    path.write_text('(rewrite ' + '(Relu ' * 20000 + 'x' + ')' * 20000 +
                    ' x :ruleset fuse :name "deep")\n')
    proc = run_python(f"""
        import eqsat_fuse as ef
        from eqsat_fuse.saturation.saturate import RuleProgram
        try:
            RuleProgram([{str(path)!r}])
        except ef.RuleFileError as exc:
            print("CLEAN", exc)
    """)
    assert proc.returncode == 0 and "CLEAN" in proc.stdout, proc.stderr[-500:]


def test_an_explosive_rule_set_stops_at_the_node_budget_with_a_correct_program(tmp_path):
    # commutativity and associativity of Add on a long sum chain; test_limits runs the same
    # rule set without soft budgets, under hard limits
    path = tmp_path / "explosive.egg"
    path.write_text('(rewrite (Add a b) (Add b a) :ruleset fuse :name "user-add-comm")\n'
                    '(rewrite (Add (Add a b) c) (Add a (Add b c)) :ruleset fuse '
                    ':name "user-add-assoc")\n')
    nodes, last = [], "x0"
    for i in range(1, 12):
        nodes.append(helper.make_node("Add", [last, f"x{i}"], [f"s{i}"]))
        last = f"s{i}"
    model = make_model(nodes, [(f"x{i}", [4]) for i in range(12)], [(last, [4])])
    compiled = ef.compile(model, rules=[path], budgets=ef.Budgets(nodes=3000))
    assert compiled.report.stop_reason == "node budget"
    assert compiled.verify().ok


# ---- cost-model files (test_costmodel covers missing, unknown and negative keys) -----------------

def _cost_file(tmp_path, key, value):
    """The shipped cpu.toml with `key = value` (the first line setting that key)."""
    import re

    text = cost_model_file("cpu").read_text()
    text, count = re.subn(rf"^{key}\s*=.*$", f"{key} = {value}", text, count=1, flags=re.M)
    assert count == 1, key
    path = tmp_path / "edited.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key, value, message", [
    ("launch_us", "nan", "must be a finite number"),
    ("bandwidth_gbs", "inf", "must be a finite number"),
    ("launch_us", "true", "must be a number, not True"),
    ("launch_us", "[1, 2]", "must be a number"),
    ("matmul_gflops", "-0.0", "greater than zero"),
])
def test_cost_values_that_are_not_usable_numbers_are_refused(tmp_path, key, value, message):
    path = _cost_file(tmp_path, key, value)
    with pytest.raises(ef.CostModelError, match=message):
        ef.compile(relu_model(), target=str(path))


def test_an_empty_cost_file_is_refused(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text("")
    with pytest.raises(ef.CostModelError, match="missing table"):
        load_cost_model(path)


def test_a_binary_cost_file_is_refused(tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\x00\xff\xfe garbage")
    with pytest.raises(ef.CostModelError):
        load_cost_model(path)


# ---- feeds at run time (test_run covers a wrong name, a missing input, dtype and shape) --------

@pytest.fixture(scope="module")
def compiled_relu():
    return ef.compile(relu_model())


@pytest.mark.parametrize("feeds, message", [
    ([np.zeros((2, 3), np.float32)], "feeds must be a dict"),
    ({"x": None}, "dtype object"),
    ({"x": [[1.0, 2.0], [3.0]]}, "input 'x' is not an array"),
    ({"x": np.array([["a", "b", "c"]] * 2)}, "dtype <U1"),
    ({"x": object()}, "dtype object"),
    ({0: np.zeros((2, 3), np.float32)}, "unknown input 0"),
])
def test_feeds_that_are_not_arrays_are_refused(compiled_relu, feeds, message):
    with pytest.raises(ef.FeedError, match=message):
        compiled_relu.run(feeds)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unusual_arrays_are_read_right_and_never_written(backend, rng):
    compiled = ef.compile(conv_bn_relu_model(rng), backend=backend)
    base = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    expected = compiled.run({"x": base.copy()})["y"]
    variants = {
        "read-only": np.broadcast_to(base, base.shape),
        "fortran": np.asfortranarray(base),
        "strided": np.ascontiguousarray(np.repeat(base, 2, axis=3))[..., ::2],
        "reversed": np.ascontiguousarray(base[..., ::-1])[..., ::-1],
    }
    for name, x in variants.items():
        before = x.copy()
        np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-6,
                                   err_msg=name)
        np.testing.assert_array_equal(x, before, err_msg=f"{name}: the input was written")


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_of_one_run_survive_the_next(backend, rng):
    compiled = ef.compile(conv_bn_relu_model(rng), backend=backend)
    x1 = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    first = compiled.run({"x": x1})["y"]
    kept = first.copy()
    compiled.run({"x": -x1})
    np.testing.assert_array_equal(first, kept)


def test_nan_and_inf_inputs_propagate(compiled_relu):
    x = np.array([[np.nan, np.inf, -np.inf], [0, -0.0, 1]], np.float32)
    y = compiled_relu.run({"x": x})["y"]
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and y[0, 2] == 0


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_an_index_out_of_range_at_run_time_is_a_clear_error(backend):
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"]),
                        helper.make_node("Relu", ["y"], ["z"])],
                       [("x", [2, 3]), ("i", [1], TensorProto.INT64)], [("z", [1, 3])])
    compiled = ef.compile(model, backend=backend)
    with pytest.raises(ef.RunError, match="Gather: index out of range"):
        compiled.run({"x": np.ones((2, 3), np.float32), "i": np.array([5])})
    # a valid index still runs, negative ones counting from the end
    out = compiled.run({"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2,
                        "i": np.array([-1])})
    np.testing.assert_array_equal(out["z"], [[1, 2, 3]])


@pytest.mark.parametrize("make_feeds, message", [
    (lambda p: np.savez(p, pixel_values=np.array([object()], dtype=object)), "not a NumPy .npz"),
    (lambda p: Path(p).write_bytes(b"not a zip"), "not a NumPy .npz"),
])
def test_cli_feeds_are_never_unpickled(tmp_path, capsys, make_feeds, message):
    feeds = tmp_path / "feeds.npz"
    make_feeds(feeds)
    assert main(["run", str(RESNET), "--inputs", str(feeds), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# ---- no data loss (test_cli covers --force and refusing to overwrite the inputs) ---------------

def test_a_failed_write_leaves_the_old_file_and_no_partial_file(tmp_path):
    out = tmp_path / "out.npz"
    out.write_bytes(b"old contents")

    def fail_halfway(handle):
        handle.write(b"new and partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(ef.EqsatFuseError, match="could not write the file: No space left"):
        write_atomically(out, fail_halfway, force=True)
    assert out.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]

    def interrupted(handle):
        handle.write(b"new and partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(out, interrupted, force=True)
    assert out.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]


def test_a_written_file_is_complete_and_readable_by_others(tmp_path):
    out = tmp_path / "out.bin"
    write_atomically(out, lambda handle: handle.write(b"x" * 100_000), force=False)
    assert out.read_bytes() == b"x" * 100_000
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("target, message", [
    ("FOLDER", "is a folder"),
    ("/proc/eqsat-fuse-out.npz", "cannot write there"),
    ("no/such/folder/out.npz", "no such folder"),
    ("LINK", "refusing to overwrite the input model"),
])
def test_run_output_that_cannot_be_written_is_a_clear_error(tmp_path, capsys, target, message):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, pixel_values=np.zeros((1, 3, 64, 64), np.float32))
    model = tmp_path / "model.onnx"
    model.write_bytes(RESNET.read_bytes())
    if target == "FOLDER":
        target = str(tmp_path / "folder")
        Path(target).mkdir()
    elif target == "LINK":
        target = str(tmp_path / "link.onnx")
        Path(target).symlink_to(model)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    assert main(["run", str(model), "--inputs", str(feeds), "-o", target, "--force",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before


def test_optimize_output_model_is_never_the_input_and_never_replaced_silently(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    model.write_bytes(RESNET.read_bytes())
    link = tmp_path / "link.onnx"
    link.symlink_to(model)
    out = tmp_path / "fused.onnx"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    for target in (model, link):
        assert main(["optimize", str(model), "-o", str(target), "--force", "--quiet"]) == 2
        assert "refusing to overwrite the input model" in capsys.readouterr().err
    assert main(["optimize", str(model), "-o", str(out), "--quiet"]) == 0
    onnx.checker.check_model(onnx.load(str(out)))
    written = out.read_bytes()
    assert main(["optimize", str(model), "-o", str(out), "--quiet"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == written
    assert main(["optimize", str(model), "-o", str(out), "--force", "--quiet"]) == 0
    assert hashlib.sha256(model.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx", "link.onnx", "model.onnx"]


def test_no_command_changes_the_model_file(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    model.write_bytes(RESNET.read_bytes())
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, pixel_values=np.zeros((1, 3, 64, 64), np.float32))
    before = (hashlib.sha256(model.read_bytes()).hexdigest(), model.stat().st_mtime_ns)
    for argv in (["optimize", str(model)], ["verify", str(model)],
                 ["run", str(model), "--inputs", str(feeds), "-o", str(tmp_path / "o.npz")]):
        assert main([*argv, "--quiet"]) == 0
    capsys.readouterr()
    assert (hashlib.sha256(model.read_bytes()).hexdigest(), model.stat().st_mtime_ns) == before


# ---- the catalogue ------------------------------------------------------------------------------

def test_docs_reliability_lists_every_case_tested_here():
    """docs/reliability.md names every test of this file and of test_limits.py."""
    import ast

    text = (Path(__file__).parent.parent / "docs" / "reliability.md").read_text()
    for module in ("test_hostile", "test_limits"):
        tree = ast.parse((Path(__file__).parent / f"{module}.py").read_text())
        tests = [node.name for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
                 and node.name != "test_docs_reliability_lists_every_case_tested_here"]
        missing = [t for t in tests if f"{module}::{t}" not in text]
        assert not missing, f"docs/reliability.md does not list {module}: {missing}"
