"""Shared fixtures: small ONNX models built with onnx.helper, and the real exported models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

MODELS_DIR = Path(__file__).parent / "models"

# Most tests compile without naming a backend and are about the pipeline, not the kernels: they
# run on the NumPy backend, which builds in milliseconds (the default, Numba, compiles each new
# kernel). EQSAT_FUSE_BACKEND=numba runs them all on Numba; tests of the default itself unset it
# (test_backends.py). Child processes the tests start inherit it.
os.environ.setdefault("EQSAT_FUSE_BACKEND", "numpy")


def real_models() -> list[dict]:
    """The entries of tests/models/manifest.json (models exported from transformers)."""
    return json.loads((MODELS_DIR / "manifest.json").read_text())["models"]


def make_model(nodes, inputs, outputs, initializers=(), opset=17, name="test"):
    """A model from helper nodes; inputs/outputs are (name, shape) or (name, shape, elem_type)."""
    def vi(spec):
        name, shape, *elem = spec
        return helper.make_tensor_value_info(name, elem[0] if elem else TensorProto.FLOAT, shape)
    graph = helper.make_graph(list(nodes), name, [vi(i) for i in inputs], [vi(o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k)
                               for k, v in dict(initializers).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def compile_in_two_processes(model_path, cache_dir, threads=None) -> list[tuple[int, int, bool]]:
    """Compile `model_path` with the Numba backend in two fresh processes sharing `cache_dir`
    (at `threads`, default the program's): (kernels JIT-compiled, kernels loaded from the disk
    cache, verified ok) of each."""
    import os
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f"""
        import json, eqsat_fuse as ef
        c = ef.compile({str(model_path)!r}, backend="numba", cache_dir={str(cache_dir)!r},
                       threads={threads!r})
        b = c.report.backend_report
        print(json.dumps([b["jit_compiled"], b["jit_loaded"], c.verify().ok]))
    """)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True, env=dict(os.environ, **(
                                 {"NUMBA_NUM_THREADS": str(threads)} if threads else {})))
        runs.append(tuple(json.loads(out.stdout.strip().splitlines()[-1])))
    return runs


def ort_outputs(model, feeds, threads: int | None = None) -> list[np.ndarray]:
    """The oracle: onnxruntime with every graph optimization off (ORT_DISABLE_ALL), its
    outputs in the model's order (`threads`: its intra-op threads, default its own)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def conv_bn_relu_model(rng, with_bias=True):
    """x[1,4,8,8] -> Conv 3x3 (8 out) -> BatchNormalization -> Relu -> y."""
    inits = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
             "s": rng.uniform(0.5, 1.5, 8).astype(np.float32),
             "b": rng.normal(0, 0.1, 8).astype(np.float32),
             "m": rng.normal(0, 0.1, 8).astype(np.float32),
             "v": rng.uniform(0.5, 1.5, 8).astype(np.float32)}
    conv_inputs = ["x", "w"]
    if with_bias:
        inits["cb"] = rng.normal(0, 0.1, 8).astype(np.float32)
        conv_inputs.append("cb")
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    return make_model(nodes, [("x", [1, 4, 8, 8])], [("y", [1, 8, 8, 8])], inits)


def _ieee_oracle(model, feeds, oracle):
    if oracle == "reference":
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run(None, feeds)
    return ort_outputs(model, feeds)


def assert_same_ieee(got, want, where):
    """`got` equals `want` in which elements are NaN, +inf, -inf, zero and negative, and in
    value to 2e-6 (the numerics contract of docs/numerics.md, at its strictest)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, where
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{where}: NaN")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"{where}: +inf")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{where}: -inf")
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[keep]), np.signbit(want[keep]),
                                  err_msg=f"{where}: sign")
    np.testing.assert_array_equal(got[keep] == 0, want[keep] == 0, err_msg=f"{where}: zero")
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, equal_nan=True, err_msg=where)


def check_ieee(model, feeds, cache, oracle="ort", numerics=None):
    """Both backends (exact numerics unless told) against the oracle (onnxruntime without
    graph optimizations, or "reference"), `assert_same_ieee` output by output; the Numba
    backend must have compiled every kernel. Returns the two compiled programs."""
    import eqsat_fuse as ef

    want = _ieee_oracle(model, feeds, oracle)
    programs = []
    for backend in ("numpy", "numba"):
        kw = {"cache_dir": cache} if backend == "numba" else {}
        program = ef.compile(model, backend=backend, numerics=numerics, **kw)
        if backend == "numba":
            assert program.report.backend_report["fallback_kernels"] == []
        got = list(program.run(feeds).values())
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same_ieee(g, w, f"{backend} output {k}")
        programs.append(program)
    return programs
