"""The elementwise family: one pass over the output, viewed as rows x columns where every
operand is a row base plus a column stride (`gen_elementwise`); bodies with several heavy ops
run in stages over an L1 tile (`staged_elementwise`); large cheap outputs are written with
non-temporal stores (`stream_elementwise`); an anchor's result that the rest of the body
broadcasts is finished by one elementwise pass over the output (`broadcast_epilogue`)."""

from __future__ import annotations

from ...ir import BodyNode, Operand
from ...lowering.layout import Layout
from .emitter import Emitter
from .spaces import Tensor, c_strides

# elementwise kernels at least this large run with prange when more than one thread is allowed
PARALLEL_MIN_ELEMENTS = 1 << 18
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


def gen_elementwise(e: Emitter, serial: bool = False) -> None:
    shape = tuple(e.kernel.info.shape)
    nodes = e.topo(e.needed(e.root))
    uses, space = e.plan_operands(nodes, shape)
    R, C = space.rows, space.cols
    numel = R * C
    code = e.code
    code.parallel = not serial and e.backend.threads > 1 and numel >= PARALLEL_MIN_ELEMENTS
    code.lines += [f"R = {code.int_param(R)}", f"C = {code.int_param(C)}"]
    stream = not code.parallel and streams(e, numel)
    stage_plan = None if stream else stages(e, nodes, C)
    hoist: list[str] = []
    values: dict[int, str] = {}
    if stage_plan is not None:
        staged_elementwise(e, *stage_plan, uses, space)
    elif stream:
        stream_elementwise(e, R, C, hoist, values, nodes, uses, space)
    else:
        inner = e.emit_nodes(nodes, uses, space, values, "        ", "r", "c", hoist)
        if code.parallel and R < 4 * e.backend.threads:
            # few long rows: the threads share each row in column chunks
            chunk = max(4096, -(-C // (4 * e.backend.threads)))
            code.lines += [f"CH = {code.int_param(chunk)}",
                           f"NC = {code.int_param(-(-C // chunk))}"]
            code.lines.append("for t in prange(R * NC):")
            code.lines.append("    r = t // NC")
            code.lines.append("    c0 = (t - r * NC) * CH")
            code.lines.append("    c1 = min(c0 + CH, C)")
            code.lines += ["    " + h for h in hoist]
            code.lines.append("    for c in range(c0, c1):")
        else:
            code.lines.append(f"for r in {'prange' if code.parallel else 'range'}(R):")
            code.lines += ["    " + h for h in hoist]
            code.lines.append("    for c in range(C):")
        code.lines += inner
        code.lines.append(f"        out[U(r * C + c)] = {e.store_expr(values[e.root])}")
    # in place: an input read only densely (at the index written) may be overwritten
    dense: dict[str, bool] = {}
    for (i, slot), lay in uses.items():
        a = e.body[i].args[slot]
        storage = e.tensor(a).storage if a.kind in ("buffer", "synthetic") else None
        if storage is None:
            continue
        ok = a.kind == "buffer" and lay.strides == c_strides(shape) and lay.offset == 0 \
            and e.backend.stored_dtype(a.ref) == e.out_stored and a.ref == storage
        dense[storage] = dense.get(storage, True) and ok
    if not serial:
        e.inplace.update(name for name, ok in dense.items() if ok)


def stages(e: Emitter, nodes: list[int], cols: int):
    """`nodes` cut after each heavy op but the last (see _HEAVY_OPS), and the values that
    later stages read from earlier ones; None when the body keeps one loop."""
    heavy = [i for i in nodes if e.body[i].op in _HEAVY_OPS]
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
    handed = sorted({a.ref for i in nodes for a in e.body[i].args
                     if a.kind == "node" and stage_of[a.ref] < stage_of[i]})
    if e.root not in groups[-1] or len(handed) > STAGE_MAX_VALUES \
            or any(e.dtypes[v] != "float32" for v in handed):
        return None         # the tiles are float32 workspace
    return groups, handed


def staged_elementwise(e: Emitter, groups, handed, uses, space) -> None:
    """One loop per stage over a tile of a row; `handed` values pass through the tiles.

    Work items are (row, column tile) pairs; with threads each thread takes a contiguous
    share of them and has tiles of its own in the workspace."""
    code = e.code
    tile = min(space.cols, STAGE_TILE)
    threads = e.backend.threads if code.parallel else 1
    slot = {v: "" if k == 0 else f" + {k} * TC" for k, v in enumerate(handed)}
    # each thread's tiles a whole number of cache lines apart: threads writing into one
    # line would pass it back and forth on every row (0.8x at two threads, 64 columns)
    per = -(-len(handed) * tile // 16) * 16 + 16
    ws = e.alloc(threads * per)
    code.lines += [f"TC = {code.int_param(tile)}", f"NC = {code.int_param(-(-space.cols // tile))}",
                   "NQ = R * NC",
                   f"for t in {'prange' if code.parallel else 'range'}({threads}):",
                   f"    sb = {ws} + t * {code.int_param(per)}",
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
        e.loads = {k: name for k, name in e.loads.items() if name in kept}
        body.append(f"        for c in range(c0, c1):      # stage {s + 1} of {len(groups)}")
        reads = sorted({a.ref for i in group for a in e.body[i].args
                        if a.kind == "node" and a.ref in slot and a.ref not in group})
        body += [f"            v{v} = WS[U(sb{slot[v]} + c - c0)]" for v in reads]
        body += e.emit_nodes(group, uses, space, values, "            ", "r", "c", hoist)
        body += [f"            WS[U(sb{slot[v]} + c - c0)] = {values[v]}"
                 for v in group if v in slot]
    body.append(f"            out[U(r * C + c)] = {e.store_expr(values[e.root])}")
    code.lines += ["        " + h for h in hoist] + body


def streams(e: Emitter, numel: int) -> bool:
    """Whether this kernel writes its output with non-temporal stores: a float32 output
    large enough that keeping it in cache helps no reader (a graph output of at least
    STREAM_MIN_OUTPUT elements, any buffer of at least STREAM_MIN_BUFFER), on x86 with
    AVX-512."""
    from .kernels import WIDE_VECTORS
    if not WIDE_VECTORS or e.out_stored != "float32" or e.out_dtype != "float32":
        return False
    if any(node.op not in _STREAM_OPS for node in e.body):
        return False        # compute-bound bodies measured slower through the L1 tile
    root = e.backend.layouts[e.kernel.output].storage
    limit = STREAM_MIN_OUTPUT if root in e.backend.external else STREAM_MIN_BUFFER
    return numel >= limit


def stream_elementwise(e: Emitter, R, C, hoist, values, nodes, uses, space) -> None:
    """The elementwise loop computing tiles in L1 that K.stream_out writes out."""
    from .kernels import STREAM_TILE
    code = e.code
    ws = e.alloc(STREAM_TILE)
    code.lines.append(f"T = WS[{ws}:{ws} + {code.int_param(STREAM_TILE)}]")
    e.loads = {}               # the loads are emitted anew at this nesting
    hoist.clear()
    values.clear()
    if C <= STREAM_TILE:
        inner = e.emit_nodes(nodes, uses, space, values, "            ", "r", "c", hoist)
        code.lines.append(f"TR = {code.int_param(max(1, STREAM_TILE // max(C, 1)))}")
        code.lines.append("for r0 in range(0, R, TR):")
        code.lines.append("    r1 = min(r0 + TR, R)")
        code.lines.append("    for r in range(r0, r1):")
        code.lines += ["        " + h for h in hoist]
        code.lines.append("        b = (r - r0) * C")
        code.lines.append("        for c in range(C):")
        code.lines += inner
        code.lines.append(f"            T[U(b + c)] = {values[e.root]}")
        code.lines.append("    K.stream_out(out, r0 * C, T, (r1 - r0) * C)")
    else:
        inner = e.emit_nodes(nodes, uses, space, values, "            ", "r", "c", hoist)
        code.lines.append(f"TC = {code.int_param(STREAM_TILE)}")
        code.lines.append("for r in range(R):")
        code.lines += ["    " + h for h in hoist]
        code.lines.append("    for c0 in range(0, C, TC):")
        code.lines.append("        c1 = min(c0 + TC, C)")
        code.lines.append("        for c in range(c0, c1):")
        code.lines += inner
        code.lines.append(f"            T[U(c - c0)] = {values[e.root]}")
        code.lines.append("        K.stream_out(out, r * C + c0, T, c1 - c0)")
    code.lines.append("K.sfence()")


def broadcast_epilogue(e: Emitter, a: int, acc: str, anchor_shape) -> None:
    """After the anchor filled `acc` whole: the rest of the body as one elementwise pass
    over the output, reading the anchor's value from acc with broadcasting."""
    key = ("acc", e.kernel.name)
    e.backend.synthetic[key] = Tensor("@" + acc, "float32", "float32",
                                      Layout("@" + acc, 0, tuple(anchor_shape),
                                          c_strides(tuple(anchor_shape))))
    e.body[a] = BodyNode("Identity", [Operand("synthetic", key)], {})
    gen_elementwise(e, serial=True)
