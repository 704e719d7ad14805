"""The values the builder knows: the generator's limits and op sets, `_Val` (a value's static
shape, dtype, interval and constant axes), and the shape and interval arithmetic on them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

MAX_NUMEL = 4096          # elements in any value
MAX_INPUT_NUMEL = 1024    # elements in a graph input the generator creates
BOUND = 50.0              # |values| kept below this (interval analysis, conservative)
INPUT_RANGE = 3.0         # feeds are drawn in [-3, 3] unless an input needs a narrower range
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

ELEMENTWISE_OPS = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "HardSigmoid",
    "HardSwish", "Clip", "Gelu", "Sqrt", "Log", "Reciprocal", "Add", "Sub", "Mul", "Div", "Pow",
    "Where", "Sum", "Identity", "Dropout", "Cast",
})

GENERATED_OPS = ELEMENTWISE_OPS | frozenset({
    "Constant", "Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool",
    "MatMul", "Gemm", "Flatten", "Softmax", "LayerNormalization", "ReduceMean", "ReduceSum",
    "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Concat", "Slice", "Split", "Gather", "Pad",
    "Expand", "Shape", "Softplus", "Sin", "Max", "Min",
})

# The first opset in which the generator may use an op (in the form it writes it).
_MIN_OPSET = {"LayerNormalization": 17, "Gelu": 20, "HardSwish": 14}
_MIN_SUPPORTED_OPSET = 13



def table_unary_ops() -> list[str]:
    """The unary elementwise ops of the operator table (eqsat_fuse/ops.py) the families above
    do not write by hand: ONNX ops of the same name (`onnx_plain`) with a NumPy reference. The
    builder writes them without attributes (their ONNX defaults), inputs inside their `domain`,
    and bounds their values by `sampled_interval`."""
    from ..ops import OPS
    return [op for op, spec in OPS.items()
            if spec.kind == "elementwise" and len(spec.inputs) == 1 and spec.onnx_plain
            and spec.reference is not None and op not in ELEMENTWISE_OPS
            and spec.domain != "bool"]          # the builder's values are floats


def sampled_interval(op: str, lo: float, hi: float) -> tuple[float, float]:
    """An interval holding a table op's values over [lo, hi], from its reference on a grid of
    the interval (widened by a margin: the fuzzer's intervals need only be safe, not tight);
    (nan, nan) where it is not finite there."""
    from ..ops import OPS
    spec = OPS[op]
    grid = np.linspace(lo, hi, 257).astype(np.float32)
    with np.errstate(all="ignore"):
        ys = np.asarray(spec.reference(grid, **dict(spec.defaults)), dtype=np.float64)
    if not np.all(np.isfinite(ys)):
        return math.nan, math.nan
    margin = 0.01 * (float(ys.max()) - float(ys.min())) + 1e-3
    return float(ys.min()) - margin, float(ys.max()) + margin


_ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Clip",
                "Gelu", "Swish")


@dataclass(eq=False)
class _Val:
    """A value of the graph being built: static shape, dtype, an interval holding its elements,
    and the axes along which it is constant because of broadcasting (`flat`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    lo: float = -INPUT_RANGE
    hi: float = INPUT_RANGE
    flat: frozenset = frozenset()
    origin: str = "node"          # input | init | node

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def bound(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _broadcast(*shapes) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        return None


def _sigmoid(v: float) -> float:
    return float(0.5 * (1.0 + math.tanh(0.5 * v)))


def _erf(v: float) -> float:
    return math.erf(v)


def _flat_elementwise(out_shape, vals) -> frozenset:
    """Axes of the broadcast result along which every operand is constant."""
    rank = len(out_shape)
    flat = set()
    for j in range(rank):
        if out_shape[j] == 1:
            continue
        if all(_const_along(v, j - (rank - v.rank)) for v in vals):
            flat.add(j)
    return frozenset(flat)


def _const_along(v: _Val, k: int) -> bool:
    return k < 0 or v.shape[k] == 1 or k in v.flat


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _onnx_slice_len(dim: int, start: int, end: int, step: int) -> int:
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return max(0, -(-(start - end) // -step))


_NP_TO_ONNX = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "bool": TensorProto.BOOL}

