"""The emitter: the state and the small API every kernel family writes one kernel with.

`Emitter` holds the kernel being generated (`kernel`, its `body` and node `dtypes`), the
backend it reads operands from (`backend`) and the module source it writes (`code`). Its API:
operands and their loads (`tensor`, `load_expr`, `operand_expr`, hoisting row-constant loads),
stores (`store_expr`), the elementwise machinery over an iteration space (`plan_operands`,
`emit_nodes`), walks of the body (`topo`, `needed`, `depends_on`), and what anchors share:
float32 inputs, workspace (`alloc`), accumulators and the fused epilogue (`emit_epilogue`).
The families (`elementwise`, `contraction`, `rows`, `movement`) are functions over it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...graphs import postorder, reachable
from ...ir import BodyNode, Kernel, Operand
from ...lowering.layout import Layout, apply_view, layout_of, probe
from ...ops import OPS
from .requantize import fast_requantization
from .scalars import compute_dtype, literal, node_dtypes, scalar_expr
from .source import ModuleSource
from .spaces import (Space, Tensor, Unsupported, broadcast_layout, col_stride, column_split,
                     probe_layout, row_table)

if TYPE_CHECKING:
    from .backend import NumbaBackend


# ops whose float16 result is one of their float16 arguments (or Cast's own rounding): no
# rounding after them
_F16_EXACT = frozenset({"Identity", "Dropout", "Relu", "Neg", "Abs", "Where", "Clip", "Cast"})


class Emitter:
    """Generates the module of one kernel: `code` is its source, written by the families."""

    def __init__(self, backend: "NumbaBackend", kernel: Kernel):
        self.backend = backend
        self.kernel = kernel
        self.code = ModuleSource(backend.numerics)
        self.body = kernel.body
        self.dtypes = node_dtypes(kernel.body, backend.operand_dtype)
        self.out_dtype = kernel.info.dtype
        self.out_stored = backend.stored_dtype(kernel.output)
        self.code.out_stored = self.out_stored
        self.workspace = 0          # float32 elements
        self.inplace: set[str] = set()
        # (storage, offset, strides, row var, col var) -> the variable holding that load
        self.loads: dict = {}
        self.load_count = 0                # loads named so far (names stay unique in a kernel)
        self.root = len(kernel.body) - 1
        # (anchor, accumulator, its shape) when the epilogue broadcasts the anchor's result:
        # it runs after the anchor, as an elementwise pass (`elementwise.broadcast_epilogue`)
        self.pending_broadcast = None

    def topo(self, nodes) -> list[int]:
        """`nodes` in dependency order (synthetic nodes are appended after their readers)."""
        wanted = set(nodes)

        def args(i: int) -> list[int]:
            # reversed: postorder visits children in the order given, and this order has always
            # visited the last argument first (the generated sources depend on it)
            return [a.ref for a in reversed(self.body[i].args)
                    if a.kind == "node" and a.ref in wanted]
        return postorder(sorted(wanted), args)

    # -- operands --
    def tensor(self, operand: Operand) -> Tensor:
        """The tensor (storage, dtypes, layout) a boundary or synthetic operand reads."""
        return self.backend.tensor(operand)

    def const_value(self, operand: Operand):
        """The value of a one-element constant operand, else None."""
        if operand.kind == "const":
            value = self.backend.constants[operand.ref]
            if np.size(value) == 1:
                return value
        return None

    def storage_array(self, t: Tensor) -> str:
        """The kernel argument (or local array) holding t's storage."""
        if t.storage.startswith("@"):
            return t.storage[1:]          # a local array of the kernel (its accumulator)
        return self.code.array(("storage", t.storage), ("storage", t.storage), t.stored)

    def load_expr(self, t: Tensor, index: str) -> str:
        """Source of one element of t at the element offset `index`, widened from float16
        where it is stored so."""
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
                uses[(i, slot)] = broadcast_layout(lay, shape)
        layouts = list(uses.values()) + list(extra_layouts)
        split = column_split(layouts + [probe_layout(shape)], shape, min_cols_dims)
        return uses, Space(shape, split)

    def scalar_const(self, a: Operand):
        """The value of a one-element constant operand (or a literal), else None."""
        if a.kind == "flit":
            return np.float32(a.ref)
        return self.const_value(a)

    def emit_nodes(self, nodes: list[int], uses: dict, space: Space, values: dict[int, str],
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
            if dt == "float16" and node.op not in _F16_EXACT \
                    and not (i == self.root and self.out_stored == "float16"):
                # computed in float32, a float16 value is rounded to float16 where ONNX makes
                # it (each op's result), not only where it is stored (the root, store_expr)
                expr = f"f16_to_f32(f32_to_f16({expr}))"
            var = f"v{i}"
            lines.append(f"{indent}{var} = {expr}")
            values[i] = var
        return lines

    def arg_dtype(self, a: Operand) -> str:
        """The logical dtype of an argument of a body node."""
        if a.kind == "node":
            return self.dtypes[a.ref]
        if a.kind == "absent":
            return "float32"
        return self.backend.operand_dtype(a)

    def operand_expr(self, i, slot, a, uses, space, row_var, col_var, hoist, lines, indent):
        """The value of boundary operand `a` (argument `slot` of node i) at (row_var,
        col_var) of `space`: a literal for a scalar constant, else a variable loaded once
        (into `hoist` when it is constant along the row, else into `lines`)."""
        const = self.scalar_const(a)
        dt = compute_dtype(self.backend.operand_dtype(a))
        if const is not None:
            value = np.asarray(const).reshape(())
            return literal(value, dt)
        key = (i, slot)
        lay = uses[key]
        t = self.tensor(a)
        cache_key = (t.storage, lay.offset, lay.strides, row_var, col_var)
        if cache_key in self.loads:
            return self.loads[cache_key]
        j = space.split
        cs = col_stride(lay, j) if col_var is not None else 0
        table = row_table(lay, j) if j else np.array([lay.offset], dtype=np.int64)
        name = f"x{self.load_count}"
        self.load_count += 1
        base = self.row_base(table, row_var)
        if base.startswith("G[") and hoist is not None and col_var is not None:
            # a row's base from the table, once a row: read inside the column loop it is
            # loaded at every column (G may alias the output), which keeps the loop scalar
            hoist.append(f"{name}b = {base}")
            base = f"{name}b"
        if cs == 0:
            index = base
        elif cs == 1:
            index = f"{base} + {col_var}"
        else:
            index = f"{base} + {col_var} * {self.code.int_param(cs)}"
        expr = self.load_expr(t, index)
        if cs == 0 and hoist is not None:
            hoist.append(f"{name} = {expr}")
        else:
            lines.append(f"{indent}{name} = {expr}")
        self.loads[cache_key] = name
        return name

    def row_base(self, table: np.ndarray, row_var: str) -> str:
        """Expression of a row's base offset: affine in the row when it can be, else a table."""
        if table.size == 1:
            return self.code.int_param(table[0])
        steps = np.diff(table)
        if np.all(steps == steps[0]):
            if steps[0] == 0:
                return self.code.int_param(table[0])
            start, step = self.code.int_param(table[0]), self.code.int_param(steps[0])
            return f"({start} + {row_var} * {step})"
        start = self.code.table(table)
        return f"G[{start} + {row_var}]"

    def store_expr(self, value: str) -> str:
        """`value` as stored in the output (narrowed to float16 where it is stored so)."""
        if self.out_stored == "float16":
            return f"f32_to_f16({value})"
        return value

    # -- the body --
    def depends_on(self, i: int, a: int) -> bool:
        """Whether body node i reads node a (directly or through other nodes)."""
        return a in reachable([i], self.args_of)

    def args_of(self, i: int) -> list[int]:
        """The body nodes node i reads."""
        return [x.ref for x in self.body[i].args if x.kind == "node"]

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
            key = ("view", self.kernel.name, i)
            self.backend.synthetic[key] = Tensor(t.storage, t.dtype, t.stored, lay)
            self.body[i] = BodyNode("Identity", [Operand("synthetic", key)], {})

    def needed(self, root: int, stop: int | None = None) -> list[int]:
        """The body nodes `root` depends on (itself included); with `stop`, only those it
        depends on other than through node `stop` (which is kept, its inputs are not)."""
        return sorted(reachable([root], lambda i: [] if i == stop else self.args_of(i)))

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

    # -- anchors: inputs, accumulators, epilogues --
    def replan(self, nodes, shape, split):
        """Layouts (broadcast to `shape`) of the boundary operands `nodes` read, over the
        space split at `split` (no column merging: the caller checked the strides)."""
        uses: dict[tuple, Layout] = {}
        for i in nodes:
            for slot, a in enumerate(self.body[i].args):
                if a.kind in ("node", "absent") or self.scalar_const(a) is not None:
                    continue
                uses[(i, slot)] = broadcast_layout(self.tensor(a).layout, shape)
        return uses, Space(shape, split)

    # epilogue over rows [r0, r1) of a space, reading the anchor's value from acc
    def emit_epilogue(self, a: int, epilogue: list[int], shape, min_cols_dims: int,
                      acc_index: str, indent: str, acc_name: str = "ACC",
                      cols: tuple[str, str] = ("0", "EC")):
        """Lines: for r in [r0, r1): for c in [cols): value = epilogue(acc[...]);
        out[...] = value."""
        uses, space = self.plan_operands(epilogue, shape, min_cols_dims=min_cols_dims)
        if space.split > len(shape) - min_cols_dims:
            raise Unsupported("epilogue columns")
        space = Space(shape, len(shape) - min_cols_dims)
        values = {a: "acc_v"}
        hoist: list[str] = []
        inner = self.emit_nodes(epilogue, uses, space, values, indent + "        ", "r", "c",
                                hoist)
        last = values[epilogue[-1]] if epilogue else "acc_v"
        acc_load = f"acc_v = {acc_name}[U({acc_index})]"
        # an integer sum requantized to 8 bits: in float32, exactly (`requantize`)
        fast = fast_requantization(self, a, epilogue, uses, space, hoist, inner, last, indent,
                                   acc_load, "r * EC + c", cols)
        lines = [f"{indent}for r in range(r0, r1):"]
        lines += [f"{indent}    {h}" for h in hoist]
        if fast is not None:
            return lines + fast, space
        lines.append(f"{indent}    for c in range({cols[0]}, {cols[1]}):")
        lines.append(f"{indent}        {acc_load}")
        lines += inner
        lines.append(f"{indent}        out[U(r * EC + c)] = {self.store_expr(last)}")
        return lines, space

    def anchor_tensor(self, a: int, slot: int) -> Tensor:
        """The tensor argument `slot` of anchor node a reads (not an inline value)."""
        arg = self.body[a].args[slot]
        if arg.kind not in ("buffer", "const", "synthetic"):
            raise Unsupported("an anchor reading an inline value")
        return self.tensor(arg)

    def f32_input(self, t: Tensor, name: str) -> str:
        """Code making `name` a float32 flat array of tensor t's elements (contiguous)."""
        code = self.code
        if t.dtype != "float32":
            raise Unsupported(f"anchor on {t.dtype}")
        arr = self.storage_array(t)
        if not t.layout.contiguous:
            return self.pack(t, name)
        off = code.int_param(t.layout.offset)
        n = code.int_param(t.layout.size)
        if t.stored == "float16":
            ws = self.alloc(t.layout.size)
            code.lines.append(f"{name} = WS[{ws}:{ws} + {n}]")
            code.lines.append(f"K.widen_f16({arr}, {off}, {n}, {name})")
        else:
            code.lines.append(f"{name} = {arr}[{off}:{off} + {n}]")
        return name

    def pack(self, t: Tensor, name: str) -> str:
        """Code copying a strided tensor into contiguous float32 workspace."""
        code = self.code
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
        code.lines.append(f"{name} = WS[{ws}:{ws} + {code.int_param(lay.size)}]")
        dims = [code.int_param(n) for n in shape]
        steps = [code.int_param(s_) for s_ in strides]
        code.lines.append(f"k_ = 0")
        code.lines.append(f"for i0 in range({dims[0]}):")
        code.lines.append(f"    for i1 in range({dims[1]}):")
        code.lines.append(f"        for i2 in range({dims[2]}):")
        code.lines.append(f"            b_ = {code.int_param(lay.offset)} + i0 * {steps[0]} + "
                          f"i1 * {steps[1]} + i2 * {steps[2]}")
        code.lines.append(f"            for i3 in range({dims[3]}):")
        code.lines.append(f"                {name}[U(k_ + i3)] = "
                          f"{self.load_expr(t, f'b_ + i3 * {steps[3]}')}")
        code.lines.append(f"            k_ += {dims[3]}")
        return name

    def alloc(self, elements: int) -> str:
        """Reserves float32 workspace (16 elements of slack); the start's expression."""
        start = self.workspace
        self.workspace += int(elements) + 16
        return self.code.int_param(start)

    def whole_acc(self, a: int, shape) -> str:
        """Workspace for an anchor result that the epilogue broadcasts to a larger output."""
        numel = int(np.prod(shape))
        ws = self.alloc(numel)
        self.code.lines.append(f"ACC = WS[{ws}:{ws} + {self.code.int_param(numel)}]")
        self.pending_broadcast = (a, "ACC", tuple(shape))
        return "ACC"

    def acc_target(self, numel: int) -> tuple[str, bool]:
        """Where the anchor writes float32 results: `out` itself, or workspace."""
        if self.out_stored == "float32" and self.out_dtype == "float32":
            return "out", False
        ws = self.alloc(numel)
        self.code.lines.append(f"ACC = WS[{ws}:{ws} + {self.code.int_param(numel)}]")
        return "ACC", True
