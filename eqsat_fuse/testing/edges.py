"""`edge_graphs`, the fuzzer strategy for the edges of floating point, and `check_edge_case`, its
strict IEEE-aware differential checker (issue 21, item 4).

The main strategy (`onnx_graphs`) keeps every value finite and moderate so that `verify`'s
tolerances hold; the bugs of issue 21 live exactly where it does not look: NaN, +-inf, -0.0,
subnormals and values near overflow, met by rewrites (a division by a constant made a
multiplication by its reciprocal, constants re-associated, `x + 0` dropped, `Pow(x, 0.5)` as
`Sqrt`), kernel flags (`arcp`), row kernels whose variance overflows, pooling corner cases and
the graph shapes that made the frontend infer wrong shapes (a pooled value, or a graph input,
that is also an output; multi-output ops). This strategy draws those, with no interval taming:

- feeds and constants mixing NaN, +-inf, +-0.0, values near the dtype's max, subnormals, tiny
  and ordinary values, in float32, float16 or float64 (and Cast chains between them);
- broadcasting elementwise chains: Div/Mul/Add/Sub by constants (subnormal, power-of-two, tiny,
  huge, zeros of both signs, inf, NaN), chains of two constants (re-association), Pow with
  float and integer-typed exponents (0.5, 2, 3, -1, -2, ...), Sqrt, Reciprocal, Div by Sqrt,
  Exp, Log, Tanh, Sigmoid, Relu, Neg, Abs;
- norms over any axis (LayerNormalization, ReduceMean/ReduceSum chains, Softmax);
- MaxPool (with its Indices output) and AveragePool with ceil_mode, strides and pads, the pooled
  value sometimes also a graph output; MatMul, Gemm and Conv followed by elementwise epilogues;
- Split (several outputs), graph inputs that are also graph outputs.

Shapes come from a few fixed frames, so the Numba backend's kernel cache is reused across
cases. The oracle is onnxruntime with its graph optimizations off; where eqsat-fuse differs,
`onnx.reference` is asked too, and a case where the two oracles themselves disagree is
ambiguous (the specification is silent, or one of them departs from it): it is skipped with a
Hypothesis event naming its class.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import currently_in_test_context, event
from hypothesis import strategies as st
from onnx import TensorProto, helper

from .case import GraphCase, model_text

_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
         "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64, "int32": TensorProto.INT32}

# (rtol, atol) of finite values by dtype: those of checking/verify.py's TOLERANCES, except
# float16's atol (each float16 op rounds; 1e-2 absolute holds for the small chains drawn here).
TOLERANCES = {"float64": (1e-7, 1e-9), "float32": (1e-3, 1e-4), "float16": (1e-2, 1e-2)}

# Frames: the shapes a case's elementwise values and its pooled / convolved values have.
_FRAMES = [(4,), (2, 4), (3, 1, 4), (2, 3, 4)]
_SPATIAL = [(1, 2, 5, 5), (1, 2, 4, 6)]

_UNARY = ["Relu", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid"]
_POW_FLOAT = [0.5, 2.0, 3.0, -1.0, -2.0, 1.5, 0.0, -0.5, 1.0]
_POW_INT = [2, 3, -1, -2, 0, 1]


def _edge_values(dtype: str) -> list[float]:
    """The special and boundary values of a float dtype, and a few ordinary ones."""
    info = np.finfo(dtype)
    sub = float(info.smallest_subnormal)
    tiny = float(info.tiny)
    return [np.nan, np.inf, -np.inf, 0.0, -0.0, float(info.max), -float(info.max),
            float(info.max) / 2, sub, -sub, tiny / 4, tiny, -tiny, 1e-3 if dtype == "float16"
            else 1e-30, 1.0, -1.0, 0.5, 2.0, -3.0, 0.1]


def _edge_constants(dtype: str) -> list[float]:
    """Constant operands of Div/Mul/Add/Sub: subnormal, power-of-two, tiny, huge, signed zeros,
    infinities, NaN and ordinary values."""
    info = np.finfo(dtype)
    sub = float(info.smallest_subnormal) * 8
    huge = 3e4 if dtype == "float16" else 1e30
    small = 1e-3 if dtype == "float16" else 1e-30
    return [sub, -sub, 0.25, 2.0, 1024.0, 2.0 ** -20 if dtype != "float16" else 2.0 ** -12,
            small, -small, huge, -huge, float(info.max), 0.0, -0.0, 1.0, -1.0, 3.0, 0.1,
            np.inf, -np.inf, np.nan]


@dataclass(eq=False)
class _V:
    name: str
    shape: tuple[int, ...]
    dtype: str
    loose: bool = False     # ONNX shape inference gets its shape wrong (ceil-mode pools)


def _broadcasts_into(small, big) -> bool:
    """Whether broadcasting `small` against `big` gives `big`."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]))


class _EdgeBuilder:
    """Draws one edge case step by step; every choice goes through `draw` (shrinkable)."""

    FAMILIES = [("f_unary", 4), ("f_const_binary", 6), ("f_const_chain", 3), ("f_binary", 3),
                ("f_pow", 3), ("f_rsqrt", 2), ("f_norm", 2), ("f_reduce", 2), ("f_pool", 2),
                ("f_contraction", 2), ("f_split", 1), ("f_cast", 2)]

    def __init__(self, draw):
        self.draw = draw
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[_V] = []
        self.values: list[_V] = []
        self.produced: list[_V] = []
        self.extra_outputs: list[_V] = []      # always outputs (pooled values, Indices)
        self.consumed: set[str] = set()
        self.feeds: dict[str, np.ndarray] = {}
        self.counter = 0
        self.dtype = self.choice(["float32"] * 6 + ["float16", "float16", "float64", "float64"])
        self.frame = self.choice(_FRAMES)

    # -- drawing
    def choice(self, seq):
        seq = list(seq)
        return seq[0] if len(seq) == 1 else self.draw(st.sampled_from(seq))

    def flip(self, p: float = 0.5) -> bool:
        return self.draw(st.integers(0, 99)) >= 100 - round(100 * p)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def edge_array(self, shape, dtype: str) -> np.ndarray:
        """Values of `dtype`: each element special/boundary with a drawn density, else
        ordinary (uniform in [-4, 4])."""
        n = int(np.prod(shape, dtype=np.int64))
        if n <= 3:
            vals = [self.choice(_edge_values(dtype)) for _ in range(n)]
            return np.array(vals, dtype=np.float64).astype(dtype).reshape(shape)
        density = self.choice([0.1, 0.3, 0.6, 1.0])
        rng = np.random.default_rng(self.draw(st.integers(0, 2**32 - 1)))
        edges = np.array(_edge_values(dtype), dtype=np.float64)
        ordinary = rng.uniform(-4, 4, n)
        picked = edges[rng.integers(0, len(edges), n)]
        out = np.where(rng.random(n) < density, picked, ordinary)
        return out.astype(dtype).reshape(shape)

    # -- graph pieces
    def node(self, op: str, inputs: list, outputs: list[str], **attrs) -> None:
        names = [i if isinstance(i, str) else i.name for i in inputs]
        self.consumed.update(names)
        self.nodes.append(helper.make_node(op, names, outputs, name=f"{op.lower()}_{len(self.nodes)}",
                                           **attrs))

    def op(self, op: str, inputs: list, shape, dtype: str | None = None, **attrs) -> _V:
        v = _V(self.fresh("v"), tuple(shape), dtype or inputs[0].dtype,
               any(getattr(i, "loose", False) for i in inputs))
        self.node(op, inputs, [v.name], **attrs)
        self.produced.append(v)
        self.values.append(v)
        return v

    def const(self, array: np.ndarray, prefix: str = "c") -> _V:
        name = self.fresh(prefix)
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        return _V(name, tuple(np.shape(array)), str(np.asarray(array).dtype))

    def new_input(self, shape, dtype: str | None = None) -> _V:
        dtype = dtype or self.dtype
        v = _V(self.fresh("x"), tuple(shape), dtype)
        self.inputs.append(v)
        self.values.append(v)
        self.feeds[v.name] = self.edge_array(shape, dtype)
        return v

    def pick(self, dtype: str | None = None, rank: int | None = None) -> _V:
        """A value to build on: usually the newest, else any (a fresh input if none fits)."""
        fits = [v for v in self.values if (dtype is None or v.dtype == dtype)
                and (rank is None or len(v.shape) == rank)]
        if not fits:
            return self.new_input(self.frame if rank is None else _SPATIAL[0], dtype)
        if self.flip(0.6):
            return fits[-1]
        return self.choice(fits)

    def operand_shape(self, x: _V) -> tuple[int, ...]:
        """A shape that broadcasts against `x` without growing it (per-channel at most when
        ONNX shape inference gets x's spatial dims wrong)."""
        shape = x.shape
        forms = [(), (1,)]
        if len(shape) >= 2:
            forms.append((shape[0],) + (1,) * (len(shape) - 1))
        if len(shape) == 4:
            forms.append((shape[1], 1, 1))
        if not x.loose:
            forms += [shape, shape[-1:]] + ([shape[1:]] if len(shape) >= 2 else [])
        # (1,) grows a scalar x to [1]: the op's output would not have x's shape
        return tuple(self.choice([f for f in forms if _broadcasts_into(f, shape)]))

    # -- families (each returns nothing; a family that cannot apply does nothing)
    def f_unary(self) -> None:
        x = self.pick()
        self.op(self.choice(_UNARY), [x], x.shape)

    def edge_const(self, dtype: str, shape) -> _V:
        if self.flip(0.7):
            value = self.choice(_edge_constants(dtype))
            return self.const(np.full(shape, value, dtype=dtype))
        return self.const(self.edge_array(shape, dtype))

    def _apply_const(self, x: _V, op: str) -> _V:
        c = self.edge_const(x.dtype, self.operand_shape(x))
        ins = [c, x] if op in ("Add", "Mul") and self.flip(0.3) else [x, c]
        if op in ("Sub", "Div") and self.flip(0.2):
            ins = [c, x]
        return self.op(op, ins, np.broadcast_shapes(x.shape, c.shape), x.dtype)

    def f_const_binary(self) -> None:
        self._apply_const(self.pick(), self.choice(["Div", "Mul", "Add", "Sub"]))

    def f_const_chain(self) -> None:
        """x op1 c1 op2 c2: what constant re-association and folding rules look for."""
        x = self.pick()
        first, second = self.choice([("Mul", "Mul"), ("Add", "Add"), ("Add", "Mul"),
                                     ("Div", "Div"), ("Mul", "Div"), ("Sub", "Add"),
                                     ("Add", "Sub")])
        self._apply_const(self._apply_const(x, first), second)

    def f_binary(self) -> None:
        x = self.pick()
        same = [v for v in self.values if v.dtype == x.dtype and v is not x
                and v.loose == x.loose and _broadcasts_into(v.shape, x.shape)]
        y = self.choice(same) if same and self.flip(0.5) else self.new_input(
            self.operand_shape(x), x.dtype)
        ins = [x, y] if self.flip(0.7) else [y, x]
        self.op(self.choice(["Add", "Sub", "Mul", "Div"]), ins, x.shape)

    def f_pow(self) -> None:
        x = self.pick()
        if self.flip(0.3):
            e = self.const(np.array(self.choice(_POW_INT), dtype=self.choice(["int64", "int32"])))
        else:
            e = self.const(np.array(self.choice(_POW_FLOAT), dtype=x.dtype))
        self.op("Pow", [x, e], x.shape)

    def f_rsqrt(self) -> None:
        x = self.pick()
        s = self.op("Sqrt", [x], x.shape)
        if self.flip(0.5):
            self.op("Reciprocal", [s], x.shape)
        else:
            w = self.edge_const(x.dtype, self.operand_shape(x))
            self.op("Div", [w, s], x.shape)

    def f_norm(self) -> None:
        x = self.pick()
        if not x.shape:
            return
        axis = self.draw(st.integers(-len(x.shape), len(x.shape) - 1))
        if x.loose or self.flip(0.3):
            self.op("Softmax", [x], x.shape, axis=axis)
            return
        norm_shape = x.shape[axis % len(x.shape):]
        scale = self.const(self.edge_array(norm_shape, x.dtype) if self.flip(0.3)
                           else np.ones(norm_shape, x.dtype))
        bias = self.const(self.edge_array(norm_shape, x.dtype) if self.flip(0.5)
                          else np.full(norm_shape, 0.5, x.dtype))
        self.op("LayerNormalization", [x, scale, bias], x.shape, axis=axis,
                epsilon=self.choice([1e-5, 1e-3]))

    def f_reduce(self) -> None:
        """ReduceMean/ReduceSum with keepdims over any axis, then an op reading both (the
        decomposed-norm shape: x - mean(x), x / sum(x))."""
        x = self.pick()
        if not x.shape:
            return
        axis = self.draw(st.integers(-len(x.shape), len(x.shape) - 1))
        axes = self.const(np.array([axis], dtype=np.int64), "axes")
        red_shape = tuple(1 if k == axis % len(x.shape) else d for k, d in enumerate(x.shape))
        if self.flip(0.5):     # opset 17: ReduceSum's axes are an input, ReduceMean's an attribute
            r = self.op("ReduceSum", [x, axes], red_shape, keepdims=1)
        else:
            r = self.op("ReduceMean", [x], red_shape, keepdims=1, axes=[axis])
        if self.flip(0.7):
            d = self.op(self.choice(["Sub", "Div"]), [x, r], x.shape)
            if self.flip(0.5):
                sq = self.op("Mul", [d, d], x.shape)
                m = self.op("ReduceMean", [sq], red_shape, keepdims=1, axes=[axis])
                self.op("Div", [d, self.op("Sqrt", [m], red_shape)], x.shape)

    def f_pool(self) -> None:
        x = self.pick("float32", rank=4)
        k = self.choice([2, 3])
        stride = self.choice([1, 2, 3])
        pads = [self.draw(st.integers(0, k - 1)) for _ in range(4)]
        ceil = int(self.flip(0.6))
        out_hw, loose = [], x.loose
        for axis in (2, 3):
            size = x.shape[axis] + pads[axis - 2] + pads[axis]
            if size < k:
                return
            n = (size - k + (stride - 1 if ceil else 0)) // stride + 1
            if ceil and (n - 1) * stride >= x.shape[axis] + pads[axis - 2]:
                n -= 1      # the last window must start inside the input or its left pad
                loose = True    # (ONNX shape inference does not know: one window too many)
            out_hw.append(n)
        shape = x.shape[:2] + tuple(out_hw)
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=pads, ceil_mode=ceil)
        if self.flip(0.5):
            with_indices = self.flip(0.4)
            v = _V(self.fresh("v"), shape, "float32", loose)
            outs = [v.name]
            if with_indices:
                idx = _V(self.fresh("i"), shape, "int64", loose)
                outs.append(idx.name)
                self.extra_outputs.append(idx)
            self.node("MaxPool", [x], outs, **attrs)
            self.produced.append(v)
            self.values.append(v)
        else:
            v = self.op("AveragePool", [x], shape, count_include_pad=int(self.flip(0.5)), **attrs)
            v.loose = loose
        if self.flip(0.5):
            self.extra_outputs.append(v)     # a pooled value that is also a graph output
        if self.flip(0.5):
            self._apply_const(v, self.choice(["Mul", "Add", "Div"]))

    def f_contraction(self) -> None:
        kind = self.choice(["MatMul", "Gemm", "Conv"])
        if kind == "Conv":
            x = self.pick("float32", rank=4)
            w = self.const(self.edge_array((3, x.shape[1], 3, 3), "float32") if self.flip(0.3)
                           else np.random.default_rng(self.draw(st.integers(0, 99)))
                           .uniform(-1, 1, (3, x.shape[1], 3, 3)).astype(np.float32))
            y = self.op("Conv", [x, w], (x.shape[0], 3) + x.shape[2:], pads=[1, 1, 1, 1])
        else:
            dtype = self.choice(["float32", "float64"]) if kind == "MatMul" else "float32"
            x = self.pick(dtype, rank=2)
            if len(x.shape) != 2:
                x = self.new_input((3, 4), dtype)
            n = self.choice([2, 5])
            w = self.const(self.edge_array((x.shape[1], n), dtype) if self.flip(0.3)
                           else np.random.default_rng(self.draw(st.integers(0, 99)))
                           .uniform(-1, 1, (x.shape[1], n)).astype(dtype))
            y = self.op(kind, [x, w], (x.shape[0], n))
        for _ in range(self.draw(st.integers(1, 3))):     # the epilogue
            if self.flip(0.3):
                y = self.op(self.choice(["Relu", "Sigmoid", "Tanh"]), [y], y.shape)
            else:
                y = self._apply_const(y, self.choice(["Add", "Mul", "Div", "Sub"]))

    def f_split(self) -> None:
        x = self.pick()
        axes = [a for a, d in enumerate(x.shape) if d >= 2]
        if not axes or x.loose:
            return
        axis = self.choice(axes)
        first = self.draw(st.integers(1, x.shape[axis] - 1))
        sizes = self.const(np.array([first, x.shape[axis] - first], dtype=np.int64), "s")
        outs = []
        for size in (first, x.shape[axis] - first):
            outs.append(_V(self.fresh("v"), x.shape[:axis] + (size,) + x.shape[axis + 1:],
                           x.dtype, x.loose))
        self.node("Split", [x, sizes], [o.name for o in outs], axis=axis)
        self.produced.extend(outs)
        self.values.extend(outs)

    def f_cast(self) -> None:
        x = self.pick()
        to = self.choice([d for d in ("float32", "float16", "float64") if d != x.dtype])
        c = self.op("Cast", [x], x.shape, to, to=_ONNX[to])
        if self.flip(0.5):
            c = self._apply_const(c, self.choice(["Add", "Mul"]))
        if self.flip(0.6):
            self.op("Cast", [c], c.shape, x.dtype, to=_ONNX[x.dtype])

    # -- driving
    def run(self) -> None:
        fams = [name for name, weight in self.FAMILIES for _ in range(weight)]
        self.new_input(self.frame)
        for _ in range(self.draw(st.integers(1, 6))):
            self.draw(_step(self, fams))

    def finish(self) -> GraphCase:
        if not self.produced:
            x = self.pick()
            self.op("Identity", [x], x.shape)
        outputs = [v for v in self.produced if v.name not in self.consumed]
        outputs += [v for v in self.produced if v.name in self.consumed and self.flip(0.12)]
        outputs += [v for v in self.extra_outputs if v not in outputs]
        if self.flip(0.15):
            outputs.append(self.inputs[0])     # a graph input that is also a graph output
        names = set()
        unique = [v for v in outputs if not (v.name in names or names.add(v.name))]
        graph = helper.make_graph(
            self.nodes, "edges",
            [helper.make_tensor_value_info(v.name, _ONNX[v.dtype], v.shape) for v in self.inputs],
            [helper.make_tensor_value_info(v.name, _ONNX[v.dtype], _declared(v)) for v in unique],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  producer_name="eqsat_fuse.testing.edges")
        model.ir_version = 8
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:   # a bug of this generator, not of eqsat-fuse
            raise AssertionError(f"eqsat_fuse.testing.edges generated an invalid model: {exc}\n"
                                 f"{model_text(model)}") from exc
        ops = [n.op_type for n in self.nodes]
        return GraphCase(model, dict(self.feeds),
                         f"edges {self.dtype}: {', '.join(ops)} ({len(ops)} nodes)")


def _declared(v: _V) -> list:
    """A graph output's declared shape: its dims, or symbolic ones where ONNX shape inference
    would contradict them (the checker rejects a model whose declared shape differs)."""
    return [f"{v.name}_d{k}" for k in range(len(v.shape))] if v.loose else list(v.shape)


@st.composite
def _step(draw, builder: _EdgeBuilder, fams: list[str]) -> None:
    """One family step, drawn as a unit (a span the shrinker can delete)."""
    outer = builder.draw
    builder.draw = draw
    try:
        getattr(builder, builder.choice(fams))()
    finally:
        builder.draw = outer


@st.composite
def _edge_graphs(draw) -> GraphCase:
    b = _EdgeBuilder(draw)
    b.run()
    return b.finish()


def edge_graphs() -> st.SearchStrategy:
    """A strategy for `GraphCase`s at the edges of floating point (see the module docstring):
    small opset-17 models whose feeds and constants hold NaN, +-inf, -0.0, subnormals and values
    near overflow. Check them with `check_edge_case`, not `check_case` (whose tolerance
    comparison does not look at signed zeros)."""
    return _edge_graphs()


# ---- the checker ---------------------------------------------------------------------------------

TALLY: Counter = Counter()     # outcomes of check_edge_case in this process (for fuzz reports)


def ieee_mismatch(got, want, dtype: str | None = None) -> str | None:
    """Why `got` differs from `want` in the numerics contract's sense (None if it does not):
    dtype and shape, NaN positions, +inf / -inf, the sign of zeros both sides hold, finite
    values within the dtype's tolerance (integer outputs: exactly)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
    if want.dtype.kind != "f":
        return None if np.array_equal(got, want) else "integer values differ"
    checks = [("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)]
    for what, test in checks:
        differ = test(got) != test(want)
        if differ.any():
            at = tuple(int(i) for i in np.argwhere(differ)[0])
            return f"{what} differs at {at}: {got[at]!r} vs {want[at]!r}"
    zeros = (got == 0) & (want == 0) & (np.signbit(got) != np.signbit(want))
    if zeros.any():
        at = tuple(int(i) for i in np.argwhere(zeros)[0])
        return f"sign of zero differs at {at}: {got[at]!r} vs {want[at]!r}"
    rtol, atol = TOLERANCES[dtype or str(want.dtype)]
    finite = np.isfinite(want)
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    outside = np.abs(g - w) > atol + rtol * np.abs(w)
    if outside.any():
        k = int(np.argmax(outside))
        at = tuple(int(i) for i in np.argwhere(finite)[k])
        return f"{int(outside.sum())} values outside tolerance, first at {at}: " \
               f"{got[at]!r} vs {want[at]!r}"
    return None


def _ort(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    """onnxruntime's outputs, graph optimizations off, one thread."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _ort_every_value(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    """onnxruntime's values with every node output also a graph output, by name. Exposing a
    value makes onnxruntime hold it in its declared dtype: for float16 ops its CPU provider has
    no kernel for, it computes in float32 and drops a Cast pair between two of them, so a
    product is not rounded to float16 unless it is an output."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    have = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in have and name in typed:
                exposed.graph.output.append(typed[name])
                have.add(name)
    names = [o.name for o in exposed.graph.output]
    return dict(zip(names, _ort(exposed, feeds)))


def _tally(outcome: str) -> str:
    TALLY[outcome] += 1
    if currently_in_test_context():
        event(outcome)
    return outcome


def check_edge_case(case: GraphCase, backend: str = "numpy", **compile_kwargs) -> str:
    """Compile `case.model`, run it on `case.feeds` and compare every output with onnxruntime
    (ORT_DISABLE_ALL) by `ieee_mismatch`. Returns the outcome ("ok", "invalid: ...",
    "refused: ...", "ambiguous: ..."), also a Hypothesis event and counted in `TALLY`; raises
    AssertionError for a crash or a mismatch both oracles agree on."""
    import eqsat_fuse as ef
    from ..errors import EqsatFuseError

    with np.errstate(all="ignore"):
        try:
            want = _ort(case.model, case.feeds)
        except Exception as exc:      # a model onnxruntime refuses is not a valid case
            return _tally(f"invalid: onnxruntime refuses ({str(exc).splitlines()[0][:90]})")
        try:
            compiled = ef.compile(case.model, backend=backend, **compile_kwargs)
        except EqsatFuseError as exc:
            return _tally(f"refused: {str(exc).splitlines()[0][:100]}")
        except Exception as exc:
            TALLY["crash"] += 1
            raise AssertionError(f"eqsat-fuse crashed compiling the model ({backend}): "
                                 f"{type(exc).__name__}: {exc}\ncase: {case.text()}") from exc
        try:
            got = list(compiled.run(case.feeds).values())
        except Exception as exc:
            TALLY["crash"] += 1
            raise AssertionError(f"the compiled program crashed ({backend}): "
                                 f"{type(exc).__name__}: {exc}\ncase: {case.text()}") from exc
    outputs = [o.name for o in case.model.graph.output]
    for k, (g, w) in enumerate(zip(got, want)):
        why = ieee_mismatch(g, w)
        if why is None:
            continue
        ambiguous = _documented_choice(case) or _ambiguous(case, k, w, g)
        if ambiguous:
            return _tally(f"ambiguous: {ambiguous}")
        TALLY["mismatch"] += 1
        raise AssertionError(f"eqsat-fuse ({backend}) differs from onnxruntime (and "
                             f"onnx.reference) in output {outputs[k]!r}: {why}\n"
                             f"case: {case.text()}")
    return _tally("ok")


def _documented_choice(case: GraphCase) -> str | None:
    """A departure from onnxruntime that docs/numerics.md documents as chosen: MaxPool over a
    window with NaN ignores the NaN (issue 21, item 15). onnxruntime does not decide alike:
    its kernel with an Indices output (and onnx.reference) keeps a NaN that comes first in a
    window, its plain kernel keeps one that comes after the window's running max (a NaN-aware
    max of the window in order: [1, NaN] gives NaN, [NaN, 1] gives 1)."""
    from ..checking.verify import oracle_outputs

    pooled = [n.input[0] for n in case.model.graph.node if n.op_type == "MaxPool"]
    if not pooled:
        return None
    with np.errstate(all="ignore"):
        values, _ = oracle_outputs(case.model, case.feeds, "ort", also=pooled)
    if any(np.isnan(values[name]).any() for name in pooled):
        return "chosen: MaxPool over a window with NaN (NaN counts as lowest)"
    return None


def _ambiguous(case: GraphCase, k: int, want: np.ndarray, got: np.ndarray) -> str | None:
    """The class of an output on which the oracles disagree (None if they agree): onnxruntime
    with onnx.reference, or with itself when every value is an output (`_ort_every_value`);
    the ops of the model, what differs, and whether eqsat-fuse sides with the other oracle."""
    from onnx.reference import ReferenceEvaluator

    ops = ",".join(sorted({n.op_type for n in case.model.graph.node}))
    name = case.model.graph.output[k].name
    with np.errstate(all="ignore"):
        try:
            ref = ReferenceEvaluator(case.model).run(None, case.feeds)[k]
        except Exception as exc:
            return f"onnx.reference fails ({type(exc).__name__}) [{ops}]"
        try:
            exposed = _ort_every_value(case.model, case.feeds).get(name, want)
        except Exception:            # no third view: the two oracles decide alone
            exposed = want
    for other, differ in ((ref, "onnxruntime and onnx.reference differ"),
                          (exposed, "onnxruntime's answer changes with every value an output")):
        why = ieee_mismatch(other, want)
        if why is None:
            continue
        kind = ("finite values" if "tolerance" in why else "shape" if why.startswith("dtype/")
                else why.split(" differs")[0])
        side = "eqsat-fuse as reference" if ieee_mismatch(got, other) is None else "neither"
        return f"{differ} in {kind} ({side}) [{ops}]"
    return None
