"""The embedded example: a small CNN block and a small attention block in one ONNX model.

Built with `onnx.helper` and seeded random weights, so `eqsat-fuse demo` needs no files. The CNN
block has Conv+BatchNormalization+Relu, a residual Add and a Gemm head; the attention block has
LayerNormalization, Q/K/V projections, Softmax attention and a GELU MLP in its erf form.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def demo_model(seed: int = 0) -> onnx.ModelProto:
    """The demo model: inputs `image` [1,16,32,32] and `tokens` [1,16,64]; two outputs."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name, *shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(max(1, np.prod(shape[1:])))
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def bn(x, channels, name):
        scale = const(f"{name}.scale", rng.uniform(0.5, 1.5, channels))
        bias = const(f"{name}.bias", rng.normal(0, 0.1, channels))
        mean = const(f"{name}.mean", rng.normal(0, 0.1, channels))
        var = const(f"{name}.var", rng.uniform(0.5, 1.5, channels))
        return node("BatchNormalization", [x, scale, bias, mean, var], name, epsilon=1e-5)

    # ---- CNN block: conv-bn-relu, conv-bn, projection shortcut, add, relu, pool, gemm head
    c1 = node("Conv", ["image", weight("conv1.w", 32, 16, 3, 3)], "conv1", pads=[1, 1, 1, 1])
    r1 = node("Relu", [bn(c1, 32, "bn1")], "relu1")
    c2 = node("Conv", [r1, weight("conv2.w", 32, 32, 3, 3)], "conv2", pads=[1, 1, 1, 1])
    b2 = bn(c2, 32, "bn2")
    sc = node("Conv", ["image", weight("proj.w", 32, 16, 1, 1), weight("proj.b", 32, scale=0.1)],
              "proj")
    r2 = node("Relu", [node("Add", [b2, sc], "residual")], "relu2")
    pooled = node("GlobalAveragePool", [r2], "pool")
    flat = node("Flatten", [pooled], "flatten", axis=1)
    node("Gemm", [flat, weight("fc.w", 10, 32), weight("fc.b", 10, scale=0.1)], "logits",
         transB=1)

    # ---- attention block: pre-norm self-attention and a GELU MLP, with residuals
    d, heads, seq = 64, 4, 16
    ln1 = node("LayerNormalization", ["tokens", const("ln1.g", np.ones(d)),
                                      const("ln1.b", np.zeros(d))], "ln1", axis=-1)

    def proj(x, name, out=d):
        mm = node("MatMul", [x, weight(f"{name}.w", d if out == d else d, out)], f"{name}.mm")
        return node("Add", [mm, weight(f"{name}.b", out, scale=0.1)], name)

    def split_heads(x, name):
        r = node("Reshape", [x, const(f"{name}.shape", [1, seq, heads, d // heads], np.int64)],
                 f"{name}.reshape")
        return node("Transpose", [r], f"{name}.heads", perm=[0, 2, 1, 3])

    q = split_heads(proj(ln1, "q"), "q")
    k = split_heads(proj(ln1, "k"), "k")
    v = split_heads(proj(ln1, "v"), "v")
    kt = node("Transpose", [k], "k.t", perm=[0, 1, 3, 2])
    scores = node("Mul", [node("MatMul", [q, kt], "qk"), const("scale", 1 / np.sqrt(d // heads))],
                  "scores")
    attn = node("Softmax", [scores], "attn", axis=-1)
    ctx = node("Transpose", [node("MatMul", [attn, v], "ctx")], "ctx.t", perm=[0, 2, 1, 3])
    merged = node("Reshape", [ctx, const("merge.shape", [1, seq, d], np.int64)], "merged")
    h = node("Add", ["tokens", proj(merged, "o")], "h")
    ln2 = node("LayerNormalization", [h, const("ln2.g", np.ones(d)), const("ln2.b", np.zeros(d))],
               "ln2", axis=-1)
    up = node("MatMul", [ln2, weight("fc1.w", d, 4 * d)], "fc1.mm")
    up = node("Add", [up, weight("fc1.b", 4 * d, scale=0.1)], "fc1")
    # GELU, erf form: 0.5 * x * (1 + erf(x / sqrt(2)))
    erf = node("Erf", [node("Div", [up, const("sqrt2", np.sqrt(2.0))], "gelu.div")], "gelu.erf")
    gelu = node("Mul", [node("Mul", [up, node("Add", [erf, const("one", 1.0)], "gelu.add")],
                             "gelu.mul"), const("half", 0.5)], "gelu")
    down = node("MatMul", [gelu, weight("fc2.w", 4 * d, d)], "fc2.mm")
    down = node("Add", [down, weight("fc2.b", d, scale=0.1)], "fc2")
    node("Add", [h, down], "encoded")

    graph = helper.make_graph(
        nodes, "eqsat_fuse_demo",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 16, 32, 32]),
         helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
         helper.make_tensor_value_info("encoded", TensorProto.FLOAT, [1, seq, d])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="eqsat-fuse demo")
    onnx.checker.check_model(model, full_check=True)
    return model
