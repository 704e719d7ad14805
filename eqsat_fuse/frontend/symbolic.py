"""Symbolic shape inference: the shapes of a model whose inputs leave dims open.

A dim the model leaves open (a `dim_param`, or an unnamed unknown dim) becomes a symbol
(`dims.symbol`), and every value gets a shape of ints and `Dim` expressions. One walk over the
nodes in topological order sorts each value into one of four kinds:

- *constant*: known at compile time (folded with `onnx.reference`, as static import does);
- *shape*: a small integer tensor whose elements are dims (`Shape`, and the Gather / Concat /
  Unsqueeze / Slice / arithmetic that exports build Reshape targets with), evaluated here on
  NumPy object arrays of dims, so that a Reshape, Expand or Slice reads its target as a dim
  expression and the shape subgraph never runs as kernels;
- *derived*: computed from symbols alone, but not as dims (a causal mask from ConstantOfShape,
  the positions of a Range): its nodes are kept as a small recipe that `bind` evaluates once per
  concrete shape, and the program reads the result as an input;
- *data*: depends on the model's input data; its nodes are the program.

Broadcasting two different open dims together makes them one (as onnxruntime's symbolic shape
inference merges them): a symbol is replaced by the other dim everywhere, and a run checks that
its feeds agree (`bind`). Written after onnxruntime's `symbolic_shape_infer.py` (sympy there)
and TVM Relax's shape expressions; our own, with `dims` as the arithmetic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..backends.numpy.pooling import _pool_out_size
from ..dims import (Dim, SymbolicError, bare_symbol, dim, dmax, dmin, floordiv, is_symbolic,
                    known_le, symbol)
from ..errors import ModelError
from ..ir import TensorInfo
from .folding import _constant_node_value, fold_node
from .protos import _attrs, _np_dtype, is_held

# an integer tensor of at most this many elements is evaluated as dims
SMALL = 64
_INT_DTYPES = ("int64", "int32")
_SHAPE_OPS = {"Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul",
              "Div", "Mod", "Max", "Min", "Identity", "Reshape", "ReduceProd", "Neg", "Where",
              "Equal", "Expand", "Range", "Size"}
_COMPARISONS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or",
                "Xor", "IsNaN", "IsInf"}
_SAME_SHAPE = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu",
               "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Softmax",
               "LogSoftmax", "LayerNormalization", "BatchNormalization", "Clip", "Cast",
               "Trilu", "CumSum", "Elu", "Selu", "Softplus", "Softsign", "Floor", "Ceil", "Round",
               "Sign", "Sin", "Cos", "Not", "IsNaN", "IsInf", "Mish", "InstanceNormalization",
               "LRN", "Dropout", "CastLike", "PRelu", "ThresholdedRelu", "Celu",
               "SimplifiedLayerNormalization", "RMSNormalization", "QuantizeLinear",
               "DequantizeLinear"}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where",
              "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
              "BitShift", "PRelu"}
_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"}


@dataclass
class SymbolicShapes:
    """What the walk found (see the module's doc)."""

    infos: dict[str, TensorInfo]
    constants: dict[str, np.ndarray]
    shape_values: dict[str, np.ndarray]          # object arrays of ints and Dims
    derived: dict[str, onnx.NodeProto] = field(default_factory=dict)   # output -> its node
    derived_order: list[onnx.NodeProto] = field(default_factory=list)
    data_nodes: list[onnx.NodeProto] = field(default_factory=list)
    symbols: dict[str, str] = field(default_factory=dict)      # symbol -> where it comes from
    # facts a run's feeds must satisfy: (dim, allowed values, why), checked by `bind`
    constraints: list[tuple] = field(default_factory=list)


def _symbol_name(text: str, taken: set[str], fallback: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", text) or fallback
    if not re.match(r"[A-Za-z_]", base):
        base = f"d_{base}"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def input_symbols(proto: onnx.ModelProto) -> dict[str, tuple]:
    """Each real input's declared shape with its open dims as symbols: a `dim_param` becomes
    the symbol of that name (inputs sharing a name share it), an unnamed dim `<input>_<axis>`."""
    initializers = {t.name for t in proto.graph.initializer}
    by_param: dict[str, Dim] = {}
    taken: set[str] = set()
    shapes: dict[str, tuple] = {}
    for vi in proto.graph.input:
        if vi.name in initializers:
            continue
        dims = []
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.dim_param and d.dim_param in by_param:
                dims.append(by_param[d.dim_param])
            else:
                name = _symbol_name(d.dim_param or f"{vi.name}_{axis}", taken, f"d{axis}")
                taken.add(name)
                sym = symbol(name)
                if d.dim_param:
                    by_param[d.dim_param] = sym
                dims.append(sym)
        shapes[vi.name] = tuple(dims)
    return shapes


def has_open_dims(proto: onnx.ModelProto) -> bool:
    initializers = {t.name for t in proto.graph.initializer}
    return any(not d.HasField("dim_value")
               for vi in proto.graph.input if vi.name not in initializers
               and vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
               for d in vi.type.tensor_type.shape.dim)


class _Walk:
    def __init__(self, proto: onnx.ModelProto, held: dict[str, np.ndarray], name: str):
        self.proto, self.name, self.held = proto, name, held
        self.opsets = proto.opset_import
        graph = proto.graph
        self.out = SymbolicShapes(infos={}, constants={}, shape_values={})
        self.subst: dict[str, Dim | int] = {}
        for t in graph.initializer:
            value = held[t.name] if is_held(t) else numpy_helper.to_array(t)
            self.out.constants[t.name] = value
            self.out.infos[t.name] = TensorInfo(tuple(value.shape), value.dtype.name)
        for vi_name, shape in input_symbols(proto).items():
            vi = next(v for v in graph.input if v.name == vi_name)
            self.out.infos[vi_name] = TensorInfo(
                shape, _np_dtype(vi.type.tensor_type.elem_type))
            for axis, d in enumerate(shape):
                if is_symbolic(d):
                    for s in d.symbols:
                        self.out.symbols.setdefault(s, f"input {vi_name!r} dim {axis}")

    # ---- what a value is ----
    def kind(self, value: str) -> str:
        if value == "" or value in self.out.constants:
            return "constant"
        if value in self.out.shape_values:
            return "shape"
        if value in self.out.derived:
            return "derived"
        return "data"

    def values(self, value: str) -> np.ndarray | None:
        """A compile-time value: a constant, or a shape value (object array of dims)."""
        if value in self.out.constants:
            return self.out.constants[value]
        return self.out.shape_values.get(value)

    def info(self, value: str) -> TensorInfo:
        try:
            return self.out.infos[value]
        except KeyError:
            raise ModelError(f"{self.name}: value {value!r} is used before it is computed") \
                from None

    def r(self, d):
        """`d` with the merged symbols replaced."""
        for _ in range(8):
            if not is_symbolic(d) or not (d.symbols & self.subst.keys()):
                return d
            d = d.substitute(self.subst)
        return d

    # ---- the walk ----
    def run(self) -> SymbolicShapes:
        for node in self.proto.graph.node:
            try:
                self.node(node)
            except SymbolicError as exc:
                raise ModelError(f"{self.name}: node {node.name or node.op_type!r} "
                                 f"({node.op_type}): {exc}") from None
        self.finish()
        return self.out

    def node(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        kinds = {self.kind(i) for i in node.input}
        if op == "Constant":
            value = _constant_node_value(node, self.held)
            self.set_constant(node.output[0], value)
            return
        if op == "Shape":
            shape = self.info(node.input[0]).shape
            a = _attrs(node)
            rank = len(shape)
            start, end = int(a.get("start", 0)), a.get("end")
            start = min(max(start + rank if start < 0 else start, 0), rank)
            end = rank if end is None else min(max(int(end) + rank if int(end) < 0 else int(end),
                                                   0), rank)
            self.set_shape_value(node.output[0], _objects(shape[start:end]))
            return
        if op == "Size":
            total = math.prod(self.info(node.input[0]).shape)     # ints and dims
            self.set_shape_value(node.output[0], _objects([total]).reshape(()))
            return
        if kinds <= {"constant"} and node.input and op not in ("RandomNormal", "RandomUniform",
                                                                "RandomNormalLike",
                                                                "RandomUniformLike"):
            self.fold(node)
            return
        if kinds <= {"constant", "shape"} and op in _SHAPE_OPS and self.small(node):
            try:
                result = _shape_op(node, [self.values(i) if i else None for i in node.input],
                                   self.r)
            except _Boolean as decided:
                self.set_constant(node.output[0], decided.value)
                return
            except (SymbolicError, _NotDims):
                result = None
            if result is not None:
                self.set_shape_value(node.output[0], result)
                return
        infos = self.shapes(node)
        for out, info in zip(node.output, infos):
            if out:
                self.out.infos[out] = info
        if kinds <= {"constant", "shape", "derived"}:
            for out in node.output:
                if out:
                    self.out.derived[out] = node
            self.out.derived_order.append(node)
        else:
            self.out.data_nodes.append(node)

    def fold(self, node: onnx.NodeProto) -> None:
        """A node over constants only, evaluated once (as static import folds it)."""
        values = [self.out.constants[i] if i else None for i in node.input]
        outputs = fold_node(node, values, {}, self.name, self.opsets)
        for out, value in zip(node.output, outputs):
            if out:
                self.set_constant(out, np.asarray(value))

    def small(self, node) -> bool:
        for i in node.input:
            if i and self.values(i) is not None and self.values(i).size > SMALL:
                return False
        return True

    def set_constant(self, name: str, value: np.ndarray) -> None:
        self.out.constants[name] = value
        self.out.infos[name] = TensorInfo(tuple(value.shape), value.dtype.name)

    def set_shape_value(self, name: str, value: np.ndarray) -> None:
        value = _map(lambda d: self.r(dim(d)), np.asarray(value, dtype=object))
        if all(not is_symbolic(d) for d in value.reshape(-1)):
            self.set_constant(name, value.astype(np.int64))
            return
        self.out.shape_values[name] = value
        self.out.infos[name] = TensorInfo(tuple(value.shape), "int64")

    def finish(self) -> None:
        out = self.out
        out.infos = {k: TensorInfo(tuple(self.r(d) for d in v.shape), v.dtype)
                     for k, v in out.infos.items()}
        out.shape_values = {k: _map(self.r, v) for k, v in out.shape_values.items()}
        out.constraints = [(self.r(d), tuple(self.r(a) for a in allowed), why)
                           for d, allowed, why in out.constraints]
        # a symbol merged into another dim by broadcasting is that dim now, in the inputs'
        # shapes too: a run checks the input that had it against the expression (`bind`)
        for s in self.subst:
            out.symbols.pop(s, None)

    # ---- output shapes ----
    def unify(self, a, b, where: str):
        a, b = self.r(a), self.r(b)
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        if not is_symbolic(a) and not is_symbolic(b):
            raise SymbolicError(f"dims {a} and {b} do not broadcast ({where})")
        if not is_symbolic(a) or not is_symbolic(b):   # a symbol against a number
            sym, num = (a, b) if is_symbolic(a) else (b, a)
            self.out.constraints.append((sym, (1, num), where))
            return num
        for x, y in ((a, b), (b, a)):
            bare = bare_symbol(x)
            if bare is not None and bare not in y.symbols:
                self.subst[bare] = y
                return y
        self.out.constraints.append((a, (b,), where))
        return a

    def broadcast(self, shapes: list[tuple], where: str) -> tuple:
        rank = max((len(s) for s in shapes), default=0)
        out = [1] * rank
        for s in shapes:
            padded = (1,) * (rank - len(s)) + tuple(s)
            out = [self.unify(x, y, where) for x, y in zip(out, padded)]
        return tuple(out)

    def shapes(self, node: onnx.NodeProto) -> list[TensorInfo]:
        op = node.op_type
        where = f"node {node.name or op!r} ({op})"
        ins = [self.info(i) if i else None for i in node.input]
        a = _attrs(node)
        first = ins[0] if ins else None
        dtype = first.dtype if first is not None else "float32"
        if op in _COMPARISONS:
            dtype = "bool"
        elif op in ("Cast",):
            dtype = _np_dtype(int(a["to"]))
        elif op in ("ArgMax", "ArgMin", "Shape", "Size", "NonZero"):
            dtype = "int64"
        elif op in ("MatMulInteger", "ConvInteger"):
            dtype = "int32"
        elif op == "Where":
            dtype = ins[1].dtype
        elif op == "CastLike" or op == "DequantizeLinear":
            dtype = ins[1].dtype
        elif op == "QuantizeLinear":
            dtype = (ins[2].dtype if len(ins) > 2 and ins[2] is not None
                     else _np_dtype(int(a.get("output_dtype", 0)) or onnx.TensorProto.UINT8))
        elif op == "ConstantOfShape":
            value = a.get("value")
            dtype = numpy_helper.to_array(value).dtype.name if value is not None else "float32"
        shape = self.shape(node, op, ins, a, where)
        if shape is None:
            return self.onnx_fallback(node, where)
        outputs = [TensorInfo(tuple(self.r(d) for d in s), dtype) for s in
                   (shape if isinstance(shape, list) else [shape])]
        if op == "Dropout" and len(node.output) > 1:
            outputs.append(TensorInfo(outputs[0].shape, "bool"))
        return outputs

    def need(self, node, position: int, what: str):
        if position >= len(node.input) or not node.input[position]:
            return None
        value = self.values(node.input[position])
        if value is None:
            raise SymbolicError(f"its {what} input is computed from the data at run time; the "
                                f"shape of its output is not known at compile time")
        return [self.r(dim(v)) for v in value.reshape(-1)]

    def shape(self, node, op, ins, a, where):
        x = ins[0].shape if ins and ins[0] is not None else None
        if op in _BROADCAST:
            return self.broadcast([i.shape for i in ins if i is not None], where)
        if op in _SAME_SHAPE:
            return x
        if op in ("MatMul", "MatMulInteger"):
            return self.matmul(ins[0].shape, ins[1].shape, where)
        if op == "Gemm":
            m = x[1] if a.get("transA", 0) else x[0]
            n = ins[1].shape[0] if a.get("transB", 0) else ins[1].shape[1]
            return (m, n)
        if op in ("Conv", "ConvInteger", "MaxPool", "AveragePool", "LpPool"):
            return self.window(node, op, ins, a)
        if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
            return (*x[:2], *([1] * (len(x) - 2)))
        if op in _REDUCE:
            return self.reduce(node, op, x, a)
        if op == "Transpose":
            perm = a.get("perm", list(range(len(x)))[::-1])
            return tuple(x[int(p)] for p in perm)
        if op == "Reshape":
            return self.reshape(x, self.need(node, 1, "shape"), int(a.get("allowzero", 0)),
                                where)
        if op == "Flatten":
            axis = int(a.get("axis", 1))
            axis = axis + len(x) if axis < 0 else axis
            return (math.prod(x[:axis]), math.prod(x[axis:]))
        if op == "Squeeze":
            axes = self.need(node, 1, "axes") or a.get("axes")
            if axes is None:
                axes = [i for i, d in enumerate(x) if d == 1]
            axes = {int(v) % len(x) for v in axes}
            return tuple(d for i, d in enumerate(x) if i not in axes)
        if op == "Unsqueeze":
            axes = self.need(node, 1, "axes") or a.get("axes")
            rank = len(x) + len(axes)
            axes = {int(v) % rank for v in axes}
            rest = iter(x)
            return tuple(1 if i in axes else next(rest) for i in range(rank))
        if op == "Concat":
            shapes = [i.shape for i in ins if i is not None]
            axis = int(a["axis"]) % len(shapes[0])
            out = list(shapes[0])
            out[axis] = 0
            for s in shapes:
                out[axis] = out[axis] + s[axis]
            for j in range(len(out)):
                if j != axis:
                    for s in shapes[1:]:
                        out[j] = self.unify(out[j], s[j], where)
            return tuple(out)
        if op == "Slice":
            return self.slice(node, x)
        if op == "Split":
            return self.split(node, x, a)
        if op == "Gather":
            axis = int(a.get("axis", 0)) % len(x)
            return (*x[:axis], *ins[1].shape, *x[axis + 1:])
        if op == "Expand":
            return self.broadcast([x, tuple(self.need(node, 1, "shape"))], where)
        if op == "Tile":
            return tuple(d * r for d, r in zip(x, self.need(node, 1, "repeats")))
        if op == "Pad":
            pads = self.need(node, 1, "pads") or a.get("pads")
            axes = self.need(node, 3, "axes")
            rank = len(x)
            axes = list(range(rank)) if axes is None else [int(v) % rank for v in axes]
            out = list(x)
            for i, ax in enumerate(axes):
                out[ax] = out[ax] + pads[i] + pads[len(axes) + i]
            return tuple(out)
        if op == "ConstantOfShape":
            return tuple(self.need(node, 0, "shape"))
        if op == "Range":
            start, limit, delta = (self.need(node, i, n)[0] for i, n in
                                   enumerate(("start", "limit", "delta")))
            if is_symbolic(delta) or delta == 0:
                raise SymbolicError("a Range with a symbolic or zero step")
            count = floordiv(limit - start + (delta - 1 if delta > 0 else delta + 1), delta)
            return (dmax(count, 0),)
        if op == "Shape":
            return (len(x),)
        if op == "Size":
            return ()
        return None

    def matmul(self, sa, sb, where):
        a1, b1 = len(sa) == 1, len(sb) == 1
        sa = (1, *sa) if a1 else sa
        sb = (*sb, 1) if b1 else sb
        self.unify(sa[-1], sb[-2], where)
        batch = self.broadcast([sa[:-2], sb[:-2]], where)
        out = (*batch, *(() if a1 else (sa[-2],)), *(() if b1 else (sb[-1],)))
        return out

    def window(self, node, op, ins, a):
        x = ins[0].shape
        rank = len(x) - 2
        kernel = list(a["kernel_shape"]) if "kernel_shape" in a else list(ins[1].shape[2:])
        strides = list(a.get("strides", [1] * rank))
        dilations = list(a.get("dilations", [1] * rank))
        pads = list(a.get("pads", [0] * 2 * rank))
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        ceil = int(a.get("ceil_mode", 0))
        out = []
        for i, (n, k, s, d) in enumerate(zip(x[2:], kernel, strides, dilations)):
            if auto in ("SAME_UPPER", "SAME_LOWER"):
                out.append(floordiv(n + s - 1, s))
                continue
            pb, pe = (0, 0) if auto == "VALID" else (pads[i], pads[rank + i])
            if not is_symbolic(n):
                out.append(_pool_out_size(n, k, pb, pe, s, d, ceil))
                continue
            num = n + pb + pe - ((k - 1) * d + 1)
            if not ceil:
                out.append(floordiv(num, s) + 1)
                continue
            # onnxruntime's ceil mode (`_pool_out_size`): ceil(num / s) + 1, less one where the
            # last window would start past the input and the left padding, i.e. the least of
            # it and ceil((n + pb) / s); exact while the end padding is under a window
            if pe > (k - 1) * d:
                raise SymbolicError("ceil-mode pooling over a symbolic dim with an end padding "
                                    "of a whole window")
            out.append(dmin(floordiv(num + s - 1, s) + 1, floordiv(n + pb + s - 1, s)))
        channels = ins[1].shape[0] if op in ("Conv", "ConvInteger") else x[1]
        return (x[0], channels, *out)

    def reduce(self, node, op, x, a):
        rank = len(x)
        if op in ("ArgMax", "ArgMin"):
            axes = [int(a.get("axis", 0))]
        else:
            axes = self.need(node, 1, "axes") if len(node.input) > 1 else a.get("axes")
        keep = int(a.get("keepdims", 1))
        if axes is None or len(axes) == 0:
            if int(a.get("noop_with_empty_axes", 0)) and axes is not None:
                return x
            axes = list(range(rank))
        axes = {int(v) % rank for v in axes}
        if keep:
            return tuple(1 if i in axes else d for i, d in enumerate(x))
        return tuple(d for i, d in enumerate(x) if i not in axes)

    def reshape(self, x, target, allowzero, where):
        out = [x[i] if (t == 0 and not allowzero and not is_symbolic(t)) else t
               for i, t in enumerate(target)]
        if any(not is_symbolic(t) and t == -1 for t in out):
            known = math.prod([t for t in out if is_symbolic(t) or t != -1])
            rest = floordiv(math.prod(x), known)
            out = [rest if (not is_symbolic(t) and t == -1) else t for t in out]
        elif math.prod(out) != math.prod(x):
            self.out.constraints.append((math.prod(x), (math.prod(out),), where))
        return tuple(out)

    def slice(self, node, x):
        starts = self.need(node, 1, "starts")
        ends = self.need(node, 2, "ends")
        rank = len(x)
        axes = self.need(node, 3, "axes")
        axes = list(range(len(starts))) if axes is None else [int(v) % rank for v in axes]
        steps = self.need(node, 4, "steps") or [1] * len(starts)
        out = list(x)
        for s, e, ax, st in zip(starts, ends, axes, steps):
            n = x[ax]
            if is_symbolic(st) or st == 0:
                raise SymbolicError("a Slice with a symbolic or zero step")
            s = _clamp_index(s, n, st)
            e = _clamp_index(e, n, st)
            if st > 0:
                out[ax] = dmax(floordiv(e - s + st - 1, st), 0)
            else:
                out[ax] = dmax(floordiv(s - e - st - 1, -st), 0)
        return tuple(out)

    def split(self, node, x, a):
        axis = int(a.get("axis", 0)) % len(x)
        sizes = self.need(node, 1, "split") or a.get("split")
        count = len(node.output)
        if sizes is None:
            n = x[axis]
            part = floordiv(n + count - 1, count)
            sizes = [part] * (count - 1) + [n - part * (count - 1)]
        return [tuple(sz if i == axis else d for i, d in enumerate(x)) for sz in sizes]

    def onnx_fallback(self, node, where) -> list[TensorInfo]:
        """ONNX's own inference for one node, open dims passed as dim_params."""
        keys: dict[str, Dim] = {}

        def typ(info: TensorInfo) -> onnx.TypeProto:
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
            dims = []
            for d in info.shape:
                if is_symbolic(d):
                    key = f"__sym{len(keys)}"
                    for k, v in keys.items():
                        if v == d:
                            key = k
                    keys[key] = d
                    dims.append(key)
                else:
                    dims.append(int(d))
            return onnx.helper.make_tensor_type_proto(elem, dims)

        types = {i: typ(self.info(i)) for i in node.input if i}
        data = {i: numpy_helper.from_array(np.asarray(self.out.constants[i]), i)
                for i in node.input if i in self.out.constants and self.out.constants[i].size
                <= SMALL}
        domain = node.domain or ""
        try:
            schema = onnx.defs.get_schema(node.op_type, max(o.version for o in self.opsets
                                                            if o.domain in ("", "ai.onnx")),
                                          domain)
            result = onnx.shape_inference.infer_node_outputs(schema, node, types, data)
        except Exception as exc:
            raise SymbolicError(f"no symbolic shape for this node ({where}): "
                                f"{str(exc).strip().splitlines()[-1][:200]}") from None
        outputs = []
        for out in node.output:
            t = result.get(out)
            if t is None or not t.tensor_type.HasField("shape"):
                raise SymbolicError(f"no symbolic shape for its output {out!r}")
            dims = []
            for d in t.tensor_type.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.dim_param in keys:
                    dims.append(keys[d.dim_param])
                else:
                    raise SymbolicError(f"its output {out!r} has a dim that depends on the "
                                        f"data or that symbolic inference cannot express")
            outputs.append(TensorInfo(tuple(dims), _np_dtype(t.tensor_type.elem_type)))
        return outputs


class _NotDims(Exception):
    """The shape op's result is not a tensor of dims (floats, undecidable comparisons)."""


def _map(f, *arrays) -> np.ndarray:
    """f elementwise over broadcast object arrays, as an object array of the broadcast shape."""
    arrays = [np.asarray(a, dtype=object) for a in arrays]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    items = [f(*args) for args in zip(*(np.broadcast_to(a, shape).reshape(-1) for a in arrays))]
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(shape)


def _objects(items) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, d in enumerate(items):
        out[i] = dim(d)
    return out


def _clamp_index(i, n, step):
    """A Slice start or end as ONNX clamps it to an axis of length n (symbolic or not)."""
    if not is_symbolic(i):
        i = int(i)
        if i < 0:
            i = i + n
            return dmax(i, 0) if step > 0 else dmax(i, -1)
        if i >= (1 << 62):
            return n if step > 0 else n - 1
    return dmin(i, n) if step > 0 else dmin(i, n - 1)


def _shape_op(node: onnx.NodeProto, inputs: list, r) -> np.ndarray | None:
    """One shape-arithmetic node on object arrays of dims, or None when it is not one."""
    op = node.op_type
    a = _attrs(node)
    x = [None if v is None else np.asarray(v, dtype=object) if v.dtype.kind in "iuO" else v
         for v in inputs]
    if any(v is not None and v.dtype.kind not in "O" for v in (x[1:] if op == "Where" else x)):
        raise _NotDims
    x0 = x[0]
    if op in ("Identity", "Cast"):
        if op == "Cast" and _np_dtype(int(a["to"])) not in _INT_DTYPES:
            raise _NotDims
        return x0
    if op == "Gather":
        return np.take(x0, np.asarray(inputs[1], dtype=np.int64), axis=int(a.get("axis", 0)))
    if op == "Unsqueeze":
        axes = [int(v) for v in (inputs[1] if len(inputs) > 1 else a["axes"])]
        out = x0
        rank = x0.ndim + len(axes)
        for ax in sorted(v % rank for v in axes):
            out = np.expand_dims(out, ax)
        return out
    if op == "Squeeze":
        axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else a.get("axes")
        if axes is None:
            return np.squeeze(x0)
        return np.squeeze(x0, axis=tuple(int(v) % x0.ndim for v in np.asarray(axes).reshape(-1)))
    if op == "Concat":
        return np.concatenate([v.reshape(-1) if v.ndim == 0 else v for v in x if v is not None],
                              axis=int(a["axis"]))
    if op == "Reshape":
        target = [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
        return x0.reshape(target)
    if op == "Slice":
        starts, ends = (int(v) for v in inputs[1]), (int(v) for v in inputs[2])
        axes = list(range(x0.ndim)) if len(inputs) < 4 or inputs[3] is None else \
            [int(v) for v in inputs[3]]
        steps = [1] * len(axes) if len(inputs) < 5 or inputs[4] is None else \
            [int(v) for v in inputs[4]]
        index = [slice(None)] * x0.ndim
        for s, e, ax, st in zip(starts, ends, axes, steps):
            index[ax] = slice(s, e, st)
        return x0[tuple(index)]
    binary = {"Add": lambda p, q: p + q, "Sub": lambda p, q: p - q, "Mul": lambda p, q: p * q,
              "Div": floordiv, "Mod": lambda p, q: p % q, "Max": dmax, "Min": dmin}
    if op in binary:
        out = x0
        for other in x[1:]:
            out = _map(lambda p, q: r(binary[op](dim(p), dim(q))), out, other)
        return out
    if op == "Neg":
        return _map(lambda p: -dim(p), x0)
    if op == "ReduceProd":
        if x0.ndim != 1 or int(a.get("keepdims", 1)) not in (0, 1):
            raise _NotDims
        out = _objects([math.prod(x0)])
        return out if int(a.get("keepdims", 1)) else out.reshape(())
    if op == "Expand":
        shape = [int(v) for v in inputs[1]]
        return np.broadcast_to(x0, np.broadcast_shapes(x0.shape, tuple(shape))).copy()
    if op == "Where":
        cond = inputs[0]
        if cond is None or cond.dtype != np.bool_:
            raise _NotDims
        return np.where(cond, x[1], x[2])
    if op == "Equal":
        def eq(p, q):
            p, q = r(dim(p)), r(dim(q))
            if p == q:
                return True
            if not is_symbolic(p) and not is_symbolic(q):
                return False
            if known_le(p + 1, q) or known_le(q + 1, p):
                return False     # apart for every value of the symbols (each >= 0)
            raise _NotDims       # depends on the symbols' values: computed per shape
        result = _map(eq, x0, x[1]).astype(bool)
        raise _Boolean(result)
    return None


class _Boolean(_NotDims):
    """A comparison of dims decided for every value: a constant bool tensor (not dims)."""

    def __init__(self, value: np.ndarray):
        super().__init__()
        self.value = value


def infer_symbolic(proto: onnx.ModelProto, held: dict[str, np.ndarray],
                   name: str) -> SymbolicShapes:
    """Walk `proto` (canonical opset, weightless: big tensors in `held`) with its open input
    dims as symbols (see the module's doc)."""
    walk = _Walk(proto, held, name)
    return walk.run()
