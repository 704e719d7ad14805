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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import onnx
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "GraphCase",
    "onnx_graphs",
    "elementwise_chains",
    "conv_blocks",
    "matmul_blocks",
    "check_case",
    "model_text",
    "GENERATED_OPS",
    "ELEMENTWISE_OPS",
]

MAX_NUMEL = 4096          # elements in any value
MAX_INPUT_NUMEL = 1024    # elements in a graph input the generator creates
BOUND = 50.0              # |values| kept below this (interval analysis, conservative)
INPUT_RANGE = 3.0         # feeds are drawn in [-3, 3] unless an input needs a narrower range
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

ELEMENTWISE_OPS = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "HardSigmoid",
    "HardSwish", "Clip", "Gelu", "Sqrt", "Log", "Reciprocal", "Add", "Sub", "Mul", "Div", "Pow", "Where",
    "Sum", "Identity", "Dropout", "Cast",
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

_ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Clip",
                "Gelu", "Swish")


# ---- the drawn case -----------------------------------------------------------------------------

@dataclass
class GraphCase:
    """One generated model, its feeds, and which ops it uses."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    description: str

    def text(self, max_values: int = 64) -> str:
        """The model as `onnx.printer` text (big initializers elided) and the feeds' shapes."""
        feeds = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.feeds.items())
        return f"{self.description}\nfeeds: {feeds}\n{model_text(self.model, max_values)}"

    def save(self, directory: str | Path) -> Path:
        """Write `model.onnx` and `feeds.npz` into `directory` (created), to replay elsewhere."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        onnx.save(self.model, str(path / "model.onnx"))
        np.savez(path / "feeds.npz", **self.feeds)
        return path

    def __repr__(self) -> str:
        return f"GraphCase<{self.text()}>"

    def _repr_pretty_(self, printer, cycle) -> None:   # what Hypothesis prints for a failure
        printer.text(repr(self))


def model_text(model: onnx.ModelProto, max_values: int = 64) -> str:
    """`onnx.printer.to_text(model)`, with the data of initializers above `max_values` elements
    left out (listed below the text with their shape and range)."""
    if all(int(np.prod(t.dims, dtype=np.int64)) <= max_values for t in model.graph.initializer):
        return onnx.printer.to_text(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    notes = []
    for t in copy.graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) > max_values:
            a = numpy_helper.to_array(t)
            notes.append(f"#   {t.name}: {a.dtype}{list(a.shape)} "
                         f"in [{a.min():.4g}, {a.max():.4g}]")
            empty = TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))
            t.CopyFrom(empty)
    return (onnx.printer.to_text(copy)
            + f"\n# data left out of initializers above {max_values} elements:\n"
            + "\n".join(notes))


# ---- values the builder knows -------------------------------------------------------------------

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


# ---- the builder --------------------------------------------------------------------------------

class _Builder:
    """Draws a graph step by step. Every choice goes through `draw`, so Hypothesis can shrink it."""

    def __init__(self, draw, opset: int, ops: frozenset[str] | None = None,
                 allow_conv: bool = True, allow_matmul: bool = True, allow_shapes: bool = True,
                 broadcast: bool = True, chain_bias: float = 0.3):
        self.draw = draw
        self.opset = opset
        self.ops = ops
        self.allow_conv = allow_conv
        self.allow_matmul = allow_matmul
        self.allow_shapes = allow_shapes
        self.broadcast = broadcast
        self.chain_bias = chain_bias
        self.intermediate_outputs = True      # intermediates may also be graph outputs
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[_Val] = []
        self.values: list[_Val] = []           # float values later steps may read
        self.consumed: set[str] = set()
        self.produced: list[_Val] = []         # float node outputs, in order (output candidates)
        self.counter = 0

    # -- drawing helpers
    def choice(self, seq):
        seq = list(seq)
        return seq[0] if len(seq) == 1 else self.draw(st.sampled_from(seq))

    def integer(self, lo: int, hi: int) -> int:
        return lo if lo >= hi else self.draw(st.integers(lo, hi))

    def flip(self, p: float = 0.5) -> bool:
        """True with probability about p; shrinks to False."""
        if p <= 0:
            return False
        if p >= 1:
            return True
        return self.draw(st.integers(0, 99)) >= 100 - round(100 * p)

    def sample(self, population, k: int) -> list:
        """k distinct elements of `population` (shrinks towards its first ones)."""
        pool = list(population)
        return [pool.pop(self.integer(0, len(pool) - 1)) for _ in range(k)]

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.draw(st.integers(0, 2**32 - 1)))

    def floats(self, shape, lo: float, hi: float, away: float = 0.0) -> np.ndarray:
        """float32 values in [lo, hi]; with `away` > 0, |v| >= away (lo < 0 < hi then)."""
        shape = tuple(shape)
        n = _numel(shape)
        if n <= 4 and self.flip(0.6):
            nice = [v for v in (1.0, 0.5, 2.0, -1.0, 0.25, 1.5, -0.5, -2.0, 3.0, 0.1)
                    if lo <= v <= hi and abs(v) >= away]
            if nice and self.flip(0.5):
                return np.full(shape, self.choice(nice), dtype=np.float32)
            lo32, hi32 = np.float32(lo), np.float32(hi)     # bounds Hypothesis accepts
            if lo32 < lo:
                lo32 = np.nextafter(lo32, np.float32(np.inf))
            if hi32 > hi:
                hi32 = np.nextafter(hi32, np.float32(-np.inf))
            elems = st.floats(float(lo32), float(max(lo32, hi32)), width=32, allow_nan=False,
                              allow_infinity=False, allow_subnormal=False)
            vals = [self.draw(elems) for _ in range(n)]
            if away > 0:
                vals = [v if abs(v) >= away else math.copysign(away, v or 1.0) for v in vals]
            return np.array(vals, dtype=np.float32).reshape(shape)
        rng = self.rng()
        if away > 0:
            mag = rng.uniform(away, max(abs(lo), abs(hi)), size=shape)
            sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
            if lo >= 0:
                sign = np.ones(shape)
            elif hi <= 0:
                sign = -np.ones(shape)
            out = np.clip(mag * sign, lo, hi)
        else:
            out = rng.uniform(lo, hi, size=shape)
        return np.asarray(out, dtype=np.float32).reshape(shape)

    # -- what may be used
    def allowed(self, *ops: str) -> bool:
        for op in ops:
            if self.opset < _MIN_OPSET.get(op, 0):
                return False
            if self.ops is not None and op not in self.ops:
                return False
        return True

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # -- graph pieces
    def node(self, op: str, inputs: list, outputs: list[str], **attrs) -> onnx.NodeProto:
        names = ["" if i is None else (i if isinstance(i, str) else i.name) for i in inputs]
        while names and names[-1] == "":
            names.pop()
        self.consumed.update(n for n in names if n)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        n = helper.make_node(op, names, outputs, name=f"{op.lower()}_{len(self.nodes)}", **attrs)
        self.nodes.append(n)
        return n

    def op(self, op: str, inputs: list, shape, lo: float, hi: float, flat=frozenset(),
           register: bool = True, **attrs) -> _Val:
        """Emit a node with one float output and record it."""
        name = self.fresh("v")
        self.node(op, inputs, [name], **attrs)
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise AssertionError(f"eqsat_fuse.testing: bad interval [{lo}, {hi}] for {op}")
        v = _Val(name, tuple(int(d) for d in shape), "float32", lo, hi,
                 frozenset(a for a in flat if shape[a] > 1))
        self.produced.append(v)
        if register:
            self.values.append(v)
        return v

    def new_input(self, shape, lo: float = -INPUT_RANGE, hi: float = INPUT_RANGE,
                  dtype: str = "float32") -> _Val:
        v = _Val(f"x{len(self.inputs)}", tuple(int(d) for d in shape), dtype, lo, hi,
                 origin="input")
        self.inputs.append(v)
        if dtype == "float32":
            self.values.append(v)
        return v

    def const(self, array, prefix: str = "c", node_ok: bool = True) -> _Val:
        """An initializer (or, now and then, a Constant node) holding `array`."""
        array = np.asarray(array)
        name = self.fresh(prefix)
        if node_ok and self.allowed("Constant") and self.flip(0.08):
            self.node("Constant", [], [name], value=numpy_helper.from_array(array, name))
        else:
            self.inits.append(numpy_helper.from_array(array, name))
        lo = hi = 0.0
        if array.dtype.kind == "f" and array.size:
            lo, hi = float(array.min()), float(array.max())
        flat = frozenset(a for a in range(array.ndim) if array.shape[a] > 1
                         and np.all(array == np.take(array, [0], axis=a)))
        return _Val(name, array.shape, array.dtype.name, lo, hi, flat, origin="init")

    def ints(self, values, prefix: str = "k") -> _Val:
        return self.const(np.asarray(values, dtype=np.int64).reshape(-1), prefix)

    def scalar(self, value: float, rank1: bool | None = None, like: _Val | None = None) -> _Val:
        """A scalar constant, of shape [] or [1] (only [] next to a rank-0 `like`)."""
        if like is not None and like.rank == 0:
            rank1 = False
        rank1 = self.flip(0.3) if rank1 is None else rank1
        shape = (1,) if rank1 else ()
        return self.const(np.full(shape, value, dtype=np.float32), "s")

    # -- shapes
    def draw_shape(self, min_rank: int = 0, max_rank: int = 4,
                   max_numel: int = MAX_INPUT_NUMEL) -> tuple[int, ...]:
        ranks = [r for r in (2, 3, 1, 4, 0) if min_rank <= r <= max_rank]
        rank = self.choice(ranks)
        dims = [1 if self.flip(0.15) else self.integer(2, 8) for _ in range(rank)]
        while _numel(dims) > max_numel:
            i = int(np.argmax(dims))
            dims[i] = max(1, dims[i] // 2)
        return tuple(dims)

    def operand_shape(self, shape, grow: bool = True) -> tuple[int, ...]:
        """A shape that broadcasts with `shape`: [], [1], [C,1,1], [W], the full shape, or (with
        `grow`, making the result bigger than `shape`) one with size-1 dims of `shape` widened
        or one with an extra leading dim."""
        shape = tuple(shape)
        r = len(shape)
        if not self.broadcast:
            return shape
        styles = ["scalar", "suffix", "full"] + (["one"] if r >= 1 or grow else [])
        if grow and any(d == 1 for d in shape):
            styles.append("widen")
        if grow and r < 5:
            styles.append("lead")
        style = self.choice(styles)
        if style == "scalar":
            out = ()
        elif style == "one":
            out = (1,)
        elif style == "full":
            out = shape
        elif style == "suffix":
            if r == 0:
                return ()
            k = self.integer(1, r)
            out = tuple(d if self.flip(0.6) else 1 for d in shape[r - k:])
        elif style == "widen":
            out = tuple(self.integer(2, 3) if d == 1 and self.flip(0.7) else
                        (d if self.flip(0.6) else 1) for d in shape)
        else:
            k = self.integer(0, r)
            out = (self.integer(2, 3),) + tuple(d if self.flip(0.5) else 1 for d in shape[r - k:])
        result = _broadcast(shape, out)
        if result is None or _numel(result) > MAX_NUMEL:
            return ()
        return out

    # -- picking operands
    def pick(self, pred: Callable[[_Val], bool] | None = None,
             make: Callable[[], _Val] | None = None, p_new: float = 0.08) -> _Val | None:
        """An existing float value satisfying `pred` (the newest ones first), or `make()`."""
        cands = [v for v in self.values if pred is None or pred(v)]
        if cands and not (make is not None and self.flip(p_new)):
            if self.chain_bias and self.flip(self.chain_bias):
                return cands[-1]
            return self.choice(cands[::-1])
        return make() if make is not None else None

    def pick_any(self, pred=None, min_rank=0, max_rank=4) -> _Val:
        def make():
            return self.new_input(self.draw_shape(min_rank, max_rank))

        def ok(v):
            return min_rank <= v.rank <= max_rank and (pred is None or pred(v))
        return self.pick(ok, make)

    def operand_for(self, a: _Val, lo: float = -2.0, hi: float = 2.0, away: float = 0.0,
                    allow_self: bool = True) -> _Val:
        """A second operand for an elementwise op with `a`: a broadcastable constant, an
        existing value, a new input, or `a` itself."""
        modes = ["const", "existing", "input"] + (["self"] if allow_self else [])
        mode = self.choice(modes)
        if mode == "self":
            return a
        if mode == "existing":
            def ok(v):
                if v is a:
                    return False
                if not self.broadcast and v.shape != a.shape:
                    return False
                out = _broadcast(a.shape, v.shape)
                return out is not None and _numel(out) <= MAX_NUMEL
            found = self.pick(ok)
            if found is not None:
                return found
            mode = "const"
        shape = self.operand_shape(a.shape)
        if mode == "input":
            if away > 0:
                return self.new_input(shape, max(away, 0.5), 3.0)
            return self.new_input(shape, max(lo, -INPUT_RANGE), min(hi, INPUT_RANGE))
        return self.const(self.floats(shape, lo, hi, away))

    # -- keeping values in range
    def tame(self, x: _Val, limit: float) -> _Val:
        """`x`, or `x` squashed so that |values| <= limit."""
        if x.bound <= limit:
            return x
        methods = []
        if limit >= 1 and self.allowed("Tanh"):
            methods.append("tanh")
        if limit >= 1 and self.allowed("Sigmoid"):
            methods.append("sigmoid")
        if self.allowed("Mul"):
            methods.append("scale")
        if self.allowed("Clip"):
            methods.append("clip")
        methods.append("fresh")
        how = self.choice(methods)
        if how == "tanh":
            return self.op("Tanh", [x], x.shape, math.tanh(x.lo), math.tanh(x.hi), x.flat)
        if how == "sigmoid":
            return self.op("Sigmoid", [x], x.shape, _sigmoid(x.lo), _sigmoid(x.hi), x.flat)
        if how == "scale":
            s = float(np.float32(0.9 * limit / x.bound))
            c = self.scalar(s, like=x)
            out = _broadcast(x.shape, c.shape)
            return self.op("Mul", [x, c], out, x.lo * s, x.hi * s, _flat_elementwise(out, [x, c]))
        if how == "clip":
            m = math.floor(limit * 4) / 4 if limit >= 0.25 else limit * 0.9
            lo_c, hi_c = self.scalar(-m, rank1=False), self.scalar(m, rank1=False)
            lo, hi = (min(max(v, -m), m) for v in (x.lo, x.hi))
            return self.op("Clip", [x, lo_c, hi_c], x.shape, lo, hi, x.flat)
        r = min(INPUT_RANGE, limit)
        return self.new_input(x.shape, -r, r)

    def positive(self, x: _Val, need: float = 0.1) -> _Val:
        """`x`, or a value computed from it whose elements are all >= need (> 0)."""
        if x.lo >= need:
            return x
        methods = []
        if self.allowed("Mul", "Add"):
            methods.append("square_plus")
        if self.allowed("Sigmoid", "Add"):
            methods.append("sigmoid_plus")
        if self.allowed("Sigmoid") and _sigmoid(-min(x.bound, 40)) >= need:
            methods.append("sigmoid")
        if self.allowed("Exp", "Tanh") and need <= 0.35:
            methods.append("exp_tanh")
        if self.allowed("Relu", "Add"):
            methods.append("relu_plus")
        methods.append("fresh")
        how = self.choice(methods)
        c_lo = max(need, 0.25)
        if how == "square_plus":
            t = self.tame(x, 5.0)
            sq = self.op("Mul", [t, t], t.shape, 0.0 if t.lo < 0 < t.hi else min(t.lo**2, t.hi**2),
                         max(t.lo**2, t.hi**2), t.flat)
            return self._add_positive_const(sq, c_lo)
        if how == "sigmoid_plus":
            s = self.op("Sigmoid", [x], x.shape, _sigmoid(x.lo), _sigmoid(x.hi), x.flat)
            return self._add_positive_const(s, c_lo)
        if how == "sigmoid":
            return self.op("Sigmoid", [x], x.shape, _sigmoid(x.lo), _sigmoid(x.hi), x.flat)
        if how == "exp_tanh":
            t = self.op("Tanh", [x], x.shape, math.tanh(x.lo), math.tanh(x.hi), x.flat)
            return self.op("Exp", [t], t.shape, math.exp(t.lo), math.exp(t.hi), t.flat)
        if how == "relu_plus":
            r = self.op("Relu", [x], x.shape, max(x.lo, 0.0), max(x.hi, 0.0), x.flat)
            return self._add_positive_const(r, c_lo)
        return self.new_input(x.shape, max(need, 0.5), INPUT_RANGE)

    def _add_positive_const(self, x: _Val, c_lo: float) -> _Val:
        c = self.const(self.floats(self.operand_shape(x.shape, grow=False), c_lo,
                                   max(2.0, c_lo * 2)))
        out = _broadcast(x.shape, c.shape)
        ins = [x, c] if self.flip() else [c, x]
        return self.op("Add", ins, out, x.lo + c.lo, x.hi + c.hi, _flat_elementwise(out, [x, c]))

    # ---- families ------------------------------------------------------------------------------
    # Each draws its operands, emits one or more nodes, and returns False if it could not apply.

    def f_unary(self, op: str | None = None) -> bool:
        ops = [o for o in ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "LeakyRelu", "Erf", "Exp",
                           "HardSigmoid", "HardSwish", "Clip", "Gelu", "Sqrt", "Log",
                           "Reciprocal") if self.allowed(o)]
        if op is None:
            if not ops:
                return False
            op = self.choice(ops)
        x = self.pick_any()
        self.unary(op, x)
        return True

    def unary(self, op: str, x: _Val) -> _Val:
        lo, hi = x.lo, x.hi
        attrs: dict[str, Any] = {}
        ins: list = [x]
        if op == "Relu":
            nlo, nhi = max(lo, 0.0), max(hi, 0.0)
        elif op == "LeakyRelu":
            alpha = self.choice([None, 0.1, 0.2, 0.01, 0.5])
            a = 0.01 if alpha is None else alpha
            attrs["alpha"] = alpha
            nlo, nhi = (lo if lo >= 0 else a * lo), (hi if hi >= 0 else a * hi)
        elif op == "Sigmoid":
            nlo, nhi = _sigmoid(lo), _sigmoid(hi)
        elif op == "Tanh":
            nlo, nhi = math.tanh(lo), math.tanh(hi)
        elif op == "Erf":
            nlo, nhi = _erf(lo), _erf(hi)
        elif op == "Neg":
            nlo, nhi = -hi, -lo
        elif op == "Abs":
            nlo = 0.0 if lo < 0 < hi else min(abs(lo), abs(hi))
            nhi = max(abs(lo), abs(hi))
        elif op == "Exp":
            x = self.tame(x, 4.0)
            ins = [x]
            nlo, nhi = math.exp(x.lo), math.exp(x.hi)
        elif op == "HardSigmoid":
            alpha, beta = self.choice([(None, None), (1 / 6, 0.5), (0.5, 0.5), (0.2, 0.6)])
            attrs.update(alpha=alpha, beta=beta)
            a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
            nlo, nhi = min(max(a * lo + b, 0.0), 1.0), min(max(a * hi + b, 0.0), 1.0)
        elif op == "HardSwish":
            nlo, nhi = (-0.375 if lo < 0 else 0.0), max(hi, 0.0)
        elif op == "Gelu":
            attrs["approximate"] = self.choice([None, "tanh", "none"])
            nlo, nhi = (-0.18 if lo < 0 else 0.0), max(hi, 0.0)
        elif op == "Clip":
            cmin = self.choice([0.0, None, -1.0, -0.5, -2.0])
            cmax = self.choice([6.0, None, 1.0, 0.5, 2.0])
            ins = [x, None if cmin is None else self.scalar(cmin, rank1=False),
                   None if cmax is None else self.scalar(cmax, rank1=False)]
            nlo = lo if cmin is None else min(max(lo, cmin), cmax if cmax is not None else 1e9)
            nhi = hi if cmax is None else max(min(hi, cmax), cmin if cmin is not None else -1e9)
            nlo, nhi = min(nlo, nhi), max(nlo, nhi)
        elif op == "Sqrt":
            x = self.positive(x, 0.01)
            ins = [x]
            nlo, nhi = math.sqrt(x.lo), math.sqrt(x.hi)
        elif op == "Log":
            x = self.positive(x, 0.1)
            ins = [x]
            nlo, nhi = math.log(x.lo), math.log(x.hi)
        elif op == "Reciprocal":
            x = self.positive(x, 0.1)
            if self.flip(0.3) and self.allowed("Neg"):
                x = self.op("Neg", [x], x.shape, -x.hi, -x.lo, x.flat)
            ins = [x]
            nlo, nhi = 1.0 / x.hi, 1.0 / x.lo
        else:
            raise AssertionError(op)
        return self.op(op, ins, x.shape, nlo, nhi, x.flat, **attrs)

    def f_binary(self, op: str | None = None) -> bool:
        ops = [o for o in ("Add", "Mul", "Sub", "Div", "Pow") if self.allowed(o)]
        if op is None:
            if not ops:
                return False
            op = self.choice(ops)
        a = self.pick_any()
        if op == "Pow":
            self.power(a)
            return True
        away = 0.5 if op == "Div" else 0.0
        b = self.operand_for(a, away=away, allow_self=op != "Div")
        first, second = (a, b) if self.flip(0.7) else (b, a)
        if op == "Div" and not (second.lo >= 0.25 or second.hi <= -0.25):
            second = self.positive(second, 0.25)
            if self.flip(0.3) and self.allowed("Neg"):
                second = self.op("Neg", [second], second.shape, -second.hi, -second.lo,
                                 second.flat)
        self.binary(op, first, second)
        return True

    def binary(self, op: str, a: _Val, b: _Val) -> _Val:
        same = a is b
        for _ in range(2):
            lo, hi = self._binary_interval(op, a, b, same)
            if max(abs(lo), abs(hi)) <= BOUND:
                break
            # tame the operands; Div keeps its (positive) divisor
            if op in ("Add", "Sub"):
                a = self.tame(a, BOUND / 2 - 1)
                b = a if same else self.tame(b, BOUND / 2 - 1)
            elif op == "Mul":
                a = self.tame(a, math.sqrt(BOUND) - 0.5)
                b = a if same else self.tame(b, math.sqrt(BOUND) - 0.5)
            else:   # Div: |b| >= 0.25
                a = self.tame(a, BOUND * 0.2)
        lo, hi = self._binary_interval(op, a, b, same)
        out = _broadcast(a.shape, b.shape)
        return self.op(op, [a, b], out, lo, hi, _flat_elementwise(out, [a, b]))

    @staticmethod
    def _binary_interval(op, a, b, same):
        if op == "Add":
            return a.lo + b.lo, a.hi + b.hi
        if op == "Sub":
            if same:
                return 0.0, 0.0
            return a.lo - b.hi, a.hi - b.lo
        if op == "Mul":
            if same:
                lo = 0.0 if a.lo < 0 < a.hi else min(a.lo**2, a.hi**2)
                return lo, max(a.lo**2, a.hi**2)
            p = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
            return min(p), max(p)
        if op == "Div":
            if same:
                return 1.0, 1.0
            inv = [1.0 / b.lo, 1.0 / b.hi]
            p = [a.lo * inv[0], a.lo * inv[1], a.hi * inv[0], a.hi * inv[1]]
            return min(p), max(p)
        raise AssertionError(op)

    def power(self, a: _Val) -> _Val:
        """Pow with a small constant exponent (positive base for fractional or negative ones),
        or, now and then, a positive constant base raised to a bounded tensor."""
        if self.flip(0.15):
            e = self.tame(a, 2.0)
            base = self.const(self.floats(self.operand_shape(e.shape), 0.5, 2.0))
            out = _broadcast(e.shape, base.shape)
            vals = [base.lo ** e.lo, base.lo ** e.hi, base.hi ** e.lo, base.hi ** e.hi]
            return self.op("Pow", [base, e], out, min(vals), max(vals),
                           _flat_elementwise(out, [e, base]))
        p = self.choice([2.0, 0.5, 3.0, 1.5, -1.0, -0.5, 1.0])
        if p in (2.0, 3.0, 1.0):
            a = self.tame(a, BOUND ** (1.0 / p) * 0.9)
            cands = [a.lo ** p, a.hi ** p] + ([0.0] if a.lo < 0 < a.hi else [])
            lo, hi = min(cands), max(cands)
            if p == 2.0:
                lo = max(lo, 0.0)
        else:
            a = self.positive(a, 0.25 if p < 0 else 0.1)
            if p > 0:
                a = self.tame(a, BOUND ** (1.0 / p) * 0.9)
                if a.lo <= 0:         # the taming input may be fresh: keep it positive
                    a = self.positive(a, 0.1)
            lo, hi = sorted([a.lo ** p, a.hi ** p])
        if self.flip(0.2):   # the exponent as a full array of the same value
            y = self.const(np.full(self.operand_shape(a.shape), p, dtype=np.float32), "e")
        else:
            y = self.scalar(p)
        out = _broadcast(a.shape, y.shape)
        return self.op("Pow", [a, y], out, lo, hi, _flat_elementwise(out, [a, y]))

    def f_where(self) -> bool:
        if not self.allowed("Where"):
            return False
        a = self.pick_any()
        b = self.operand_for(a)
        cshape = self.operand_shape(_broadcast(a.shape, b.shape))
        if self.flip(0.1):
            cond = self.new_input(cshape, 0, 1, dtype="bool")
        else:
            cond = self.const(self.rng().random(size=cshape) < 0.5, "cond")
        x, y = (a, b) if self.flip() else (b, a)
        out = _broadcast(cond.shape, a.shape, b.shape)
        if out is None or _numel(out) > MAX_NUMEL:
            cond = self.const(np.array(True), "cond")
            out = _broadcast(a.shape, b.shape)
        flat = _flat_elementwise(out, [cond, x, y])
        self.op("Where", [cond, x, y], out, min(x.lo, y.lo), max(x.hi, y.hi), flat)
        return True

    def f_sum(self) -> bool:
        if not self.allowed("Sum"):
            return False
        a = self.tame(self.pick_any(), BOUND / 3 - 1)
        parts = [a]
        for _ in range(self.integer(0, 2)):
            b = self.tame(self.operand_for(a), BOUND / 3 - 1)
            out = _broadcast(*[p.shape for p in parts], b.shape)
            if out is not None and _numel(out) <= MAX_NUMEL:
                parts.append(b)
        out = _broadcast(*[p.shape for p in parts])
        self.op("Sum", parts, out, sum(p.lo for p in parts), sum(p.hi for p in parts),
                _flat_elementwise(out, parts))
        return True

    def f_identity(self) -> bool:
        ops = [o for o in ("Identity", "Dropout") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick_any()
        if op == "Identity":
            self.op("Identity", [x], x.shape, x.lo, x.hi, x.flat)
            return True
        form = self.choice(["plain", "ratio", "ratio_training", "mask"])
        ins: list = [x]
        if form in ("ratio", "ratio_training"):
            ins.append(self.const(np.array(self.choice([0.5, 0.1, 0.0]), dtype=np.float32), "r"))
        if form == "ratio_training":
            ins.append(self.const(np.array(False), "t"))
        if form == "mask":   # the optional mask output, declared and left unused
            self.op("Dropout", ins, x.shape, x.lo, x.hi, x.flat)
            self.nodes[-1].output.append(self.fresh("mask"))
            return True
        self.op("Dropout", ins, x.shape, x.lo, x.hi, x.flat)
        return True

    def f_cast(self) -> bool:
        if not self.allowed("Cast"):
            return False
        x = self.pick_any()
        via = self.choice([None, TensorProto.DOUBLE, TensorProto.FLOAT16])
        if via is None:
            self.op("Cast", [x], x.shape, x.lo, x.hi, x.flat, to=TensorProto.FLOAT)
            return True
        mid = self.fresh("cast")
        self.node("Cast", [x], [mid], to=via)
        self.op("Cast", [mid], x.shape, x.lo - 0.05, x.hi + 0.05, x.flat, to=TensorProto.FLOAT)
        return True

    def f_opaque(self) -> bool:
        ops = [o for o in ("Softplus", "Sin", "Max", "Min") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick_any()
        if op == "Softplus":
            sp = lambda v: math.log1p(math.exp(-abs(v))) + max(v, 0.0)   # noqa: E731
            self.op("Softplus", [x], x.shape, sp(x.lo), sp(x.hi), x.flat)
        elif op == "Sin":
            self.op("Sin", [x], x.shape, -1.0, 1.0, x.flat)
        else:
            b = self.operand_for(x)
            out = _broadcast(x.shape, b.shape)
            f = max if op == "Max" else min
            self.op(op, [x, b], out, f(x.lo, b.lo), f(x.hi, b.hi), _flat_elementwise(out, [x, b]))
        return True

    def f_pattern(self) -> bool:
        patterns = []
        if self.allowed("Sigmoid", "Mul"):
            patterns.append("swish")
        if self.allowed("Div", "Erf", "Add", "Mul"):
            patterns.append("gelu_erf")
        if self.allowed("Mul", "Pow", "Add", "Tanh"):
            patterns.append("gelu_tanh")
        if self.allowed("Add", "Clip", "Mul", "Div"):
            patterns.append("hardswish")
        if self.allowed("Add", "Relu"):
            patterns.append("bias_relu")
        if self.allowed("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"):
            patterns.append("layernorm")
        if self.allowed("Exp", "ReduceSum", "Div"):
            patterns.append("softmax")
        if not patterns:
            return False
        which = self.choice(patterns)
        if which in ("layernorm", "softmax"):
            x = self.pick_any(lambda v: v.rank >= 1 and v.shape[-1] >= 2, min_rank=1)
            if x.rank == 0 or x.shape[-1] < 2:
                return False
            return self.decomposed_norm(x, which)
        x = self.pick_any()
        f = x.flat

        def sc(value: float, rank1: bool | None = None) -> _Val:
            return self.scalar(value, rank1, like=x)
        if which == "swish":
            s = self.op("Sigmoid", [x], x.shape, _sigmoid(x.lo), _sigmoid(x.hi), f)
            ins = [x, s] if self.flip(0.7) else [s, x]
            self.op("Mul", ins, x.shape, -0.2785 if x.lo < 0 else 0.0, max(x.hi, 0.0), f)
        elif which == "gelu_erf":
            r2 = 1.4142135
            if self.flip(0.5):
                d = self.op("Div", [x, sc(r2)], x.shape, x.lo / r2, x.hi / r2, f)
            else:
                d = self.op("Mul", [x, sc(1 / r2)], x.shape, x.lo / r2, x.hi / r2, f)
            e = self.op("Erf", [d], x.shape, _erf(d.lo), _erf(d.hi), f)
            p = self.op("Add", [e, sc(1.0)], x.shape, e.lo + 1, e.hi + 1, f)
            m = self.op("Mul", [x, p], x.shape, min(0.0, 2 * x.lo), max(0.0, 2 * x.hi), f)
            self.op("Mul", [m, sc(0.5)], x.shape, -0.18 if x.lo < 0 else 0.0, max(x.hi, 0.0), f)
        elif which == "gelu_tanh":
            x = self.tame(x, 3.0)
            f = x.flat
            c = self.op("Pow", [x, sc(3.0)], x.shape, x.lo**3, x.hi**3, f)
            k1, k2 = 0.044715, 0.7978846
            c2 = self.op("Mul", [c, sc(k1)], x.shape, c.lo * k1, c.hi * k1, f)
            s = self.op("Add", [x, c2], x.shape, x.lo + c2.lo, x.hi + c2.hi, f)
            s2 = self.op("Mul", [s, sc(k2)], x.shape, s.lo * k2, s.hi * k2, f)
            t = self.op("Tanh", [s2], x.shape, math.tanh(s2.lo), math.tanh(s2.hi), f)
            p = self.op("Add", [t, sc(1.0)], x.shape, t.lo + 1, t.hi + 1, f)
            h = self.op("Mul", [x, sc(0.5)], x.shape, x.lo * 0.5, x.hi * 0.5, f)
            self.op("Mul", [h, p], x.shape, min(0.0, 2 * h.lo), max(0.0, 2 * h.hi), f)
        elif which == "hardswish":
            a = self.op("Add", [x, sc(3.0)], x.shape, x.lo + 3, x.hi + 3, f)
            c = self.op("Clip", [a, sc(0.0, False), sc(6.0, False)], x.shape,
                        min(max(a.lo, 0), 6), min(max(a.hi, 0), 6), f)
            m = self.op("Mul", [x, c], x.shape, min(0.0, 6 * x.lo), max(0.0, 6 * x.hi), f)
            self.op("Div", [m, sc(6.0)], x.shape, m.lo / 6, m.hi / 6, f)
        else:  # bias_relu
            c = self.const(self.floats(self.operand_shape(x.shape), -1.0, 1.0))
            out = _broadcast(x.shape, c.shape)
            s = self.op("Add", [x, c], out, x.lo + c.lo, x.hi + c.hi,
                        _flat_elementwise(out, [x, c]))
            self.op("Relu", [s], out, max(s.lo, 0), max(s.hi, 0), s.flat)
        return True

    def decomposed_norm(self, x: _Val, which: str) -> bool:
        """LayerNorm or Softmax over the last axis written out op by op, as older exporters do."""
        r = x.rank
        n = x.shape[-1]
        if which == "softmax":
            x = self.tame(x, 4.0)
            e = self.op("Exp", [x], x.shape, math.exp(x.lo), math.exp(x.hi), x.flat)
            s = self.reduce("ReduceSum", e, [r - 1], 1, register=False, tame=False)
            self.op("Div", [e, s], x.shape, e.lo / s.hi, 1.0, x.flat)
            return True
        if (r - 1) in x.flat or n < 2:
            return False
        x = self.tame(x, 8.0)
        if (r - 1) in x.flat:
            return False
        m = self.reduce("ReduceMean", x, [r - 1], 1, register=False)
        d = self.op("Sub", [x, m], x.shape, x.lo - x.hi, x.hi - x.lo, x.flat, register=False)
        sq = self.op("Mul", [d, d], x.shape, 0.0, max(d.lo**2, d.hi**2), x.flat, register=False)
        var = self.reduce("ReduceMean", sq, [r - 1], 1, register=False)
        eps = self.scalar(self.choice([1e-5, 1e-3]), rank1=False)
        ve = self.op("Add", [var, eps], var.shape, var.lo + 1e-5, var.hi + 1e-3, var.flat,
                     register=False)
        sd = self.op("Sqrt", [ve], var.shape, math.sqrt(ve.lo), math.sqrt(ve.hi), var.flat,
                     register=False)
        b = math.sqrt(n)
        y = self.op("Div", [d, sd], x.shape, -b, b, x.flat)
        if self.flip(0.7):
            g = self.const(self.floats((n,), 0.5, 1.5), "gamma")
            y = self.op("Mul", [y, g], x.shape, -b * g.hi, b * g.hi, x.flat)
            beta = self.const(self.floats((n,), -0.5, 0.5), "beta")
            self.op("Add", [y, beta], x.shape, y.lo + beta.lo, y.hi + beta.hi, x.flat)
        return True

    def f_const_subgraph(self) -> bool:
        """A constant computed by nodes that read only initializers, then applied to a value."""
        if not self.allowed("Mul", "Add"):
            return False
        x = self.pick_any()
        shape = self.operand_shape(x.shape)
        kind = self.choice(["bn_scale", "mul_add", "reshape", "neg"])
        if kind == "bn_scale" and self.allowed("Sqrt", "Div"):
            s = self.const(self.floats(shape, 0.5, 1.5), "scale")
            v = self.const(self.floats(shape, 0.5, 1.5), "var")
            ve = self.op("Add", [v, self.scalar(1e-5, like=s)], shape, v.lo, v.hi + 1e-5,
                         register=False)
            sd = self.op("Sqrt", [ve], shape, math.sqrt(ve.lo), math.sqrt(ve.hi), register=False)
            c = self.op("Div", [s, sd], shape, s.lo / sd.hi, s.hi / sd.lo, register=False)
            self.binary("Mul", x, c)
        elif kind == "reshape" and self.allowed("Reshape") and len(shape) >= 1:
            flat = self.const(self.floats((_numel(shape),), -1.0, 1.0), "cflat")
            c = self.op("Reshape", [flat, self.ints(shape)], shape, flat.lo, flat.hi,
                        register=False)
            self.binary("Add", x, c)
        elif kind == "neg" and self.allowed("Neg"):
            c0 = self.const(self.floats(shape, -1.0, 1.0))
            c = self.op("Neg", [c0], shape, -c0.hi, -c0.lo, register=False)
            self.binary("Add" if self.flip() else "Mul", x, c)
        else:
            c1 = self.const(self.floats(shape, -1.0, 1.0))
            c2 = self.const(self.floats(shape, -1.0, 1.0))
            m = self.op("Mul", [c1, c2], shape, -1.0, 1.0, register=False)
            c3 = self.const(self.floats(shape, -1.0, 1.0))
            c = self.op("Add", [m, c3], shape, -2.0, 2.0, register=False)
            self.binary("Mul" if self.flip() else "Add", x, c)
        return True

    # -- contractions
    def f_conv(self, bn: bool | None = None, act: str | bool | None = None,
               residual: bool | None = None, spatial: int | None = None) -> bool:
        if not (self.allow_conv and self.allowed("Conv")):
            return False
        sp = spatial if spatial is not None else self.choice([2, 1])

        def ok(v):
            if v.rank != sp + 2 or v.shape[1] > 16:
                return False
            return v.shape[0] * _numel(v.shape[2:]) <= 144 and max(v.shape[2:]) <= 24

        def make():
            n = self.integer(1, 2)
            c = self.integer(1, 8)
            if sp == 2:
                dims = [self.integer(1, 10), self.integer(1, 10)]
            else:
                dims = [self.integer(1, 24)]
            while n * _numel(dims) > 144:
                i = int(np.argmax(dims))
                dims[i] = max(1, dims[i] // 2)
            return self.new_input((n, c, *dims))
        x = self.pick(ok, make, p_new=0.15)
        before = set(map(id, self.values))
        y = self.conv(x)
        y = self.epilogue(y, bn=bn, act=act, residual=residual, before=before)
        return True

    def conv(self, x: _Val) -> _Val:
        n, c = x.shape[:2]
        in_sp = list(x.shape[2:])
        sp = len(in_sp)
        groups = [1] + ([c] if c > 1 else []) + [d for d in _divisors(c) if 1 < d < c]
        g = self.choice(groups)
        auto_pad = self.choice(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER",
                                "VALID"])
        kernel, strides, dils, pb, pe, out_sp = [], [], [], [], [], []
        for size in in_sp:
            s = self.choice([1, 2])
            # onnxruntime refuses dilations with auto_pad SAME_*
            d = self.choice([1, 2]) if not auto_pad.startswith("SAME") else 1
            if auto_pad == "NOTSET":
                lo_pad, hi_pad = self.integer(0, 2), self.integer(0, 2)
            else:
                lo_pad = hi_pad = 0
            ks = [k for k in (1, 3, 2, 5) if (c // g <= 4 or k < 5)]
            if auto_pad in ("NOTSET", "VALID"):
                room = size + lo_pad + hi_pad
                ks = [k for k in ks if (k - 1) * d + 1 <= room] or [1]
            k = self.choice(ks)
            eff = (k - 1) * d + 1
            if auto_pad == "NOTSET":
                lo_pad, hi_pad = min(lo_pad, eff - 1), min(hi_pad, eff - 1)
                if size + lo_pad + hi_pad < eff:
                    d = 1
                    eff = k
                o = (size + lo_pad + hi_pad - eff) // s + 1
            elif auto_pad == "VALID":
                if size < eff:
                    d, k, eff = 1, 1, 1
                o = (size - eff) // s + 1
            else:
                o = -(-size // s)
            kernel.append(k), strides.append(s), dils.append(d), out_sp.append(o)
            pb.append(lo_pad), pe.append(hi_pad)
        per_channel = n * _numel(out_sp)
        cout_max = max(1, MAX_NUMEL // per_channel)
        if g > cout_max:
            g = 1
        if g == c and c > 1:
            mults = [m for m in (1, 2) if g * m <= cout_max] or [1]
        else:
            mults = [m for m in range(1, 17) if g * m <= min(16, cout_max)] or [1]
        cout = g * self.choice(mults)
        fan_in = (c // g) * _numel(kernel)
        rng = self.rng()
        w = rng.standard_normal((cout, c // g, *kernel)) / math.sqrt(fan_in)
        has_bias = self.flip(0.6)
        b = rng.normal(0, 0.3, cout) if has_bias else np.zeros(cout)
        xb = x.bound
        m = np.abs(w).reshape(cout, -1).sum(1) * xb + np.abs(b)
        if m.max() > 16:
            w *= (16 - np.abs(b).max()) / (np.abs(w).reshape(cout, -1).sum(1).max() * xb)
            m = np.abs(w).reshape(cout, -1).sum(1) * xb + np.abs(b)
        wv = self.const(w.astype(np.float32), "w", node_ok=False)
        bv = self.const(b.astype(np.float32), "b", node_ok=False) if has_bias else None
        attrs: dict[str, Any] = {}
        if self.flip(0.3):
            attrs["kernel_shape"] = kernel
        if auto_pad == "NOTSET":
            if any(pb) or any(pe) or self.flip(0.3):
                attrs["pads"] = pb + pe
        else:
            attrs["auto_pad"] = auto_pad
        if any(s != 1 for s in strides) or self.flip(0.2):
            attrs["strides"] = strides
        if any(d != 1 for d in dils) or self.flip(0.2):
            attrs["dilations"] = dils
        if g != 1 or self.flip(0.2):
            attrs["group"] = g
        flat = frozenset(a for a in x.flat if a != 1)
        bound = float(m.max())
        return self.op("Conv", [x, wv, bv], (n, cout, *out_sp), -bound, bound, flat, **attrs)

    def batchnorm(self, x: _Val) -> _Val:
        c = x.shape[1]
        rng = self.rng()
        scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
        if self.flip(0.2):
            scale *= np.where(rng.random(c) < 0.5, -1, 1).astype(np.float32)
        beta = rng.normal(0, 0.3, c).astype(np.float32)
        mean = rng.normal(0, 0.3, c).astype(np.float32)
        var = rng.uniform(0.5, 2.0, c).astype(np.float32)
        eps = self.choice([None, 1e-3, 1e-5])
        k = scale / np.sqrt(var + (1e-5 if eps is None else eps))
        ends = np.stack([(x.lo - mean) * k + beta, (x.hi - mean) * k + beta])
        names = [self.const(a, p, node_ok=False) for a, p in
                 ((scale, "bn_s"), (beta, "bn_b"), (mean, "bn_m"), (var, "bn_v"))]
        return self.op("BatchNormalization", [x, *names], x.shape, float(ends.min()),
                       float(ends.max()), x.flat, epsilon=eps,
                       momentum=self.choice([None, 0.9]))

    def activation(self, y: _Val, act: str | None = None) -> _Val:
        acts = [a for a in _ACTIVATIONS
                if (a == "Swish" and self.allowed("Sigmoid", "Mul")) or self.allowed(a)]
        if act is None:
            if not acts:
                return y
            act = self.choice(acts)
        if act == "Swish":
            s = self.op("Sigmoid", [y], y.shape, _sigmoid(y.lo), _sigmoid(y.hi), y.flat)
            return self.op("Mul", [y, s], y.shape, -0.2785 if y.lo < 0 else 0.0, max(y.hi, 0.0),
                           y.flat)
        return self.unary(act, y)

    def epilogue(self, y: _Val, bn=None, act=None, residual=None,
                 before: set[int] | None = None) -> _Val:
        """Optional BatchNormalization, activation, residual Add (and activation after it).
        The residual is a value of y's shape from `before` the block (ids), or a new input."""
        if (bn is None and self.allowed("BatchNormalization") and y.rank >= 2 and self.flip(0.5)) \
                or bn:
            y = self.batchnorm(y)
        if act is None:
            if self.flip(0.6):
                y = self.activation(y)
        elif act:
            y = self.activation(y, None if act is True else act)
        if (residual is None and self.allowed("Add") and self.flip(0.3)) or residual:
            def ok(v):
                return ((before is None or id(v) in before) and v is not y
                        and _broadcast(v.shape, y.shape) == y.shape)
            other = self.pick(ok, lambda: self.new_input(y.shape), p_new=0.3)
            other = self.tame(other, 16.0)
            ins = [y, other] if self.flip(0.6) else [other, y]
            y = self.binary("Add", *ins)
            if act is None and self.flip(0.5):
                y = self.activation(y)
        return y

    def f_pool(self) -> bool:
        if not self.allow_conv:
            return False
        ops = [o for o in ("MaxPool", "AveragePool", "GlobalAveragePool") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick(lambda v: v.rank in (3, 4) and v.numel <= MAX_NUMEL,
                      lambda: self.new_input((self.integer(1, 2), self.integer(1, 6),
                                              self.integer(2, 8), self.integer(2, 8))))
        if op == "GlobalAveragePool":
            flat = frozenset(a for a in x.flat if a == 0)
            self.op(op, [x], x.shape[:2] + (1,) * (x.rank - 2), x.lo, x.hi, flat)
            return True
        kernel, strides, pads_b, pads_e, dils, out_sp = [], [], [], [], [], []
        for size in x.shape[2:]:
            k = self.choice([2, 3, 1])
            s = self.choice([1, 2])
            d = self.choice([1, 2]) if op == "MaxPool" else 1
            pmax = k - 1 if d == 1 else min(k - 1, 1)
            pb, pe = self.integer(0, pmax), self.integer(0, pmax)
            eff = (k - 1) * d + 1
            if size + pb + pe < eff:
                k, d, eff, pb, pe = 1, 1, 1, 0, 0
            kernel.append(k), strides.append(s), dils.append(d), pads_b.append(pb)
            pads_e.append(pe), out_sp.append((size + pb + pe - eff) // s + 1)
        attrs: dict[str, Any] = dict(kernel_shape=kernel)
        if any(s != 1 for s in strides) or self.flip(0.2):
            attrs["strides"] = strides
        if any(pads_b) or any(pads_e):
            attrs["pads"] = pads_b + pads_e
        lo, hi = x.lo, x.hi
        if op == "MaxPool" and (any(d != 1 for d in dils) or self.flip(0.2)):
            attrs["dilations"] = dils
        if op == "AveragePool":
            cip = self.choice([None, 1, 0])
            attrs["count_include_pad"] = cip
            if cip == 1 and attrs.get("pads"):
                lo, hi = min(lo, 0.0), max(hi, 0.0)
        flat = frozenset(a for a in x.flat if a != 1)
        self.op(op, [x], x.shape[:2] + tuple(out_sp), lo, hi, flat, **attrs)
        return True

    def f_matmul(self, bias: bool | None = None, act: bool | str | None = None) -> bool:
        if not (self.allow_matmul and self.allowed("MatMul")):
            return False
        variant = self.choice(["weight", "weight", "activation", "vector"])

        def ok(v):
            return 1 <= v.rank <= 4 and v.shape[-1] <= 64 and v.numel <= 2048

        def make():
            k = self.integer(1, 32)
            lead = [self.integer(1, 8)] + ([self.integer(1, 3)] if self.flip(0.3) else [])
            return self.new_input((*lead[::-1], k))
        a = self.pick(ok, make, p_new=0.15)
        k = a.shape[-1]
        if variant == "activation" and a.rank >= 2:
            a = self.tame(a, min(INPUT_RANGE, math.sqrt(16.0 / k)))
            if self.allow_shapes and self.allowed("Transpose") and self.flip(0.6):   # a @ a^T
                perm = list(range(a.rank))
                perm[-1], perm[-2] = perm[-2], perm[-1]
                bshape = tuple(a.shape[p] for p in perm)
                flat = frozenset(i for i, p in enumerate(perm) if p in a.flat)
                b = self.op("Transpose", [a], bshape, a.lo, a.hi, flat, perm=perm)
            else:
                nn = self.integer(1, 8)
                lim = min(INPUT_RANGE, math.sqrt(16.0 / k))
                b = self.new_input(a.shape[:-2] + (k, nn), -lim, lim)
            out = _broadcast(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
            if _numel(out) > MAX_NUMEL:
                return False
            bound = k * a.bound * b.bound
            flat = frozenset(i for i in range(len(out) - 2) if i in a.flat and i in b.flat)
            y = self.op("MatMul", [a, b], out, -bound, bound, flat)
        else:
            vector_lhs = variant == "vector" and self.flip()
            if vector_lhs and a.rank != 1:
                a = self.new_input((k,)) if self.flip(0.5) else a
            n_out = self.integer(1, 16)
            vector_rhs = variant == "vector" and not vector_lhs
            rng = self.rng()
            if vector_rhs:
                wshape: tuple[int, ...] = (k,)
            elif a.rank >= 3 and self.flip(0.25):
                wshape = (self.choice([a.shape[-3], 1]), k, n_out)
            elif a.rank == 2 and self.flip(0.1):
                wshape = (2, k, n_out)
            else:
                wshape = (k, n_out)
            w = rng.standard_normal(wshape) / math.sqrt(k)
            colsum = np.abs(w).sum(axis=-2 if len(wshape) >= 2 else 0).max()
            if colsum * a.bound > 16:
                w *= 16 / (colsum * a.bound)
                colsum = np.abs(w).sum(axis=-2 if len(wshape) >= 2 else 0).max()
            if a.rank == 1 and len(wshape) == 1:
                out: tuple[int, ...] = ()
            elif a.rank == 1:
                out = wshape[:-2] + (wshape[-1],)
            elif len(wshape) == 1:
                out = a.shape[:-1]
            else:
                out = _broadcast(a.shape[:-2], wshape[:-2]) + (a.shape[-2], wshape[-1])
            if _numel(out) > MAX_NUMEL:
                return False
            wv = self.const(w.astype(np.float32), "w", node_ok=False)
            bound = float(colsum * a.bound)
            if a.rank >= 2 and len(wshape) >= 2:
                off = len(out) - a.rank
                flat = frozenset(i + off for i in a.flat if i < a.rank - 1)
            elif a.rank >= 2:
                flat = frozenset(i for i in a.flat if i < a.rank - 1)
            else:
                flat = frozenset()
            ins = [a, wv]
            y = self.op("MatMul", ins, out, -bound, bound, flat)
        if y.rank >= 1 and self.allowed("Add") and ((bias is None and self.flip(0.5)) or bias):
            c = self.const(self.floats((y.shape[-1],), -0.5, 0.5), "bias")
            y = self.binary("Add", *((y, c) if self.flip(0.8) else (c, y)))
        if (act is None and self.flip(0.4)) or act:
            y = self.activation(y, None if act in (None, True) else act)
        return True

    def f_gemm(self, bias: bool | None = None, act: bool | str | None = None) -> bool:
        if not (self.allow_matmul and self.allowed("Gemm")):
            return False

        def make():
            return self.new_input((self.integer(1, 8), self.integer(1, 32)))
        a = self.pick(lambda v: v.rank == 2 and max(v.shape) <= 64, make, p_new=0.2)
        if a.rank != 2:
            return False
        trans_a = self.flip(0.25)
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        n_out = self.integer(1, 16)
        trans_b = self.flip(0.5)
        rng = self.rng()
        w = rng.standard_normal((k, n_out)) / math.sqrt(k)
        alpha = self.choice([None, 0.5, 2.0, -1.0])
        beta = self.choice([None, 0.5, -1.0])
        al = 1.0 if alpha is None else alpha
        be = 1.0 if beta is None else beta
        colsum = np.abs(w).sum(0).max()
        if abs(al) * colsum * a.bound > 16:
            w *= 16 / (abs(al) * colsum * a.bound)
            colsum = np.abs(w).sum(0).max()
        wv = self.const((w.T if trans_b else w).astype(np.float32), "w", node_ok=False)
        cshape = self.choice([None, (n_out,), (1, n_out), (m, n_out), (m, 1), (), (1,)])
        if (bias is True and cshape is None) or bias is False:
            cshape = (n_out,) if bias else None
        cv = None if cshape is None else self.const(self.floats(cshape, -0.5, 0.5), "gc")
        bound = float(abs(al) * colsum * a.bound + (abs(be) * 0.5 if cv is not None else 0))
        flat = frozenset()
        if (1 if trans_a else 0) in a.flat and (cv is None or len(cshape) < 2 or cshape[0] == 1):
            flat = frozenset({0})
        y = self.op("Gemm", [a, wv, cv], (m, n_out), -bound, bound, flat,
                    alpha=alpha, beta=beta, transA=1 if trans_a else None,
                    transB=1 if trans_b else None)
        if (act is None and self.flip(0.4)) or act:
            self.activation(y, None if act in (None, True) else act)
        return True

    # -- row kernels
    def f_softmax(self) -> bool:
        if not self.allowed("Softmax"):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.choice([None] + list(range(-x.rank, x.rank)))
        ax = (-1 if axis is None else axis) % x.rank
        n = x.shape[ax]
        lo = math.exp(-(x.hi - x.lo)) / n if x.hi - x.lo < 700 else 0.0
        self.op("Softmax", [x], x.shape, lo, 1.0, x.flat, axis=axis)
        return True

    def f_layernorm(self) -> bool:
        if not self.allowed("LayerNormalization"):
            return False

        def axes_ok(v):
            return [a for a in range(v.rank)
                    if 2 <= _numel(v.shape[a:]) <= 512
                    and not any(i in v.flat for i in range(a, v.rank))]
        x = self.pick_any(lambda v: bool(axes_ok(v)), min_rank=1)
        x = self.tame(x, 5.0)
        axes = axes_ok(x)
        if not axes:
            return False
        a = self.choice(axes)
        axis_attr = self.choice([a, a - x.rank, None]) if a == x.rank - 1 else \
            self.choice([a, a - x.rank])
        nshape = x.shape[a:]
        scale = self.const(self.floats(nshape, 0.5, 1.5), "ln_g", node_ok=False)
        bias = self.const(self.floats(nshape, -0.5, 0.5), "ln_b", node_ok=False) \
            if self.flip(0.7) else None
        eps = self.choice([None, 1e-3, 1e-5])
        b = math.sqrt(_numel(nshape)) * scale.hi + (0.5 if bias is not None else 0.0)
        flat = frozenset(i for i in x.flat if i < a)
        self.op("LayerNormalization", [x, scale, bias], x.shape, -b, b, flat,
                axis=axis_attr, epsilon=eps)
        return True

    def f_batchnorm(self) -> bool:
        if not self.allowed("BatchNormalization"):
            return False
        x = self.pick_any(lambda v: v.shape[1] <= 64, min_rank=2)
        self.batchnorm(self.tame(x, BOUND / 2.5))
        return True

    def f_reduce(self) -> bool:
        ops = [o for o in ("ReduceMean", "ReduceSum") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick_any(min_rank=1)
        axes = [a for a in range(x.rank) if self.flip(0.4)] or [self.integer(0, x.rank - 1)]
        if _numel([x.shape[a] for a in axes]) > 256:
            axes = [min(axes, key=lambda a: x.shape[a])]
            if x.shape[axes[0]] > 256:
                return False
        keep = self.choice([None, 0, 1])
        form = self.choice(["axes", "all", "noop"]) if self.flip(0.2) else "axes"
        self.reduce(op, x, axes, keep, form=form)
        return True

    def reduce(self, op: str, x: _Val, axes: list[int], keepdims, form: str = "axes",
               register: bool = True, tame: bool = True) -> _Val:
        r = x.rank
        if form != "axes":
            axes = list(range(r))
        count = _numel([x.shape[a] for a in axes])
        if tame and op == "ReduceSum" and count * x.bound > 2 * BOUND:
            x = self.tame(x, 2 * BOUND / count)
        keep = 1 if keepdims is None else keepdims
        attrs: dict[str, Any] = {"keepdims": keepdims}
        ins: list = [x]
        if form == "axes":
            written = [a - r if self.flip(0.3) else a for a in axes]
            if self.flip(0.2):
                written = written[::-1]
            if op == "ReduceMean" and self.opset < 18:
                attrs["axes"] = written
            else:
                ins.append(self.ints(written, "axes"))
        elif form == "noop":
            attrs["noop_with_empty_axes"] = 1
            if op == "ReduceMean" and self.opset < 18:
                attrs["noop_with_empty_axes"] = None     # attribute form: no such attribute
            else:
                axes = []
        if not axes:   # noop_with_empty_axes=1 and no axes: Identity
            return self.op(op, ins, x.shape, x.lo, x.hi, x.flat, register=register, **attrs)
        if keep:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            flat = frozenset(i for i in x.flat if i not in axes)
        else:
            kept = [i for i in range(r) if i not in axes]
            shape = tuple(x.shape[i] for i in kept)
            flat = frozenset(j for j, i in enumerate(kept) if i in x.flat)
        lo, hi = (x.lo, x.hi) if op == "ReduceMean" else (x.lo * count, x.hi * count)
        return self.op(op, ins, shape, lo, hi, flat, register=register, **attrs)

    # -- views and data movement
    def f_transpose(self) -> bool:
        if not (self.allow_shapes and self.allowed("Transpose")):
            return False
        x = self.pick_any(min_rank=2)
        if self.flip(0.15):
            perm, written = list(range(x.rank))[::-1], None
        else:
            perm = list(self.draw(st.permutations(range(x.rank))))
            written = perm
        flat = frozenset(i for i, p in enumerate(perm) if p in x.flat)
        self.op("Transpose", [x], tuple(x.shape[p] for p in perm), x.lo, x.hi, flat,
                perm=written)
        return True

    def _view_flat(self, x: _Val, out_rank: int) -> frozenset:
        return frozenset(range(out_rank)) if x.flat else frozenset()

    def f_reshape(self) -> bool:
        if not (self.allow_shapes and self.allowed("Reshape")):
            return False
        x = self.pick_any()
        n = x.numel
        rank = self.choice([2, 1, 3, 4] + ([0] if n == 1 else []))
        dims, rest = [], n
        for _ in range(max(rank - 1, 0)):
            d = self.choice(_divisors(rest))
            dims.append(d)
            rest //= d
        if rank >= 1:
            dims.append(rest)
        if rank >= 1 and _numel(dims) != n:
            return False
        written = list(dims)
        if rank >= 1 and self.flip(0.4):
            written[self.integer(0, rank - 1)] = -1
        for i in range(min(rank, x.rank)):
            if written[i] == dims[i] == x.shape[i] and self.flip(0.3):
                written[i] = 0
        shape_v = self.ints(written, "shape")
        self.op("Reshape", [x, shape_v], tuple(dims), x.lo, x.hi, self._view_flat(x, rank))
        return True

    def f_flatten(self) -> bool:
        if not (self.allow_shapes and self.allowed("Flatten")):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.choice([None] + list(range(-x.rank, x.rank + 1)))
        a = 1 if axis is None else (axis + x.rank if axis < 0 else axis)
        out = (_numel(x.shape[:a]), _numel(x.shape[a:]))
        self.op("Flatten", [x], out, x.lo, x.hi, self._view_flat(x, 2), axis=axis)
        return True

    def f_unsqueeze(self) -> bool:
        if not (self.allow_shapes and self.allowed("Unsqueeze")):
            return False
        x = self.pick_any(max_rank=4)
        k = self.integer(1, 2)
        out_rank = x.rank + k
        pos = sorted(self.sample(range(out_rank), k))
        written = [p - out_rank if self.flip(0.3) else p for p in pos]
        shape, src, flat = [], 0, set()
        for i in range(out_rank):
            if i in pos:
                shape.append(1)
            else:
                if src in x.flat:
                    flat.add(i)
                shape.append(x.shape[src])
                src += 1
        self.op("Unsqueeze", [x, self.ints(written, "axes")], tuple(shape), x.lo, x.hi, flat)
        return True

    def f_squeeze(self) -> bool:
        if not (self.allow_shapes and self.allowed("Squeeze")):
            return False
        x = self.pick(lambda v: 1 in v.shape)
        if x is None:
            return False
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if self.flip(0.25):
            axes, ins = ones, [x]
        else:
            axes = [i for i in ones if self.flip()] or [self.choice(ones)]
            written = [a - x.rank if self.flip(0.3) else a for a in axes]
            ins = [x, self.ints(written, "axes")]
        kept = [i for i in range(x.rank) if i not in axes]
        flat = frozenset(j for j, i in enumerate(kept) if i in x.flat)
        self.op("Squeeze", ins, tuple(x.shape[i] for i in kept), x.lo, x.hi, flat)
        return True

    def f_concat(self) -> bool:
        if not (self.allow_shapes and self.allowed("Concat")):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.integer(0, x.rank - 1)
        parts = [x]
        for _ in range(self.integer(1, 2)):
            mode = self.choice(["const", "self", "existing", "input"])
            if mode == "self":
                parts.append(x)
                continue
            if mode == "existing":
                def ok(v):
                    return v.rank == x.rank and all(
                        v.shape[i] == x.shape[i] for i in range(x.rank) if i != axis)
                v = self.pick(ok)
                if v is not None:
                    parts.append(v)
                    continue
            shape = list(x.shape)
            shape[axis] = self.integer(1, 4)
            if mode == "input":
                parts.append(self.new_input(shape))
            else:
                parts.append(self.const(self.floats(shape, -2.0, 2.0)))
        shape = list(x.shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        if _numel(shape) > MAX_NUMEL:
            parts = parts[:1] + [x]
            shape[axis] = 2 * x.shape[axis]
            if _numel(shape) > MAX_NUMEL:
                return False
        written = axis - x.rank if self.flip(0.3) else axis
        flat = frozenset().union(*[p.flat for p in parts])
        self.op("Concat", parts, tuple(shape), min(p.lo for p in parts),
                max(p.hi for p in parts), flat, axis=written)
        return True

    def f_slice(self) -> bool:
        if not (self.allow_shapes and self.allowed("Slice")):
            return False
        x = self.pick_any(min_rank=1)
        axes = [a for a in range(x.rank) if self.flip(0.5)] or [self.integer(0, x.rank - 1)]
        if self.flip(0.3):
            axes = axes[::-1]
        starts, ends, steps, shape = [], [], [], list(x.shape)
        for a in axes:
            dim = x.shape[a]
            step = self.choice([1, 2, -1, -2, 3])
            start = self.choice([self.integer(-dim - 2, dim + 2), 0, -1,
                                 INT64_MAX if step < 0 else 0])
            end = self.choice([self.integer(-dim - 2, dim + 2), INT64_MAX, INT64_MIN, -1])
            if step > 0 and end == INT64_MIN:
                end = INT64_MAX
            if step < 0 and end == INT64_MAX:
                end = INT64_MIN
            length = _onnx_slice_len(dim, start, end, step)
            if length == 0:
                start, end = (0, INT64_MAX) if step > 0 else (-1, INT64_MIN)
                length = _onnx_slice_len(dim, start, end, step)
            starts.append(start), ends.append(end), steps.append(step)
            shape[a] = length
        ins = [x, self.ints(starts, "starts"), self.ints(ends, "ends")]
        default_axes = axes == list(range(len(axes)))
        if not default_axes or self.flip(0.5) or any(s != 1 for s in steps):
            ins.append(self.ints([a - x.rank if self.flip(0.3) else a for a in axes], "axes"))
            if any(s != 1 for s in steps) or self.flip(0.3):
                ins.append(self.ints(steps, "steps"))
        self.op("Slice", ins, tuple(shape), x.lo, x.hi, x.flat)
        return True

    def f_split(self) -> bool:
        if not (self.allow_shapes and self.allowed("Split")):
            return False
        x = self.pick(lambda v: any(d >= 2 for d in v.shape))
        if x is None:
            return False
        axis = self.choice([a for a in range(x.rank) if x.shape[a] >= 2])
        dim = x.shape[axis]
        k = self.integer(2, min(3, dim))
        forms = ["sizes"]
        if self.opset < 18 and dim % k == 0:
            forms.append("equal")
        if self.opset >= 18:
            chunk = -(-dim // k)
            if dim - chunk * (k - 1) >= 1:
                forms.append("num_outputs")
        form = self.choice(forms)
        if form == "sizes":
            cuts = sorted(self.sample(range(1, dim), k - 1))
            sizes = [b - a for a, b in zip([0] + cuts, cuts + [dim])]
        elif form == "equal":
            sizes = [dim // k] * k
        else:
            chunk = -(-dim // k)
            sizes = [chunk] * (k - 1) + [dim - chunk * (k - 1)]
        attrs: dict[str, Any] = {"axis": axis - x.rank if self.flip(0.3) else
                                 (None if axis == 0 and self.flip() else axis)}
        ins: list = [x]
        if form == "sizes":
            ins.append(self.ints(sizes, "split"))
        elif form == "num_outputs":
            attrs["num_outputs"] = k
        names = [self.fresh("v") for _ in sizes]
        self.node("Split", ins, names, **attrs)
        for name, size in zip(names, sizes):
            shape = list(x.shape)
            shape[axis] = size
            v = _Val(name, tuple(shape), "float32", x.lo, x.hi,
                     frozenset(a for a in x.flat if shape[a] > 1))
            self.produced.append(v)
            self.values.append(v)
        return True

    def f_gather(self) -> bool:
        if not (self.allow_shapes and self.allowed("Gather")):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.integer(0, x.rank - 1)
        d = x.shape[axis]
        ishape = self.choice([(), (self.integer(1, 4),), (self.integer(1, 3), self.integer(1, 3))])
        out = x.shape[:axis] + tuple(ishape) + x.shape[axis + 1:]
        if _numel(out) > MAX_NUMEL:
            ishape = ()
            out = x.shape[:axis] + x.shape[axis + 1:]
        if self.flip(0.1):
            idx = self.new_input(ishape, -d, d - 1, dtype="int64")
            idx_flat = set(range(axis, axis + len(ishape)))
        else:
            values = self.rng().integers(-d, d, size=ishape).astype(np.int64)
            idx = self.const(values, "idx")
            idx_flat = set(range(axis, axis + len(ishape))) \
                if (len(np.unique(values)) <= 1 or axis in x.flat) else set()
        flat = set(idx_flat)
        for i in x.flat:
            if i < axis:
                flat.add(i)
            elif i > axis:
                flat.add(i - 1 + len(ishape))
        written = axis - x.rank if self.flip(0.3) else (None if axis == 0 and self.flip() else
                                                        axis)
        self.op("Gather", [x, idx], out, x.lo, x.hi, flat, axis=written)
        return True

    def f_pad(self) -> bool:
        if not (self.allow_shapes and self.allowed("Pad")):
            return False
        x = self.pick_any(min_rank=1)
        r = x.rank
        mode = self.choice(["constant", "reflect", "edge"])
        begins, ends = [], []
        for dim in x.shape:
            limit = 2 if mode != "reflect" else min(2, dim - 1)
            lo_allowed = -1 if (mode == "constant" and dim >= 3 and self.flip(0.1)) else 0
            begins.append(self.integer(lo_allowed, limit))
            ends.append(self.integer(0, limit))
        shape = tuple(d + b + e for d, b, e in zip(x.shape, begins, ends))
        if _numel(shape) > MAX_NUMEL or min(shape, default=1) < 1:
            return False
        lo, hi = x.lo, x.hi
        ins: list = [x]
        use_axes = self.opset >= 18 and self.flip(0.2)
        if use_axes:
            axes = [a for a in range(r) if begins[a] or ends[a]] or [0]
            ins.append(self.ints([begins[a] for a in axes] + [ends[a] for a in axes], "pads"))
        else:
            ins.append(self.ints(begins + ends, "pads"))
        if mode == "constant":
            value = self.choice([None, 0.0, 1.0, -1.5, 0.5])
            if value is not None:
                ins.append(self.const(np.array(value, dtype=np.float32), "pv"))
            v = 0.0 if value is None else value
            if any(begins) or any(ends):
                lo, hi = min(lo, v), max(hi, v)
        if use_axes:
            if len(ins) == 2:
                ins.append(None)
            ins.append(self.ints([a - r if self.flip(0.3) else a for a in axes], "axes"))
        self.op("Pad", ins, shape, lo, hi, x.flat,
                mode=None if mode == "constant" and self.flip() else mode)
        return True

    def f_expand(self) -> bool:
        if not (self.allow_shapes and self.allowed("Expand")):
            return False
        x = self.pick_any(max_rank=4)
        target = [self.integer(2, 3) if d == 1 and self.flip(0.7) else
                  (1 if self.flip(0.2) else d) for d in x.shape]
        if x.rank < 4 and self.flip(0.4):
            target = [self.integer(1, 3)] + target
        out = _broadcast(x.shape, target)
        if out is None or _numel(out) > MAX_NUMEL:
            return False
        off = len(out) - x.rank
        flat = {i for i in range(len(out)) if i < off or x.shape[i - off] == 1 or
                (i - off) in x.flat}
        self.op("Expand", [x, self.ints(target, "shape")], out, x.lo, x.hi, flat)
        return True

    def f_shape_subgraph(self) -> bool:
        """Reshape driven by a shape computed at run time: Shape -> Gather/Slice -> Unsqueeze ->
        Concat -> Reshape."""
        if not (self.allow_shapes and self.allowed("Shape", "Gather", "Unsqueeze", "Concat",
                                                   "Reshape")):
            return False
        y = self.pick_any(min_rank=1)
        r = y.rank
        # group consecutive dims of y into the target dims
        groups, cur = [], [0]
        for i in range(1, r):
            if self.flip(0.4):
                cur.append(i)
            else:
                groups.append(cur)
                cur = [i]
        groups.append(cur)
        shape_name = self.fresh("shape")
        start = end = None
        if self.opset >= 15 and self.flip(0.2):   # Shape(start=1): the index shift is tracked
            start = 1 if r >= 2 else None
        self.node("Shape", [y], [shape_name], start=start, end=end)
        offset = start or 0
        pieces, target, minus_one_used = [], [], False
        for grp in groups:
            size = _numel([y.shape[i] for i in grp])
            target.append(size)
            if len(grp) == 1 and grp[0] >= offset and self.flip(0.8):
                idx = grp[0] - offset
                if self.allowed("Slice") and self.flip(0.3):
                    piece = self.fresh("dim")
                    self.node("Slice", [shape_name, self.ints([idx], "st"),
                                        self.ints([idx + 1], "en")], [piece])
                else:
                    g = self.fresh("dim")
                    ind = self.const(np.array(idx if self.flip(0.7) else idx - (r - offset),
                                              dtype=np.int64), "i")
                    self.node("Gather", [shape_name, ind], [g], axis=0)
                    piece = self.fresh("dim")
                    self.node("Unsqueeze", [g, self.ints([0], "ax")], [piece])
                pieces.append(piece)
            elif not minus_one_used and self.flip(0.5):
                minus_one_used = True
                pieces.append(self.ints([-1], "m1").name)
            else:
                pieces.append(self.ints([size], "d").name)
        if self.flip(0.3) and len(target) < 5:   # an extra leading 1
            pieces.insert(0, self.ints([1], "one").name)
            target.insert(0, 1)
        new_shape = self.fresh("newshape")
        self.node("Concat", pieces, [new_shape], axis=0)
        # reshape y, or another value with as many elements
        other = self.pick(lambda v: v.numel == y.numel and v is not y) if self.flip(0.3) else None
        src = other or y
        self.op("Reshape", [src, new_shape], tuple(target), src.lo, src.hi,
                self._view_flat(src, len(target)))
        return True

    # ---- driving -------------------------------------------------------------------------------

    FAMILIES = [   # (method, weight)
        ("f_unary", 6), ("f_binary", 6), ("f_conv", 3), ("f_matmul", 2), ("f_gemm", 1),
        ("f_where", 1), ("f_sum", 1), ("f_pattern", 2), ("f_identity", 1),
        ("f_const_subgraph", 1), ("f_softmax", 1), ("f_layernorm", 1), ("f_reduce", 1),
        ("f_batchnorm", 1), ("f_pool", 1), ("f_transpose", 1), ("f_reshape", 1),
        ("f_flatten", 1), ("f_unsqueeze", 1), ("f_squeeze", 1), ("f_concat", 1), ("f_slice", 1),
        ("f_split", 1), ("f_gather", 1), ("f_pad", 1), ("f_expand", 1),
        ("f_shape_subgraph", 1), ("f_cast", 1), ("f_opaque", 1),
    ]

    def run(self, max_nodes: int, families: Sequence[tuple[str, int]] | None = None) -> None:
        """Add steps until the graph has `max_nodes` nodes or a drawn "stop" (a geometric
        number of steps, like `st.lists`, so the shrinker can delete whole steps)."""
        fams = [name for name, weight in (families or self.FAMILIES) for _ in range(weight)]
        more = min(0.97, max(0.75, 1.0 - 0.6 / max_nodes))
        start = len(self.nodes)
        for _ in range(8 * max_nodes + 8):
            if len(self.nodes) >= max_nodes:
                break
            if len(self.nodes) > start and not self.flip(more):
                break
            self.draw(_step(self, fams))

    def step(self, fams: list[str]) -> None:
        getattr(self, self.choice(fams))()

    def start(self, n_inputs: int | None = None) -> None:
        for _ in range(self.integer(1, 2) if n_inputs is None else n_inputs):
            self.new_input(self.draw_shape())

    def finish(self) -> GraphCase:
        if not self.produced:     # nothing applied: fall back on one op that always can
            if self.allowed("Identity"):
                x = self.pick_any()
                self.op("Identity", [x], x.shape, x.lo, x.hi, x.flat)
            else:
                raise InvalidArgument("eqsat_fuse.testing: `ops` allows no op the generator "
                                      "can place on a float tensor")
        outputs = [v for v in self.produced if v.name not in self.consumed]
        for v in self.produced:
            if v.name in self.consumed and self.intermediate_outputs and self.flip(0.12):
                outputs.append(v)
        if not outputs:
            outputs.append(self.produced[-1])
        order = {v.name: i for i, v in enumerate(self.produced)}
        outputs.sort(key=lambda v: order[v.name])
        graph_inputs = [helper.make_tensor_value_info(v.name, _NP_TO_ONNX[v.dtype], v.shape)
                        for v in self.inputs]
        graph_outputs = [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, v.shape)
                         for v in outputs]
        graph = helper.make_graph(self.nodes, "fuzz", graph_inputs, graph_outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="eqsat_fuse.testing")
        model.ir_version = max(helper.find_min_ir_version_for(list(model.opset_import)), 8)
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:   # a bug of this generator, not of eqsat-fuse
            raise AssertionError("eqsat_fuse.testing generated an invalid model: "
                                 f"{exc}\n{model_text(model)}") from exc
        feeds = {v.name: self.feed(v) for v in self.inputs}
        ops = [n.op_type for n in self.nodes]
        shown = ", ".join(ops) if len(ops) <= 16 else ", ".join(ops[:16]) + ", ..."
        ins = " ".join(f"{v.name}{list(v.shape)}" for v in self.inputs)
        description = (f"{shown} ({len(ops)} nodes, opset {self.opset}, inputs {ins}, "
                       f"{len(outputs)} output{'s' if len(outputs) != 1 else ''})")
        return GraphCase(model, feeds, description)

    def feed(self, v: _Val) -> np.ndarray:
        if v.dtype == "bool":
            return np.asarray(self.rng().random(size=v.shape) < 0.5).reshape(v.shape)
        if v.dtype == "int64":
            return np.asarray(self.rng().integers(int(v.lo), int(v.hi) + 1, size=v.shape),
                              dtype=np.int64).reshape(v.shape)
        style = self.choice(["uniform", "normal", "integers", "small"])
        if style == "small" and v.numel <= 8:
            return self.floats(v.shape, v.lo, v.hi)
        rng = self.rng()
        if style == "normal":
            out = np.clip(rng.standard_normal(v.shape) * (v.hi - v.lo) / 4 + (v.hi + v.lo) / 2,
                          v.lo, v.hi)
        elif style == "integers" and math.ceil(v.lo) <= math.floor(v.hi):
            out = rng.integers(math.ceil(v.lo), math.floor(v.hi) + 1, size=v.shape)
        else:
            out = rng.uniform(v.lo, v.hi, size=v.shape)
        return np.asarray(out, dtype=np.float32).reshape(v.shape)


@st.composite
def _step(draw, builder: _Builder, fams: list[str]) -> None:
    """One step of `builder.run`, drawn as a unit (a span the shrinker can delete)."""
    outer = builder.draw
    builder.draw = draw
    try:
        builder.step(fams)
    finally:
        builder.draw = outer


# ---- the public strategies ----------------------------------------------------------------------

def _check_opset(opset) -> tuple[int, ...]:
    opsets = (opset,) if isinstance(opset, int) else tuple(opset)
    newest = onnx.defs.onnx_opset_version()
    if not opsets or any(not isinstance(o, int) or not _MIN_SUPPORTED_OPSET <= o <= newest
                         for o in opsets):
        raise InvalidArgument(f"opset must be an int (or a sequence of ints) from "
                              f"{_MIN_SUPPORTED_OPSET} to {newest}, not {opset!r}")
    return opsets


def _check_ops(ops) -> frozenset[str] | None:
    if ops is None:
        return None
    ops = frozenset([ops] if isinstance(ops, str) else ops)
    unknown = ops - GENERATED_OPS
    if unknown:
        raise InvalidArgument(f"ops {sorted(unknown)} are not generated by eqsat_fuse.testing; "
                              f"choose from {sorted(GENERATED_OPS)}")
    return ops


@st.composite
def _graphs(draw, max_nodes, opsets, ops, allow_conv, allow_matmul, allow_shapes, broadcast,
            chain_bias, families) -> GraphCase:
    opset = draw(st.sampled_from(opsets)) if len(opsets) > 1 else opsets[0]
    b = _Builder(draw, opset, ops, allow_conv, allow_matmul, allow_shapes, broadcast, chain_bias)
    b.start()
    b.run(max_nodes, families)
    return b.finish()


def onnx_graphs(max_nodes: int = 12, opset: int | Sequence[int] = 17,
                ops: Iterable[str] | None = None, allow_conv: bool = True,
                allow_matmul: bool = True, allow_shapes: bool = True) -> st.SearchStrategy:
    """A strategy for `GraphCase`s: random valid ONNX models with their feeds.

    - `max_nodes`: the graph grows by a drawn number of steps, and stops at `max_nodes` nodes
      at the latest (the last step may add a small block past it: a conv with its epilogue, a
      shape subgraph, a positivizing pair of nodes);
    - `opset`: the default-domain opset the model imports (13 or newer), or a sequence of them
      to draw from; ops that need a newer opset (LayerNormalization 17, Gelu 20) are left out;
    - `ops`: if given, only these ONNX op types appear (a subset of `GENERATED_OPS`);
      constraints are then met with fresh inputs and constants instead of helper nodes;
    - `allow_conv`: Conv blocks and pooling; `allow_matmul`: MatMul and Gemm;
      `allow_shapes`: Transpose/Reshape/Flatten/(Un)Squeeze/Concat/Slice/Split/Gather/Pad/
      Expand and Shape subgraphs.
    """
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise InvalidArgument(f"max_nodes must be a positive int, not {max_nodes!r}")
    return _graphs(max_nodes, _check_opset(opset), _check_ops(ops), allow_conv, allow_matmul,
                   allow_shapes, True, 0.3, None)


_ELEMENTWISE_FAMILIES = [("f_unary", 4), ("f_binary", 5), ("f_where", 1), ("f_sum", 1),
                         ("f_pattern", 1), ("f_identity", 1), ("f_const_subgraph", 1),
                         ("f_cast", 1)]


def elementwise_chains(max_nodes: int = 8, opset: int | Sequence[int] = 17,
                       broadcast: bool = True) -> st.SearchStrategy:
    """Graphs of elementwise ops only (unary, binary, Pow, Where, Sum, Identity/Dropout, the
    Swish/GELU/HardSwish patterns, constant operands computed by constant subgraphs), each step
    usually reading the previous one. With `broadcast`, operands have shapes of their own that
    broadcast ([C,1,1], [W], [], bigger ones...); without, the tensor operands all have the same
    shape (scalar constants, such as Pow's exponent or Clip's bounds, still broadcast)."""
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise InvalidArgument(f"max_nodes must be a positive int, not {max_nodes!r}")
    ops = ELEMENTWISE_OPS | {"Constant"}
    return _graphs(max_nodes, _check_opset(opset), ops, False, False, False, broadcast, 0.7,
                   _ELEMENTWISE_FAMILIES)


@st.composite
def _conv_blocks(draw, opsets, batchnorm, activation, residual, spatial, extra_steps,
                 intermediate_outputs):
    opset = draw(st.sampled_from(opsets)) if len(opsets) > 1 else opsets[0]
    b = _Builder(draw, opset)
    b.intermediate_outputs = intermediate_outputs
    b.f_conv(bn=batchnorm, act=activation, residual=residual, spatial=spatial)
    if extra_steps:
        b.run(len(b.nodes) + extra_steps, [("f_conv", 3), ("f_unary", 1), ("f_binary", 1),
                                           ("f_pool", 1)])
    return b.finish()


def conv_blocks(opset: int | Sequence[int] = 17, batchnorm: bool | None = None,
                activation: bool | str | None = None, residual: bool | None = None,
                spatial: int | None = None, extra_steps: int = 0,
                intermediate_outputs: bool = True) -> st.SearchStrategy:
    """One Conv (random channels, kernel, stride, pads/auto_pad, dilation, groups incl.
    depthwise, bias or not) with its epilogue: BatchNormalization, an activation, a residual Add.

    `batchnorm`/`residual`: True forces, False forbids, None draws. `activation`: an op name
    ("Relu", "Swish", ...), True (any), False (none) or None (drawn). `spatial`: 1 or 2 (None:
    drawn). `extra_steps`: further conv/elementwise/pool steps after the block.
    `intermediate_outputs`: whether values inside the block may also be graph outputs (which
    keeps them from being fused away); with False only the block's last value is an output.
    """
    if spatial not in (None, 1, 2):
        raise InvalidArgument(f"spatial must be 1, 2 or None, not {spatial!r}")
    if isinstance(activation, str) and activation not in _ACTIVATIONS:
        raise InvalidArgument(f"activation must be one of {_ACTIVATIONS}, not {activation!r}")
    return _conv_blocks(_check_opset(opset), batchnorm, activation, residual, spatial,
                        extra_steps, intermediate_outputs)


@st.composite
def _matmul_blocks(draw, opsets, gemm, bias, activation, intermediate_outputs):
    opset = draw(st.sampled_from(opsets)) if len(opsets) > 1 else opsets[0]
    b = _Builder(draw, opset)
    b.intermediate_outputs = intermediate_outputs
    use_gemm = draw(st.booleans()) if gemm is None else gemm
    for _ in range(4):
        done = b.f_gemm(bias, activation) if use_gemm else b.f_matmul(bias, activation)
        if done:
            break
    return b.finish()


def matmul_blocks(opset: int | Sequence[int] = 17, gemm: bool | None = None,
                  bias: bool | None = None, activation: bool | str | None = None,
                  intermediate_outputs: bool = True) -> st.SearchStrategy:
    """One MatMul (weights, batched weights, 1-D operands, or activation x activation) or Gemm
    (transA/transB, alpha/beta, C of any broadcastable shape), then a bias Add and an
    activation. `gemm`/`bias`/`activation`/`intermediate_outputs` as in `conv_blocks` (None:
    drawn)."""
    if isinstance(activation, str) and activation not in _ACTIVATIONS:
        raise InvalidArgument(f"activation must be one of {_ACTIVATIONS}, not {activation!r}")
    return _matmul_blocks(_check_opset(opset), gemm, bias, activation, intermediate_outputs)


# ---- checking a case ----------------------------------------------------------------------------

def check_case(case: GraphCase, backend: str = "numpy", **compile_kwargs):
    """Compile `case.model`, run it on `case.feeds` and compare with onnxruntime through
    `compiled.verify(case.feeds)`. Raises AssertionError (with the description, the verify
    summary and the model as text) when eqsat-fuse fails or differs; returns the `Compiled`."""
    import eqsat_fuse as ef
    from .checking.verify import oracle_outputs

    def fail(what: str, exc: BaseException | None = None):
        detail = f"{type(exc).__name__}: {exc}\n" if exc is not None else ""
        return AssertionError(f"{what}\n{detail}case: {case.text()}")

    try:
        compiled = ef.compile(case.model, backend=backend, **compile_kwargs)
    except Exception as exc:
        raise fail("eqsat-fuse failed to compile the model", exc) from exc
    try:
        result = compiled.verify(case.feeds)
    except Exception as exc:
        try:
            oracle_outputs(case.model, case.feeds, "ort")
        except Exception as ort_exc:
            raise fail("onnxruntime cannot run the generated model (a bug of "
                       "eqsat_fuse.testing)", ort_exc) from ort_exc
        raise fail("the compiled program failed to run", exc) from exc
    if not result.ok:
        raise AssertionError(f"eqsat-fuse differs from {result.against}\n"
                             f"{result.summary()}\ncase: {case.text()}")
    return compiled
