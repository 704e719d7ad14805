"""The graph builder's core: `_BuilderCore` draws every choice through Hypothesis, emits nodes
and constants, tracks the values, picks and tames operands, and drives the steps into a
`GraphCase`. The op families that grow the graph are mixins in elementwise.py,
contractions.py, rows.py and views.py; strategies.py assembles them into `_Builder`."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import onnx
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from onnx import TensorProto, helper, numpy_helper

from .case import GraphCase, model_text
from .values import (_MIN_OPSET, _NP_TO_ONNX, INPUT_RANGE, MAX_INPUT_NUMEL, MAX_NUMEL, _broadcast,
                     _flat_elementwise, _numel, _sigmoid, _Val)


class _BuilderCore:
    """What every family uses: drawing, emitting nodes and constants, shapes, picking and taming
    operands, and the driving loop. Every choice goes through `draw`, so Hypothesis can shrink
    it."""

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

    # ---- driving -------------------------------------------------------------------------------

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
def _step(draw, builder: _BuilderCore, fams: list[str]) -> None:
    """One step of `builder.run`, drawn as a unit (a span the shrinker can delete)."""
    outer = builder.draw
    builder.draw = draw
    try:
        builder.step(fams)
    finally:
        builder.draw = outer
