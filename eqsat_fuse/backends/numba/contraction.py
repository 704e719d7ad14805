"""The contraction family: MatMul, Gemm and Conv as one GEMM per matrix product, then the
fused epilogue over the accumulator's rows.

MatMul/Gemm with constant weights: `packed_gemm.gemm` on AVX-512 (weights packed into column
panels at compile time), else `np.dot` or `kernels.gemm_parallel`; batched and activation x
activation products: one strided `kernels.gemm` per batch (leading dims and transposes, so
views need no copy). Conv: `packed_gemm.gemm_rows` over row offsets of the input on AVX-512
(`conv_packed`), or on small planes positions x channels (`conv_positions`), direct loops for depthwise, shifted GEMMs over the padded input for stride-1
convolutions on wide planes (`conv_shifted`), else im2col (or the planes of a 1x1) and `np.dot`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import packed_gemm as PG
from ...ir import BodyNode, Operand
from ...lowering.layout import Layout
from .emitter import Emitter
from .spaces import Tensor, Unsupported, batch_map, broadcast_layout, row_table

# a stride-1 Conv runs as shifted GEMMs over the padded input (no im2col) when the padded row
# is at most this much longer than the output row and the output plane is this large
SHIFTED_MAX_WIDTH_RATIO = 1.1
SHIFTED_MIN_PIXELS = 256
# constant-weight GEMMs of at least this many multiply-adds share their panels among threads
PARALLEL_MIN_MACS = 1 << 22
# a Conv of at least this many multiply-adds shares its column chunks (packed) among the
# threads, in one parallel region
PARALLEL_MIN_CONV_MACS = 1 << 20
# a depthwise one its channel blocks from this many: it does several times a GEMM's work per
# multiply-add (MobileNetV2's int8 3x3 on 28 x 28, 1.0M of them, took 250 us at one thread)
PARALLEL_MIN_DW_MACS = 1 << 17
# Conv on AVX-512: the packed-weight microkernel over row offsets of the input (conv_packed);
# output positions go in chunks of at most CONV_CHUNK_PANELS panels whose input slice is within
# CONV_CHUNK_BYTES, and rows in blocks whose output chunk is within CONV_BLOCK_BYTES
PACKED_CONV = True
# ... or the other way round, positions x output channels (`conv_positions`), where
# `positions_pay` says so; CONV_LAYOUT "rows" or "positions" forces one (tests)
CONV_LAYOUT: str | None = None
CONV_POSITIONS_MIN_K = 128
CONV_POSITIONS_BLOCK = 512          # output positions per block of `conv_positions`
CONV_CHUNK_PANELS = 8
CONV_CHUNK_BYTES = 1 << 19
CONV_BLOCK_BYTES = 1 << 18
# output bytes of one BLAS call before a GEMM is split into row blocks
GEMM_BLOCK_BYTES = 1 << 26


def gemm_block(rows: int, cols: int) -> int:
    """Rows per BLAS call: all of them unless the block's output exceeds GEMM_BLOCK_BYTES.

    Every call repacks the whole B operand, so small row blocks (to keep the epilogue's rows
    in L1) cost more in packing than the epilogue gains; one call per GEMM is fastest here.
    """
    return max(8, min(rows, GEMM_BLOCK_BYTES // max(4 * cols, 1)))


def gen_matmul(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """MatMul/Gemm: the product into the accumulator, then the epilogue over its rows."""
    node = e.body[a]
    code = e.code
    if prologue:
        epilogue = sorted(prologue + epilogue)
    ta = e.anchor_tensor(a, 0)
    tb = e.anchor_tensor(a, 1)
    if ta.dtype != "float32" or tb.dtype != "float32":
        raise Unsupported("MatMul on non-float32")
    mshape = _product_shape(e, node, ta, tb)
    out_shape = tuple(e.kernel.info.shape)
    bcast = int(np.prod(mshape)) != int(np.prod(out_shape))
    N = mshape[-1]
    # B: a constant is passed as a contiguous 2-D (K, N) array; a buffer as its storage
    b_const = tb.storage in e.backend.constants and tb.layout.contiguous
    if node.op == "Gemm":
        Bv = np.asarray(e.backend.constants[tb.storage]) if b_const else None
        if Bv is not None and node.attrs["trans_b"]:
            Bv = np.ascontiguousarray(Bv.T)
        alpha, beta = float(node.attrs["alpha"]), float(node.attrs["beta"])
    else:
        Bv = None
        alpha, beta = 1.0, 0.0
    if bcast:
        acc = e.whole_acc(a, mshape)
    else:
        acc, _ = e.acc_target(int(np.prod(out_shape)))
    epi_nodes = _gemm_scaling(e, a, node, alpha, beta, list(epilogue))
    if bcast:
        lines_epi = []
    else:
        # the rows of the epilogue space are (batch..., M); columns N
        lines_epi, space = e.emit_epilogue(a, epi_nodes, tuple(mshape), 1, "r * EC + c", "",
                                           acc)
        if space.cols != N:
            raise Unsupported("epilogue column blocking")
    code.lines.append(f"EC = {code.int_param(N)}")
    epi_fn = ["    " + line for line in lines_epi]
    if b_const and len(tb.layout.shape) == 2:
        _constant_b_product(e, node, ta, tb, Bv, mshape, acc, epi_fn)
    else:
        _batched_product(e, ta, tb, mshape, acc, epi_fn)


def _product_shape(e: Emitter, node: BodyNode, ta: Tensor, tb: Tensor) -> tuple[int, ...]:
    """The shape of the product (batch..., M, N), before any broadcasting epilogue."""
    sa, sb = ta.layout.shape, tb.layout.shape
    if node.op == "Gemm":
        at = node.attrs
        if at["trans_a"] or len(sa) != 2 or len(sb) != 2:
            raise Unsupported("Gemm with trans_a")
        if tb.storage not in e.backend.constants and at["trans_b"]:
            raise Unsupported("Gemm with a transposed buffer B")
        return (sa[0], sb[0] if at["trans_b"] else sb[1])
    if len(sa) < 2 or len(sb) < 2:
        raise Unsupported("MatMul on 1-D")
    batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    return tuple(batch) + (sa[-2], sb[-1])


def _gemm_scaling(e: Emitter, a: int, node: BodyNode, alpha: float, beta: float,
                  epi_nodes: list[int]) -> list[int]:
    """Gemm's alpha and beta * C as synthetic body nodes the epilogue reads first (its other
    operands join the epilogue's); the epilogue's nodes."""
    c_arg = None
    if node.op == "Gemm" and len(node.args) > 2 and node.args[2].kind != "absent" \
            and beta != 0.0:
        c_arg = node.args[2]
    if alpha == 1.0 and c_arg is None:
        return epi_nodes
    # rewrite: acc_v -> alpha * acc_v + beta * C as synthetic nodes the epilogue reads
    pre = []
    idx = a
    if alpha != 1.0:
        idx = len(e.body)
        e.body.append(BodyNode("Mul", [Operand("node", a), Operand("flit", alpha)], {}))
        e.dtypes.append("float32")
        pre.append(idx)
    if c_arg is not None:
        cidx = len(e.body)
        if beta != 1.0:
            e.body.append(BodyNode("Mul", [c_arg, Operand("flit", beta)], {}))
            e.dtypes.append("float32")
            pre.append(cidx)
            c_val = Operand("node", cidx)
        else:
            c_val = c_arg
        e.body.append(BodyNode("Add", [Operand("node", idx), c_val], {}))
        e.dtypes.append("float32")
        pre.append(len(e.body) - 1)
    # the old consumers of the anchor read the new value
    new = pre[-1]
    for i in epi_nodes:
        e.body[i].args = [Operand("node", new) if x.kind == "node" and x.ref == a
                          else x for x in e.body[i].args]
    return pre + epi_nodes


def _constant_b_product(e: Emitter, node: BodyNode, ta: Tensor, tb: Tensor, Bv, mshape,
                        acc: str, epi_fn: list[str]) -> None:
    """One GEMM over all rows of A (batch folded into M), in row blocks, with constant
    weights: packed into column panels on AVX-512, else a contiguous (K, N) array for BLAS."""
    code = e.code
    sa, sb = ta.layout.shape, tb.layout.shape
    M, N, Kd = mshape[-2], mshape[-1], sa[-1]
    batch = int(np.prod(mshape[:-2])) if len(mshape) > 2 else 1
    A = e.f32_input(ta, "A")
    code.lines.append(f"A2 = A.reshape(({code.int_param(int(np.prod(sa[:-1])))}, "
                      f"{code.int_param(Kd)}))")
    bkey = ("B", e.kernel.name)
    value = Bv if node.op == "Gemm" else np.ascontiguousarray(
        np.asarray(e.backend.constants[tb.storage], dtype=np.float32).reshape(sb))
    rows = batch * M
    block = gemm_block(rows, N)
    code.lines.append(f"RT = {code.int_param(rows)}")
    code.lines.append(f"BM = {code.int_param(block)}")
    if PG.AVAILABLE:           # workspace for a block of A's rows, packed per call
        size = PG.a_workspace(min(rows, block), Kd)
        ap = e.alloc(size)
        code.lines.append(f"AP = WS[{ap}:{ap} + {code.int_param(size)}]")
    code.lines.append("for r0 in range(0, RT, BM):")
    code.lines.append("    r1 = min(r0 + BM, RT)")
    if PG.AVAILABLE:
        # the weights packed into column panels once, here; A's rows packed per block
        Bname = code.array(bkey, ("array", e.backend.packed(value)))
        driver = ("gemm_parallel" if e.backend.threads > 1
                  and rows * N * Kd >= PARALLEL_MIN_MACS else "gemm")
        code.uses_packed_gemm = True
        code.lines.append(f"    PG.{driver}_entry((A, 0, {code.int_param(Kd)}, r0, r1, {Bname}, "
                          f"EC, {code.int_param(Kd)}, {acc}, 0, EC, AP))")
    else:
        Bname = code.array(bkey, ("array", np.ascontiguousarray(value, dtype=np.float32)))
        if shares_gemm(e, rows * N * Kd):
            code.lines.append(f"    K.gemm_parallel(0, 0, r1 - r0, EC, {code.int_param(Kd)}, "
                              f"F32(1), A, r0 * {code.int_param(Kd)}, {code.int_param(Kd)}, "
                              f"{Bname}, 0, EC, F32(0), {acc}, r0 * EC, EC, "
                              f"{e.backend.threads})")
            epi_fn = parallel_rows(e, epi_fn)
        else:
            code.lines.append(f"    np.dot(A2[r0:r1], {Bname}, {acc}[r0 * EC:r1 * EC]"
                              f".reshape((r1 - r0, EC)))")
    code.lines += epi_fn


def _batched_product(e: Emitter, ta: Tensor, tb: Tensor, mshape, acc: str,
                     epi_fn: list[str]) -> None:
    """Batched: broadcast batch dims, one strided GEMM per batch (K.gemm takes leading dims
    and transposes, so transposed or sliced views of buffers need no packing copy)."""
    code = e.code
    sa, sb = ta.layout.shape, tb.layout.shape
    M, N, Kd = mshape[-2], mshape[-1], sa[-1]
    batch = int(np.prod(mshape[:-2])) if len(mshape) > 2 else 1
    if len(sa) - 2 > len(mshape) - 2 or len(sb) - 2 > len(mshape) - 2:
        raise Unsupported("batch dims")
    bdims = tuple(mshape[:-2])
    operands = []
    for t, name in ((ta, "A"), (tb, "B")):
        view = blas_view(e, t, bdims)
        if view is None:             # pack into contiguous float32 workspace
            if t.storage in e.backend.constants and name == "B":
                arr = code.array(("B", e.kernel.name), ("array", np.ascontiguousarray(
                    np.asarray(e.backend.constants[t.storage], dtype=np.float32).reshape(sb))))
            else:
                arr = e.f32_input(t, name)
            shp = t.layout.shape
            sub = (1,) * (len(bdims) - (len(shp) - 2)) + tuple(shp[:-2])
            table = batch_map(bdims, sub) * int(shp[-2] * shp[-1])
            view = (0, max(int(shp[-1]), 1), table, arr)
        operands.append(view)
    (tra, lda, tab_a, arr_a), (trb, ldb, tab_b, arr_b) = operands
    code.lines.append(f"M = {code.int_param(M)}")
    off_a = e.row_base(tab_a, "bi")
    off_b = e.row_base(tab_b, "bi")
    # the batch is shared among the threads, each product one serial BLAS call
    share = batch > 1 and shares_gemm(e, batch * M * N * Kd)
    code.parallel = code.parallel or share
    code.lines.append(f"for bi in {'prange' if share else 'range'}({code.int_param(batch)}):")
    code.lines.append("    r0 = bi * M")
    code.lines.append("    r1 = r0 + M")
    code.lines.append(f"    K.gemm({tra}, {trb}, M, EC, {code.int_param(Kd)}, F32(1), {arr_a}, "
                      f"{off_a}, {code.int_param(lda)}, {arr_b}, {off_b}, "
                      f"{code.int_param(ldb)}, F32(0), {acc}, r0 * EC, EC)")
    code.lines += epi_fn


def shares_gemm(e: Emitter, macs: int) -> bool:
    """Whether a BLAS product of `macs` multiply-adds is split among the threads (BLAS is
    single-threaded while a program runs; see `eqsat_fuse.threads`)."""
    return e.backend.threads > 1 and macs >= PARALLEL_MIN_MACS


def parallel_rows(e: Emitter, lines: list[str]) -> list[str]:
    """An epilogue (`emit_epilogue`'s lines) with its row loop shared among the threads;
    marks the kernel parallel."""
    e.code.parallel = True
    head = lines[0]
    assert head.lstrip().startswith("for r in range(r0, r1):"), head
    return [head.replace("for r in range(", "for r in prange(", 1)] + lines[1:]


def blas_view(e: Emitter, t: Tensor, bdims: tuple) -> tuple | None:
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
    blay = broadcast_layout(blay, bdims)
    table = row_table(blay, len(bdims)) if bdims else np.array([lay.offset], np.int64)
    return trans, int(ld), table, e.storage_array(t)


@dataclass
class ConvGeometry:
    """A 2-D Conv's shapes: input N x C x H x W, weights M x Cg x kh x kw in G groups,
    pads (ph, pw at the start, pe_h, pe_w at the end), strides and dilations."""

    N: int
    C: int
    H: int
    W: int
    M: int
    Cg: int
    kh: int
    kw: int
    G: int
    ph: int
    pw: int
    pe_h: int
    pe_w: int
    sh: int
    sw: int
    dh: int
    dw: int

    @property
    def Mg(self) -> int:            # output channels per group
        return self.M // self.G

    @property
    def OH(self) -> int:
        return (self.H + self.ph + self.pe_h - ((self.kh - 1) * self.dh + 1)) // self.sh + 1

    @property
    def OW(self) -> int:
        return (self.W + self.pw + self.pe_w - ((self.kw - 1) * self.dw + 1)) // self.sw + 1

    @property
    def Hp(self) -> int:            # the padded input plane
        return self.H + self.ph + self.pe_h

    @property
    def Wp(self) -> int:
        return self.W + self.pw + self.pe_w

    @property
    def padded(self) -> bool:
        return any((self.ph, self.pw, self.pe_h, self.pe_w))


def gen_conv(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """Conv: the products into the accumulator (one of four paths), then the epilogue."""
    node = e.body[a]
    code = e.code
    if prologue:
        epilogue = sorted(prologue + epilogue)
    tx = e.anchor_tensor(a, 0)
    tw = e.anchor_tensor(a, 1)
    if tw.storage not in e.backend.constants:
        raise Unsupported("Conv with non-constant weights")
    if len(tx.layout.shape) != 4:
        raise Unsupported("Conv that is not 2-D")
    attrs = node.attrs
    wv = np.asarray(e.backend.constants[tw.storage], dtype=np.float32)
    g = ConvGeometry(*tx.layout.shape, *wv.shape, int(attrs["group"]), *attrs["pads"],
                     *attrs["strides"], *attrs["dilations"])
    out_shape = (g.N, g.M, g.OH, g.OW)
    bcast = tuple(e.kernel.info.shape) != out_shape
    P = g.OH * g.OW
    if bcast:
        acc = e.whole_acc(a, out_shape)
    else:
        acc, _ = e.acc_target(g.N * g.M * P)
    epi_nodes = _conv_bias(e, a, node, g.M, list(epilogue))
    depthwise = g.Cg == 1 and g.Mg == 1
    packed = PACKED_CONV and PG.AVAILABLE and not depthwise
    if bcast:
        lines_epi = []
    else:
        lines_epi, space = e.emit_epilogue(a, epi_nodes, out_shape, 2, "r * EC + c", "",
                                           acc, ("oc0", "oc1") if packed else ("0", "EC"))
        if space.cols != P:
            raise Unsupported("Conv epilogue columns")
    code.lines.append(f"EC = {code.int_param(P)}")
    X = e.f32_input(tx, "X")
    geo = [g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW]
    gexpr = ", ".join(code.int_param(v) for v in geo)
    code.lines.append(f"NB = {code.int_param(g.N)}")
    code.lines.append(f"CI = {code.int_param(g.C)}")
    code.lines.append(f"MO = {code.int_param(g.M)}")
    code.lines.append(f"HW = {code.int_param(g.H * g.W)}")
    if packed:
        return conv_packed(e, g, wv, X, acc, lines_epi)
    if depthwise:
        return conv_depthwise(e, g, wv, acc, lines_epi, gexpr)
    direct = g.kh == 1 and g.kw == 1 and g.sh == 1 and g.sw == 1 and not g.padded \
        and g.dh == 1 and g.dw == 1
    if not direct and g.sh == 1 and g.sw == 1 and g.Wp <= SHIFTED_MAX_WIDTH_RATIO * g.OW \
            and g.OH * g.OW >= SHIFTED_MIN_PIXELS:
        return conv_shifted(e, g, wv, X, acc, lines_epi)
    return conv_im2col(e, g, wv, acc, lines_epi, gexpr, direct)


def _conv_bias(e: Emitter, a: int, node: BodyNode, M: int, epi_nodes: list[int]) -> list[int]:
    """The Conv's bias as a synthetic Add the epilogue reads first; the epilogue's nodes."""
    b_arg = node.args[2] if len(node.args) > 2 else Operand("absent")
    if b_arg.kind == "absent":
        return epi_nodes
    bias = e.tensor(b_arg)
    key = ("convbias", e.kernel.name)
    lay = Layout(bias.layout.storage, bias.layout.offset, (1, M, 1, 1),
                 (0, bias.layout.strides[0] if bias.layout.shape else 0, 0, 0))
    e.backend.synthetic[key] = Tensor(bias.storage, bias.dtype, bias.stored, lay)
    idx = len(e.body)
    e.body.append(BodyNode("Add", [Operand("node", a), Operand("synthetic", key)], {}))
    e.dtypes.append("float32")
    for i in epi_nodes:
        e.body[i].args = [Operand("node", idx) if x.kind == "node" and x.ref == a
                          else x for x in e.body[i].args]
    return [idx] + epi_nodes


def conv_depthwise(e: Emitter, g: ConvGeometry, wv, acc: str, lines_epi: list[str],
                   gexpr: str, stage=None) -> None:
    """A depthwise Conv as direct loops (`K.depthwise2d`: channel-blocked vector sums) over
    blocks of channels, each block's epilogue right after it. With more than one thread and
    enough work the blocks are shared among the threads (`conv_parts`), each with its own
    padded-plane scratch. `stage(indent)`, when given, writes the lines that fill XB
    with the float32 planes of channels m0..m1 before each block (ConvInteger's x - zx), and
    the block reads them from there; else it reads X."""
    from .kernels import DW_LANES, depthwise_pad_size, dw_blocked
    code = e.code
    P = g.OH * g.OW
    pad_size = depthwise_pad_size(g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
                                  g.OH, g.OW)
    wname = code.array(("W", e.kernel.name), ("array", np.ascontiguousarray(wv.reshape(-1))))
    block = max(1, min(g.M, (1 << 15) // max(P, 1)))
    macs = g.N * g.M * P * g.kh * g.kw
    # whole vectors of channels where the kernel blocks them; as many blocks a thread
    unit = DW_LANES if dw_blocked(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.OW) else 1
    units = -(-g.M // unit)
    threads = conv_parts(e, macs, units, PARALLEL_MIN_DW_MACS)
    block = min(g.M, balanced_chunk(units, max(1, block // unit), threads) * unit)
    nblocks = -(-g.M // block)
    parts = conv_parts(e, macs, nblocks, PARALLEL_MIN_DW_MACS)
    pad = e.alloc(pad_size * parts)
    padn = code.int_param(pad_size)
    code.lines.append(f"PADS = WS[{pad}:{pad} + {code.int_param(pad_size * parts)}]")
    if stage is not None:
        planes = block * g.H * g.W
        xb = e.alloc(planes * parts)
        code.lines.append(f"XBS = WS[{xb}:{xb} + {code.int_param(planes * parts)}]")
    code.lines.append(f"BC = {code.int_param(block)}")
    code.lines.append("for n in range(NB):")
    if parts == 1:
        code.lines.append("    for m0 in range(0, MO, BC):")
        scratch, ind = "PADS", "        "
    else:
        code.parallel = True
        code.lines.append(f"    for p in prange({code.int_param(parts)}):")
        code.lines.append(f"        for bi in range(p * {code.int_param(-(-nblocks // parts))}, "
                          f"min((p + 1) * {code.int_param(-(-nblocks // parts))}, "
                          f"{code.int_param(nblocks)})):")
        code.lines.append("            m0 = bi * BC")
        scratch, ind = f"PADS[p * {padn}:(p + 1) * {padn}]", "            "
    code.lines.append(f"{ind}m1 = min(m0 + BC, MO)")
    source, offset = "X", "n * CI * HW"
    if stage is not None:
        planes = code.int_param(block * g.H * g.W)
        code.lines.append(f"{ind}XB = XBS[{'p * ' + planes if parts > 1 else '0'}:"
                          f"{'(p + 1) * ' if parts > 1 else ''}{planes}]")
        code.lines += stage(ind)
        source, offset = "XB", "-m0 * HW"          # channel m0 at XB[0]
    code.lines.append(f"{ind}K.depthwise2d_entry(({source}, {offset}, {wname}, {gexpr}, m0, "
                      f"m1, {scratch}, {acc}, (n * MO + m0) * EC))")
    code.lines.append(f"{ind}r0 = n * MO + m0")
    code.lines.append(f"{ind}r1 = n * MO + m1")
    code.lines += [ind + line for line in lines_epi]


def conv_parts(e: Emitter, macs: int, items: int, least: int = PARALLEL_MIN_CONV_MACS) -> int:
    """How many threads share a Conv's independent blocks (channel blocks, column chunks):
    one unless the program has more than one thread, the Conv at least `least`
    multiply-adds, and there are at least as many blocks as threads.
    One parallel region per Conv, so its fork and join are paid once."""
    threads = e.backend.threads
    if threads == 1 or macs < least or items < threads:
        return 1
    return threads


def balanced_chunk(units: int, most: int, threads: int) -> int:
    """Units per chunk (at most `most`) that split `units` into a multiple of `threads`
    chunks where there are enough units, as evenly as whole units allow: chunks that threads
    share then give each thread the same work."""
    chunks = -(-units // min(most, units))
    chunks = min(units, -(-chunks // threads) * threads)
    return -(-units // chunks)


def conv_im2col(e: Emitter, g: ConvGeometry, wv, acc: str, lines_epi: list[str], gexpr: str,
                direct: bool) -> None:
    """A Conv as one `np.dot` per group and row block over the im2col matrix of the input
    (`K.im2col`), or over the input planes themselves for a 1x1 stride-1 unpadded Conv."""
    code = e.code
    G, Cg, Mg, P = g.G, g.Cg, g.Mg, g.OH * g.OW
    K_ = Cg * g.kh * g.kw
    wname = code.array(("W", e.kernel.name),
                       ("array", np.ascontiguousarray(wv.reshape(G, Mg, K_))))
    block = gemm_block(Mg, P)
    code.lines.append(f"GR = {code.int_param(G)}")
    code.lines.append(f"CG = {code.int_param(Cg)}")
    code.lines.append(f"MG = {code.int_param(Mg)}")
    code.lines.append(f"KK = {code.int_param(K_)}")
    code.lines.append(f"BM = {code.int_param(block)}")
    if not direct:
        cols = e.alloc(K_ * P)
        code.lines.append(f"COLS = WS[{cols}:{cols} + KK * EC].reshape((KK, EC))")
    code.lines.append("for n in range(NB):")
    code.lines.append("    for g in range(GR):")
    if direct:
        code.lines.append("        xo = (n * CI + g * CG) * HW")
        code.lines.append("        COLS = X[xo:xo + CG * HW].reshape((CG, EC))")
    else:
        code.lines.append(f"        K.im2col(X, (n * CI + g * CG) * HW, CG, {gexpr}, "
                          f"COLS.reshape(-1))")
    code.lines.append("        for m0 in range(0, MG, BM):")
    code.lines.append("            m1 = min(m0 + BM, MG)")
    code.lines.append("            r0 = n * MO + g * MG + m0")
    code.lines.append("            r1 = n * MO + g * MG + m1")
    code.lines.append(f"            np.dot({wname}[g, m0:m1], COLS, "
                      f"{acc}[r0 * EC:r1 * EC].reshape((m1 - m0, EC)))")
    code.lines += ["            " + line for line in lines_epi]


@dataclass
class _ConvSource:
    """Where `conv_packed`'s GEMMs read the input: B[k, q] = SRC[table[k] + q], q a position
    on rows Wq wide (the input planes themselves for a direct 1x1, else the padded planes
    split by stride phase into XP, `phase_planes`)."""
    direct: bool
    table: np.ndarray           # offset of row (c, i, j) of the im2col matrix
    Wq: int
    col_bytes: int              # input bytes per output position (a float of each plane)
    planes: str = ""            # the line that fills XP, "" for a direct 1x1


def _conv_source(e: Emitter, g: ConvGeometry, X: str) -> _ConvSource:
    code = e.code
    pads = (g.ph, g.pw, g.pe_h, g.pe_w)
    if g.kh == 1 and g.kw == 1 and g.sh == 1 and g.sw == 1 and not any(pads):
        return _ConvSource(True, np.arange(g.Cg, dtype=np.int64) * (g.H * g.W), g.OW,
                           4 * g.Cg)
    taps = [((i * g.dh) % g.sh, (j * g.dw) % g.sw, (i * g.dh) // g.sh, (j * g.dw) // g.sw)
            for i in range(g.kh) for j in range(g.kw)]
    phases = sorted({(t[0], t[1]) for t in taps})
    NP = len(phases)
    Hq = g.OH + (g.kh - 1) * g.dh // g.sh
    Wq = g.OW + (g.kw - 1) * g.dw // g.sw
    pq = Hq * Wq
    table = np.array([(c * NP + phases.index((t[0], t[1]))) * pq + t[2] * Wq + t[3]
                      for c in range(g.Cg) for t in taps], dtype=np.int64)
    xp_size = g.Cg * NP * pq + Wq + 16
    xp = e.alloc(xp_size)
    code.lines.append(f"XP = WS[{xp}:{xp} + {code.int_param(xp_size)}]")
    ph_name = code.array(("PH", e.kernel.name),
                         ("array", np.array(phases, dtype=np.int64).reshape(-1)))
    geo = ", ".join(code.int_param(v) for v in (g.H, g.W, g.ph, g.pw, g.sh, g.sw))
    planes = (f"K.phase_planes({X}, xo, CG, {geo}, {ph_name}, {code.int_param(Hq)}, "
              f"{code.int_param(Wq)}, XP)")
    return _ConvSource(False, table, Wq, 4 * g.Cg * NP, planes)


def positions_pay(g: ConvGeometry, Wq: int) -> bool:
    """Whether `conv_positions` beats `conv_packed`'s rows: per output channel the rows path
    computes OH * Wq positions in whole panels of PG.NR, the positions path every position once
    for output channels in whole panels; its C goes through a transpose, which pays where the
    products are long (at least CONV_POSITIONS_MIN_K taps x channels). Measured on this
    machine (Zen 4), one thread: ResNet-18's 3 x 3 convolutions 1.05-1.4x faster this way on
    every plane from 56 x 56 to 7 x 7, a 1x1 of 512 channels on 7 x 7 1.25x; a 1x1 of 16 or 64
    channels on 112 x 112 or 56 x 56 1.1-1.3x slower."""
    if g.G != 1:
        return False
    if CONV_LAYOUT is not None:
        return CONV_LAYOUT == "positions"
    if g.Cg * g.kh * g.kw < CONV_POSITIONS_MIN_K:
        return False
    rows = g.M * (-(-(g.OH * Wq) // PG.NR) * PG.NR)
    positions = g.OH * g.OW * (-(-g.M // PG.NR) * PG.NR)
    return positions <= rows


def conv_packed(e: Emitter, g: ConvGeometry, wv, X: str, acc: str, lines_epi: list[str]) -> None:
    """A Conv as GEMMs of the packed weights (`packed_gemm.gemm_rows`) with B read through
    a table of row offsets: row (c, i, j) of the im2col matrix is a shifted view of one
    plane of the input, so no im2col matrix is built. A 1x1 stride-1 unpadded Conv reads
    the input planes themselves; any other pads and splits the input by stride phase once
    (`phase_planes`), and computes each output row Wq >= OW wide (tap offsets along a row
    are then plain shifts); `compact_cols` drops the extra columns. Output positions go in
    chunks of whole 32-column panels sized to keep their slice of the input in L2, and each
    chunk's epilogue runs while its rows are in cache. Small planes with many channels go
    the other way round (`conv_positions`, `positions_pay`)."""
    code = e.code
    G, Cg, Mg, OH, OW = g.G, g.Cg, g.Mg, g.OH, g.OW
    K_ = Cg * g.kh * g.kw
    src = _conv_source(e, g, X)
    if positions_pay(g, src.Wq):
        return conv_positions(e, g, wv, X, src, acc, lines_epi)
    Wq = src.Wq
    PQ = OH * Wq                                # positions computed, Wq per output row
    # chunk: whole panels, the input slice it reads within CONV_CHUNK_BYTES
    panels = max(1, min(CONV_CHUNK_PANELS, CONV_CHUNK_BYTES // (src.col_bytes * PG.NR)))
    CC = min(panels * PG.NR, -(-PQ // PG.NR) * PG.NR)
    # rows per block: the block's output chunk within CONV_BLOCK_BYTES, whole row tiles
    BM = max(PG.MR, (CONV_BLOCK_BYTES // (4 * CC)) // PG.MR * PG.MR)
    BM = min(BM, -(-Mg // PG.MR) * PG.MR)
    wg = np.asarray(wv, dtype=np.float32).reshape(G, Mg, K_)
    wp = np.concatenate([PG.pack_rows(wg[g]).reshape(-1) for g in range(G)])
    wname = code.array(("WP", e.kernel.name), ("array", wp))
    tname = code.array(("T", e.kernel.name), ("array", PG.row_table(src.table)))
    compact = Wq != OW
    macs = g.N * g.M * K_ * OH * OW
    nchunks = -(-PQ // CC)
    # threads share the column chunks (one parallel region), else a large product's row tiles
    parts = conv_parts(e, macs, nchunks)
    driver = "gemm_rows_parallel" if parts == 1 and e.backend.threads > 1 and \
        macs >= PARALLEL_MIN_MACS else "gemm_rows"
    if compact:
        opb = e.alloc(BM * CC * parts)
        code.lines.append(f"OPB = WS[{opb}:{opb} + {code.int_param(BM * CC * parts)}]")
    code.uses_packed_gemm = True
    for name, v in (("GR", G), ("CG", Cg), ("MG", Mg), ("KK", K_), ("PQ", PQ), ("CC", CC),
                    ("BM", BM), ("WQ", Wq), ("OW_", OW),
                    ("WG", -(-Mg // PG.MR) * PG.MR * K_)):
        code.lines.append(f"{name} = {code.int_param(v)}")
    code.lines.append("for n in range(NB):")
    code.lines.append("    for g in range(GR):")
    code.lines.append("        xo = (n * CI + g * CG) * HW")
    if src.direct:
        SRC, src_off = X, "xo + c0"
    else:
        code.lines.append("        " + src.planes)
        SRC, src_off = "XP", "c0"
    ind, opb_off = _chunk_loop(e, parts, nchunks)
    code.lines.append(f"{ind}c1 = min(c0 + CC, PQ)")
    if compact:
        code.lines.append(f"{ind}oc0 = (c0 // WQ) * OW_ + min(c0 % WQ, OW_)")
        code.lines.append(f"{ind}oc1 = (c1 // WQ) * OW_ + min(c1 % WQ, OW_)")
    else:
        code.lines.append(f"{ind}oc0 = c0")
        code.lines.append(f"{ind}oc1 = c1")
    code.lines.append(f"{ind}for m0 in range(0, MG, BM):")
    ind += "    "
    code.lines.append(f"{ind}m1 = min(m0 + BM, MG)")
    code.lines.append(f"{ind}r0 = n * MO + g * MG + m0")
    code.lines.append(f"{ind}r1 = n * MO + g * MG + m1")
    if compact:
        code.lines.append(f"{ind}PG.{driver}_entry(({wname}, g * WG + m0 * KK, m1 - m0, KK, "
                          f"{SRC}, {src_off}, {tname}, c1 - c0, OPB, {opb_off}, CC))")
        code.lines.append(f"{ind}K.compact_cols(OPB[{opb_off}:], m1 - m0, CC, c0, c1, WQ, OW_, "
                          f"{acc}, r0 * EC, EC)")
    else:
        code.lines.append(f"{ind}PG.{driver}_entry(({wname}, g * WG + m0 * KK, m1 - m0, KK, "
                          f"{SRC}, {src_off}, {tname}, c1 - c0, {acc}, r0 * EC + c0, EC))")
    code.lines += [ind + line for line in lines_epi]


def conv_positions(e: Emitter, g: ConvGeometry, wv, X: str, src: _ConvSource, acc: str,
                   lines_epi: list[str]) -> None:
    """A Conv (one group) as C[position, channel] = A @ W^T (`packed_gemm.gemm_gather`): A the
    im2col matrix, which the microkernel reads straight from the same planes and tap table as
    `conv_packed` (the positions of a tile consecutive along an output row), the weights packed
    into column panels of output channels (`packed_gemm.pack`, at compile time). Output rows go
    in blocks; each panel's C block goes back into channel rows (`transpose_into`) and its
    epilogue runs while they are in cache. No output column is padding, which on a 7 x 7 plane
    is more than a fifth of the rows path's work. With threads, each takes a range of output
    rows (one parallel region)."""
    code = e.code
    K_, M, OH, OW = g.Cg * g.kh * g.kw, g.M, g.OH, g.OW
    # output rows per block: its C block within CONV_POSITIONS_BLOCK positions
    RB = max(1, min(OH, CONV_POSITIONS_BLOCK // OW))
    parts = conv_parts(e, g.N * M * K_ * OH * OW, OH)
    ot = e.alloc(RB * OW * PG.NR * parts)
    code.lines.append(f"OT = WS[{ot}:{ot} + {code.int_param(RB * OW * PG.NR * parts)}]")
    wt = np.asarray(wv, dtype=np.float32).reshape(M, K_).T
    bname = code.array(("WB", e.kernel.name), ("array", e.backend.packed(wt)))
    tname = code.array(("T", e.kernel.name), ("array", src.table))
    code.uses_packed_gemm = True
    for name, v in (("CG", g.Cg), ("KK", K_), ("OH_", OH), ("OW_", OW), ("WQ", src.Wq), ("RB", RB),
                    ("OTP", RB * OW * PG.NR), ("NPAN", -(-M // PG.NR))):
        code.lines.append(f"{name} = {code.int_param(v)}")
    code.lines.append("for n in range(NB):")
    code.lines.append("    xo = n * CI * HW")
    if src.direct:
        SRC, src_off = X, "xo"
    else:
        code.lines.append("    " + src.planes)
        SRC, src_off = "XP", "0"
    if parts == 1:
        code.lines.append("    for q in range(1):")
    else:
        code.parallel = True
        code.lines.append(f"    for q in prange({code.int_param(parts)}):")
    ind = "        "
    code.lines += [f"{ind}lo = q * OH_ // {code.int_param(parts)}",
                   f"{ind}hi = (q + 1) * OH_ // {code.int_param(parts)}",
                   f"{ind}for l0 in range(lo, hi, RB):"]
    ind += "    "
    code.lines += [f"{ind}l1 = min(l0 + RB, hi)",
                   f"{ind}for pn in range(NPAN):"]
    ind += "    "
    code.lines += [f"{ind}m0 = pn * {PG.NR}",
                   f"{ind}m1 = min(m0 + {PG.NR}, MO)",
                   f"{ind}PG.gemm_gather_entry(({SRC}, {src_off}, {tname}, l0, l1, OW_, WQ, "
                   f"{bname}, pn, MO, KK, OT, q * OTP))",
                   f"{ind}K.transpose_into(OT, q * OTP, {PG.NR}, (l1 - l0) * OW_, m1 - m0, "
                   f"{acc}, (n * MO + m0) * EC + l0 * OW_, EC)",
                   f"{ind}r0 = n * MO + m0",
                   f"{ind}r1 = n * MO + m1",
                   f"{ind}oc0 = l0 * OW_",
                   f"{ind}oc1 = l1 * OW_"]
    code.lines += [ind + line for line in lines_epi]


def _chunk_loop(e: Emitter, parts: int, nchunks: int) -> tuple[str, str]:
    """The loop over `conv_packed`'s column chunks (c0: the chunk's first position), serial
    or shared among `parts` threads in ranges of chunks; returns the body's indent and where
    the part's output block starts in OPB."""
    code = e.code
    if parts == 1:
        code.lines.append("        for c0 in range(0, PQ, CC):")
        return "            ", "0"
    code.parallel = True
    per = code.int_param(-(-nchunks // parts))
    code.lines.append(f"        for p in prange({code.int_param(parts)}):")
    code.lines.append(f"            for ci in range(p * {per}, "
                      f"min((p + 1) * {per}, {code.int_param(nchunks)})):")
    code.lines.append("                c0 = ci * CC")
    return "                ", "p * BM * CC"


def conv_shifted(e: Emitter, g: ConvGeometry, wv, X: str, acc: str, lines_epi: list[str]) -> None:
    """A stride-1 Conv as kh*kw accumulating GEMMs over shifted views of the zero-padded
    input (no im2col matrix, which is kh*kw times the input): with the output computed
    on rows of the padded width Wp, tap (i, j) reads the padded planes from offset
    i*dh*Wp + j*dw as one (Cg x OH*Wp) matrix. The Wp - OW extra columns per row are
    dropped when the rows are compacted into the accumulator, then the epilogue runs."""
    code = e.code
    H, W, G, Cg, Mg, kh, kw = g.H, g.W, g.G, g.Cg, g.Mg, g.kh, g.kw
    ph, pw, dh, dw, OH, OW, Hp, Wp = g.ph, g.pw, g.dh, g.dw, g.OH, g.OW, g.Hp, g.Wp
    PP = OH * Wp
    plane = Hp * Wp
    wt = np.ascontiguousarray(wv.reshape(G, Mg, Cg, kh, kw).transpose(0, 3, 4, 1, 2))
    wname = code.array(("WT", e.kernel.name), ("array", wt.reshape(-1)))
    xp = e.alloc(Cg * plane + (kw - 1) * dw + 16)
    op = e.alloc(Mg * PP)
    code.lines.append(f"XP = WS[{xp}:{xp} + {code.int_param(Cg * plane + (kw - 1) * dw + 16)}]")
    code.lines.append(f"OP = WS[{op}:{op} + {code.int_param(Mg * PP)}]")
    geo = ", ".join(code.int_param(v) for v in (Cg, H, W, ph, pw, Hp, Wp))
    code.lines.append("for n in range(NB):")
    code.lines.append(f"    for g in range({code.int_param(G)}):")
    code.lines.append(f"        K.pad_planes(X, (n * CI + g * {code.int_param(Cg)}) * HW, "
                      f"{geo}, XP)")
    first = True
    for i in range(kh):
        for j in range(kw):
            w_off = code.int_param(((0 * kh + i) * kw + j) * Mg * Cg)
            step = code.int_param(kh * kw * Mg * Cg)
            code.lines.append(
                f"        K.gemm(0, 0, {code.int_param(Mg)}, {code.int_param(PP)}, "
                f"{code.int_param(Cg)}, F32(1), {wname}, g * {step} + {w_off}, "
                f"{code.int_param(Cg)}, XP, {code.int_param(i * dh * Wp + j * dw)}, "
                f"{code.int_param(plane)}, F32({0.0 if first else 1.0}), OP, 0, "
                f"{code.int_param(PP)})")
            first = False
    code.lines.append(f"        r0 = n * MO + g * {code.int_param(Mg)}")
    code.lines.append(f"        r1 = r0 + {code.int_param(Mg)}")
    code.lines.append(f"        K.compact_rows(OP, {code.int_param(Mg)}, {code.int_param(OH)}, "
                      f"{code.int_param(OW)}, {code.int_param(Wp)}, {acc}, r0 * EC)")
    code.lines += ["        " + line for line in lines_epi]
