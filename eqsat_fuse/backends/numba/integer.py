"""The integer contraction family: MatMulInteger of uint8 activations by constant int8 weights,
and ConvInteger of uint8 or int8 activations by constant int8 weights, on the VNNI int8 GEMM
(`int8_gemm.py`), exactly, with their elementwise epilogue.

The weights are packed once, here, with their column sums; the activations' zero point (one
for the tensor: a constant, or a value computed at run time as DynamicQuantizeLinear computes
it, or none) is compensated by them, sum_k (a - za) b = sum_k a b - za sum_k b. Weights with a
zero point of their own (other than zeros), activations of another dtype or layout, and CPUs
without VNNI raise `Unsupported`: such a kernel runs through the NumPy fallback (exact too).
"""

from __future__ import annotations

import numpy as np

from . import int8_gemm as I8
from .contraction import ConvGeometry, balanced_chunk, conv_depthwise, conv_parts
from .emitter import Emitter
from .spaces import Unsupported

# A depthwise ConvInteger of at most this many taps runs as the float32 depthwise kernel on
# x - zx: every product of two 8-bit differences (at most 255 * 255) and every sum of up to
# 258 of them is an integer below 2^24, which float32 holds exactly, in any order and with FMAs.
EXACT_FLOAT_TAPS = 258


def _zero_point(e: Emitter, a: int, slot: int) -> tuple[np.ndarray | None, str]:
    """The zero point in `slot` of anchor `a`: its constant value (None when absent or computed
    at run time), and the source of its one element ("0" when absent)."""
    arg = e.body[a].args[slot] if slot < len(e.body[a].args) else None
    if arg is None or arg.kind == "absent":
        return None, "0"
    t = e.tensor(arg)
    if t.storage in e.backend.constants and np.all(np.asarray(e.backend.constants[t.storage]) == 0):
        return np.zeros(1, np.int64), "0"            # zeros, one or one per row or column
    if t.layout.size != 1:
        raise Unsupported("a zero point per row or column")
    if t.storage in e.backend.constants:
        value = np.asarray(e.backend.constants[t.storage])
        return value, str(int(value.reshape(-1)[0]))
    return None, f"np.int64({e.load_expr(t, str(t.layout.offset))})"


def _require_zero_weight_point(e: Emitter, a: int) -> None:
    """The weights' zero point (slot 3) must be absent or zeros: the kernels compensate only
    the activations' one."""
    zw, source = _zero_point(e, a, 3)
    if source != "0" and (zw is None or np.any(zw != 0)):
        raise Unsupported("weights with a zero point")


def gen_matmul_integer(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """MatMulInteger: A [..., K] uint8 (batch folded into rows) times constant B [K, N] int8
    into int32 tiles, then the epilogue over the rows."""
    if not I8.AVAILABLE:
        raise Unsupported("an int8 GEMM needs AVX-512 VNNI")
    # nodes that do not read the product (a scale of scales) are computed with the epilogue:
    # the anchor reads tensors only (`anchor_tensor`), never one of them
    epilogue = sorted(prologue + epilogue)
    code = e.code
    ta, tb = e.anchor_tensor(a, 0), e.anchor_tensor(a, 1)
    if ta.dtype != "uint8" or tb.dtype != "int8":
        raise Unsupported(f"MatMulInteger of {ta.dtype} by {tb.dtype}")
    if tb.storage not in e.backend.constants or len(tb.layout.shape) != 2 or \
            len(ta.layout.shape) < 2 or not ta.layout.contiguous:
        raise Unsupported("MatMulInteger other than activations by constant weights")
    _, za = _zero_point(e, a, 2)
    _require_zero_weight_point(e, a)
    k, n = tb.layout.shape
    rows = int(np.prod(ta.layout.shape[:-1]))
    if tuple(e.kernel.info.shape) != (*ta.layout.shape[:-1], n):
        raise Unsupported("a broadcasting epilogue")
    b = np.asarray(e.backend.constants[tb.storage]).reshape(k, n)
    ldc = I8.c_cols(n)
    colsum = np.zeros(ldc, np.int32)
    colsum[:n] = b.astype(np.int64).sum(axis=0)
    bp = code.array(("I8B", e.kernel.name), ("array", I8.pack_b(b)))
    sums = code.array(("I8S", e.kernel.name), ("array", colsum))
    block = min(I8.c_rows(rows), max(I8.MR, (1 << 21) // (4 * ldc) // I8.MR * I8.MR))
    # threads share the blocks of rows, each packing its own A
    parts = conv_parts(e, rows * k * n, -(-rows // I8.MR))
    if parts > 1:
        block = min(block, I8.c_rows(-(-rows // parts)))
    nblocks = -(-rows // block)
    parts = min(parts, nblocks)
    pack_words = -(-I8.a_workspace(block, k) // 4)
    ap = e.alloc(pack_words * parts)
    acc = e.alloc(I8.c_rows(rows) * ldc)
    arr = e.storage_array(ta)
    p = code.int_param
    code.lines += [
        f"EC = {p(n)}",
        f"LDC = {p(ldc)}",
        f"A8 = {arr}[{p(ta.layout.offset)}:{p(ta.layout.offset)} + {p(ta.layout.size)}]",
        f"AP = WS[{ap}:{ap} + {p(pack_words * parts)}].view(np.uint8)",
        f"C32 = WS[{acc}:{acc} + {p(I8.c_rows(rows) * ldc)}].view(np.int32)"]
    if parts == 1:
        code.lines += [f"for r0 in range(0, {p(rows)}, {p(block)}):", "    th = 0"]
        indent = "    "
    else:
        code.parallel = True
        per = p(-(-nblocks // parts))
        code.lines += [f"for th in prange({p(parts)}):",
                       f"    for bi in range(th * {per}, min((th + 1) * {per}, {p(nblocks)})):",
                       f"        r0 = bi * {p(block)}"]
        indent = "        "
    code.lines += [
        f"{indent}r1 = min(r0 + {p(block)}, {p(rows)})",
        f"{indent}I8.gemm_entry((A8, 0, {p(k)}, r0, r1, {bp}, EC, {p(k)}, C32, LDC, "
        f"AP[th * {p(4 * pack_words)}:(th + 1) * {p(4 * pack_words)}], {sums}, {za}))"]
    code.uses_int8_gemm = True
    lines, space = e.emit_epilogue(a, epilogue, (*ta.layout.shape[:-1], n), 1, "r * LDC + c",
                                   indent, "C32")
    if space.cols != n:
        raise Unsupported("epilogue column blocking")
    code.lines += lines


def gen_conv_integer(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """ConvInteger, 2-D, of one image at a time: with one group as a GEMM of the weights by
    the activations (`_conv_columns`) in chunks of output positions, each chunk's epilogue
    right after it; depthwise as the exact float32 depthwise kernel; other groups by direct
    loops (`I8.conv_direct`). int8 activations are read as uint8 + 128, their zero point moved
    with them; padding contributes the zero point, hence nothing."""
    if not I8.AVAILABLE:
        raise Unsupported("an int8 GEMM needs AVX-512 VNNI")
    epilogue = sorted(prologue + epilogue)
    code = e.code
    node = e.body[a]
    tx, tw = e.anchor_tensor(a, 0), e.anchor_tensor(a, 1)
    if tx.dtype not in ("uint8", "int8") or tw.dtype != "int8":
        raise Unsupported(f"ConvInteger of {tx.dtype} by {tw.dtype}")
    if tw.storage not in e.backend.constants or len(tx.layout.shape) != 4 or \
            not tx.layout.contiguous:
        raise Unsupported("ConvInteger other than a 2-D one by constant weights")
    zx, zx_source = _zero_point(e, a, 2)
    _require_zero_weight_point(e, a)
    flip = tx.dtype == "int8"
    if flip:                            # x - zx = (x + 128) - (zx + 128)
        zx_source = f"({zx_source} + 128)"
    w = np.asarray(e.backend.constants[tw.storage])
    N, C, H, W = tx.layout.shape
    M, _, kh, kw = w.shape
    G = int(node.attrs["group"])
    ph, pw, pe_h, pe_w = node.attrs["pads"]
    sh, sw = node.attrs["strides"]
    dh, dw = node.attrs["dilations"]
    OH, OW = e.kernel.info.shape[2:] if len(e.kernel.info.shape) == 4 else (0, 0)
    if tuple(e.kernel.info.shape) != (N, M, OH, OW):
        raise Unsupported("a broadcasting epilogue")
    P = OH * OW
    p = code.int_param
    arr = e.storage_array(tx)
    code.lines += [f"EC = {p(P)}",
                   f"X8 = {arr}[{p(tx.layout.offset)}:{p(tx.layout.offset)} + "
                   f"{p(tx.layout.size)}]" + (".view(np.uint8)" if flip else "")]
    geo = ", ".join(p(v) for v in (C, H, W))
    taps = ", ".join(p(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw))
    if G == 1:
        index, indent, cols, acc_name = _conv_columns(e, w, (N, C, H, W), (OH, OW),
                                                      node.attrs, zx_source, flip)
    elif G == C == M and kh * kw <= EXACT_FLOAT_TAPS:
        return _conv_depthwise_exact(e, a, epilogue, w, (N, C, H, W), (ph, pw, pe_h, pe_w),
                                     (sh, sw, dh, dw), zx_source, flip)
    else:
        wname = code.array(("I8W", e.kernel.name), ("array", np.ascontiguousarray(w.reshape(-1))))
        acc = e.alloc(M * P)
        code.lines += [
            f"C32 = WS[{acc}:{acc} + {p(M * P)}].view(np.int32)",
            f"for n in range({p(N)}):",
            f"    I8.conv_direct_entry((X8, n * {p(C * H * W)}, {geo}, {p(M)}, {p(G)}, {taps}, "
            f"{p(OH)}, {p(OW)}, {wname}, {zx_source}, {int(flip)}, C32))",
            f"    r0 = n * {p(M)}",
            f"    r1 = r0 + {p(M)}"]
        index, indent, cols, acc_name = "(r - r0) * EC + c", "    ", ("0", "EC"), "C32"
    code.uses_int8_gemm = True
    lines, space = e.emit_epilogue(a, epilogue, (N, M, OH, OW), 2, index, indent, acc_name, cols)
    if space.cols != P:
        raise Unsupported("epilogue column blocking")
    code.lines += lines


def _conv_depthwise_exact(e: Emitter, a: int, epilogue: list[int], w: np.ndarray, shape,
                          pads, steps, zx_source: str, flip: bool) -> None:
    """A depthwise ConvInteger as the float32 depthwise kernel (`contraction.conv_depthwise`)
    on the differences x - zx, exactly (`EXACT_FLOAT_TAPS`); the epilogue reads its sums."""
    code, p = e.code, e.code.int_param
    N, C, H, W = shape
    M, _, kh, kw = w.shape
    g = ConvGeometry(N, C, H, W, M, 1, kh, kw, C, *pads, *steps)
    P = g.OH * g.OW
    acc, _ = e.acc_target(N * M * P)
    lines_epi, space = e.emit_epilogue(a, epilogue, (N, M, g.OH, g.OW), 2, "r * EC + c", "",
                                       acc)
    if space.cols != P:
        raise Unsupported("epilogue column blocking")
    top = "np.uint8(0x80)" if flip else "np.uint8(0)"
    code.lines += [f"EC = {p(P)}", f"ZX = np.int32({zx_source})",
                   f"NB = {p(N)}", f"CI = {p(C)}", f"MO = {p(M)}", f"HW = {p(H * W)}"]
    geo = [g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW]

    def stage(ind: str) -> list[str]:
        # each block's planes as x - zx right before its taps, while they are in cache (a
        # pass over the whole tensor first: MobileNetV2's 96-channel stride-2 one 557 -> 478
        # us at one thread)
        return [f"{ind}for i in range(U((m1 - m0) * HW)):",
                f"{ind}    XB[i] = np.float32(np.int32(X8[U((n * CI + m0) * HW) + i] ^ {top})"
                f" - ZX)"]

    conv_depthwise(e, g, w.astype(np.float32), acc, lines_epi, ", ".join(p(v) for v in geo),
                   stage)


def _conv_columns(e: Emitter, w: np.ndarray, shape, out_hw, attrs: dict, zx_source: str,
                  flip: bool) -> tuple[str, str, tuple[str, str], str]:
    """The lines of a one-group ConvInteger (`I8.conv_columns`: signed weights by the unsigned
    activations, read from the image's padded quad planes, `I8.quad_planes`), its chunks of
    positions shared among the threads; returns the epilogue's accumulator index, indent,
    columns and array. A stride-1 Conv's chunks are whole output rows, read from the image
    with no packing; other strides pack each chunk's panels."""
    code = e.code
    p = code.int_param
    N, C, H, W = shape
    OH, OW = out_hw
    M, _, kh, kw = w.shape
    P = OH * OW
    ph, pw, pe_h, pe_w = attrs["pads"]
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    geo = ", ".join(p(v) for v in (C, H, W))
    ap, rowsum = I8.conv_a(w)
    aname = code.array(("I8A", e.kernel.name), ("array", ap))
    sums = code.array(("I8S", e.kernel.name), ("array", rowsum))
    Hp, Wp = H + ph + pe_h, W + pw + pe_w
    oname = code.array(("I8O", e.kernel.name),
                       ("array", I8.conv_offsets(C, kh, kw, Hp, Wp, dh, dw)))
    k4, rows = I8.quad_words(C) * kh * kw, -(-M // I8.MR) * I8.MR
    tname = code.array(("I8T", e.kernel.name), ("array", np.arange(k4, dtype=np.int64) * I8.NR))
    # chunks of C about 512 KiB (and of packed B about 256 KiB); shared among the threads, a
    # multiple of their number, so that each thread has the same work
    threads = conv_parts(e, N * M * w[0].size * P, -(-P // I8.NR))
    if sh == sw == 1:               # whole output rows
        nrows = balanced_chunk(OH, max(1, (1 << 17) // rows // Wp), threads)
        block, ldv, bsz = nrows * OW, I8.c_cols(nrows * Wp), 0
        ldc = ldv if Wp == OW else block    # C read where it was computed, or rows moved
    else:                           # whole panels of positions
        most = max(1, min((1 << 18) // (4 * k4 * I8.NR), (1 << 19) // (4 * rows * I8.NR)))
        block = balanced_chunk(-(-P // I8.NR), most, threads) * I8.NR
        ldc = ldv = block
        bsz = k4 * block
    nchunks = -(-P // block)
    # threads share an image's chunks of positions, each with its own B and C workspace
    parts = conv_parts(e, N * M * w[0].size * P, nchunks)
    csz = rows * ldv
    acc = e.alloc(csz * parts)
    xwords = I8.quad_image_words(C, Hp, Wp)
    xq = e.alloc(xwords)
    code.lines += [f"C32 = WS[{acc}:{acc} + {p(csz * parts)}].view(np.int32)",
                   f"XQ = WS[{xq}:{xq} + {p(xwords)}].view(np.int32)"]
    if bsz:
        bws = e.alloc(bsz * parts)
        code.lines.append(f"BW = WS[{bws}:{bws} + {p(bsz * parts)}].view(np.uint8)")
    code.lines += [
        f"for n in range({p(N)}):",
        f"    I8.quad_planes_entry((X8, n * {p(C * H * W)}, {geo}, {p(ph)}, {p(pw)}, "
        f"{p(Hp)}, {p(Wp)}, {zx_source}, {int(flip)}, XQ))"]
    if parts == 1:
        code.lines += [f"    for p0 in range(0, EC, {p(block)}):",
                       "        th = 0"]
    else:
        code.parallel = True
        per = p(-(-nchunks // parts))
        code.lines += [f"    for th in prange({p(parts)}):",
                       f"        for ci in range(th * {per}, min((th + 1) * {per}, "
                       f"{p(nchunks)})):",
                       f"            p0 = ci * {p(block)}"]
    indent = "        " if parts == 1 else "            "
    bw = f"BW[th * {p(4 * bsz)}:(th + 1) * {p(4 * bsz)}]" if bsz else "XQ.view(np.uint8)[:0]"
    code.lines += [indent + line for line in (
        f"p1 = min(p0 + {p(block)}, EC)",
        f"CW = C32[th * {p(csz)}:(th + 1) * {p(csz)}]",
        f"I8.conv_columns_entry((XQ, {oname}, {p(k4)}, {p(Wp)}, {p(sh)}, {p(sw)}, "
        f"{p(OW)}, p0, p1, {aname}, {p(M)}, {sums}, {zx_source}, CW, {p(ldc)}, "
        f"{bw}, {tname}, {p(ldv)}))",
        f"r0 = n * {p(M)}",
        f"r1 = r0 + {p(M)}")]
    index = f"(r - r0) * {p(ldc)} + (c - p0)"
    cols, acc_name = ("p0", "p1"), "CW"
    return index, indent, cols, acc_name
