"""And, Or, Xor and Not: the boolean ops transformer exports combine their masks with (every
Hugging Face export of bench/export_real_models.py has an `And`). They are covered elementwise
ops: no Opaque kernel, fused with their neighbours, the same values as onnxruntime on both
backends. (ONNX's own Not cases are opset-1 models, which the importer does not read, so this
file is what tests Not.)"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef

from conftest import make_model


def _mask_model():
    # a padding mask and a causal mask combined as the exporters do, then used as scores'
    # additive mask: where(keep, x, -inf-ish), with Or, Xor and Not on the way
    nodes = [
        helper.make_node("And", ["pad", "causal"], ["both"]),
        helper.make_node("Not", ["both"], ["masked"]),
        helper.make_node("Or", ["masked", "extra"], ["drop"]),
        helper.make_node("Xor", ["drop", "flip"], ["drop2"]),
        helper.make_node("Cast", ["drop2"], ["dropf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["dropf", "big"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    inputs = [("x", [2, 4, 8]), ("pad", [2, 1, 8], TensorProto.BOOL),
              ("causal", [4, 8], TensorProto.BOOL), ("extra", [2, 4, 8], TensorProto.BOOL),
              ("flip", [8], TensorProto.BOOL)]
    return make_model(nodes, inputs, [("y", [2, 4, 8])],
                      initializers={"big": np.array(-1e4, np.float32)}, opset=21)


def _feeds(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, 4, 8)).astype(np.float32),
            "pad": rng.random((2, 1, 8)) < 0.7, "causal": np.tril(np.ones((4, 8), bool)),
            "extra": rng.random((2, 4, 8)) < 0.2, "flip": rng.random(8) < 0.5}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_the_boolean_ops_of_a_mask_fuse_and_match_onnxruntime(backend, tmp_path):
    model = _mask_model()
    compiled = ef.compile(model, backend=backend, cache_dir=tmp_path)
    assert not compiled.program.plan.opaque_nodes
    ops = [op for k in compiled.report.kernels for op in k.ops]
    assert {"And", "Or", "Xor", "Not"} <= set(ops)
    assert len(compiled.report.kernels) == 1          # the whole mask and its use, one kernel
    if backend == "numba":
        assert not compiled.report.backend_report["fallback_kernels"]
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = _feeds(seed)
        want = session.run(None, feeds)[0]
        np.testing.assert_array_equal(compiled.run(feeds)["y"], want)
