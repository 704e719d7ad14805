"""Larger synthetic-but-realistic ONNX models for the extraction benchmarks, built with onnx.helper.

- `resnet(blocks)`: a deep ResNet with bottleneck blocks (Conv+BN+ReLU x3, residual Add+ReLU),
  a stem with MaxPool, global average pooling and a Gemm head.
- `bert(layers)`: a BERT encoder exported the old way (opset 13 style): LayerNorm decomposed into
  ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add, GELU in its erf form, attention with Reshape/Transpose,
  scaled MatMul, additive mask, Softmax, and residual Adds.

Both run under onnxruntime (the weights are random), so compiled programs can be verified.
They are built in memory (a second or so); `python bench/extract_models.py DIR` writes them out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    def __init__(self, seed: int = 0):
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def weight(self, shape, scale=None) -> str:
        name = self.name("w")
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        scale = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        self.inits[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def const(self, value) -> str:
        name = self.name("c")
        self.inits[name] = np.asarray(value, dtype=np.float32)
        return name

    def ints(self, values) -> str:
        name = self.name("s")
        self.inits[name] = np.asarray(values, dtype=np.int64)
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def model(self, inputs, outputs, name: str, opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model)


def _conv_bn(g: _Graph, x: str, cin: int, cout: int, k: int, stride: int = 1,
             relu: bool = True) -> str:
    pad = k // 2
    y = g.op("Conv", [x, g.weight((cout, cin, k, k))], kernel_shape=[k, k],
             pads=[pad] * 4, strides=[stride, stride])
    scale = g.const(g.rng.uniform(0.5, 1.5, cout))
    bias = g.const(g.rng.normal(0, 0.1, cout))
    mean = g.const(g.rng.normal(0, 0.1, cout))
    var = g.const(g.rng.uniform(0.5, 1.5, cout))
    y = g.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
    return g.op("Relu", [y]) if relu else y


def resnet(blocks: int = 50, width: int = 16, size: int = 32, classes: int = 10,
           seed: int = 0) -> onnx.ModelProto:
    """A deep bottleneck ResNet: about 10 ONNX nodes per block."""
    g = _Graph(seed)
    x = _conv_bn(g, "pixels", 3, width, 3)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    channels = width
    stages = [blocks // 4 + (1 if i < blocks % 4 else 0) for i in range(4)]
    for stage, count in enumerate(stages):
        out = width * 2 ** stage * 2
        for block in range(count):
            stride = 2 if block == 0 and stage > 0 else 1
            mid = out // 4
            y = _conv_bn(g, x, channels, mid, 1)
            y = _conv_bn(g, y, mid, mid, 3, stride)
            y = _conv_bn(g, y, mid, out, 1, relu=False)
            skip = x if (channels == out and stride == 1) else _conv_bn(g, x, channels, out, 1,
                                                                        stride, relu=False)
            x = g.op("Relu", [g.op("Add", [y, skip])])
            channels = out
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    x = g.op("Gemm", [x, g.weight((classes, channels)), g.const(np.zeros(classes))], transB=1)
    return g.model([("pixels", TensorProto.FLOAT, [1, 3, size, size])], [x],
                   f"resnet{blocks}", 13)


def _layer_norm(g: _Graph, x: str, hidden: int) -> str:
    mean = g.op("ReduceMean", [x], axes=[-1])
    d = g.op("Sub", [x, mean])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.const(2.0)])], axes=[-1])
    sd = g.op("Sqrt", [g.op("Add", [var, g.const(1e-12)])])
    y = g.op("Div", [d, sd])
    return g.op("Add", [g.op("Mul", [y, g.const(np.ones(hidden))]), g.const(np.zeros(hidden))])


def _dense(g: _Graph, x: str, cin: int, cout: int) -> str:
    return g.op("Add", [g.op("MatMul", [x, g.weight((cin, cout))]),
                        g.const(g.rng.normal(0, 0.02, cout))])


def bert(layers: int = 20, hidden: int = 64, heads: int = 2, seq: int = 16,
         seed: int = 0) -> onnx.ModelProto:
    """A BERT encoder: about 75 ONNX nodes per layer."""
    g = _Graph(seed)
    head = hidden // heads
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask = g.op("Unsqueeze", [mask, g.ints([1, 2])])
    mask = g.op("Mul", [g.op("Sub", [g.const(1.0), mask]), g.const(-10000.0)])
    x = g.op("Gather", [g.weight((100, hidden), 0.02), "input_ids"], axis=0)
    x = _layer_norm(g, g.op("Add", [x, g.weight((seq, hidden), 0.02)]), hidden)
    split_shape = g.ints([1, seq, heads, head])
    merge_shape = g.ints([1, seq, hidden])
    for _ in range(layers):
        def heads_of(t, perm):
            return g.op("Transpose", [g.op("Reshape", [t, split_shape])], perm=perm)
        q = heads_of(_dense(g, x, hidden, hidden), [0, 2, 1, 3])
        k = heads_of(_dense(g, x, hidden, hidden), [0, 2, 3, 1])
        v = heads_of(_dense(g, x, hidden, hidden), [0, 2, 1, 3])
        scores = g.op("Div", [g.op("MatMul", [q, k]), g.const(np.sqrt(head))])
        probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, merge_shape])
        x = _layer_norm(g, g.op("Add", [_dense(g, ctx, hidden, hidden), x]), hidden)
        h = _dense(g, x, hidden, 4 * hidden)
        erf = g.op("Erf", [g.op("Div", [h, g.const(np.sqrt(2.0))])])
        h = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(1.0)])]), g.const(0.5)])
        x = _layer_norm(g, g.op("Add", [_dense(g, h, 4 * hidden, hidden), x]), hidden)
    return g.model([("input_ids", TensorProto.INT64, [1, seq]),
                    ("attention_mask", TensorProto.INT64, [1, seq])], [x],
                   f"bert{layers}", 13)


MODELS = {
    "resnet150": lambda: resnet(150),        # 1,515 ONNX nodes
    "bert30": lambda: bert(30),              # ~1,500 ONNX nodes
}


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for name, build in MODELS.items():
        model = build()
        onnx.save(model, str(folder / f"{name}.onnx"))
        print(f"{folder / name}.onnx: {len(model.graph.node)} ONNX nodes", file=sys.stderr)
