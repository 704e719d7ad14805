"""The row family: Softmax and LayerNormalization one row at a time (the prologue's row into
a workspace row, its statistics in 16 lanes, then the epilogue), ReduceMean/ReduceSum and
ReduceMax/ReduceMin over trailing axes (the sum or the extreme in lanes, an epilogue per row or
per element of the row), and 2-D pooling (`K.pool2d`, then the epilogue)."""

from __future__ import annotations

import numpy as np

from ...ir import BodyNode, Operand
from ...lowering.layout import probe
from .emitter import Emitter
from .scalars import flit
from .spaces import Space, Unsupported, broadcast_layout, col_stride, column_split, probe_layout


def gen_rows(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """Softmax / LayerNormalization, one row at a time with prologue and epilogue."""
    node = e.body[a]
    code = e.code
    shape = tuple(e.kernel.info.shape)
    rank = len(shape)
    axis = node.attrs["axis"]
    axis = axis + rank if axis < 0 else axis
    if node.op == "Softmax" and axis != rank - 1:
        raise Unsupported("Softmax not over the last axis")
    if e.dtypes[a] != "float32":
        raise Unsupported("row kernel on non-float32")
    x_arg = node.args[0]
    # prologue: the value of x at (r, c); the row space is dims < axis, columns dims >= axis
    pro_nodes = [i for i in e.topo(e.needed(a)) if i != a]
    # epilogue: everything the output reads other than through the anchor (prologue values
    # the epilogue reads too are computed again in its loop)
    epilogue = [i for i in e.topo(set(e.needed(e.root, stop=a))) if i != a]
    uses_p, space_p = e.plan_operands(pro_nodes, shape, min_cols_dims=rank - axis)
    uses_e, space_e = e.plan_operands(epilogue, shape, min_cols_dims=rank - axis)
    # x itself when it is a boundary
    if x_arg.kind != "node":
        t = e.tensor(x_arg)
        lay = broadcast_layout(t.layout, shape)
        split = column_split([lay, probe_layout(shape)], shape, rank - axis)
        if split > axis:
            raise Unsupported("row kernel input strides")
    if space_p.split > axis or space_e.split > axis:
        raise Unsupported("row kernel operand strides")
    space = Space(shape, axis)
    space_p = Space(shape, axis)
    space_e = Space(shape, axis)
    uses_p, _ = e.replan(pro_nodes, shape, axis)
    uses_e, _ = e.replan(epilogue, shape, axis)
    R, C = space.rows, space.cols
    code.lines.append(f"R = {code.int_param(R)}")
    code.lines.append(f"C = {code.int_param(C)}")
    parts = row_parts(e, R, R * C)
    row0 = row_buffer(e, C, parts)
    start = len(code.lines)
    code.lines.append(f"ROW = WS[{row0}:{row0} + C]")
    code.lines.append("for r in range(R):")
    hoist: list[str] = []
    values: dict[int, str] = {}
    pro = e.emit_nodes(pro_nodes, uses_p, space_p, values, "        ", "r", "c", hoist)
    if x_arg.kind == "node":
        xval = values[x_arg.ref]
    else:
        xval = e.operand_expr(a, 0, x_arg, {(a, 0): broadcast_layout(
            e.tensor(x_arg).layout, shape)}, space, "r", "c", hoist, pro, "        ")
    code.lines += ["    " + h for h in hoist]
    # the row (prologue applied) goes to ROW; its statistics in 16-lane reductions
    code.lines.append("    for c in range(C):")
    code.lines += pro
    code.lines.append(f"        ROW[c] = F32({xval})")
    scale_expr = _row_statistics(e, node, shape[axis:])
    values_e: dict[int, str] = {a: "y"}
    hoist_e: list[str] = []
    e.loads = {}               # the loads are emitted anew in the epilogue's loop
    epi = e.emit_nodes(epilogue, uses_e, space_e, values_e, "        ", "r", "c", hoist_e)
    last = values_e[e.root]
    code.lines += ["    " + h for h in hoist_e]
    code.lines.append("    for c in range(C):")
    code.lines.append(f"        y = {scale_expr}")
    code.lines += epi
    code.lines.append(f"        out[U(r * C + c)] = {e.store_expr(last)}")
    share_rows(e, start, parts, R)


# row kernels of at least this many elements share their rows among the threads
PARALLEL_MIN_ROW_ELEMENTS = 1 << 16


def row_parts(e: Emitter, rows: int, numel: int) -> int:
    """How many threads share a row kernel's rows: one unless the program has more than one
    thread, the kernel at least PARALLEL_MIN_ROW_ELEMENTS elements and two rows a thread."""
    threads = e.backend.threads
    if threads == 1 or numel < PARALLEL_MIN_ROW_ELEMENTS or rows < 2 * threads:
        return 1
    return threads


def row_buffer(e: Emitter, cols: int, parts: int) -> str:
    """Workspace for one row of `cols` floats per part; the expression of this part's row
    start in WS (indexed by the part `p` of `share_rows` when there are several)."""
    stride = -(-cols // 16) * 16 + 16      # each part's row starts whole cache lines apart
    ws = e.alloc(stride * parts)
    return f"{ws} + p * {e.code.int_param(stride)}" if parts > 1 else ws


def share_rows(e: Emitter, start: int, parts: int, rows: int) -> None:
    """With parts > 1, the kernel's lines from `start` (its row scratch, then `for r in
    range(R):` and the row's body) become one parallel loop over `parts` contiguous blocks of
    rows, each part with its own scratch (made inside the part, or indexed by `p`)."""
    if parts == 1:
        return
    code = e.code
    code.parallel = True
    per = code.int_param(-(-rows // parts))
    body = code.lines[start:]
    i = body.index("for r in range(R):")
    body[i] = f"for r in range(p * {per}, min(R, (p + 1) * {per})):"
    code.lines[start:] = [f"for p in prange({code.int_param(parts)}):"] + \
        ["    " + line for line in body]


def _row_statistics(e: Emitter, node: BodyNode, cols_shape) -> str:
    """Lines computing the statistics of the row in ROW (Softmax: max and sum of exp, the row
    left exponentiated; LayerNorm: mean and inverse deviation); the expression of the
    normalized value at column c."""
    code = e.code
    if node.op == "Softmax":
        code.lines.append("    mx = K.row_max(ROW, C)")
        code.lines.append("    mx = F32(0) if mx == F32(-np.inf) else mx")
        code.lines.append("    K.exp_shift(ROW, C, mx)")
        code.lines.append("    inv = F32(1) / K.row_sum(ROW, C)")
        return "ROW[c] * inv"
    eps = flit(node.attrs["epsilon"])
    code.lines.append("    mean = K.row_sum(ROW, C) / F32(C)")
    code.lines.append("    q = K.row_sumsq(ROW, C, mean)")
    code.lines.append(f"    inv = F32(1) / np.sqrt(q / F32(C) + {eps})")
    # scale and bias: vectors over the normalized dims
    sc = row_vector(e, node.args[1], cols_shape)
    bi = row_vector(e, node.args[2], cols_shape) if len(node.args) > 2 else None
    scale_expr = f"(ROW[c] - mean) * inv * {sc}"
    if bi is not None:
        scale_expr += f" + {bi}"
    return scale_expr


def row_vector(e: Emitter, arg: Operand, cols_shape) -> str:
    """Expression of a vector operand indexed by the column `c` (LayerNorm scale/bias)."""
    if arg.kind == "absent":
        return None
    const = e.scalar_const(arg)
    if const is not None:
        return flit(np.asarray(const).reshape(()))
    t = e.tensor(arg)
    lay = broadcast_layout(t.layout, tuple(cols_shape))
    split = column_split([lay, probe_layout(tuple(cols_shape))], tuple(cols_shape),
                         len(cols_shape))
    cs = col_stride(lay, 0)
    off = e.code.int_param(lay.offset)
    if cs == 1:
        return e.load_expr(t, f"{off} + c")
    if cs == 0:
        return e.load_expr(t, off)
    return e.load_expr(t, f"{off} + c * {e.code.int_param(cs)}")


def gen_reduce(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """ReduceMean/ReduceSum/GlobalAveragePool/ReduceMax/ReduceMin over trailing axes: each
    row's sum or extreme in lanes, then the epilogue, once per row or per element of the row
    (x - mean(x))."""
    node = e.body[a]
    code = e.code
    x_arg = node.args[0]
    in_shape = e.value_shape(x_arg)
    rank = len(in_shape)
    axes, mean = _reduced_axes(node, rank)
    if e.dtypes[a] != "float32":
        raise Unsupported("reduction on non-float32")
    first = axes[0]
    if axes != tuple(range(first, rank)):
        raise Unsupported("reduction over non-trailing axes")
    # the prologue the reduction reads (nodes only the epilogue reads are computed there)
    red_pro = [i for i in e.topo(e.needed(a)) if i != a]
    uses_p, space_p = e.replan(red_pro, in_shape, first)
    for lay in uses_p.values():
        if column_split([lay], in_shape, rank - first) > first:
            raise Unsupported("reduction input strides")
    out_shape = tuple(e.kernel.info.shape)
    R = int(np.prod(in_shape[:first], dtype=np.int64))
    C = int(np.prod(in_shape[first:], dtype=np.int64))
    keepdims = node.op == "GlobalAveragePool" or bool(node.attrs.get("keepdims", 1))
    # the epilogue: after the anchor, or reading a prologue value (Softmax written out)
    post = set(e.needed(e.root, stop=a))
    per_row = int(np.prod(out_shape, dtype=np.int64)) == R and \
        all(i in epilogue or i == a for i in post)
    if not per_row:
        # the epilogue runs per element of the reduced input: x - sum(x, keepdims)
        if not keepdims or out_shape != tuple(in_shape):
            raise Unsupported("reduction epilogue of another shape")
    code.lines.append(f"R = {code.int_param(R)}")
    code.lines.append(f"C = {code.int_param(C)}")
    hoist: list[str] = []
    values: dict[int, str] = {}
    pro = e.emit_nodes(red_pro, uses_p, space_p, values, "            ", "r", "c", hoist)
    if x_arg.kind == "node":
        xval = values[x_arg.ref]
    else:
        lay = broadcast_layout(e.tensor(x_arg).layout, in_shape)
        if column_split([lay], in_shape, rank - first) > first:
            raise Unsupported("reduction input strides")
        xval = e.operand_expr(a, 0, x_arg, {(a, 0): lay}, space_p, "r", "c", hoist,
                              pro, "            ")
    values_e = {a: "y"}
    hoist_e: list[str] = []
    if per_row:
        # epilogue over the output, one element per row
        eshape = out_shape
        uses_e, space_e = e.replan(epilogue, eshape, len(eshape))
        epi = e.emit_nodes(epilogue, uses_e, space_e, values_e, "    ", "r", None,
                           hoist_e)
    else:
        post_nodes = [i for i in e.topo(post) if i != a]
        uses_e, space_e = e.replan(post_nodes, in_shape, first)
        for lay in uses_e.values():
            if column_split([lay], in_shape, rank - first) > first:
                raise Unsupported("reduction epilogue strides")
        e.loads = {}           # the loads are emitted anew in the epilogue's loop
        epi = e.emit_nodes(post_nodes, uses_e, space_e, values_e, "        ", "r", "c",
                           hoist_e)
    last = values_e[e.root]
    parts = row_parts(e, R, R * C)
    if node.op in ("ReduceMax", "ReduceMin"):
        fold = "K.row_max" if node.op == "ReduceMax" else "K.row_min"
        t = e.tensor(x_arg) if x_arg.kind != "node" else None
        if t is not None and t.layout.contiguous and t.stored == t.dtype == "float32" \
                and tuple(t.layout.shape) == tuple(in_shape):
            X = e.f32_input(t, "X")        # read in place: no prologue, nothing broadcast
            start = len(code.lines)
            code.lines.append("for r in range(R):")
            code.lines.append(f"    y = {fold}({X}[r * C:], C)")
        else:
            chunk = min(C, ROW_FOLD_MAX)
            row0 = row_buffer(e, chunk, parts)
            start = len(code.lines)
            _lane_extreme(code.lines, hoist, pro, xval, fold, row0, code.int_param(chunk))
    else:
        row0 = row_buffer(e, C, parts) if C <= ROW_FOLD_MAX else None
        start = len(code.lines)
        _lane_sum(code.lines, hoist, pro, xval, mean, row0)
    code.lines += ["    " + h for h in hoist_e]
    if per_row:
        code.lines += epi
        code.lines.append(f"    out[U(r)] = {e.store_expr(last)}")
    else:
        code.lines.append("    for c in range(C):")
        code.lines += epi
        code.lines.append(f"        out[U(r * C + c)] = {e.store_expr(last)}")
    share_rows(e, start, parts, R)


def _reduced_axes(node: BodyNode, rank: int) -> tuple[tuple[int, ...], bool]:
    """The axes a reduction node sums over (sorted, non-negative), and whether it averages."""
    if node.op == "GlobalAveragePool":
        return tuple(range(2, rank)), True
    axes = tuple(sorted(a_ + rank if a_ < 0 else a_ for a_ in node.attrs["axes"]))
    if not axes:
        raise Unsupported("reduce over no axes")
    return axes, node.op == "ReduceMean"


ROW_FOLD_MAX = 16384     # columns up to which a reduction's row goes through a row buffer


def _lane_extreme(lines: list[str], hoist: list[str], pro: list[str], xval: str, fold: str,
                  row0: str, chunk: str) -> None:
    """The loop over rows opening with each row's largest (or smallest) value of `xval` into
    y: chunks of the row go through a row buffer that `fold` (`K.row_max`, `K.row_min`) folds
    in lanes in registers; a NaN anywhere gives NaN, as NumPy's."""
    lines.append(f"CH = {chunk}")
    lines.append(f"ROW = WS[{row0}:{row0} + CH]")
    lines.append("for r in range(R):")
    lines += ["    " + h for h in hoist]
    smallest = fold.endswith("min")
    lines.append(f"    y = {'' if smallest else '-'}F32(np.inf)")
    lines.append("    for c0 in range(0, C, CH):")
    lines.append("        n = min(CH, C - c0)")
    lines.append("        for cc in range(n):")
    lines.append("            c = c0 + cc")
    lines += pro
    lines.append(f"            ROW[U(cc)] = {xval}")
    lines.append(f"        v = {fold}(ROW, n)")
    lines.append(f"        y = v if (v {'<' if smallest else '>'} y or v != v) else y")


def _lane_sum(lines: list[str], hoist: list[str], pro: list[str], xval: str,
              mean: bool, row0: str | None) -> None:
    """The loop over rows opening with each row's sum (or mean) of `xval` into y, in 16 lanes
    (`kernels.row_sum`'s order), then the remainder. With `row0` (an offset into WS) the
    row's values go into a row buffer there first, which `K.row_sum` folds with the lanes in
    a register; without, the lanes are an array, which LLVM keeps in memory (one thread:
    an RMSNorm over 128 rows of 512, 46 -> 35 us; a GlobalAveragePool of 96 planes of
    112 x 112, 352 -> 189 us)."""
    if row0 is not None:
        lines.append(f"ROW = WS[{row0}:{row0} + C]")
        lines.append("for r in range(R):")
        lines += ["    " + h for h in hoist]
        lines.append("    for c in range(C):")
        lines += [line[4:] for line in pro]
        lines.append(f"        ROW[c] = {xval}")
        lines.append("    y = K.row_sum(ROW, C)" + (" / F32(C)" if mean else ""))
        return
    lines.append("PART = np.empty(K.LANES, np.float32)")
    lines.append("CF = C - C % K.LANES")
    lines.append("for r in range(R):")
    lines += ["    " + h for h in hoist]
    lines.append("    for k in range(K.LANES):")
    lines.append("        PART[k] = F32(0)")
    lines.append("    for c0 in range(0, CF, K.LANES):")
    lines.append("        for k in range(K.LANES):")
    lines.append("            c = c0 + k")
    lines += pro
    lines.append(f"            PART[k] += {xval}")
    lines.append("    s = F32(0)")
    lines.append("    for k in range(K.LANES):")
    lines.append("        s += PART[k]")
    lines.append("    for c in range(CF, C):")
    lines += [line[4:] for line in pro]
    lines.append(f"        s += {xval}")
    lines.append("    y = s / F32(C)" if mean else "    y = s")


def _widened_bytes(e: Emitter, t) -> str:
    """Code making X a float32 copy of the 8-bit integer tensor t (every value exact): the
    max of a window of integers is the max of their floats (a QOperator model's MaxPool)."""
    if not t.layout.contiguous:
        raise Unsupported("MaxPool of strided integers")
    code = e.code
    n = code.int_param(t.layout.size)
    ws = e.alloc(t.layout.size)
    arr = e.storage_array(t)
    code.lines.append(f"X = WS[{ws}:{ws} + {n}]")
    code.lines.append(f"for i in range({n}):")
    code.lines.append(f"    X[U(i)] = F32({arr}[U({code.int_param(t.layout.offset)} + i)])")
    return "X"


def gen_pool(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    node = e.body[a]
    code = e.code
    if prologue:
        raise Unsupported("pool with a prologue")
    tx = e.anchor_tensor(a, 0)
    small_ints = tx.dtype in ("uint8", "int8") and node.op == "MaxPool"
    if len(tx.layout.shape) != 4 or (tx.dtype != "float32" and not small_ints):
        raise Unsupported("pooling that is not 2-D float32 (or MaxPool of 8-bit integers)")
    from ..numpy.pooling import _pool_geometry
    attrs = node.attrs
    N, C, H, W = tx.layout.shape
    nd, ks, pb, pe, st, dil, out_sp, extra = _pool_geometry(
        probe(tx.layout.shape), attrs["kernel_shape"], attrs["pads"], attrs["strides"],
        attrs["dilations"], attrs["ceil_mode"])
    OH, OW = out_sp
    out_shape = (N, C, OH, OW)
    if tuple(e.kernel.info.shape) != out_shape:
        raise Unsupported("pool output shape")
    acc, widened = e.acc_target(N * C * OH * OW)
    lines_epi, space = e.emit_epilogue(a, epilogue, out_shape, 2, "r * EC + c", "", acc)
    if space.cols != OH * OW:
        raise Unsupported("pool epilogue columns")
    X = _widened_bytes(e, tx) if small_ints else e.f32_input(tx, "X")
    is_max = node.op == "MaxPool"
    include = bool(attrs.get("count_include_pad", 0))
    geo = [N * C, H, W, ks[0], ks[1], st[0], st[1], pb[0], pb[1], pe[0], pe[1], dil[0],
           dil[1], OH, OW, int(is_max), int(include)]
    code.lines.append(f"EC = {code.int_param(OH * OW)}")
    code.lines.append(f"K.pool2d_entry((X, 0, {', '.join(code.int_param(v) for v in geo)}, "
                      f"{acc}))")
    code.lines.append(f"r0 = 0")
    code.lines.append(f"r1 = {code.int_param(N * C)}")
    code.lines += lines_epi
