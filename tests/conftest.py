"""Shared fixtures: small ONNX models built with onnx.helper, and the real exported models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

MODELS_DIR = Path(__file__).parent / "models"


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
