"""Write the model of the worked example in docs/rules.md: x @ w, then a per-column scale."""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "c"], ["y"]),
     helper.make_node("Relu", ["y"], ["out"])],
    "matmul_scale",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, [8, 32])],
    [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w"),
     numpy_helper.from_array(rng.uniform(0.5, 2.0, 32).astype(np.float32), "c")])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
          sys.argv[1] if len(sys.argv) > 1 else "matmul_scale.onnx")
