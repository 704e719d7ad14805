"""The Numba backend: one generated, compiled loop nest per fused kernel, called in sequence
from one compiled function per program segment.

For each kernel, `NumbaBackend.prepare` writes the source of one Python module holding one
`@njit` function, from the kernel body only (generated identifiers; numbers enter the source as
`repr` of floats and ints; nothing of the model's names or strings). Shapes, offsets and
broadcast tables are arguments, so kernels with the same structure share one source and one
compiled function. Modules are written to a cache folder named by the hash of their source (and
of the hand-written runtime they call, `RUNTIME_DIGEST`) and compiled with `cache=True`, so a
second process loads the machine code instead of compiling.

Segments: lowering groups consecutive compiled kernels (everything between NumPy-only steps:
opaque nodes, fallbacks) into one generated `@njit` function that calls them in order on views
of the arena made from addresses (`segment_source`), so Python dispatches once per segment
instead of once per kernel (a dispatch with 7 array arguments costs a few microseconds; tiny
models run 30-150 kernels).

Kernel families:
- elementwise (any broadcasting, views read in place): one pass over the output, viewed as rows
  x columns where every operand is a row base plus a column stride; each input element is read
  once and each output element written once; float32 polynomial exp/tanh/erf (`approx`) keep
  the loop vectorized (512-bit vectors on AVX-512, `kernels.wide_vectors`); indices are
  unsigned (`U(...)`), since Numba's negative-index wraparound on signed indices turns the
  loads into gathers; large outputs of cheap (memory-bound) bodies are written through an L1
  tile with non-temporal stores (no read-for-ownership of the output);
- Conv, MatMul and Gemm: one GEMM per matrix product, then the fused epilogue. On AVX-512
  CPUs, constant-weight MatMul/Gemm run `packed_gemm.gemm` (weights packed into column panels
  at compile time, a register-blocked microkernel: 1.2x OpenBLAS on the BERT-base shapes), and
  Conv runs `packed_gemm.gemm_rows` (weights packed into row tiles, the input read through a
  table of row offsets: each im2col row is a shifted view of a padded, phase-split input
  plane, so no im2col matrix is built; `conv_packed`). Depthwise Conv runs direct loops (3x3
  taps summed in registers). Other CPUs use BLAS: `np.dot` (im2col, direct 1x1), shifted GEMMs
  over the padded input for stride-1 convolutions on wide planes, and `kernels.gemm`,
  which takes leading dimensions and transposes so transposed or sliced views need no copy.
  BLAS runs single-threaded while a program runs (`eqsat_fuse.threads`), so with more than one
  thread a large product is split among Numba's threads (`kernels.gemm_parallel`, or the
  batch of a batched product in `prange`) and its epilogue rows run in `prange`;
- Softmax and LayerNormalization: one row at a time, prologue (the fused elementwise input),
  the row statistics in 16 independent lanes (a vectorized reduction without reassociation)
  and the epilogue; ReduceMean/ReduceSum over trailing axes (an epilogue that reads the
  reduced input or a prologue value, x - mean(x) or Softmax written out, runs per element of
  the row after its sum), pooling (2-D);
- data movement (Concat, Gather, constant Pad, views that strides cannot express) as
  generated strided copies.

Anything else falls back to the NumPy evaluation of that kernel (writing into the same arena
slot); `fallbacks` lists those kernels with the reason. So do kernels on dtypes Numba has no
type for (bfloat16, float8, int4...) and kernels with an empty operand or output.

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

from ...ir import BodyNode, Kernel, KernelPlan, Operand
from ...lowering.layout import Layout, apply_view, probe, layout_of
from ...ops import OPS
from . import packed_gemm as PG

# elementwise kernels at least this large run with prange when more than one thread is allowed
PARALLEL_MIN_ELEMENTS = 1 << 18
# a stride-1 Conv runs as shifted GEMMs over the padded input (no im2col) when the padded row
# is at most this much longer than the output row and the output plane is this large
SHIFTED_MAX_WIDTH_RATIO = 1.1
SHIFTED_MIN_PIXELS = 256
# elementwise kernels write float32 outputs this large with non-temporal stores (elements):
# graph outputs (the caller reads them later, if at all soon) and huge intermediates
STREAM_MIN_OUTPUT = 1 << 21
STREAM_MIN_BUFFER = 1 << 24
# ... and only when the body is cheap arithmetic (memory-bound): a body with exp, tanh, erf or a
# division is compute-bound, and its loop ran up to 2x slower writing into the L1 tile
_STREAM_OPS = frozenset({"Add", "Sub", "Mul", "Neg", "Relu", "LeakyRelu", "Clip", "Where",
                         "Cast", "Identity", "Dropout", "HardSigmoid", "HardSwish"})
# an elementwise body with several of these (polynomial approximations, a dozen or more
# constants each) runs as one loop per such op over a tile of STAGE_TILE elements of a row,
# handing values on through L1: in one loop the constants outgrow the 32 vector registers and
# are reloaded from memory over and over (1.2x slower for sigmoid+tanh+erf). Rows narrower
# than STAGE_MIN_COLS, and more than STAGE_MAX_VALUES values handed on, keep one loop.
_HEAVY_OPS = frozenset({"Exp", "Tanh", "Sigmoid", "Erf", "Gelu"})
STAGE_TILE = 1024
STAGE_MIN_COLS = 64
STAGE_MAX_VALUES = 4
# constant-weight GEMMs of at least this many multiply-adds share their panels among threads
PARALLEL_MIN_MACS = 1 << 22
# Conv on AVX-512: the packed-weight microkernel over row offsets of the input (conv_packed);
# output positions go in chunks of at most CONV_CHUNK_PANELS panels whose input slice is within
# CONV_CHUNK_BYTES, and rows in blocks whose output chunk is within CONV_BLOCK_BYTES
PACKED_CONV = True
CONV_CHUNK_PANELS = 8
CONV_CHUNK_BYTES = 1 << 19
CONV_BLOCK_BYTES = 1 << 18
# output bytes of one BLAS call before a GEMM is split into row blocks
GEMM_BLOCK_BYTES = 1 << 26
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


def _gemm_block(rows: int, cols: int) -> int:
    """Rows per BLAS call: all of them unless the block's output exceeds GEMM_BLOCK_BYTES.

    Every call repacks the whole B operand, so small row blocks (to keep the epilogue's rows
    in L1) cost more in packing than the epilogue gains; one call per GEMM is fastest here.
    """
    return max(8, min(rows, GEMM_BLOCK_BYTES // max(4 * cols, 1)))


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

    def mergeable(d: int) -> bool:       # can dim d merge with the dims after it?
        # size-1 dims are skipped: dim d merges with the next dim of size > 1 (a unit dim
        # between them must not hide a broadcast: [2,1,1] against [2,1,3])
        if shape[d] == 1:
            return True
        e = d + 1
        while e < n and shape[e] == 1:
            e += 1
        if e == n:
            return True
        for lay in layouts:
            if lay.strides[d] != lay.strides[e] * shape[e]:
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
        self.uses_packed_gemm = False
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
            "# generated by eqsat_fuse.backends.numba.backend: one fused kernel",
            f"# runtime {RUNTIME_DIGEST}",
            "import numpy as np",
            "from numba import njit, prange",
            "from eqsat_fuse.backends.numba.approx import (exp_f32, tanh_f32, sigmoid_f32,",
            "    erf_f32, gelu_f32, gelu_tanh_f32, f16_to_f32, f32_to_f16)",
            "from eqsat_fuse.backends.numba import kernels as K",
            "F32 = np.float32",
            "U = np.uint64      # unsigned indices: no negative-index wraparound, loops vectorize",
            "",
            *self.header,
            *(["from eqsat_fuse.backends.numba import packed_gemm as PG", "PG.ensure_compiled()"]
              if self.uses_packed_gemm else []),
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
        from .kernels import WIDE_VECTORS
        if WIDE_VECTORS:
            body.insert(0, "    K.wide_vectors()")
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
    if op == "Abs":
        return f"abs({a})"
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
        if to == "float16" and dtypes[0] != "float16":
            # float16 values are computed in float32: round to float16 here (ties to even)
            return f"f16_to_f32(f32_to_f16(np.float32({a})))"
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
        self._nloads = 0                # loads named so far (names stay unique in a kernel)
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
        raw = f"{arr}[U({index})]"
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
                    # (C,) along axis 1 of the normalized input, whose rank may be less than
                    # the space's when a later node broadcasts it (dims align on the right)
                    try:
                        rank = len(self.value_shape(node.args[0]))
                    except Unsupported:     # an anchor's result: the space has its shape
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
        name = f"x{self._nloads}"
        self._nloads += 1
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
            if "movement" in kinds:
                return self.gen_movement()
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
        m.lines += [f"R = {m.int_param(R)}", f"C = {m.int_param(C)}"]
        stream = not m.parallel and self.streams(numel)
        stages = None if stream else self.stages(nodes, C)
        hoist: list[str] = []
        values: dict[int, str] = {}
        if stages is not None:
            self.staged_elementwise(*stages, uses, space)
        elif stream:
            self.stream_elementwise(R, C, hoist, values, nodes, uses, space)
        else:
            inner = self.emit_nodes(nodes, uses, space, values, "        ", "r", "c", hoist)
            if m.parallel and R < 4 * self.b.threads:
                # few long rows: the threads share each row in column chunks
                chunk = max(4096, -(-C // (4 * self.b.threads)))
                m.lines += [f"CH = {m.int_param(chunk)}", f"NC = {m.int_param(-(-C // chunk))}"]
                m.lines.append("for t in prange(R * NC):")
                m.lines.append("    r = t // NC")
                m.lines.append("    c0 = (t - r * NC) * CH")
                m.lines.append("    c1 = min(c0 + CH, C)")
                m.lines += ["    " + h for h in hoist]
                m.lines.append("    for c in range(c0, c1):")
            else:
                m.lines.append(f"for r in {'prange' if m.parallel else 'range'}(R):")
                m.lines += ["    " + h for h in hoist]
                m.lines.append("    for c in range(C):")
            m.lines += inner
            m.lines.append(f"        out[U(r * C + c)] = {self.store_expr(values[self.root])}")
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

    def stages(self, nodes: list[int], cols: int):
        """`nodes` cut after each heavy op but the last (see _HEAVY_OPS), and the values that
        later stages read from earlier ones; None when the body keeps one loop."""
        heavy = [i for i in nodes if self.body[i].op in _HEAVY_OPS]
        if len(heavy) < 2 or cols < STAGE_MIN_COLS:
            return None
        groups, current = [], []
        for i in nodes:
            current.append(i)
            if i in heavy[:-1]:
                groups.append(current)
                current = []
        groups.append(current)
        stage_of = {i: s for s, group in enumerate(groups) for i in group}
        handed = sorted({a.ref for i in nodes for a in self.body[i].args
                         if a.kind == "node" and stage_of[a.ref] < stage_of[i]})
        if self.root not in groups[-1] or len(handed) > STAGE_MAX_VALUES \
                or any(self.dtypes[v] != "float32" for v in handed):
            return None         # the tiles are float32 workspace
        return groups, handed

    def staged_elementwise(self, groups, handed, uses, space) -> None:
        """One loop per stage over a tile of a row; `handed` values pass through the tiles.

        Work items are (row, column tile) pairs; with threads each thread takes a contiguous
        share of them and has tiles of its own in the workspace."""
        m = self.m
        tile = min(space.cols, STAGE_TILE)
        threads = self.b.threads if m.parallel else 1
        slot = {v: "" if k == 0 else f" + {k} * TC" for k, v in enumerate(handed)}
        # each thread's tiles a whole number of cache lines apart: threads writing into one
        # line would pass it back and forth on every row (0.8x at two threads, 64 columns)
        per = -(-len(handed) * tile // 16) * 16 + 16
        ws = self.alloc(threads * per)
        m.lines += [f"TC = {m.int_param(tile)}", f"NC = {m.int_param(-(-space.cols // tile))}",
                    "NQ = R * NC",
                    f"for t in {'prange' if m.parallel else 'range'}({threads}):",
                    f"    sb = {ws} + t * {m.int_param(per)}",
                    f"    for q in range(t * NQ // {threads}, (t + 1) * NQ // {threads}):",
                    "        r = q // NC",
                    "        c0 = (q - r * NC) * TC",
                    "        c1 = min(c0 + TC, C)"]
        hoist: list[str] = []
        body: list[str] = []
        values: dict[int, str] = {}
        for s, group in enumerate(groups):
            # loads hoisted to the row stay valid; loads inside a stage's loop are its own
            kept = {line.split(" = ")[0] for line in hoist}
            self._loads = {k: name for k, name in self._loads.items() if name in kept}
            body.append(f"        for c in range(c0, c1):      # stage {s + 1} of {len(groups)}")
            reads = sorted({a.ref for i in group for a in self.body[i].args
                            if a.kind == "node" and a.ref in slot and a.ref not in group})
            body += [f"            v{v} = WS[U(sb{slot[v]} + c - c0)]" for v in reads]
            body += self.emit_nodes(group, uses, space, values, "            ", "r", "c", hoist)
            body += [f"            WS[U(sb{slot[v]} + c - c0)] = {values[v]}"
                     for v in group if v in slot]
        body.append(f"            out[U(r * C + c)] = {self.store_expr(values[self.root])}")
        m.lines += ["        " + h for h in hoist] + body

    # -- data movement: strided copies (Concat, Gather, Pad, views that need a copy) --
    def emit_copy(self, t: "Tensor", src_off, src_strides, dst_off, dst_strides, shape,
                  indent: str = "") -> None:
        """Lines copying `shape` elements of t (at src_off + i.src_strides) to out (at
        dst_off + i.dst_strides). Offsets are expressions; dims are merged where both sides
        allow, the innermost loop is the last merged dim."""
        m = self.m
        dims = [(int(n), int(a), int(b)) for n, a, b in zip(shape, src_strides, dst_strides)
                if n != 1]
        if any(n == 0 for n, _, _ in dims):
            return
        merged: list[tuple[int, int, int]] = []
        for n, a, b in dims:
            if merged and merged[-1][1] == a * n and merged[-1][2] == b * n:
                n0 = merged[-1][0]
                merged[-1] = (n0 * n, a, b)
            else:
                merged.append((n, a, b))
        if len(merged) > 4:
            raise Unsupported("a copy over more than 4 strided dims")
        lines = m.lines
        if not merged:
            lines.append(f"{indent}out[U({dst_off})] = "
                         f"{self.store_expr(self.load_expr(t, str(src_off)))}")
            return
        s_expr, d_expr = [str(src_off)], [str(dst_off)]
        for k, (n, a, b) in enumerate(merged[:-1]):
            lines.append(f"{indent}for i{k} in range({m.int_param(n)}):")
            indent += "    "
            s_expr.append(f"i{k} * {m.int_param(a)}")
            d_expr.append(f"i{k} * {m.int_param(b)}")
        lines.append(f"{indent}s_ = {' + '.join(s_expr)}")
        lines.append(f"{indent}d_ = {' + '.join(d_expr)}")
        n, a, b = merged[-1]
        lines.append(f"{indent}for iL in range({m.int_param(n)}):")
        src = f"s_ + iL" if a == 1 else f"s_ + iL * {m.int_param(a)}"
        dst = f"d_ + iL" if b == 1 else f"d_ + iL * {m.int_param(b)}"
        lines.append(f"{indent}    out[U({dst})] = {self.store_expr(self.load_expr(t, src))}")

    def boundary(self, a: Operand) -> "Tensor":
        """The tensor an argument reads: a boundary operand, or a resolved view of one."""
        while a.kind == "node":
            node = self.body[a.ref]
            if node.op != "Identity":
                raise Unsupported("data movement of an inline value")
            a = node.args[0]
        if a.kind not in ("buffer", "const", "synthetic"):
            raise Unsupported(f"data movement of {a.kind}")
        return self.tensor(a)

    def gen_copy(self, source: Operand) -> None:
        """A view strides cannot express (a Reshape of a transposed buffer): copy the source in
        its own logical order into the contiguous output."""
        t = self.boundary(source)
        lay = t.layout
        self.emit_copy(t, lay.offset, lay.strides, 0, _c_strides(lay.shape), lay.shape)

    def gen_movement(self) -> None:
        node = self.body[self.root]
        out_shape = tuple(self.k.info.shape)
        out_strides = _c_strides(out_shape)
        rank = len(out_shape)
        m = self.m
        if node.op == "Concat":
            axis = node.attrs["axis"]
            axis = axis + rank if axis < 0 else axis
            at = 0
            for arg in node.args:
                t = self.boundary(arg)
                lay = t.layout
                self.emit_copy(t, lay.offset, lay.strides, m.int_param(at * out_strides[axis]),
                               out_strides, lay.shape)
                at += lay.shape[axis]
            return
        if node.op == "Pad":
            if node.attrs.get("mode", "constant") != "constant":
                raise Unsupported("Pad that is not constant")
            t = self.boundary(node.args[0])
            lay = t.layout
            r = len(lay.shape)
            pads = [int(v) for v in node.attrs["pads"]]
            if len(pads) != 2 * r:
                raise Unsupported("Pad with axes")
            before, after = pads[:r], pads[r:]
            shape, offset = [], lay.offset
            for d in range(r):           # negative pads crop the source
                lo, hi = max(-before[d], 0), max(-after[d], 0)
                shape.append(lay.shape[d] - lo - hi)
                offset += lo * lay.strides[d]
            dst = sum(max(b, 0) * s_ for b, s_ in zip(before, out_strides))
            if any(b > 0 for b in before) or any(e > 0 for e in after):
                value = node.attrs.get("value")
                value = np.asarray(0 if value is None else value).reshape(-1)[:1]
                value = value[0] if value.size else 0
                lit = self.literal(value, self.out_dtype)
                m.lines.append(f"for i in range({m.int_param(int(np.prod(out_shape)))}):")
                m.lines.append(f"    out[U(i)] = {self.store_expr(lit)}")
            self.emit_copy(t, offset, lay.strides, m.int_param(dst), out_strides, shape)
            return
        if node.op == "Gather":
            t = self.boundary(node.args[0])
            ti = self.boundary(node.args[1])
            lay = t.layout
            r = len(lay.shape)
            axis = node.attrs["axis"]
            axis = axis + r if axis < 0 else axis
            if not ti.layout.contiguous or ti.dtype not in ("int64", "int32"):
                raise Unsupported("Gather indices")
            # out = data[:axis] + indices + data[axis+1:] (the index rank from the output: a
            # folded scalar index may be stored with shape (1,))
            irank = rank - (r - 1)
            ni = int(np.prod(out_shape[axis:axis + irank], dtype=np.int64))
            if irank < 0 or ti.layout.size != ni:
                raise Unsupported("Gather shapes")
            inner = int(np.prod(lay.shape[axis + 1:], dtype=np.int64))
            n_axis = lay.shape[axis]
            shape = lay.shape[:axis] + lay.shape[axis + 1:]
            src_strides = lay.strides[:axis] + lay.strides[axis + 1:]
            dst_strides = tuple(out_strides[:axis]) + tuple(out_strides[axis + irank:])
            m.lines.append(f"N = {m.int_param(n_axis)}")
            m.lines.append(f"for j in range({m.int_param(ni)}):")
            idx = self.load_expr(ti, f"{m.int_param(ti.layout.offset)} + j")
            m.lines.append(f"    k = np.int64({idx})")
            m.lines.append("    k = k + N if k < 0 else k")
            m.lines.append("    if k < 0 or k >= N:")
            m.lines.append("        raise IndexError('Gather: index out of range')")
            self.emit_copy(t, f"{m.int_param(lay.offset)} + k * {m.int_param(lay.strides[axis])}",
                           src_strides, f"j * {m.int_param(inner)}", dst_strides, shape,
                           "    ")
            return
        raise Unsupported(f"movement op {node.op}")

    def literal(self, value, dtype: str) -> str:
        value = np.asarray(value).reshape(())
        if dtype in ("float32", "float16"):
            return _flit(float(value))
        if dtype == "bool":
            return "True" if bool(value) else "False"
        if dtype in _NP_TYPES:
            kind = np.dtype(dtype).kind
            v = float(value) if kind == "f" else int(value)
            return f"{_NP_TYPES[dtype]}({v!r})"
        raise Unsupported(f"literal of {dtype}")

    def streams(self, numel: int) -> bool:
        """Whether this kernel writes its output with non-temporal stores: a float32 output
        large enough that keeping it in cache helps no reader (a graph output of at least
        STREAM_MIN_OUTPUT elements, any buffer of at least STREAM_MIN_BUFFER), on x86 with
        AVX-512."""
        from .kernels import WIDE_VECTORS
        if not WIDE_VECTORS or self.out_stored != "float32" or self.out_dtype != "float32":
            return False
        if any(node.op not in _STREAM_OPS for node in self.body):
            return False        # compute-bound bodies measured slower through the L1 tile
        root = self.b.layouts[self.k.output].storage
        limit = STREAM_MIN_OUTPUT if root in self.b.external else STREAM_MIN_BUFFER
        return numel >= limit

    def stream_elementwise(self, R, C, hoist, values, nodes, uses, space) -> None:
        """The elementwise loop computing tiles in L1 that K.stream_out writes out."""
        from .kernels import STREAM_TILE
        m = self.m
        ws = self.alloc(STREAM_TILE)
        m.lines.append(f"T = WS[{ws}:{ws} + {m.int_param(STREAM_TILE)}]")
        self._loads = {}               # the loads are emitted anew at this nesting
        hoist.clear()
        values.clear()
        if C <= STREAM_TILE:
            inner = self.emit_nodes(nodes, uses, space, values, "            ", "r", "c", hoist)
            m.lines.append(f"TR = {m.int_param(max(1, STREAM_TILE // max(C, 1)))}")
            m.lines.append("for r0 in range(0, R, TR):")
            m.lines.append("    r1 = min(r0 + TR, R)")
            m.lines.append("    for r in range(r0, r1):")
            m.lines += ["        " + h for h in hoist]
            m.lines.append("        b = (r - r0) * C")
            m.lines.append("        for c in range(C):")
            m.lines += inner
            m.lines.append(f"            T[U(b + c)] = {values[self.root]}")
            m.lines.append("    K.stream_out(out, r0 * C, T, (r1 - r0) * C)")
        else:
            inner = self.emit_nodes(nodes, uses, space, values, "            ", "r", "c", hoist)
            m.lines.append(f"TC = {m.int_param(STREAM_TILE)}")
            m.lines.append("for r in range(R):")
            m.lines += ["    " + h for h in hoist]
            m.lines.append("    for c0 in range(0, C, TC):")
            m.lines.append("        c1 = min(c0 + TC, C)")
            m.lines.append("        for c in range(c0, c1):")
            m.lines += inner
            m.lines.append(f"            T[U(c - c0)] = {values[self.root]}")
            m.lines.append("        K.stream_out(out, r * C + c0, T, c1 - c0)")
        m.lines.append("K.sfence()")

    def needed(self, root: int, stop: int | None = None) -> list[int]:
        """The body nodes `root` depends on (itself included); with `stop`, only those it
        depends on other than through node `stop` (which is kept, its inputs are not)."""
        seen, stack = set(), [root]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            if i != stop:
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
                      acc_index: str, indent: str, acc_name: str = "ACC",
                      cols: tuple[str, str] = ("0", "EC")):
        """Lines: for r in [r0, r1): for c in [cols): value = epilogue(acc[...]);
        out[...] = value."""
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
        lines.append(f"{indent}    for c in range({cols[0]}, {cols[1]}):")
        lines.append(f"{indent}        acc_v = {acc_name}[U({acc_index})]")
        lines += inner
        lines.append(f"{indent}        out[U(r * EC + c)] = {self.store_expr(last)}")
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
        m.lines.append(f"                {name}[U(k_ + i3)] = "
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
        batch = int(np.prod(mshape[:-2])) if len(mshape) > 2 else 1
        epi_fn = ["    " + line for line in lines_epi]
        if b_const and len(sb) == 2:
            # one GEMM over all rows of A (batch folded into M), in row blocks
            A = self.f32_input(ta, "A")
            m.lines.append(f"A2 = A.reshape(({m.int_param(int(np.prod(sa[:-1])))}, "
                           f"{m.int_param(Kd)}))")
            bkey = ("B", self.k.name)
            value = Bv if node.op == "Gemm" else np.ascontiguousarray(
                np.asarray(self.b.constants[tb.storage], dtype=np.float32).reshape(sb))
            rows = batch * M
            block = _gemm_block(rows, N)
            m.lines.append(f"RT = {m.int_param(rows)}")
            m.lines.append(f"BM = {m.int_param(block)}")
            if PG.AVAILABLE:           # workspace for a block of A's rows, packed per call
                size = PG.a_workspace(min(rows, block), Kd)
                ap = self.alloc(size)
                m.lines.append(f"AP = WS[{ap}:{ap} + {m.int_param(size)}]")
            m.lines.append(f"for r0 in range(0, RT, BM):")
            m.lines.append(f"    r1 = min(r0 + BM, RT)")
            if PG.AVAILABLE:
                # the weights packed into column panels once, here; A's rows packed per block
                Bname = m.array(bkey, ("array", PG.pack(value)))
                driver = ("gemm_parallel" if self.b.threads > 1
                          and rows * N * Kd >= PARALLEL_MIN_MACS else "gemm")
                m.uses_packed_gemm = True
                m.lines.append(f"    PG.{driver}(A, 0, {m.int_param(Kd)}, r0, r1, {Bname}, EC, "
                               f"{m.int_param(Kd)}, {acc}, 0, EC, AP)")
            else:
                Bname = m.array(bkey, ("array", np.ascontiguousarray(value, dtype=np.float32)))
                if self.shares_gemm(rows * N * Kd):
                    m.lines.append(f"    K.gemm_parallel(0, 0, r1 - r0, EC, {m.int_param(Kd)}, "
                                   f"F32(1), A, r0 * {m.int_param(Kd)}, {m.int_param(Kd)}, "
                                   f"{Bname}, 0, EC, F32(0), {acc}, r0 * EC, EC, "
                                   f"{self.b.threads})")
                    epi_fn = self.parallel_rows(epi_fn)
                else:
                    m.lines.append(f"    np.dot(A2[r0:r1], {Bname}, {acc}[r0 * EC:r1 * EC]"
                                   f".reshape((r1 - r0, EC)))")
            m.lines += epi_fn
            return
        # batched: broadcast batch dims, one strided GEMM per batch (K.gemm takes leading dims
        # and transposes, so transposed or sliced views of buffers need no packing copy)
        if len(sa) - 2 > len(mshape) - 2 or len(sb) - 2 > len(mshape) - 2:
            raise Unsupported("batch dims")
        bdims = tuple(mshape[:-2])
        operands = []
        for t, name in ((ta, "A"), (tb, "B")):
            view = self.blas_view(t, bdims)
            if view is None:             # pack into contiguous float32 workspace
                if t.storage in self.b.constants and name == "B":
                    arr = m.array(("B", self.k.name), ("array", np.ascontiguousarray(
                        np.asarray(self.b.constants[t.storage], dtype=np.float32).reshape(sb))))
                else:
                    arr = self.f32_input(t, name)
                shp = t.layout.shape
                sub = (1,) * (len(bdims) - (len(shp) - 2)) + tuple(shp[:-2])
                table = _batch_map(bdims, sub) * int(shp[-2] * shp[-1])
                view = (0, max(int(shp[-1]), 1), table, arr)
            operands.append(view)
        (tra, lda, tab_a, arr_a), (trb, ldb, tab_b, arr_b) = operands
        m.lines.append(f"M = {m.int_param(M)}")
        off_a = self.row_base(tab_a, "bi")
        off_b = self.row_base(tab_b, "bi")
        # the batch is shared among the threads, each product one serial BLAS call
        share = batch > 1 and self.shares_gemm(batch * M * N * Kd)
        m.parallel = m.parallel or share
        m.lines.append(f"for bi in {'prange' if share else 'range'}({m.int_param(batch)}):")
        m.lines.append(f"    r0 = bi * M")
        m.lines.append(f"    r1 = r0 + M")
        m.lines.append(f"    K.gemm({tra}, {trb}, M, EC, {m.int_param(Kd)}, F32(1), {arr_a}, {off_a}, "
                       f"{m.int_param(lda)}, {arr_b}, {off_b}, {m.int_param(ldb)}, F32(0), "
                       f"{acc}, r0 * EC, EC)")
        m.lines += epi_fn

    def shares_gemm(self, macs: int) -> bool:
        """Whether a BLAS product of `macs` multiply-adds is split among the threads (BLAS is
        single-threaded while a program runs; see `eqsat_fuse.threads`)."""
        return self.b.threads > 1 and macs >= PARALLEL_MIN_MACS

    def parallel_rows(self, lines: list[str]) -> list[str]:
        """An epilogue (`emit_epilogue`'s lines) with its row loop shared among the threads;
        marks the kernel parallel."""
        self.m.parallel = True
        head = lines[0]
        assert head.lstrip().startswith("for r in range(r0, r1):"), head
        return [head.replace("for r in range(", "for r in prange(", 1)] + lines[1:]

    def blas_view(self, t: Tensor, bdims: tuple) -> tuple | None:
        """(transposed, leading dim, element offset per batch, array) when BLAS can read the
        matrices of t (last two dims, batch dims broadcast over `bdims`) where they are."""
        lay = t.layout
        if t.stored != "float32" or t.dtype != "float32" or len(lay.shape) < 2:
            return None
        rows, cols = lay.shape[-2], lay.shape[-1]
        sr, sc = lay.strides[-2], lay.strides[-1]
        if cols == 1 or sc == 1:
            trans, ld = 0, (sr if rows > 1 else max(cols, 1))
            if ld < max(cols, 1):
                return None
        elif rows == 1 or sr == 1:
            trans, ld = 1, (sc if cols > 1 else max(rows, 1))
            if ld < max(rows, 1):
                return None
        else:
            return None
        blay = Layout(lay.storage, lay.offset, tuple(lay.shape[:-2]), tuple(lay.strides[:-2]))
        blay = _broadcast_layout(blay, bdims)
        table = _row_table(blay, len(bdims)) if bdims else np.array([lay.offset], np.int64)
        return trans, int(ld), table, self.storage_array(t)

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
        depthwise = Cg == 1 and Mg == 1
        packed = PACKED_CONV and PG.AVAILABLE and not depthwise
        if bcast:
            lines_epi = []
        else:
            lines_epi, space = self.emit_epilogue(a, epi_nodes, out_shape, 2, "r * EC + c", "",
                                                  acc, ("oc0", "oc1") if packed else ("0", "EC"))
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
        if packed:
            return self.conv_packed(wv, X, acc, lines_epi, N, H, W, M, G, Cg, Mg, kh, kw, sh,
                                    sw, attrs["pads"], dh, dw, OH, OW)
        if depthwise:
            from .kernels import depthwise_pad_size
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
        direct = kh == 1 and kw == 1 and sh == 1 and sw == 1 and not any(attrs["pads"]) \
            and dh == 1 and dw == 1
        Hp, Wp = H + ph + pe_h, W + pw + pe_w
        if not direct and sh == 1 and sw == 1 and Wp <= SHIFTED_MAX_WIDTH_RATIO * OW \
                and OH * OW >= SHIFTED_MIN_PIXELS:
            return self.conv_shifted(wv, tx, X, acc, lines_epi, N, C, H, W, M, G, Cg, Mg, kh,
                                     kw, ph, pw, dh, dw, OH, OW, Hp, Wp)
        wname = m.array(("W", self.k.name),
                        ("array", np.ascontiguousarray(wv.reshape(G, Mg, K_))))
        block = _gemm_block(Mg, P)
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

    def conv_packed(self, wv, X, acc, lines_epi, N, H, W, M, G, Cg, Mg, kh, kw, sh, sw,
                    pads, dh, dw, OH, OW) -> None:
        """A Conv as GEMMs of the packed weights (`packed_gemm.gemm_rows`) with B read through
        a table of row offsets: row (c, i, j) of the im2col matrix is a shifted view of one
        plane of the input, so no im2col matrix is built. A 1x1 stride-1 unpadded Conv reads
        the input planes themselves; any other pads and splits the input by stride phase once
        (`phase_planes`), and computes each output row Wq >= OW wide (tap offsets along a row
        are then plain shifts); `compact_cols` drops the extra columns. Output positions go in
        chunks of whole 32-column panels sized to keep their slice of the input in L2, and each
        chunk's epilogue runs while its rows are in cache."""
        m = self.m
        K_ = Cg * kh * kw
        direct = kh == 1 and kw == 1 and sh == 1 and sw == 1 and not any(pads)
        if direct:
            Hq, Wq = OH, OW
            table = np.arange(Cg, dtype=np.int64) * (H * W)
            col_bytes = 4 * K_           # input bytes per output position: a float of each row
        else:
            taps = [((i * dh) % sh, (j * dw) % sw, (i * dh) // sh, (j * dw) // sw)
                    for i in range(kh) for j in range(kw)]
            phases = sorted({(t[0], t[1]) for t in taps})
            NP = len(phases)
            Hq = OH + (kh - 1) * dh // sh
            Wq = OW + (kw - 1) * dw // sw
            pq = Hq * Wq
            table = np.array([(c * NP + phases.index((t[0], t[1]))) * pq + t[2] * Wq + t[3]
                              for c in range(Cg) for t in taps], dtype=np.int64)
            col_bytes = 4 * Cg * NP      # ... a float of each plane (the taps share them)
            xp_size = Cg * NP * pq + Wq + 16
            xp = self.alloc(xp_size)
            m.lines.append(f"XP = WS[{xp}:{xp} + {m.int_param(xp_size)}]")
            ph_name = m.array(("PH", self.k.name),
                              ("array", np.array(phases, dtype=np.int64).reshape(-1)))
        PQ = OH * Wq                                # positions computed, Wq per output row
        # chunk: whole panels, the input slice it reads within CONV_CHUNK_BYTES
        panels = max(1, min(CONV_CHUNK_PANELS, CONV_CHUNK_BYTES // (col_bytes * PG.NR)))
        CC = min(panels * PG.NR, -(-PQ // PG.NR) * PG.NR)
        # rows per block: the block's output chunk within CONV_BLOCK_BYTES, whole row tiles
        BM = max(PG.MR, (CONV_BLOCK_BYTES // (4 * CC)) // PG.MR * PG.MR)
        BM = min(BM, -(-Mg // PG.MR) * PG.MR)
        wg = np.asarray(wv, dtype=np.float32).reshape(G, Mg, K_)
        wp = np.concatenate([PG.pack_rows(wg[g]).reshape(-1) for g in range(G)])
        wname = m.array(("WP", self.k.name), ("array", wp))
        tname = m.array(("T", self.k.name), ("array", PG.row_table(table)))
        compact = Wq != OW
        if compact:
            opb = self.alloc(BM * CC)
            m.lines.append(f"OPB = WS[{opb}:{opb} + {m.int_param(BM * CC)}]")
        macs = N * M * K_ * OH * OW
        driver = "gemm_rows_parallel" if self.b.threads > 1 and macs >= PARALLEL_MIN_MACS \
            else "gemm_rows"
        m.uses_packed_gemm = True
        for name, v in (("GR", G), ("CG", Cg), ("MG", Mg), ("KK", K_), ("PQ", PQ), ("CC", CC),
                        ("BM", BM), ("WQ", Wq), ("OW_", OW),
                        ("WG", -(-Mg // PG.MR) * PG.MR * K_)):
            m.lines.append(f"{name} = {m.int_param(v)}")
        m.lines.append("for n in range(NB):")
        m.lines.append("    for g in range(GR):")
        m.lines.append("        xo = (n * CI + g * CG) * HW")
        if direct:
            src, src_off = X, "xo + c0"
        else:
            geo = ", ".join(m.int_param(v) for v in (H, W, pads[0], pads[1], sh, sw))
            m.lines.append(f"        K.phase_planes({X}, xo, CG, {geo}, {ph_name}, "
                           f"{m.int_param(Hq)}, WQ, XP)")
            src, src_off = "XP", "c0"
        m.lines.append("        for c0 in range(0, PQ, CC):")
        m.lines.append("            c1 = min(c0 + CC, PQ)")
        if compact:
            m.lines.append("            oc0 = (c0 // WQ) * OW_ + min(c0 % WQ, OW_)")
            m.lines.append("            oc1 = (c1 // WQ) * OW_ + min(c1 % WQ, OW_)")
        else:
            m.lines.append("            oc0 = c0")
            m.lines.append("            oc1 = c1")
        m.lines.append("            for m0 in range(0, MG, BM):")
        m.lines.append("                m1 = min(m0 + BM, MG)")
        m.lines.append("                r0 = n * MO + g * MG + m0")
        m.lines.append("                r1 = n * MO + g * MG + m1")
        if compact:
            m.lines.append(f"                PG.{driver}({wname}, g * WG + m0 * KK, m1 - m0, KK, "
                           f"{src}, {src_off}, {tname}, c1 - c0, OPB, 0, CC)")
            m.lines.append(f"                K.compact_cols(OPB, m1 - m0, CC, c0, c1, WQ, OW_, "
                           f"{acc}, r0 * EC, EC)")
        else:
            m.lines.append(f"                PG.{driver}({wname}, g * WG + m0 * KK, m1 - m0, KK, "
                           f"{src}, {src_off}, {tname}, c1 - c0, {acc}, r0 * EC + c0, EC)")
        m.lines += ["                " + line for line in lines_epi]

    def conv_shifted(self, wv, tx, X, acc, lines_epi, N, C, H, W, M, G, Cg, Mg, kh, kw, ph, pw,
                     dh, dw, OH, OW, Hp, Wp) -> None:
        """A stride-1 Conv as kh*kw accumulating GEMMs over shifted views of the zero-padded
        input (no im2col matrix, which is kh*kw times the input): with the output computed
        on rows of the padded width Wp, tap (i, j) reads the padded planes from offset
        i*dh*Wp + j*dw as one (Cg x OH*Wp) matrix. The Wp - OW extra columns per row are
        dropped when the rows are compacted into the accumulator, then the epilogue runs."""
        m = self.m
        PP = OH * Wp
        plane = Hp * Wp
        wt = np.ascontiguousarray(wv.reshape(G, Mg, Cg, kh, kw).transpose(0, 3, 4, 1, 2))
        wname = m.array(("WT", self.k.name), ("array", wt.reshape(-1)))
        xp = self.alloc(Cg * plane + (kw - 1) * dw + 16)
        op = self.alloc(Mg * PP)
        m.lines.append(f"XP = WS[{xp}:{xp} + {m.int_param(Cg * plane + (kw - 1) * dw + 16)}]")
        m.lines.append(f"OP = WS[{op}:{op} + {m.int_param(Mg * PP)}]")
        geo = ", ".join(m.int_param(v) for v in (Cg, H, W, ph, pw, Hp, Wp))
        m.lines.append("for n in range(NB):")
        m.lines.append(f"    for g in range({m.int_param(G)}):")
        m.lines.append(f"        K.pad_planes(X, (n * CI + g * {m.int_param(Cg)}) * HW, {geo}, XP)")
        first = True
        for i in range(kh):
            for j in range(kw):
                w_off = m.int_param(((0 * kh + i) * kw + j) * Mg * Cg)
                step = m.int_param(kh * kw * Mg * Cg)
                m.lines.append(
                    f"        K.gemm(0, 0, {m.int_param(Mg)}, {m.int_param(PP)}, "
                    f"{m.int_param(Cg)}, F32(1), {wname}, g * {step} + {w_off}, "
                    f"{m.int_param(Cg)}, XP, {m.int_param(i * dh * Wp + j * dw)}, "
                    f"{m.int_param(plane)}, F32({0.0 if first else 1.0}), OP, 0, "
                    f"{m.int_param(PP)})")
                first = False
        m.lines.append(f"        r0 = n * MO + g * {m.int_param(Mg)}")
        m.lines.append(f"        r1 = r0 + {m.int_param(Mg)}")
        m.lines.append(f"        K.compact_rows(OP, {m.int_param(Mg)}, {m.int_param(OH)}, "
                       f"{m.int_param(OW)}, {m.int_param(Wp)}, {acc}, r0 * EC)")
        m.lines += ["        " + line for line in lines_epi]

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
        pro_nodes = [i for i in self.topo(self.needed(a)) if i != a]
        # epilogue: everything the output reads other than through the anchor (prologue values
        # the epilogue reads too are computed again in its loop)
        epilogue = [i for i in self.topo(set(self.needed(self.root, stop=a))) if i != a]
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
        m.lines.append("PART = np.empty(K.LANES, np.float32)")
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
        # the row (prologue applied) goes to ROW; its statistics in 16-lane reductions
        m.lines.append("    for c in range(C):")
        m.lines += pro
        m.lines.append(f"        ROW[c] = F32({xval})")
        if node.op == "Softmax":
            m.lines.append("    mx = K.row_max(ROW, C, PART)")
            m.lines.append("    mx = F32(0) if mx == F32(-np.inf) else mx")
            m.lines.append("    K.exp_shift(ROW, C, mx)")
            m.lines.append("    inv = F32(1) / K.row_sum(ROW, C, PART)")
            scale_expr = "ROW[c] * inv"
        else:
            eps = _flit(node.attrs["epsilon"])
            m.lines.append("    mean = K.row_sum(ROW, C, PART) / F32(C)")
            m.lines.append("    q = K.row_sumsq(ROW, C, mean, PART)")
            m.lines.append(f"    inv = F32(1) / np.sqrt(q / F32(C) + {eps})")
            # scale and bias: vectors over the normalized dims
            sc = self.row_vector(node.args[1], shape[axis:])
            bi = self.row_vector(node.args[2], shape[axis:]) if len(node.args) > 2 else None
            scale_expr = f"(ROW[c] - mean) * inv * {sc}"
            if bi is not None:
                scale_expr += f" + {bi}"
        values_e: dict[int, str] = {a: "y"}
        hoist_e: list[str] = []
        self._loads = {}               # the loads are emitted anew in the epilogue's loop
        epi = self.emit_nodes(epilogue, uses_e, space_e, values_e, "        ", "r", "c", hoist_e)
        last = values_e[self.root]
        m.lines += ["    " + h for h in hoist_e]
        m.lines.append("    for c in range(C):")
        m.lines.append(f"        y = {scale_expr}")
        m.lines += epi
        m.lines.append(f"        out[U(r * C + c)] = {self.store_expr(last)}")

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
        # the prologue the reduction reads (nodes only the epilogue reads are computed there)
        red_pro = [i for i in self.topo(self.needed(a)) if i != a]
        uses_p, space_p = self._replan(red_pro, in_shape, first)
        for lay in uses_p.values():
            if _column_split([lay], in_shape, rank - first) > first:
                raise Unsupported("reduction input strides")
        out_shape = tuple(self.k.info.shape)
        R = int(np.prod(in_shape[:first], dtype=np.int64))
        C = int(np.prod(in_shape[first:], dtype=np.int64))
        keepdims = node.op == "GlobalAveragePool" or bool(node.attrs.get("keepdims", 1))
        # the epilogue: after the anchor, or reading a prologue value (Softmax written out)
        post = set(self.needed(self.root, stop=a))
        per_row = int(np.prod(out_shape, dtype=np.int64)) == R and \
            all(i in epilogue or i == a for i in post)
        if not per_row:
            # the epilogue runs per element of the reduced input: x - sum(x, keepdims)
            if not keepdims or out_shape != tuple(in_shape):
                raise Unsupported("reduction epilogue of another shape")
        m.lines.append(f"R = {m.int_param(R)}")
        m.lines.append(f"C = {m.int_param(C)}")
        hoist: list[str] = []
        values: dict[int, str] = {}
        pro = self.emit_nodes(red_pro, uses_p, space_p, values, "            ", "r", "c", hoist)
        if x_arg.kind == "node":
            xval = values[x_arg.ref]
        else:
            lay = _broadcast_layout(self.tensor(x_arg).layout, in_shape)
            if _column_split([lay], in_shape, rank - first) > first:
                raise Unsupported("reduction input strides")
            xval = self.operand_expr(a, 0, x_arg, {(a, 0): lay}, space_p, "r", "c", hoist,
                                     pro, "            ")
        values_e = {a: "y"}
        hoist_e: list[str] = []
        if per_row:
            # epilogue over the output, one element per row
            eshape = out_shape
            uses_e, space_e = self._replan(epilogue, eshape, len(eshape))
            epi = self.emit_nodes(epilogue, uses_e, space_e, values_e, "    ", "r", None,
                                  hoist_e)
        else:
            post_nodes = [i for i in self.topo(post) if i != a]
            uses_e, space_e = self._replan(post_nodes, in_shape, first)
            for lay in uses_e.values():
                if _column_split([lay], in_shape, rank - first) > first:
                    raise Unsupported("reduction epilogue strides")
            self._loads = {}           # the loads are emitted anew in the epilogue's loop
            epi = self.emit_nodes(post_nodes, uses_e, space_e, values_e, "        ", "r", "c",
                                  hoist_e)
        last = values_e[self.root]
        # the sum in 16 lanes (independent chains LLVM vectorizes), then the remainder
        m.lines.append("PART = np.empty(K.LANES, np.float32)")
        m.lines.append(f"CF = C - C % K.LANES")
        m.lines.append("for r in range(R):")
        m.lines += ["    " + h for h in hoist]
        m.lines.append("    for k in range(K.LANES):")
        m.lines.append("        PART[k] = F32(0)")
        m.lines.append("    for c0 in range(0, CF, K.LANES):")
        m.lines.append("        for k in range(K.LANES):")
        m.lines.append("            c = c0 + k")
        m.lines += pro
        m.lines.append(f"            PART[k] += {xval}")
        m.lines.append("    s = F32(0)")
        m.lines.append("    for k in range(K.LANES):")
        m.lines.append("        s += PART[k]")
        m.lines.append("    for c in range(CF, C):")
        m.lines += [line[4:] for line in pro]
        m.lines.append(f"        s += {xval}")
        m.lines.append("    y = s / F32(C)" if mean else "    y = s")
        m.lines += ["    " + h for h in hoist_e]
        if per_row:
            m.lines += epi
            m.lines.append(f"    out[U(r)] = {self.store_expr(last)}")
        else:
            m.lines.append("    for c in range(C):")
            m.lines += epi
            m.lines.append(f"        out[U(r * C + c)] = {self.store_expr(last)}")


    def value_shape(self, arg: Operand) -> tuple[int, ...]:
        """The shape of an operand, or of an inline elementwise value (NumPy broadcasting)."""
        if arg.kind == "node":
            node = self.body[arg.ref]
            if node.op == "BatchNormalization":       # its parameters do not broadcast
                return self.value_shape(node.args[0])
            if OPS[node.op].kind != "elementwise":
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
        from ..numpy.ops import _pool_geometry
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


# ---- program segments: many kernel calls in one compiled function ----------------------------

_DTYPE_EXPR = {"float32": "np.float32", "float64": "np.float64", "int64": "np.int64",
               "int32": "np.int32", "int16": "np.int16", "int8": "np.int8", "uint8": "np.uint8",
               "uint16": "np.uint16", "uint32": "np.uint32", "uint64": "np.uint64",
               "bool": "np.bool_"}


@dataclass
class KernelCall:
    """One call of a compiled kernel inside a segment, its arguments described by where they live:

    ("arena", byte offset, elements, dtype) | ("const", index in P, shape, dtype) |
    ("dyn", index among the segment's dynamic arrays, dtype) | ("gp", start, stop) |
    ("fp", start, stop) | ("scratch",)    (dtype as stored: float16 is "uint16")
    """

    fn: Any
    digest: str
    args: list

    def example(self) -> tuple:
        """Arrays of the argument types (what the kernel is compiled for)."""
        out = []
        for spec in self.args:
            kind = spec[0]
            if kind == "arena" or kind == "dyn":
                out.append(np.empty(1, np.dtype(spec[-1])))
            elif kind == "const":
                out.append(np.empty((1,) * max(len(spec[2]), 1), np.dtype(spec[3])))
            elif kind == "gp":
                out.append(np.empty(1, np.int64))
            else:
                out.append(np.empty(1, np.float32))
        return tuple(out)


def segment_source(calls: list[KernelCall], dynamic: int) -> tuple[str, list[str]]:
    """The module of one segment: imports of its kernels, then one call per kernel."""
    names: dict[str, str] = {}
    for call in calls:
        names.setdefault(call.digest, f"k{len(names)}")
    lines = [
        "# generated by eqsat_fuse.backends.numba.backend: kernel calls of one program segment",
        f"# runtime {RUNTIME_DIGEST}",
        "import sys",
        "import numpy as np",
        "from numba import njit, carray",
        "from eqsat_fuse.backends.numba.kernels import address",
        "",
    ]
    lines += [f'{name} = sys.modules["eqsat_fuse_kernel_{digest}"].kernel'
              for digest, name in names.items()]
    params = ["P", "GP", "FP"] + [f"D{i}" for i in range(dynamic)]
    lines += ["", "", "@njit(cache=True, error_model='numpy')",
              f"def segment({', '.join(params)}):", "    a = P[0]"]
    for call in calls:
        args = []
        for spec in call.args:
            kind = spec[0]
            if kind == "arena":
                _, offset, numel, dtype = spec
                args.append(f"carray(address(a + {offset}), {numel}, {_DTYPE_EXPR[dtype]})")
            elif kind == "const":
                _, index, shape, dtype = spec
                shape_expr = "(" + "".join(f"{int(n)}, " for n in shape) + ")" if shape \
                    else "1"
                args.append(f"carray(address(P[{index}]), {shape_expr}, {_DTYPE_EXPR[dtype]})")
            elif kind == "dyn":
                args.append(f"D{spec[1]}")
            elif kind == "gp":
                args.append(f"GP[{spec[1]}:{spec[2]}]")
            elif kind == "fp":
                args.append(f"FP[{spec[1]}:{spec[2]}]")
            else:
                args.append("carray(address(P[1]), 1, np.float32)")
        lines.append(f"    {names[call.digest]}({', '.join(args)})")
    return "\n".join(lines) + "\n", list(names)


def _runtime_digest() -> str:
    """A hash of the hand-written code generated modules call (approx, kernels): it goes
    into every generated source, so editing them never reuses stale cached machine code."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("approx.py", "kernels.py", "packed_gemm.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


RUNTIME_DIGEST = _runtime_digest()


def _holds(path: Path, source: str) -> bool:
    """Whether the cached module file at `path` holds exactly `source` (only then is it run)."""
    try:
        return path.read_text() == source
    except (OSError, UnicodeDecodeError):
        return False


# ---- the backend: sources, cache, compile, bind -----------------------------------------------

class NumbaBackend:
    """Builds compiled kernels for one lowered program."""

    def __init__(self, plan: KernelPlan, constants: dict[str, np.ndarray],
                 layouts: dict[str, Layout], stored: dict[str, str],
                 cache_dir: str | Path | None = None, threads: int | None = None):
        from ...threads import resolve
        self.plan = plan
        self.constants = constants
        self.layouts = layouts
        self.stored = stored
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.threads = resolve(threads)
        self.synthetic: dict[Any, Tensor] = {}
        self.external = {layouts[ref].storage for ref in plan.outputs.values() if ref in layouts}
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
        dtype = self.dtype_of(a.ref)
        if dtype not in _NP_TYPES:     # bfloat16, float8, int4...: Numba has no such type
            raise Unsupported(f"operand of dtype {dtype}")
        if lay.size == 0:
            raise Unsupported("an empty operand")
        return Tensor(lay.storage, dtype, self.stored_dtype(lay.storage), lay)

    # -- kernels --
    def prepare(self, kernel: Kernel) -> Impl:
        """Generate, cache and compile one kernel; raises Unsupported for the NumPy fallback."""
        started = time.perf_counter()
        body = [BodyNode(n.op, list(n.args), dict(n.attrs)) for n in kernel.body]
        k = Kernel(kernel.name, kernel.output, kernel.inputs, body, kernel.kind, kernel.info,
                   kernel.eclass)
        gen = KernelGen(self, k)
        if int(np.prod(kernel.info.shape, dtype=np.int64)) == 0:
            raise Unsupported("an empty output")
        if kernel.info.dtype not in ("float32", "float64", "int64", "int32", "bool") and \
                gen.out_stored != "float16":
            raise Unsupported(f"output dtype {kernel.info.dtype}")
        if kernel.kind == "alias":          # a view strides cannot express: a copy
            if len(body) != 1 or not body[0].args:
                raise Unsupported("alias kernel")
            gen.gen_copy(body[0].args[0])
        else:
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

    def load(self, source: str, prefix: str = "kernel"):
        """The function of a generated module (written to the cache folder, named by hash)."""
        digest = hashlib.sha256(source.encode()).hexdigest()[:24]
        key = f"{prefix}_{digest}"
        if key in self.modules:
            return self.modules[key], digest
        folder = self.cache_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{prefix[0]}_{digest}.py"
        if not _holds(path, source):     # missing, or truncated or edited since: write it anew
            tmp = folder / f".{prefix[0]}_{digest}.{os.getpid()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, path)
        name = f"eqsat_fuse_{prefix}_{digest}"
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
        fn = getattr(module, prefix)
        self.modules[key] = fn
        self.stats.sources += 1
        return fn, digest

    def segment(self, calls: list["KernelCall"], dynamic: list[tuple[str, np.dtype]]):
        """One compiled function that runs `calls` in order: `fn(P, GP, FP, *dynamic arrays)`.

        Python then pays one dispatch per segment instead of one per kernel. `P` holds the
        arena's address (P[0]), a scratch vector's (P[1]) and each constant's; `GP`/`FP` are
        every kernel's integer and float parameters end to end; the dynamic arrays are the
        graph inputs and outputs the calls touch (flat, float16 as uint16).
        """
        source, kernels = segment_source(calls, len(dynamic))
        for call in calls:                 # compile (or load) each kernel for its argument types
            self.compile(call.fn, call.example())
        fn, _ = self.load(source, "segment")
        example = (np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.float32),
                   *[np.empty(1, dtype) for _, dtype in dynamic])
        self.compile(fn, example)
        return fn

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
