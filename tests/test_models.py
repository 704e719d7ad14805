"""End to end on real models exported from transformers (tests/models, see its README)."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_fuse as ef

from conftest import MODELS_DIR, real_models

MODELS = real_models()


@pytest.fixture(scope="module", params=[m["file"] for m in MODELS])
def compiled(request):
    return request.param, ef.compile(MODELS_DIR / request.param)


def test_real_model_matches_onnxruntime(compiled):
    name, program = compiled
    result = program.verify(seed=1)
    assert result.ok, f"{name}\n{result.summary()}"
    for check in result.outputs:     # the bar: rtol 1e-3, atol 1e-4
        assert check.rtol <= 1e-3 and check.atol <= 1e-4


def test_real_model_runs_fewer_kernels_than_it_has_nodes(compiled):
    name, program = compiled
    report = program.report
    assert report.kernels_out < report.nodes_imported, name
    assert report.stop_reason == "saturated", name


@pytest.mark.parametrize("numerics", ["exact", "fast"])
@pytest.mark.parametrize("file", ["resnet_tiny_op17.onnx", "resnet_tiny_op9.onnx"])
def test_resnet_batchnorms_and_activations_run_inside_the_convs(file, numerics):
    """Fast: every BatchNormalization folded into its Conv's weights. Exact (the default): each
    runs as its Conv's epilogue, never as a kernel of its own."""
    report = ef.compile(MODELS_DIR / file, numerics=numerics).report
    ops = [op for k in report.kernels for op in k.ops]
    compute = [k.ops for k in report.kernels if k.kind == "compute"]
    folds = report.matches_per_rule.get("conv2d-nobias-bn-fold", 0)
    if numerics == "fast":
        assert "BatchNormalization" not in ops and folds >= 9
        ends = ("Relu", "Conv", "Add")
    else:
        assert folds == 0
        assert all(ops[0] == "Conv" for ops in compute if "BatchNormalization" in ops)
        ends = ("Relu", "Conv", "Add", "Mul", "BatchNormalization")
    assert ["Relu"] not in compute, "a Relu ran as a kernel of its own"
    assert all(ops[-1] in ends for ops in compute if "Conv" in ops)
    # every ReLU of the model sits in a Conv kernel (the one after the stem's MaxPool excepted)
    relu_kernels = [ops for ops in compute if "Relu" in ops]
    assert relu_kernels and all("Conv" in ops for ops in relu_kernels)
    assert report.kernels_out <= report.nodes_in // 2


def test_opset9_and_opset17_exports_compile_to_the_same_program():
    a = ef.compile(MODELS_DIR / "resnet_tiny_op9.onnx").report
    b = ef.compile(MODELS_DIR / "resnet_tiny_op17.onnx").report
    assert [k.ops for k in a.kernels] == [k.ops for k in b.kernels]


def test_transformer_outputs_match_on_user_given_inputs():
    program = ef.compile(MODELS_DIR / "bert_tiny_op17.onnx")
    rng = np.random.default_rng(3)
    feeds = {"input_ids": rng.integers(0, 100, (1, 16)).astype(np.int64),
             "attention_mask": np.concatenate([np.ones((1, 12)), np.zeros((1, 4))],
                                              axis=1).astype(np.int64)}
    assert program.verify(feeds).ok


def onnxruntime_extended_node_count(path, tmp_path) -> int:
    """Nodes onnxruntime's own optimizer leaves at ORT_ENABLE_EXTENDED (every fusion it has,
    without the layout pass that adds reorder nodes), counted in its saved optimized model."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort_optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return len(onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("file", [m["file"] for m in MODELS])
def test_kernels_are_no_more_than_onnxruntime_extended_nodes(file, tmp_path):
    report = ef.compile(MODELS_DIR / file).report
    ort_nodes = onnxruntime_extended_node_count(MODELS_DIR / file, tmp_path)
    # views (Reshape/Transpose... that move no data) counted too, as onnxruntime counts its own
    assert report.kernels_out + report.views <= ort_nodes, (file, report.kernels_out,
                                                            report.views, ort_nodes)
