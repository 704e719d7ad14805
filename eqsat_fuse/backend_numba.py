"""The Numba backend: one generated, compiled loop nest per fused kernel.

For each kernel, `NumbaBackend.prepare` writes the source of one Python module holding one
`@njit` function, from the kernel body only (generated identifiers; numbers enter the source as
`repr` of floats and ints; nothing of the model's names or strings). Shapes, offsets and
broadcast tables are arguments, so kernels with the same structure share one source and one
compiled function. Modules are written to a cache folder named by the hash of their source and
compiled with `cache=True`, so a second process loads the machine code instead of compiling.

Kernel families:
- elementwise (any broadcasting, views read in place): one pass over the output, viewed as rows
  x columns where every operand is a row base plus a column stride; each input element is read
  once and each output element written once; float32 polynomial exp/tanh/erf (`approx`) keep
  the loop vectorized;
- Conv (im2col or direct 1x1, depthwise by direct loops), MatMul and Gemm on BLAS (`np.dot`
  inside the kernel), computed in row blocks; the fused epilogue runs on each block right
  after its GEMM, while the block is in cache;
- Softmax and LayerNormalization: one row at a time, prologue (the fused elementwise input),
  the row statistics and the epilogue all on the row while it sits in L1; ReduceMean/ReduceSum
  over trailing axes, pooling (2-D);
- views and the movement ops (Concat, Gather, Pad) are plain NumPy copies into the arena.

Anything else falls back to the NumPy evaluation of that kernel (writing into the same arena
slot); `fallbacks` lists those kernels with the reason.

Float16 storage: a buffer stored as float16 is held as uint16 here (Numba has no float16) and
converted with the F16C instructions on load and store; arithmetic is float32.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .ir import BodyNode, Kernel, KernelPlan, Operand
from .layout import Layout, apply_view, probe, layout_of
from .ops import OPS

# elementwise kernels at least this large run with prange when more than one thread is allowed
PARALLEL_MIN_ELEMENTS = 1 << 18
CACHE_ENV = "EQSAT_FUSE_CACHE_DIR"
FASTMATH = '{"contract", "nsz", "arcp"}'
_FLOATS = ("float32", "float16")


def default_cache_dir() -> Path:
    """`$EQSAT_FUSE_CACHE_DIR`, else the user cache folder (XDG) / eqsat-fuse / kernels."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eqsat-fuse" / "kernels"


class Unsupported(Exception):
    """The generator cannot build this kernel: it runs through the NumPy evaluation instead."""


@dataclass
class JitStats:
    kernels: int = 0                  # compiled kernels used by the program
    sources: int = 0                  # distinct generated sources
    compiled: int = 0                 # compiled in this process
    loaded: int = 0                   # loaded from the on-disk cache
    seconds: float = 0.0              # time spent generating, compiling and loading
    fallbacks: list[tuple[str, str]] = field(default_factory=list)   # (kernel, why)
    copies: int = 0                   # movement kernels run as NumPy copies


# ---- per-kernel description -----------------------------------------------------------------

@dataclass
class Tensor:
    """A tensor operand of a generated kernel: storage name, dtype as stored, and its layout."""

    storage: str
    dtype: str              # logical dtype (the plan's)
    stored: str             # dtype in memory ("float16" for float32 values stored in float16)
    layout: Layout


@dataclass
class Impl:
    """What `prepare` gives lowering: a compiled kernel and how to call it."""

    fn: Any
    args: list                        # ("storage", name) | ("array", ndarray) | ("workspace",)
    workspace_bytes: int = 0
    workspace_dtype: str = "float32"
    inplace_inputs: set = field(default_factory=set)
    source_hash: str = ""


def _c_strides(shape) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _broadcast_layout(layout: Layout, shape: tuple[int, ...]) -> Layout:
    """The layout of `layout` broadcast (NumPy rules) to `shape`: stride 0 on broadcast dims."""
    extra = len(shape) - len(layout.shape)
    if extra < 0:
        raise Unsupported("operand of higher rank than the output")
    strides = [0] * extra
    for n_in, s_in, n_out in zip(layout.shape, layout.strides, shape[extra:]):
        if n_in == n_out:
            strides.append(s_in if n_in != 1 else 0)
        elif n_in == 1:
            strides.append(0)
        else:
            raise Unsupported(f"operand shape {layout.shape} does not broadcast to {shape}")
    return Layout(layout.storage, layout.offset, tuple(shape), tuple(strides))


def _column_split(layouts: list[Layout], shape: tuple[int, ...], min_cols_dims: int = 1) -> int:
    """The first dim j such that dims j.. merge into one strided column axis for every operand.

    At least the last `min_cols_dims` dims are columns (raises Unsupported if they cannot be).
    """
    n = len(shape)
    if n == 0:
        return 0

    def mergeable(d: int) -> bool:       # can dim d merge with dim d+1 for every operand?
        for lay in layouts:
            if shape[d] == 1 or shape[d + 1] == 1:
                continue
            if lay.strides[d] != lay.strides[d + 1] * shape[d + 1]:
                return False
        return True

    j = n - 1
    while j > 0 and mergeable(j - 1):
        j -= 1
    if n - j < min_cols_dims:
        raise Unsupported("operand strides do not allow the kernel's column blocks")
    return j


def _col_stride(lay: Layout, j: int) -> int:
    """The stride of the merged column axis (dims j..) of a layout."""
    for d in range(len(lay.shape) - 1, j - 1, -1):
        if lay.shape[d] != 1:
            return lay.strides[d]
    return 0


def _row_table(lay: Layout, j: int) -> np.ndarray:
    """Element offsets of each row (multi-index over dims < j) of a layout."""
    rows = lay.shape[:j]
    table = np.full(rows if rows else (), lay.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(rows, lay.strides[:j])):
        idx = np.arange(n, dtype=np.int64) * s
        table = table + idx.reshape((1,) * d + (n,) + (1,) * (len(rows) - d - 1))
    return np.ascontiguousarray(table.reshape(-1))


class _Module:
    """Accumulates one generated module: argument names, integer parameters and code lines."""

    def __init__(self):
        self.params: list[int] = []           # ints (and row tables) packed into one int64 array
        self.fparams: list[float] = []        # float scalars packed into one float32 array
        self.arrays: list[tuple] = []         # kernel array arguments, in order
        self.array_names: dict[Any, str] = {}
        self.lines: list[str] = []
        self.header: list[str] = []
        self.parallel = False
        self.imports: set[str] = set()

    def int_param(self, value: int) -> str:
        self.params.append(int(value))
        return f"G[{len(self.params) - 1}]"

    def table(self, values: np.ndarray) -> str:
        """Appends an int table to the int params; returns the expression of its start index."""
        start = len(self.params) + 1
        expr = self.int_param(start)
        self.params.extend(int(v) for v in values)
        return expr

    def float_param(self, value: float) -> str:
        self.fparams.append(float(value))
        return f"FP[{len(self.fparams) - 1}]"

    def array(self, key, spec) -> str:
        if key not in self.array_names:
            self.array_names[key] = f"a{len(self.arrays)}"
            self.arrays.append(spec)
        return self.array_names[key]

    def source(self) -> str:
        names = ["out", *[self.array_names[k] for k in self.array_names], "G", "FP", "WS"]
        decorator = (f"@njit(cache=True, error_model='numpy', fastmath={FASTMATH}"
                     + (", parallel=True" if self.parallel else "") + ")")
        head = [
            "# generated by eqsat_fuse.backend_numba: one fused kernel",
            "import numpy as np",
            "from numba import njit, prange",
            "from eqsat_fuse.approx import (exp_f32, tanh_f32, sigmoid_f32, erf_f32, gelu_f32,",
            "                               gelu_tanh_f32, f16_to_f32, f32_to_f16)",
            "from eqsat_fuse import kernels_numba as K",
            "F32 = np.float32",
            "",
            *self.header,
            "",
            decorator,
            f"def kernel({', '.join(names)}):",
        ]
        # integer parameters become locals first: LLVM cannot prove that `out` does not alias
        # G, so G[i] inside a loop would be reloaded each iteration and block vectorization
        import re
        used = sorted({int(i) for line in self.lines for i in re.findall(r"\bG\[(\d+)\]", line)})
        lines = [re.sub(r"\bG\[(\d+)\]", r"g\1", line) for line in self.lines]
        body = [f"    g{i} = G[{i}]" for i in used] + ["    " + line for line in lines]
        body = body or ["    pass"]
        return "\n".join(head + body) + "\n"


# ---- scalar expressions of elementwise ops ----------------------------------------------------

def _flit(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "F32(np.nan)"
    if math.isinf(value):
        return "F32(np.inf)" if value > 0 else "F32(-np.inf)"
    return f"F32({value!r})"


_NP_TYPES = {"float32": "np.float32", "float64": "np.float64", "int64": "np.int64",
             "int32": "np.int32", "int8": "np.int8", "uint8": "np.uint8", "bool": "np.bool_",
             "int16": "np.int16", "uint16": "np.uint16", "uint32": "np.uint32",
             "uint64": "np.uint64", "float16": "np.float32"}


def _compute(dtype: str) -> str:
    """The dtype arithmetic happens in (float16 values are computed in float32)."""
    return "float32" if dtype == "float16" else dtype


def node_dtypes(body: list[BodyNode], operand_dtype: Callable[[Operand], str]) -> list[str]:
    """The logical dtype of every body node."""
    out: list[str] = []

    def arg(a: Operand) -> str:
        return out[a.ref] if a.kind == "node" else operand_dtype(a)

    for node in body:
        if node.op == "Cast":
            out.append(str(np.dtype(node.attrs["to"])))
        elif node.op == "Where":
            out.append(arg(node.args[1]))
        elif node.args and node.args[0].kind != "absent":
            out.append(arg(node.args[0]))
        else:
            out.append("float32")
    return out


def scalar_expr(node: BodyNode, args: list[str], dtypes: list[str], out_dtype: str,
                const_value: Callable[[int], Any]) -> str:
    """Python/Numba source of one elementwise op on scalar arguments.

    `args` are expressions of the arguments (already in compute dtypes), `const_value(i)` is the
    constant value of argument i when it is a scalar constant (else None).
    """
    op = node.op
    t = _compute(out_dtype)
    is_float = t in ("float32", "float64")
    f32 = t == "float32"
    T = _NP_TYPES.get(t)
    if T is None:
        raise Unsupported(f"dtype {out_dtype}")

    def lit(v):
        return _flit(v) if f32 else f"{T}({float(v)!r})" if is_float else f"{T}({int(v)!r})"

    a = args[0] if args else None
    if op in ("Identity", "Dropout"):
        return a
    if op == "Add":
        return f"({a} + {args[1]})"
    if op == "Sub":
        return f"({a} - {args[1]})"
    if op == "Mul":
        return f"({a} * {args[1]})"
    if op == "Div":
        if not is_float:
            raise Unsupported("integer Div")
        return f"({a} / {args[1]})"
    if op == "Neg":
        return f"(-{a})"
    if not is_float and op not in ("Relu", "Where", "Cast", "Clip"):
        raise Unsupported(f"{op} on {out_dtype}")
    if op == "Relu":
        return f"({lit(0)} if {a} < {lit(0)} else {a})"
    if op == "LeakyRelu":
        return f"({a} if {a} >= {lit(0)} else {a} * {lit(node.attrs['alpha'])})"
    if op == "Clip":
        v = a
        if len(args) > 1 and node.args[1].kind != "absent":
            v = f"({args[1]} if {v} < {args[1]} else {v})"
        if len(args) > 2 and node.args[2].kind != "absent":
            v = f"({args[2]} if {v} > {args[2]} else {v})"
        return v
    if op == "Where":
        return f"({args[1]} if {a} else {args[2]})"
    if op == "Cast":
        to = str(np.dtype(node.attrs["to"]))
        if to == "bool":
            return f"({a} != 0)"
        if np.dtype(to).kind in "iu" and dtypes[0] in ("float32", "float64", "float16"):
            raise Unsupported("float to integer Cast")
        return f"{_NP_TYPES[to]}({a})" if to in _NP_TYPES else _unsupported(to)
    if op == "Sqrt":
        return f"np.sqrt({a})"
    if op == "Reciprocal":
        return f"({lit(1)} / {a})"
    if op == "Log":
        return f"np.log({a})"
    if op == "Pow":
        y = const_value(1)
        if y is not None and np.size(y) == 1:
            y = float(np.asarray(y).reshape(()))
            if y == 1.0:
                return a
            if y == 2.0:
                return f"({a} * {a})"
            if y == 3.0:
                return f"({a} * {a} * {a})"
            if y == 0.5:
                return f"np.sqrt({a})"
            if y == -1.0:
                return f"({lit(1)} / {a})"
        return f"({a} ** {args[1]})"
    approx = {"Exp": "exp_f32", "Tanh": "tanh_f32", "Sigmoid": "sigmoid_f32", "Erf": "erf_f32"}
    if op in approx:
        if f32:
            return f"{approx[op]}({a})"
        libm = {"Exp": "np.exp({})", "Tanh": "np.tanh({})", "Erf": "math.erf({})",
                "Sigmoid": "(1.0 / (1.0 + np.exp(-{})))"}
        return libm[op].format(a)
    if op == "Gelu":
        if not f32:
            raise Unsupported("float64 Gelu")
        return f"gelu_tanh_f32({a})" if node.attrs.get("approximate") == "tanh" \
            else f"gelu_f32({a})"
    if op == "HardSigmoid":
        v = f"({a} * {lit(node.attrs['alpha'])} + {lit(node.attrs['beta'])})"
        return f"min(max({v}, {lit(0)}), {lit(1)})"
    if op == "HardSwish":
        v = f"({a} * {lit(1.0 / 6.0)} + {lit(0.5)})"
        return f"({a} * min(max({v}, {lit(0)}), {lit(1)}))"
    if op == "BatchNormalization":
        eps = lit(node.attrs["epsilon"])
        return (f"(({a} - {args[3]}) * ({args[1]} / np.sqrt({args[4]} + {eps})) + {args[2]})")
    raise Unsupported(f"op {op}")


def _unsupported(what):
    raise Unsupported(what)


# ---- the generator --------------------------------------------------------------------------

@dataclass
class _Space:
    """An iteration space: the output viewed as rows x columns."""

    shape: tuple[int, ...]
    split: int            # dims < split are rows, dims >= split the merged column axis

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:self.split], dtype=np.int64))

    @property
    def cols(self) -> int:
        return int(np.prod(self.shape[self.split:], dtype=np.int64))


class KernelGen:
    """Generates the module of one kernel."""

    def __init__(self, backend: "NumbaBackend", kernel: Kernel):
        self.b = backend
        self.k = kernel
        self.m = _Module()
        self.body = kernel.body
        self.dtypes = node_dtypes(kernel.body, backend.operand_dtype)
        self.out_dtype = kernel.info.dtype
        self.out_stored = backend.stored_dtype(kernel.output)
        self.workspace = 0          # float32 elements
        self.inplace: set[str] = set()
        self._loads: dict = {}
        self.root = len(kernel.body) - 1
        self.pending_broadcast = None

    def topo(self, nodes) -> list[int]:
        """`nodes` in dependency order (synthetic nodes are appended after their readers)."""
        wanted, order, done = set(nodes), [], set()
        for start in sorted(wanted):
            stack = [(start, False)]
            while stack:
                i, expanded = stack.pop()
                if i in done:
                    continue
                if expanded:
                    done.add(i)
                    order.append(i)
                    continue
                stack.append((i, True))
                stack.extend((a.ref, False) for a in self.body[i].args
                             if a.kind == "node" and a.ref in wanted and a.ref not in done)
        return order

    # -- operands --
    def tensor(self, operand: Operand) -> Tensor:
        return self.b.tensor(operand)

    def const_value(self, operand: Operand):
        if operand.kind == "const":
            value = self.b.constants[operand.ref]
            if np.size(value) == 1:
                return value
        return None

    def storage_array(self, t: Tensor) -> str:
        if t.storage.startswith("@"):
            return t.storage[1:]          # a local array of the kernel (its accumulator)
        return self.m.array(("storage", t.storage), ("storage", t.storage))

    def load_expr(self, t: Tensor, index: str) -> str:
        arr = self.storage_array(t)
        raw = f"{arr}[{index}]"
        if t.stored == "float16" and t.dtype != "float16":
            return f"f16_to_f32({raw})"
        if t.stored == "float16":
            return f"f16_to_f32({raw})"
        return raw

    # -- the elementwise machinery over a space --
    def plan_operands(self, nodes: list[int], shape: tuple[int, ...], extra_layouts=(),
                      min_cols_dims: int = 1, reshape_for: dict | None = None):
        """Layouts (broadcast to `shape`) of every boundary operand `nodes` read; the space."""
        uses: dict[tuple, Layout] = {}
        for i in nodes:
            node = self.body[i]
            for slot, a in enumerate(node.args):
                if a.kind in ("node", "absent"):
                    continue
                if self.scalar_const(a) is not None:
                    continue
                t = self.tensor(a)
                lay = t.layout
                if node.op == "BatchNormalization" and slot > 0:
                    rank = len(shape)
                    lay = Layout(lay.storage, lay.offset, (1, lay.size) + (1,) * (rank - 2),
                                 (0, lay.strides[0] if lay.shape else 0) + (0,) * (rank - 2))
                uses[(i, slot)] = _broadcast_layout(lay, shape)
        layouts = list(uses.values()) + list(extra_layouts)
        split = _column_split(layouts + [probe_layout(shape)], shape, min_cols_dims)
        return uses, _Space(shape, split)

    def scalar_const(self, a: Operand):
        """The value of a one-element constant operand (or a literal), else None."""
        if a.kind == "flit":
            return np.float32(a.ref)
        return self.const_value(a)

    def emit_nodes(self, nodes: list[int], uses: dict, space: _Space, values: dict[int, str],
                   indent: str, row_var: str, col_var: str | None, hoist: list[str] | None):
        """Code computing `nodes` at (row, col); returns lines. `values` maps node -> variable.

        Row-constant loads go to `hoist` (emitted once per row) when given.
        """
        lines: list[str] = []
        for i in nodes:
            node = self.body[i]
            if OPS[node.op].kind != "elementwise":
                raise Unsupported(f"{node.op} inside an elementwise body")
            args = []
            for slot, a in enumerate(node.args):
                if a.kind == "node":
                    args.append(values[a.ref])
                elif a.kind == "absent":
                    args.append("None")
                else:
                    args.append(self.operand_expr(i, slot, a, uses, space, row_var, col_var,
                                                  hoist, lines, indent))
            dt = self.dtypes[i]
            consts = {s: self.scalar_const(a) for s, a in enumerate(node.args)
                      if a.kind == "const"}
            expr = scalar_expr(node, args, [self.arg_dtype(a) for a in node.args], dt,
                               lambda s: consts.get(s))
            var = f"v{i}"
            lines.append(f"{indent}{var} = {expr}")
            values[i] = var
        return lines

    def arg_dtype(self, a: Operand) -> str:
        if a.kind == "node":
            return self.dtypes[a.ref]
        if a.kind == "absent":
            return "float32"
        return self.b.operand_dtype(a)

    def operand_expr(self, i, slot, a, uses, space, row_var, col_var, hoist, lines, indent):
        const = self.scalar_const(a)
        dt = _compute(self.b.operand_dtype(a))
        if const is not None:
            value = np.asarray(const).reshape(())
            if dt == "float32":
                return _flit(value)
            if dt == "bool":
                return "True" if bool(value) else "False"
            return f"{_NP_TYPES[dt]}({value.item()!r})"
        key = (i, slot)
        lay = uses[key]
        t = self.tensor(a)
        cache_key = (t.storage, lay.offset, lay.strides, row_var, col_var)
        if cache_key in self._loads:
            return self._loads[cache_key]
        j = space.split
        cs = _col_stride(lay, j) if col_var is not None else 0
        table = _row_table(lay, j) if j else np.array([lay.offset], dtype=np.int64)
        name = f"x{len(self._loads)}"
        base = self.row_base(table, row_var)
        if cs == 0:
            index = base
        elif cs == 1:
            index = f"{base} + {col_var}"
        else:
            index = f"{base} + {col_var} * {self.m.int_param(cs)}"
        expr = self.load_expr(t, index)
        if cs == 0 and hoist is not None:
            hoist.append(f"{name} = {expr}")
        else:
            lines.append(f"{indent}{name} = {expr}")
        self._loads[cache_key] = name
        return name

    def row_base(self, table: np.ndarray, row_var: str) -> str:
        """Expression of a row's base offset: affine in the row when it can be, else a table."""
        if table.size == 1:
            return self.m.int_param(table[0])
        steps = np.diff(table)
        if np.all(steps == steps[0]):
            if steps[0] == 0:
                return self.m.int_param(table[0])
            return f"({self.m.int_param(table[0])} + {row_var} * {self.m.int_param(steps[0])})"
        start = self.m.table(table)
        return f"G[{start} + {row_var}]"

    def store_expr(self, value: str) -> str:
        if self.out_stored == "float16":
            return f"f32_to_f16({value})"
        return value

    # -- kernel families --
    def generate(self) -> None:
        ops = [n.op for n in self.body]
        anchors = [i for i, n in enumerate(self.body)
                   if OPS.get(n.op) is not None and OPS[n.op].kind in ("anchor", "reduction")]
        if any(op not in OPS for op in ops):
            raise Unsupported("unknown op")
        if len(anchors) == 0:
            kinds = {OPS[op].kind for op in ops}
            if kinds <= {"elementwise", "view"}:
                return self.gen_elementwise()
            raise Unsupported(f"body of {', '.join(sorted(set(ops)))}")
        if len(anchors) > 1:
            raise Unsupported("more than one anchor")
        a = anchors[0]
        op = self.body[a].op
        epilogue = [i for i in range(len(self.body)) if i != a and self.depends_on(i, a)]
        prologue = [i for i in range(len(self.body)) if i != a and i not in epilogue]
        for i in prologue + epilogue:
            if OPS[self.body[i].op].kind not in ("elementwise",):
                raise Unsupported(f"{self.body[i].op} next to {op}")
        if op in ("MatMul", "Gemm"):
            self.gen_matmul(a, prologue, epilogue)
            if self.pending_broadcast:
                self.broadcast_epilogue(*self.pending_broadcast)
            return None
        if op == "Conv":
            self.gen_conv(a, prologue, epilogue)
            if self.pending_broadcast:
                self.broadcast_epilogue(*self.pending_broadcast)
            return None
        if op in ("Softmax", "LayerNormalization"):
            return self.gen_rows(a, prologue, epilogue)
        if op in ("ReduceMean", "ReduceSum", "GlobalAveragePool"):
            return self.gen_reduce(a, prologue, epilogue)
        if op in ("MaxPool", "AveragePool"):
            return self.gen_pool(a, prologue, epilogue)
        raise Unsupported(f"anchor {op}")

    def depends_on(self, i: int, a: int) -> bool:
        stack, seen = [i], set()
        while stack:
            j = stack.pop()
            if j == a:
                return True
            if j in seen:
                continue
            seen.add(j)
            stack.extend(x.ref for x in self.body[j].args if x.kind == "node")
        return False

    def resolve_views(self) -> None:
        """Inline view nodes over boundary operands become operands with the viewed layout."""
        for i, node in enumerate(self.body):
            if OPS[node.op].kind != "view":
                continue
            a = node.args[0]
            if a.kind not in ("buffer", "const"):
                raise Unsupported("a view of an inline value")
            t = self.tensor(a)
            base = np.lib.stride_tricks.as_strided(
                probe((1,)), shape=t.layout.shape, strides=t.layout.strides)
            view = apply_view(node, base)
            if view is None:
                raise Unsupported("a view that needs a copy inside a body")
            lay = layout_of(view, t.storage, probe((1,)))
            lay = Layout(t.storage, t.layout.offset + lay.offset, lay.shape, lay.strides)
            self.b.synthetic[("view", self.k.name, i)] = Tensor(t.storage, t.dtype, t.stored, lay)
            self.body[i] = BodyNode("Identity", [Operand("synthetic", ("view", self.k.name, i))],
                                    {})

    def gen_elementwise(self, serial: bool = False) -> None:
        shape = tuple(self.k.info.shape)
        nodes = self.topo(self.needed(self.root))
        uses, space = self.plan_operands(nodes, shape)
        R, C = space.rows, space.cols
        numel = R * C
        m = self.m
        m.parallel = not serial and self.b.threads > 1 and numel >= PARALLEL_MIN_ELEMENTS
        chunk = C
        if m.parallel:
            chunk = max(4096, -(-C // (4 * self.b.threads))) if R < 4 * self.b.threads else C
        nchunks = -(-C // chunk) if C else 0
        m.lines += [f"R = {m.int_param(R)}", f"C = {m.int_param(C)}",
                    f"CH = {m.int_param(chunk)}", f"NC = {m.int_param(nchunks)}"]
        loop = "prange" if m.parallel else "range"
        m.lines.append(f"for t in {loop}(R * NC):")
        m.lines.append("    r = t // NC")
        m.lines.append("    c0 = (t - r * NC) * CH")
        m.lines.append("    c1 = min(c0 + CH, C)")
        hoist: list[str] = []
        values: dict[int, str] = {}
        inner = self.emit_nodes(nodes, uses, space, values, "        ", "r", "c", hoist)
        m.lines += ["    " + h for h in hoist]
        m.lines.append("    for c in range(c0, c1):")
        m.lines += inner
        m.lines.append(f"        out[r * C + c] = {self.store_expr(values[self.root])}")
        # in place: an input read only densely (at the index written) may be overwritten
        dense: dict[str, bool] = {}
        for (i, slot), lay in uses.items():
            a = self.body[i].args[slot]
            storage = self.tensor(a).storage if a.kind in ("buffer", "synthetic") else None
            if storage is None:
                continue
            ok = a.kind == "buffer" and lay.strides == _c_strides(shape) and lay.offset == 0 \
                and self.b.stored_dtype(a.ref) == self.out_stored and a.ref == storage
            dense[storage] = dense.get(storage, True) and ok
        if not serial:
            self.inplace.update(name for name, ok in dense.items() if ok)

    def needed(self, root: int) -> list[int]:
        """The body nodes `root` depends on (itself included)."""
        seen, stack = set(), [root]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(a.ref for a in self.body[i].args if a.kind == "node")
        return sorted(seen)

    def broadcast_epilogue(self, a: int, acc: str, anchor_shape) -> None:
        """After the anchor filled `acc` whole: the rest of the body as one elementwise pass
        over the output, reading the anchor's value from acc with broadcasting."""
        key = ("acc", self.k.name)
        self.b.synthetic[key] = Tensor("@" + acc, "float32", "float32",
                                       Layout("@" + acc, 0, tuple(anchor_shape),
                                              _c_strides(tuple(anchor_shape))))
        self.body[a] = BodyNode("Identity", [Operand("synthetic", key)], {})
        self.gen_elementwise(serial=True)

    # epilogue over rows [r0, r1) of a space, reading the anchor's value from acc
    def emit_epilogue(self, a: int, epilogue: list[int], shape, min_cols_dims: int,
                      acc_index: str, indent: str, acc_name: str = "ACC"):
        """Lines: for r in [r0, r1): for c: value = epilogue(acc[...]); out[...] = value."""
        uses, space = self.plan_operands(epilogue, shape, min_cols_dims=min_cols_dims)
        if space.split > len(shape) - min_cols_dims:
            raise Unsupported("epilogue columns")
        space = _Space(shape, len(shape) - min_cols_dims)
        values = {a: "acc_v"}
        hoist: list[str] = []
        inner = self.emit_nodes(epilogue, uses, space, values, indent + "        ", "r", "c",
                                hoist)
        last = values[epilogue[-1]] if epilogue else "acc_v"
        lines = [f"{indent}for r in range(r0, r1):"]
        lines += [f"{indent}    {h}" for h in hoist]
        lines.append(f"{indent}    for c in range(EC):")
        lines.append(f"{indent}        acc_v = {acc_name}[{acc_index}]")
        lines += inner
        lines.append(f"{indent}        out[r * EC + c] = {self.store_expr(last)}")
        return lines, space

    def anchor_tensor(self, a: int, slot: int) -> Tensor:
        arg = self.body[a].args[slot]
        if arg.kind not in ("buffer", "const", "synthetic"):
            raise Unsupported("an anchor reading an inline value")
        return self.tensor(arg)

    def f32_input(self, t: Tensor, name: str) -> str:
        """Code making `name` a float32 flat array of tensor t's elements (contiguous)."""
        m = self.m
        if t.dtype != "float32":
            raise Unsupported(f"anchor on {t.dtype}")
        arr = self.storage_array(t)
        if not t.layout.contiguous:
            return self.pack(t, name)
        off = m.int_param(t.layout.offset)
        n = m.int_param(t.layout.size)
        if t.stored == "float16":
            ws = self.alloc(t.layout.size)
            m.lines.append(f"{name} = WS[{ws}:{ws} + {n}]")
            m.lines.append(f"K.widen_f16({arr}, {off}, {n}, {name})")
        else:
            m.lines.append(f"{name} = {arr}[{off}:{off} + {n}]")
        return name

    def pack(self, t: Tensor, name: str) -> str:
        """Code copying a strided tensor into contiguous float32 workspace."""
        m = self.m
        lay = t.layout
        shape, strides = list(lay.shape), list(lay.strides)
        while len(shape) > 4:              # fold leading dims that merge
            if strides[0] == strides[1] * shape[1] or shape[0] == 1:
                shape[1] *= shape[0]
                shape, strides = shape[1:], strides[1:]
            else:
                raise Unsupported("a strided anchor input of rank > 4")
        shape = [1] * (4 - len(shape)) + shape
        strides = [0] * (4 - len(strides)) + strides
        ws = self.alloc(lay.size)
        arr = self.storage_array(t)
        m.lines.append(f"{name} = WS[{ws}:{ws} + {m.int_param(lay.size)}]")
        dims = [m.int_param(n) for n in shape]
        steps = [m.int_param(s_) for s_ in strides]
        m.lines.append(f"k_ = 0")
        m.lines.append(f"for i0 in range({dims[0]}):")
        m.lines.append(f"    for i1 in range({dims[1]}):")
        m.lines.append(f"        for i2 in range({dims[2]}):")
        m.lines.append(f"            b_ = {m.int_param(lay.offset)} + i0 * {steps[0]} + "
                       f"i1 * {steps[1]} + i2 * {steps[2]}")
        m.lines.append(f"            for i3 in range({dims[3]}):")
        m.lines.append(f"                {name}[k_ + i3] = "
                       f"{self.load_expr(t, f'b_ + i3 * {steps[3]}')}")
        m.lines.append(f"            k_ += {dims[3]}")
        return name

    def alloc(self, elements: int) -> str:
        start = self.workspace
        self.workspace += int(elements) + 16
        return self.m.int_param(start)

    def whole_acc(self, a: int, shape) -> str:
        """Workspace for an anchor result that the epilogue broadcasts to a larger output."""
        numel = int(np.prod(shape))
        ws = self.alloc(numel)
        self.m.lines.append(f"ACC = WS[{ws}:{ws} + {self.m.int_param(numel)}]")
        self.pending_broadcast = (a, "ACC", tuple(shape))
        return "ACC"

    def acc_target(self, numel: int) -> tuple[str, bool]:
        """Where the anchor writes float32 results: `out` itself, or workspace."""
        if self.out_stored == "float32" and self.out_dtype == "float32":
            return "out", False
        ws = self.alloc(numel)
        self.m.lines.append(f"ACC = WS[{ws}:{ws} + {self.m.int_param(numel)}]")
        return "ACC", True

    def gen_matmul(self, a: int, prologue: list[int], epilogue: list[int]) -> None:
        node = self.body[a]
        m = self.m
        if prologue:
            epilogue = sorted(prologue + epilogue)
        ta = self.anchor_tensor(a, 0)
        tb = self.anchor_tensor(a, 1)
        if ta.dtype != "float32" or tb.dtype != "float32":
            raise Unsupported("MatMul on non-float32")
        sa, sb = ta.layout.shape, tb.layout.shape
        out_shape = tuple(self.k.info.shape)
        if node.op == "Gemm":
            at = node.attrs
            if at["trans_a"] or len(sa) != 2 or len(sb) != 2:
                raise Unsupported("Gemm with trans_a")
            if tb.storage not in self.b.constants and at["trans_b"]:
                raise Unsupported("Gemm with a transposed buffer B")
            mshape = (sa[0], sb[0] if at["trans_b"] else sb[1])
        else:
            if len(sa) < 2 or len(sb) < 2:
                raise Unsupported("MatMul on 1-D")
            batch = np.broadcast_shapes(sa[:-2], sb[:-2])
            mshape = tuple(batch) + (sa[-2], sb[-1])
        bcast = int(np.prod(mshape)) != int(np.prod(out_shape))
        M, N = mshape[-2], mshape[-1]
        Kd = sa[-1]
        # B: a constant is passed as a contiguous 2-D (K, N) array; a buffer as its storage
        b_const = tb.storage in self.b.constants and tb.layout.contiguous
        if node.op == "Gemm":
            Bv = np.asarray(self.b.constants[tb.storage]) if b_const else None
            if Bv is not None and node.attrs["trans_b"]:
                Bv = np.ascontiguousarray(Bv.T)
            alpha, beta = float(node.attrs["alpha"]), float(node.attrs["beta"])
        else:
            alpha, beta = 1.0, 0.0
        epi_shape = out_shape
        if bcast:
            acc = self.whole_acc(a, mshape)
        else:
            acc, widened = self.acc_target(int(np.prod(out_shape)))
        # epilogue operands (Gemm's C joins them)
        extra = []
        c_arg = None
        if node.op == "Gemm" and len(node.args) > 2 and node.args[2].kind != "absent" \
                and beta != 0.0:
            c_arg = node.args[2]
        lines_epi, space = None, None
        # the rows of the epilogue space are (batch..., M); columns N
        cols_dims = 1
        epi_nodes = list(epilogue)
        pre = []
        if alpha != 1.0 or c_arg is not None:
            # rewrite: acc_v -> alpha * acc_v + beta * C as synthetic nodes the epilogue reads
            idx = a
            if alpha != 1.0:
                idx = len(self.body)
                self.body.append(BodyNode("Mul", [Operand("node", a), Operand("flit", alpha)],
                                          {}))
                self.dtypes.append("float32")
                pre.append(idx)
            if c_arg is not None:
                cidx = len(self.body)
                if beta != 1.0:
                    self.body.append(BodyNode("Mul", [c_arg, Operand("flit", beta)], {}))
                    self.dtypes.append("float32")
                    pre.append(cidx)
                    c_val = Operand("node", cidx)
                else:
                    c_val = c_arg
                self.body.append(BodyNode("Add", [Operand("node", idx), c_val], {}))
                self.dtypes.append("float32")
                pre.append(len(self.body) - 1)
            # the old consumers of the anchor read the new value
            new = pre[-1]
            for i in epi_nodes:
                self.body[i].args = [Operand("node", new) if x.kind == "node" and x.ref == a
                                     else x for x in self.body[i].args]
            epi_nodes = pre + epi_nodes
        if node.op == "MatMul" or True:
            epi_shape = tuple(mshape)
        if bcast:
            lines_epi = []
        else:
            lines_epi, space = self.emit_epilogue(a, epi_nodes, epi_shape, cols_dims,
                                                  "r * EC + c", "", acc)
            if space.cols != N:
                raise Unsupported("epilogue column blocking")
        m.lines.append(f"EC = {m.int_param(N)}")
        A = self.f32_input(ta, "A")
        m.lines.append(f"A2 = A.reshape(({m.int_param(int(np.prod(sa[:-1])))}, "
                       f"{m.int_param(Kd)}))")
        if b_const:
            bkey = ("B", self.k.name)
            value = Bv if node.op == "Gemm" else np.ascontiguousarray(
                np.asarray(self.b.constants[tb.storage], dtype=np.float32).reshape(sb))
            Bname = m.array(bkey, ("array", np.ascontiguousarray(value, dtype=np.float32)))
        else:
            Bname = self.f32_input(tb, "B")
        block = max(8, min(M, (1 << 16) // max(N, 1)))
        batch_a = int(np.prod(sa[:-2])) if len(sa) > 2 else 1
        batch = int(np.prod(mshape[:-2])) if len(mshape) > 2 else 1
        epi_fn = ["    " + line for line in lines_epi]
        if b_const and (len(sb) == 2):
            # one GEMM over all rows of A (batch folded into M), in row blocks
            rows = batch * M
            m.lines.append(f"RT = {m.int_param(rows)}")
            m.lines.append(f"BM = {m.int_param(block)}")
            m.lines.append(f"for r0 in range(0, RT, BM):")
            m.lines.append(f"    r1 = min(r0 + BM, RT)")
            m.lines.append(f"    np.dot(A2[r0:r1], {Bname}, {acc}[r0 * EC:r1 * EC]"
                           f".reshape((r1 - r0, EC)))")
            m.lines += epi_fn
            return
        # batched: broadcast batch dims, 2-D GEMM per batch
        if len(sb) == 2 and not b_const:
            pass
        sb_full = tuple(sb)
        if len(sa) - 2 > len(mshape) - 2 or len(sb) - 2 > len(mshape) - 2:
            raise Unsupported("batch dims")
        bdims = mshape[:-2]
        sa_b = (1,) * (len(bdims) - (len(sa) - 2)) + tuple(sa[:-2])
        sb_b = (1,) * (len(bdims) - (len(sb) - 2)) + tuple(sb[:-2])
        if b_const:
            m.lines.append(f"B = {Bname}")
        m.lines.append(f"B3 = B.reshape(({m.int_param(int(np.prod(sb[:-2])) if len(sb) > 2 else 1)}, "
                       f"{m.int_param(Kd)}, {m.int_param(N)}))")
        m.lines.append(f"A3 = A.reshape(({m.int_param(batch_a)}, {m.int_param(M)}, "
                       f"{m.int_param(Kd)}))")
        # batch index -> A batch, B batch (row-major over bdims with broadcasting)
        ta_idx = _batch_map(bdims, sa_b)
        tb_idx = _batch_map(bdims, sb_b)
        m.lines.append(f"M = {m.int_param(M)}")
        ta_t = m.table(ta_idx)
        tb_t = m.table(tb_idx)
        m.lines.append(f"for bi in range({m.int_param(batch)}):")
        m.lines.append(f"    r0 = bi * M")
        m.lines.append(f"    r1 = r0 + M")
        m.lines.append(f"    np.dot(A3[G[{ta_t} + bi]], B3[G[{tb_t} + bi]], "
                       f"{acc}[r0 * EC:r1 * EC].reshape((M, EC)))")
        m.lines += epi_fn

    def gen_conv(self, a: int, prologue: list[int], epilogue: list[int]) -> None:
        node = self.body[a]
        m = self.m
        if prologue:
            epilogue = sorted(prologue + epilogue)
        tx = self.anchor_tensor(a, 0)
        tw = self.anchor_tensor(a, 1)
        if tw.storage not in self.b.constants:
            raise Unsupported("Conv with non-constant weights")
        if len(tx.layout.shape) != 4:
            raise Unsupported("Conv that is not 2-D")
        attrs = node.attrs
        N, C, H, W = tx.layout.shape
        wv = np.asarray(self.b.constants[tw.storage], dtype=np.float32)
        M, Cg, kh, kw = wv.shape
        G = int(attrs["group"])
        Mg = M // G
        ph, pw, pe_h, pe_w = attrs["pads"]
        sh, sw = attrs["strides"]
        dh, dw = attrs["dilations"]
        OH = (H + ph + pe_h - ((kh - 1) * dh + 1)) // sh + 1
        OW = (W + pw + pe_w - ((kw - 1) * dw + 1)) // sw + 1
        out_shape = (N, M, OH, OW)
        bcast = tuple(self.k.info.shape) != out_shape
        P = OH * OW
        if bcast:
            acc = self.whole_acc(a, out_shape)
        else:
            acc, widened = self.acc_target(N * M * P)
        epi_nodes = list(epilogue)
        b_arg = node.args[2] if len(node.args) > 2 else Operand("absent")
        if b_arg.kind != "absent":
            bias = self.tensor(b_arg)
            key = ("convbias", self.k.name)
            lay = Layout(bias.layout.storage, bias.layout.offset, (1, M, 1, 1),
                         (0, bias.layout.strides[0] if bias.layout.shape else 0, 0, 0))
            self.b.synthetic[key] = Tensor(bias.storage, bias.dtype, bias.stored, lay)
            idx = len(self.body)
            self.body.append(BodyNode("Add", [Operand("node", a), Operand("synthetic", key)], {}))
            self.dtypes.append("float32")
            for i in epi_nodes:
                self.body[i].args = [Operand("node", idx) if x.kind == "node" and x.ref == a
                                     else x for x in self.body[i].args]
            epi_nodes = [idx] + epi_nodes
        if bcast:
            lines_epi = []
        else:
            lines_epi, space = self.emit_epilogue(a, epi_nodes, out_shape, 2, "r * EC + c", "",
                                                  acc)
            if space.cols != P:
                raise Unsupported("Conv epilogue columns")
        m.lines.append(f"EC = {m.int_param(P)}")
        X = self.f32_input(tx, "X")
        geo = [H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW]
        gexpr = ", ".join(m.int_param(v) for v in geo)
        m.lines.append(f"NB = {m.int_param(N)}")
        m.lines.append(f"CI = {m.int_param(C)}")
        m.lines.append(f"MO = {m.int_param(M)}")
        m.lines.append(f"HW = {m.int_param(H * W)}")
        depthwise = Cg == 1 and Mg == 1
        if depthwise:
            from .kernels_numba import depthwise_pad_size
            wname = m.array(("W", self.k.name), ("array", np.ascontiguousarray(wv.reshape(-1))))
            pad = self.alloc(depthwise_pad_size(H, W, kh, kw, sh, sw, ph, pw, dh, dw))
            padn = m.int_param(depthwise_pad_size(H, W, kh, kw, sh, sw, ph, pw, dh, dw))
            block = max(1, min(M, (1 << 15) // max(P, 1)))
            m.lines.append(f"PADS = WS[{pad}:{pad} + {padn}]")
            m.lines.append(f"BC = {m.int_param(block)}")
            m.lines.append("for n in range(NB):")
            m.lines.append("    for m0 in range(0, MO, BC):")
            m.lines.append("        m1 = min(m0 + BC, MO)")
            m.lines.append(f"        K.depthwise2d(X, n * CI * HW, {wname}, {gexpr}, m0, m1, PADS, "
                           f"{acc}, (n * MO + m0) * EC)")
            m.lines.append("        r0 = n * MO + m0")
            m.lines.append("        r1 = n * MO + m1")
            m.lines += ["        " + line for line in lines_epi]
            return
        K_ = Cg * kh * kw
        wname = m.array(("W", self.k.name),
                        ("array", np.ascontiguousarray(wv.reshape(G, Mg, K_))))
        direct = kh == 1 and kw == 1 and sh == 1 and sw == 1 and not any(attrs["pads"]) \
            and dh == 1 and dw == 1
        block = max(8, min(Mg, (1 << 16) // max(P, 1)))
        m.lines.append(f"GR = {m.int_param(G)}")
        m.lines.append(f"CG = {m.int_param(Cg)}")
        m.lines.append(f"MG = {m.int_param(Mg)}")
        m.lines.append(f"KK = {m.int_param(K_)}")
        m.lines.append(f"BM = {m.int_param(block)}")
        if not direct:
            cols = self.alloc(K_ * P)
            m.lines.append(f"COLS = WS[{cols}:{cols} + KK * EC].reshape((KK, EC))")
        m.lines.append("for n in range(NB):")
        m.lines.append("    for g in range(GR):")
        if direct:
            m.lines.append("        xo = (n * CI + g * CG) * HW")
            m.lines.append("        COLS = X[xo:xo + CG * HW].reshape((CG, EC))")
        else:
            m.lines.append(f"        K.im2col(X, (n * CI + g * CG) * HW, CG, {gexpr}, "
                           f"COLS.reshape(-1))")
        m.lines.append("        for m0 in range(0, MG, BM):")
        m.lines.append("            m1 = min(m0 + BM, MG)")
        m.lines.append("            r0 = n * MO + g * MG + m0")
        m.lines.append("            r1 = n * MO + g * MG + m1")
        m.lines.append(f"            np.dot({wname}[g, m0:m1], COLS, "
                       f"{acc}[r0 * EC:r1 * EC].reshape((m1 - m0, EC)))")
        m.lines += ["            " + line for line in lines_epi]

    def gen_rows(self, a: int, prologue: list[int], epilogue: list[int]) -> None:
        """Softmax / LayerNormalization, one row at a time with prologue and epilogue."""
        node = self.body[a]
        m = self.m
        shape = tuple(self.k.info.shape)
        rank = len(shape)
        axis = node.attrs["axis"]
        axis = axis + rank if axis < 0 else axis
        if node.op == "Softmax" and axis != rank - 1:
            raise Unsupported("Softmax not over the last axis")
        if self.dtypes[a] != "float32":
            raise Unsupported("row kernel on non-float32")
        x_arg = node.args[0]
        # prologue: the value of x at (r, c); the row space is dims < axis, columns dims >= axis
        pro_nodes = prologue
        extra = []
        uses_p, space_p = self.plan_operands(pro_nodes, shape, min_cols_dims=rank - axis)
        uses_e, space_e = self.plan_operands(epilogue, shape, min_cols_dims=rank - axis)
        # x itself when it is a boundary
        if x_arg.kind != "node":
            t = self.tensor(x_arg)
            lay = _broadcast_layout(t.layout, shape)
            split = _column_split([lay, probe_layout(shape)], shape, rank - axis)
            if split > axis:
                raise Unsupported("row kernel input strides")
        if space_p.split > axis or space_e.split > axis:
            raise Unsupported("row kernel operand strides")
        space = _Space(shape, axis)
        space_p = _Space(shape, axis)
        space_e = _Space(shape, axis)
        uses_p, _ = self._replan(pro_nodes, shape, axis)
        uses_e, _ = self._replan(epilogue, shape, axis)
        R, C = space.rows, space.cols
        m.lines.append(f"R = {m.int_param(R)}")
        m.lines.append(f"C = {m.int_param(C)}")
        ws = self.alloc(C)
        m.lines.append(f"ROW = WS[{ws}:{ws} + C]")
        m.lines.append("for r in range(R):")
        hoist: list[str] = []
        values: dict[int, str] = {}
        pro = self.emit_nodes(pro_nodes, uses_p, space_p, values, "        ", "r", "c", hoist)
        if x_arg.kind == "node":
            xval = values[x_arg.ref]
        else:
            xval = self.operand_expr(a, 0, x_arg, {(a, 0): _broadcast_layout(
                self.tensor(x_arg).layout, shape)}, space, "r", "c", hoist, pro, "        ")
        m.lines += ["    " + h for h in hoist]
        if node.op == "Softmax":
            m.lines.append("    mx = -np.inf")
            m.lines.append("    for c in range(C):")
            m.lines += pro
            m.lines.append(f"        xv = F32({xval})")
            m.lines.append("        ROW[c] = xv")
            m.lines.append("        mx = xv if xv > mx else mx")
            m.lines.append("    mx = F32(0) if mx == -np.inf else mx")
            m.lines.append("    s = F32(0)")
            m.lines.append("    for c in range(C):")
            m.lines.append("        e = exp_f32(ROW[c] - mx)")
            m.lines.append("        ROW[c] = e")
            m.lines.append("        s += e")
            m.lines.append("    inv = F32(1) / s")
            scale_expr = "ROW[c] * inv"
        else:
            eps = _flit(node.attrs["epsilon"])
            m.lines.append("    s = F32(0)")
            m.lines.append("    for c in range(C):")
            m.lines += pro
            m.lines.append(f"        xv = F32({xval})")
            m.lines.append("        ROW[c] = xv")
            m.lines.append("        s += xv")
            m.lines.append("    mean = s / F32(C)")
            m.lines.append("    q = F32(0)")
            m.lines.append("    for c in range(C):")
            m.lines.append("        d = ROW[c] - mean")
            m.lines.append("        q += d * d")
            m.lines.append(f"    inv = F32(1) / np.sqrt(q / F32(C) + {eps})")
            # scale and bias: vectors over the normalized dims
            sc = self.row_vector(node.args[1], shape[axis:])
            bi = self.row_vector(node.args[2], shape[axis:]) if len(node.args) > 2 else None
            scale_expr = f"(ROW[c] - mean) * inv * {sc}"
            if bi is not None:
                scale_expr += f" + {bi}"
        values_e: dict[int, str] = {a: "y"}
        hoist_e: list[str] = []
        epi = self.emit_nodes(epilogue, uses_e, space_e, values_e, "        ", "r", "c", hoist_e)
        last = values_e[epilogue[-1]] if epilogue else "y"
        m.lines += ["    " + h for h in hoist_e]
        m.lines.append("    for c in range(C):")
        m.lines.append(f"        y = {scale_expr}")
        m.lines += epi
        m.lines.append(f"        out[r * C + c] = {self.store_expr(last)}")

    def _replan(self, nodes, shape, split):
        uses: dict[tuple, Layout] = {}
        for i in nodes:
            for slot, a in enumerate(self.body[i].args):
                if a.kind in ("node", "absent") or self.scalar_const(a) is not None:
                    continue
                uses[(i, slot)] = _broadcast_layout(self.tensor(a).layout, shape)
        return uses, _Space(shape, split)

    def row_vector(self, arg: Operand, cols_shape) -> str:
        """Expression of a vector operand indexed by the column `c` (LayerNorm scale/bias)."""
        if arg.kind == "absent":
            return None
        const = self.scalar_const(arg)
        if const is not None:
            return _flit(np.asarray(const).reshape(()))
        t = self.tensor(arg)
        lay = _broadcast_layout(t.layout, tuple(cols_shape))
        split = _column_split([lay, probe_layout(tuple(cols_shape))], tuple(cols_shape),
                              len(cols_shape))
        cs = _col_stride(lay, 0)
        off = self.m.int_param(lay.offset)
        if cs == 1:
            return self.load_expr(t, f"{off} + c")
        if cs == 0:
            return self.load_expr(t, off)
        return self.load_expr(t, f"{off} + c * {self.m.int_param(cs)}")

    def gen_reduce(self, a: int, prologue: list[int], epilogue: list[int]) -> None:
        node = self.body[a]
        m = self.m
        x_arg = node.args[0]
        in_shape = self.value_shape(x_arg)
        rank = len(in_shape)
        if node.op == "GlobalAveragePool":
            axes, mean = tuple(range(2, rank)), True
        else:
            axes, mean = tuple(sorted(a_ + rank if a_ < 0 else a_ for a_ in node.attrs["axes"])), \
                node.op == "ReduceMean"
            if not axes:
                raise Unsupported("reduce over no axes")
        if self.dtypes[a] != "float32":
            raise Unsupported("reduction on non-float32")
        first = axes[0]
        if axes != tuple(range(first, rank)):
            raise Unsupported("reduction over non-trailing axes")
        uses_p, space_p = self._replan(prologue, in_shape, first)
        for lay in uses_p.values():
            if _column_split([lay], in_shape, rank - first) > first:
                raise Unsupported("reduction input strides")
        out_shape = tuple(self.k.info.shape)
        R = int(np.prod(in_shape[:first], dtype=np.int64))
        C = int(np.prod(in_shape[first:], dtype=np.int64))
        m.lines.append(f"R = {m.int_param(R)}")
        m.lines.append(f"C = {m.int_param(C)}")
        hoist: list[str] = []
        values: dict[int, str] = {}
        pro = self.emit_nodes(prologue, uses_p, space_p, values, "        ", "r", "c", hoist)
        if x_arg.kind == "node":
            xval = values[x_arg.ref]
        else:
            lay = _broadcast_layout(self.tensor(x_arg).layout, in_shape)
            if _column_split([lay], in_shape, rank - first) > first:
                raise Unsupported("reduction input strides")
            xval = self.operand_expr(a, 0, x_arg, {(a, 0): lay}, space_p, "r", "c", hoist,
                                     pro, "        ")
        # epilogue over the output, one element per row
        eshape = out_shape
        uses_e, space_e = self._replan(epilogue, eshape, len(eshape))
        values_e = {a: "y"}
        hoist_e: list[str] = []
        epi = self.emit_nodes(epilogue, uses_e, space_e, values_e, "    ", "r", None, hoist_e)
        last = values_e[epilogue[-1]] if epilogue else "y"
        m.lines.append("for r in range(R):")
        m.lines += ["    " + h for h in hoist]
        m.lines.append("    s = F32(0)")
        m.lines.append("    for c in range(C):")
        m.lines += pro
        m.lines.append(f"        s += {xval}")
        m.lines.append("    y = s / F32(C)" if mean else "    y = s")
        m.lines += ["    " + h for h in hoist_e]
        m.lines += epi
        m.lines.append(f"    out[r] = {self.store_expr(last)}")

    def value_shape(self, arg: Operand) -> tuple[int, ...]:
        """The shape of an operand, or of an inline elementwise value (NumPy broadcasting)."""
        if arg.kind == "node":
            node = self.body[arg.ref]
            if OPS[node.op].kind != "elementwise" or node.op == "BatchNormalization":
                raise Unsupported("shape of an inline value")
            shapes = [self.value_shape(a) for a in node.args
                      if a.kind != "absent" and self.scalar_const(a) is None]
            return tuple(np.broadcast_shapes(*shapes)) if shapes else ()
        return tuple(self.tensor(arg).layout.shape)

    def gen_pool(self, a: int, prologue: list[int], epilogue: list[int]) -> None:
        node = self.body[a]
        m = self.m
        if prologue:
            raise Unsupported("pool with a prologue")
        tx = self.anchor_tensor(a, 0)
        if len(tx.layout.shape) != 4 or tx.dtype != "float32":
            raise Unsupported("pooling that is not 2-D float32")
        from .numpy_ops import _pool_geometry
        attrs = node.attrs
        N, C, H, W = tx.layout.shape
        nd, ks, pb, pe, st, dil, out_sp, extra = _pool_geometry(
            probe(tx.layout.shape), attrs["kernel_shape"], attrs["pads"], attrs["strides"],
            attrs["dilations"], attrs["ceil_mode"])
        OH, OW = out_sp
        out_shape = (N, C, OH, OW)
        if tuple(self.k.info.shape) != out_shape:
            raise Unsupported("pool output shape")
        acc, widened = self.acc_target(N * C * OH * OW)
        lines_epi, space = self.emit_epilogue(a, epilogue, out_shape, 2, "r * EC + c", "", acc)
        if space.cols != OH * OW:
            raise Unsupported("pool epilogue columns")
        X = self.f32_input(tx, "X")
        is_max = node.op == "MaxPool"
        include = bool(attrs.get("count_include_pad", 0))
        geo = [N * C, H, W, ks[0], ks[1], st[0], st[1], pb[0], pb[1], pe[0], pe[1], dil[0],
               dil[1], OH, OW, int(is_max), int(include)]
        m.lines.append(f"EC = {m.int_param(OH * OW)}")
        m.lines.append(f"K.pool2d(X, 0, {', '.join(m.int_param(v) for v in geo)}, {acc})")
        m.lines.append(f"r0 = 0")
        m.lines.append(f"r1 = {m.int_param(N * C)}")
        m.lines += lines_epi


def probe_layout(shape) -> Layout:
    return Layout("", 0, tuple(shape), _c_strides(shape))


def _batch_map(bdims, sub) -> np.ndarray:
    """For each batch index over `bdims` (row-major), the flat index into a broadcast `sub`."""
    if not bdims:
        return np.zeros(1, dtype=np.int64)
    idx = np.arange(int(np.prod(sub)) if sub else 1, dtype=np.int64).reshape(sub if sub else ())
    return np.ascontiguousarray(np.broadcast_to(idx, bdims).reshape(-1))


# ---- the backend: sources, cache, compile, bind -----------------------------------------------

class NumbaBackend:
    """Builds compiled kernels for one lowered program."""

    def __init__(self, plan: KernelPlan, constants: dict[str, np.ndarray],
                 layouts: dict[str, Layout], stored: dict[str, str],
                 cache_dir: str | Path | None = None, threads: int | None = None):
        import numba
        self.plan = plan
        self.constants = constants
        self.layouts = layouts
        self.stored = stored
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.threads = threads if threads is not None else numba.get_num_threads()
        self.synthetic: dict[Any, Tensor] = {}
        self.stats = JitStats()
        self.modules: dict[str, Any] = {}

    # -- tensors --
    def operand_dtype(self, a: Operand) -> str:
        if a.kind == "flit":
            return "float32"
        if a.kind == "synthetic":
            return self.synthetic[a.ref].dtype
        if a.kind == "const":
            return str(np.asarray(self.constants[a.ref]).dtype)
        if a.ref in self.plan.inputs:
            return self.plan.inputs[a.ref].dtype
        return self.plan.buffers[a.ref].dtype

    def stored_dtype(self, name: str) -> str:
        return self.stored.get(name) or self.dtype_of(name)

    def dtype_of(self, name: str) -> str:
        if name in self.constants:
            return str(np.asarray(self.constants[name]).dtype)
        if name in self.plan.inputs:
            return self.plan.inputs[name].dtype
        return self.plan.buffers[name].dtype

    def tensor(self, a: Operand) -> Tensor:
        if a.kind == "synthetic":
            return self.synthetic[a.ref]
        if a.kind not in ("buffer", "const"):
            raise Unsupported(f"operand {a.kind}")
        lay = self.layouts.get(a.ref)
        if lay is None:
            raise Unsupported("an operand without a layout")
        return Tensor(lay.storage, self.dtype_of(a.ref), self.stored_dtype(lay.storage), lay)

    # -- kernels --
    def prepare(self, kernel: Kernel) -> Impl:
        """Generate, cache and compile one kernel; raises Unsupported for the NumPy fallback."""
        started = time.perf_counter()
        body = [BodyNode(n.op, list(n.args), dict(n.attrs)) for n in kernel.body]
        k = Kernel(kernel.name, kernel.output, kernel.inputs, body, kernel.kind, kernel.info,
                   kernel.eclass)
        gen = KernelGen(self, k)
        if kernel.info.dtype not in ("float32", "float64", "int64", "int32", "bool") and \
                gen.out_stored != "float16":
            raise Unsupported(f"output dtype {kernel.info.dtype}")
        gen.resolve_views()
        gen.generate()
        source = gen.m.source()
        fn, digest = self.load(source)
        impl = Impl(fn=fn, args=gen.m.arrays, workspace_bytes=4 * gen.workspace,
                    inplace_inputs=gen.inplace, source_hash=digest)
        impl.params = np.asarray(gen.m.params or [0], dtype=np.int64)
        impl.fparams = np.asarray(gen.m.fparams or [0.0], dtype=np.float32)
        impl.out_stored = gen.out_stored
        self.stats.seconds += time.perf_counter() - started
        self.stats.kernels += 1
        return impl

    def load(self, source: str):
        digest = hashlib.sha256(source.encode()).hexdigest()[:24]
        if digest in self.modules:
            return self.modules[digest], digest
        folder = self.cache_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"k_{digest}.py"
        if not path.exists():
            tmp = folder / f".k_{digest}.{os.getpid()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, path)
        name = f"eqsat_fuse_kernel_{digest}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception:
                del sys.modules[name]
                raise
        self.modules[digest] = module.kernel
        self.stats.sources += 1
        return module.kernel, digest

    def compile(self, fn, args: tuple) -> None:
        """Compile (or load from the disk cache) `fn` for the types of `args`."""
        from numba import typeof
        started = time.perf_counter()
        sig = tuple(typeof(x) for x in args)
        if sig in fn.overloads:
            self.stats.seconds += time.perf_counter() - started
            return
        hits = sum(fn.stats.cache_hits.values())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn.compile(sig)
        if sum(fn.stats.cache_hits.values()) > hits:
            self.stats.loaded += 1
        else:
            self.stats.compiled += 1
        self.stats.seconds += time.perf_counter() - started
