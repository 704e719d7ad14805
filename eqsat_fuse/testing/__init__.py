"""Hypothesis strategies that generate random, valid ONNX models, for fuzzing eqsat-fuse.

Use them to check that your own rule files (or any change to the compiler) keep the compiled
program equal to the original model on onnxruntime::

    from hypothesis import given, settings
    from eqsat_fuse.testing import onnx_graphs, check_case

    @settings(max_examples=200, deadline=None)
    @given(onnx_graphs(max_nodes=12))
    def test_my_rules(case):
        check_case(case, rules=["my_rules.egg"])     # extra keywords go to eqsat_fuse.compile

Every strategy draws a `GraphCase`: `case.model` (an `onnx.ModelProto`), `case.feeds` (one
float32 array, or an int64/bool one for index and condition inputs, per graph input) and
`case.description` (the ops used, for messages). Everything, the weights and the feeds included,
comes from the Hypothesis draw, so a failing case is replayed and shrunk like any other. A case
prints as `onnx.printer` text (which `onnx.parser.parse_model` reads back); `case.save(folder)`
writes `model.onnx` and `feeds.npz` to replay it elsewhere. The narrower strategies
`elementwise_chains`, `conv_blocks` and `matmul_blocks` aim at one kind of fusion each.
`edge_graphs` (edges.py) is the other end: small graphs whose feeds and constants hold NaN,
+-inf, -0.0, subnormals and values near overflow, checked by `check_edge_case` in NaN,
infinity and signed-zero pattern against onnxruntime (see edges.py for what it draws).

What the graphs contain (over many draws):

- elementwise chains of any length, operands broadcast between different ranks and shapes
  (initializers of shape [C,1,1], [1], [], [W], inputs with size-1 dims on either side);
- unary ops (Relu, LeakyRelu, Sigmoid, Tanh, Erf, Exp, Neg, Abs, HardSigmoid, HardSwish,
  Clip with and without bounds, Gelu from opset 20, Sqrt/Log/Reciprocal on inputs made
  positive first),
  binary Add/Sub/Mul/Div and Pow with small constant exponents, Sum, Where with a bool initializer,
  and the multi-node patterns rules look for (Swish, GELU in its erf and tanh forms, HardSwish,
  decomposed LayerNorm and Softmax);
- Conv blocks (1-D and 2-D, random channels/kernel/stride/pads/auto_pad/dilation/groups, depthwise
  included, with or without bias) with BatchNormalization, an activation and a residual Add;
  MaxPool/AveragePool/GlobalAveragePool; MatMul (batched, 1-D, activation x activation) and Gemm
  (transA/transB/alpha/beta, C of every broadcastable shape) with bias Add and activation;
- Softmax, LayerNormalization, BatchNormalization, ReduceMean/ReduceSum (keepdims, negative axes);
- Transpose, Reshape (with 0 and -1), Flatten, Unsqueeze, Squeeze, Concat, Slice (negative
  steps, out-of-range bounds), Split, Gather, Pad (constant/reflect/edge), Expand, Identity,
  Dropout, Cast round trips;
- shared intermediates, several graph outputs (intermediates among them), constant subgraphs
  (nodes reading only initializers, Constant nodes) and shape subgraphs
  (Shape -> Gather -> Unsqueeze -> Concat -> Reshape);
- a few ops eqsat-fuse does not cover (Softplus, Sin, Max, Min), which it runs opaquely.

The generator tracks every value's static shape, an interval bounding its values and the axes
along which it is constant, and only picks ops whose constraints hold: divisors stay away from
zero, Log/Sqrt/Reciprocal/fractional Pow see positive inputs, Exp sees bounded inputs, magnitudes
stay moderate (so float32 rounding stays far below `verify`'s tolerances), LayerNormalization
never normalizes rows that are constant by broadcasting. Tensors hold at most a few thousand
elements. Each model passes `onnx.checker.check_model(model, full_check=True)` (the strategy
checks it) and runs in onnxruntime.

Requires `hypothesis` (a test dependency of eqsat-fuse).

The package, one job per module: case.py (`GraphCase`, `model_text`), values.py (the limits,
the op sets and the values the builder tracks), builder.py (the builder's core: drawing,
emitting, picking, taming, driving), the op families mixed into it (elementwise.py,
contractions.py, rows.py, views.py), strategies.py (the public strategies),
differential.py (`check_case`) and edges.py (`edge_graphs`, `check_edge_case`).
"""

from .case import GraphCase, model_text
from .differential import check_case
from .edges import check_edge_case, edge_graphs, ieee_mismatch
from .strategies import conv_blocks, elementwise_chains, matmul_blocks, onnx_graphs
from .values import ELEMENTWISE_OPS, GENERATED_OPS

__all__ = [
    "GraphCase",
    "onnx_graphs",
    "elementwise_chains",
    "conv_blocks",
    "matmul_blocks",
    "check_case",
    "edge_graphs",
    "check_edge_case",
    "ieee_mismatch",
    "model_text",
    "GENERATED_OPS",
    "ELEMENTWISE_OPS",
]
