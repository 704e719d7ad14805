"""ONNX export: `compiled.to_onnx(path)` and `eqsat-fuse optimize MODEL -o OUT.onnx`.

Every real model and the demo model export to a file that passes the ONNX checker (full check),
runs in onnxruntime and computes what the original model computes (verify's tolerances); fused
kernels are local functions of domain `eqsat_fuse`; writing never loses a file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper, numpy_helper, shape_inference

import eqsat_fuse as ef
from eqsat_fuse.frontend.symbolic import has_open_dims
from eqsat_fuse.tools import export
from eqsat_fuse.cli import main
from eqsat_fuse.demo import demo_model
from eqsat_fuse.ops import OPS
from eqsat_fuse.testing import onnx_graphs
from eqsat_fuse.checking.verify import compare, oracle_outputs, random_feeds

from conftest import MODELS_DIR

ort.set_default_logger_severity(3)

# the models with open dims (test_symbolic) compile shape-generic programs, which to_onnx
# refuses for now
MODELS = sorted(p.name for p in MODELS_DIR.glob("*.onnx")
                if not has_open_dims(onnx.load(str(p), load_external_data=False))) + ["demo"]
RESNET = MODELS_DIR / "resnet_tiny_op17.onnx"


def source_of(name: str) -> onnx.ModelProto:
    return demo_model() if name == "demo" else onnx.load(str(MODELS_DIR / name))


@cache
def compiled_model(name: str, numerics: str = "exact"):
    return ef.compile(demo_model() if name == "demo" else MODELS_DIR / name, numerics=numerics)


def run_ort(model: onnx.ModelProto | Path, feeds: dict) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def all_nodes(model: onnx.ModelProto):
    yield from model.graph.node
    for function in model.functions:
        yield from function.node


def check_export(model: onnx.ModelProto, source: onnx.ModelProto, compiled) -> float:
    """Checker, onnxruntime and the original's outputs; returns the largest difference."""
    onnx.checker.check_model(model, full_check=True)
    feeds = random_feeds(compiled.plan.inputs, seed=1)
    expected, oracle = oracle_outputs(source, feeds)
    result = compare(run_ort(model, feeds), expected, oracle)
    assert result.ok, result.summary()
    return max((o.max_abs_diff for o in result.outputs), default=0.0)


# ---- every model ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_every_model_exports_checks_runs_and_matches(name, tmp_path):
    compiled = compiled_model(name)
    source = source_of(name)
    path = tmp_path / "out.onnx"
    returned = compiled.to_onnx(path)
    model = onnx.load(str(path))
    assert model == returned
    check_export(model, source, compiled)

    # the original interface: input and output names, dtypes, in order
    initializers = {t.name for t in source.graph.initializer}
    src_inputs = [vi for vi in source.graph.input if vi.name not in initializers]
    assert [vi.name for vi in model.graph.input] == [vi.name for vi in src_inputs]
    assert [vi.name for vi in model.graph.output] == [vi.name for vi in source.graph.output]
    for got, want in zip([*model.graph.input, *model.graph.output],
                         [*src_inputs, *source.graph.output]):
        assert got.type.tensor_type.elem_type == want.type.tensor_type.elem_type
    for vi in model.graph.input:
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        assert shape == compiled.plan.inputs[vi.name].shape

    # one node per kernel; each fused kernel a call of a local function of domain eqsat_fuse
    plan = compiled.plan
    fused = [k for k in plan.kernels if len(k.body) > 1]
    calls = [n for n in model.graph.node if n.domain == export.EXPORT_DOMAIN]
    assert len(calls) == len(fused)
    assert [n.output[0] for n in calls] == [k.output for k in fused]
    functions = {f.name: f for f in model.functions}
    assert {n.op_type for n in calls} == set(functions)
    assert all(f.domain == export.EXPORT_DOMAIN for f in functions.values())
    assert all(n.domain in ("", "ai.onnx") for f in functions.values() for n in f.node)
    for call in calls:        # a function's ops are its kernel's ops (plus Constant literals)
        kernel = next(k for k in fused if k.output == call.output[0])
        ops = [n.op_type for n in functions[call.op_type].node if n.op_type != "Constant"]
        assert ops == [o for op in kernel.ops for o in export.SPELLED_OUT.get(op, [op])]
    # every intermediate buffer has a value_info with its shape
    declared = {vi.name: vi for vi in model.graph.value_info}
    for kernel in plan.kernels:
        if kernel.output not in plan.outputs:
            dims = declared[kernel.output].type.tensor_type.shape.dim
            assert tuple(d.dim_value for d in dims) == kernel.info.shape


def test_resnet_export_has_folded_batchnorm_and_fused_conv_functions():
    compiled = compiled_model("resnet_tiny_op17.onnx", numerics="fast")     # folds the BNs
    model = compiled.to_onnx()
    ops = [n.op_type for n in all_nodes(model)]
    assert "BatchNormalization" not in ops
    functions = {f.name: [n.op_type for n in f.node] for f in model.functions}
    run = [op for n in model.graph.node for op in functions.get(n.op_type, [n.op_type])]
    assert run.count("Conv") == 12 and "BatchNormalization" not in run
    names = {f.name for f in model.functions}
    assert any(name.startswith("Conv_Relu") for name in names)
    assert any(name.startswith("Conv_Add_Relu") for name in names)
    # the folded weights are what lowering computed, held as initializers
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, value in compiled.program.constants.items():
        if name in initializers:
            np.testing.assert_array_equal(initializers[name].reshape(value.shape), value)
    assert len(model.graph.node) == len(compiled.plan.kernels) < \
        len(source_of(RESNET.name).graph.node)


def test_kernels_with_the_same_body_share_one_function():
    model = compiled_model("bert_tiny_op17.onnx", numerics="fast").to_onnx()    # Gelu found
    calls = [n.op_type for n in model.graph.node if n.domain == export.EXPORT_DOMAIN]
    assert calls.count("MatMul_Add") == 6 and calls.count("MatMul_Add_Gelu") == 2
    assert len(model.functions) == len(set(calls)) < len(calls)
    # a function is readable: inputs named after the slot that reads them, one output
    gelu = next(f for f in model.functions if f.name == "MatMul_Add_Gelu")
    assert list(gelu.input) == ["MatMul_a", "MatMul_b", "Add_b"] and list(gelu.output) == ["out"]
    assert [n.op_type for n in gelu.node] == ["MatMul", "Add", "Gelu"]


def test_gelu_below_opset_20_is_written_out_with_erf():
    compiled = compiled_model("bert_tiny_op17.onnx")
    model = compiled.to_onnx(opset=18)
    ops = [n.op_type for n in all_nodes(model)]
    assert "Gelu" not in ops and "Erf" in ops
    assert model.opset_import[0].version == 18
    check_export(model, source_of("bert_tiny_op17.onnx"), compiled)


# ---- the forms the real models do not have -------------------------------------------------------

def zoo_model() -> onnx.ModelProto:
    """Ops and forms the real models lack: ConvTranspose whose output_shape asks for negative
    pads, Pad with a value, a Split with an unused output, an uncovered op with two outputs
    (TopK), Slice with steps, ReduceSum, a float16 round trip, an output made of constants."""
    rng = np.random.default_rng(0)
    inits = {
        "ct.w": rng.standard_normal((4, 2, 3, 3)), "ct.b": rng.standard_normal(2),
        "pads": np.array([0, 0, 1, 2, 0, 0, 2, 1]), "pad.value": np.array(0.5),
        "split": np.array([2, 1, 3]), "k": np.array([2]), "axes": np.array([2]),
        "starts": np.array([1, 0]), "ends": np.array([5, 6]), "sl.axes": np.array([2, 3]),
        "steps": np.array([2, 1]), "lo": np.array(-0.5), "hi": np.array(0.5),
        "c1": rng.standard_normal(1), "c2": rng.standard_normal(1),
    }
    inits = {k: v.astype(np.int64 if v.dtype.kind == "i" else np.float32)
             for k, v in inits.items()}
    n = helper.make_node
    nodes = [
        n("ConvTranspose", ["x", "ct.w", "ct.b"], ["ct"], strides=[2, 2], output_shape=[14, 14]),
        n("LeakyRelu", ["ct"], ["ct.act"], alpha=0.2),
        n("Pad", ["x", "pads", "pad.value"], ["padded"], mode="constant"),
        n("HardSigmoid", ["padded"], ["hs"], alpha=0.3, beta=0.4),
        n("Split", ["x", "split"], ["s0", "s1", "s2"], axis=3),
        n("Concat", ["s2", "s0"], ["cat"], axis=3),
        n("Clip", ["cat", "lo", "hi"], ["clipped"]),
        n("TopK", ["x", "k"], ["top.v", "top.i"], axis=3),
        n("Cast", ["top.i"], ["top.if"], to=TensorProto.FLOAT),
        n("Add", ["top.v", "top.if"], ["top"]),
        n("Slice", ["x", "starts", "ends", "sl.axes", "steps"], ["sliced"]),
        n("ReduceSum", ["sliced", "axes"], ["rsum"], keepdims=0),
        n("Cast", ["rsum"], ["half"], to=TensorProto.FLOAT16),
        n("Cast", ["half"], ["back"], to=TensorProto.FLOAT),
        n("Exp", ["back"], ["e"]),
        n("Add", ["c1", "c2"], ["const_out"]),
    ]
    outputs = ["ct.act", "hs", "clipped", "top", "e", "const_out"]
    graph = helper.make_graph(
        nodes, "zoo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return shape_inference.infer_shapes(model, strict_mode=True)    # declares the outputs' shapes


def test_forms_outside_the_real_models_export_exactly():
    source = zoo_model()
    compiled = ef.compile(source)
    model = compiled.to_onnx()
    assert check_export(model, source, compiled) < 1e-5
    graph_ops = [n.op_type for n in model.graph.node]
    assert graph_ops.count("Split") == 1 and graph_ops.count("TopK") == 1   # one node each
    split = next(n for n in model.graph.node if n.op_type == "Split")
    assert len(split.output) == 3 and {"s0", "s2"} <= set(split.output)
    topk = next(n for n in model.graph.node if n.op_type == "TopK")
    assert list(topk.output) == ["top.v", "top.i"]
    pad_value = next(t for t in model.graph.initializer if t.name.endswith("value"))
    assert list(pad_value.dims) == []                  # Pad's constant_value stays a scalar
    # ONNX forbids negative pads: the export never writes one
    for node in all_nodes(model):
        for attr in node.attribute:
            if attr.name == "pads":
                assert min(attr.ints) >= 0, node


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(onnx_graphs(max_nodes=14, opset=(13, 17, 21)))
def test_random_models_export_and_match(case):
    compiled = ef.compile(case.model)
    model = compiled.to_onnx()
    onnx.checker.check_model(model, full_check=True)
    expected, oracle = oracle_outputs(case.model, case.feeds)
    result = compare(run_ort(model, case.feeds), expected, oracle)
    assert result.ok, f"{result.summary()}\n{case.text()}"


def test_every_term_language_op_has_an_export():
    # the ops ONNX writes one to one are exported from the operator table; the rest by name
    plain = {name for name, spec in OPS.items() if spec.onnx_plain}
    handled = plain | {
        "LeakyRelu", "HardSigmoid", "Gelu", "Cast", "BatchNormalization", "Conv",
        "ConvTranspose", "Gemm", "Softmax", "LayerNormalization", "ReduceMean", "ReduceSum",
        "MaxPool", "AveragePool", "LRN", "Concat", "Gather", "Pad", "Transpose", "Reshape",
        "Expand", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Opaque", "Scalar", "Ints",
        "QuantizeLinear", "DequantizeLinear", "ConvInteger", "ReduceMax", "ReduceMin",
        "FusedAttention"}
    source = Path(export.__file__).read_text()
    computing = {name for name, spec in OPS.items()
                 if spec.kind not in ("structure",) and name not in ("Input", "Const", "Absent")}
    assert computing <= handled
    for op in handled - plain:
        assert f'"{op}"' in source


# ---- writing the file ----------------------------------------------------------------------------

def test_to_onnx_never_replaces_a_file_without_force_nor_the_source_model(tmp_path):
    model_path = tmp_path / "model.onnx"
    model_path.write_bytes(RESNET.read_bytes())
    compiled = ef.compile(model_path)
    out = tmp_path / "fused.onnx"
    out.write_bytes(b"keep me")
    with pytest.raises(ef.EqsatFuseError, match="already exists; pass force=True"):
        compiled.to_onnx(out)
    assert out.read_bytes() == b"keep me"
    compiled.to_onnx(out, force=True)
    assert onnx.load(str(out)).graph.node
    before = model_path.read_bytes()
    with pytest.raises(ef.EqsatFuseError, match="refusing to overwrite the input model"):
        compiled.to_onnx(model_path, force=True)
    assert model_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx", "model.onnx"]


def test_a_model_over_the_protobuf_limit_keeps_its_tensors_in_a_data_file(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "EXTERNAL_DATA_BYTES", 100_000)    # 2 GiB, scaled down
    compiled = compiled_model("resnet_tiny_op17.onnx")
    out = tmp_path / "fused.onnx"
    compiled.to_onnx(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx", "fused.onnx.data"]
    model = onnx.load(str(out), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    assert out.stat().st_size < 100_000
    feeds = random_feeds(compiled.plan.inputs)
    expected, oracle = oracle_outputs(source_of(RESNET.name), feeds)
    assert compare(run_ort(out, feeds), expected, oracle).ok
    onnx.checker.check_model(str(out), full_check=True)


def test_cli_optimize_writes_the_model_and_never_loses_a_file(tmp_path, capsys):
    model_path = tmp_path / "model.onnx"
    model_path.write_bytes(RESNET.read_bytes())
    out = tmp_path / "fused.onnx"
    assert main(["optimize", str(model_path), "-o", str(out), "--quiet"]) == 0
    assert f"wrote the optimized model to {out}" in capsys.readouterr().out
    written = out.read_bytes()
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert any(f.domain == export.EXPORT_DOMAIN for f in model.functions)

    # an existing file: refused without --force, before compiling; replaced with it
    out.write_bytes(b"keep me")
    assert main(["optimize", str(model_path), "-o", str(out), "--quiet"]) == 2
    assert "already exists; pass --force to replace it" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert main(["optimize", str(model_path), "-o", str(out), "--force", "--quiet"]) == 0
    assert out.read_bytes() == written

    # the input model: never, even with --force
    before = model_path.read_bytes()
    assert main(["optimize", str(model_path), "-o", str(model_path), "--force", "--quiet"]) == 2
    assert "refusing to overwrite the input model" in capsys.readouterr().err
    assert model_path.read_bytes() == before

    # --json keeps stdout pure JSON
    assert main(["optimize", str(model_path), "-o", str(out), "--force", "--json",
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.lstrip().startswith("{") and "wrote the optimized model" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx", "model.onnx"]
