"""Hand-written Numba building blocks that generated kernels call: im2col, depthwise
convolution, pooling, float16 widening (float16 inputs of these are widened to float32 first).

They take flat (1-D, contiguous) arrays plus integer geometry, so one compiled version serves
every kernel of the same dtypes; the generated kernel applies its fused epilogue on the rows
each block produces while they are still in cache. Loops are serial: the backend calls them
next to BLAS, where OpenMP threads would fight OpenBLAS's (shared/NOTES-kernels.md).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...numerics import RUNTIME_FASTMATH
from .approx import exp_f32, f16_to_f32
from .calls import F32_ARRAY, I64, runtime_entry
from .vectors import (LANES, lane_max, lane_min, lane_sum, lane_sumsq, tap_max1, tap_max2,
                      tap_sums1, tap_sums4, transpose16)

U = np.uint64        # unsigned indices: Numba adds no negative-index wraparound, loops vectorize
# The hand-written runtime is compiled once for both numerics modes
# (`eqsat_fuse.numerics.RUNTIME_FASTMATH`): FMAs in its sums of products, as onnxruntime's
# MLAS kernels; no `arcp` (AveragePool's division by the window count stays a division) and no
# `nsz` (signed zeros survive the pools and products).
_OPTS = dict(cache=True, error_model="numpy", fastmath=set(RUNTIME_FASTMATH))


def _host_has_avx512() -> bool:
    try:
        import llvmlite.binding as llvm
        return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")
    except Exception:           # pragma: no cover - a host llvmlite cannot describe
        return False


WIDE_VECTORS = _host_has_avx512()


@intrinsic
def wide_vectors(typingctx):
    """Let LLVM vectorize the calling function with 512-bit vectors.

    On AVX-512 CPUs LLVM prefers 256-bit vectors by default (`prefer-vector-width`); for the
    polynomial exp/tanh/erf loops 512-bit vectors are 1.3-1.9x faster on this machine (see
    shared/NOTES-kernels.md). The function attributes are set on the function being compiled;
    CPUs without AVX-512 ignore them.
    """
    sig = types.none()

    def codegen(context, builder, signature, args):
        attrs = builder.function.attributes
        # llvmlite only accepts its list of enum attributes: add the string ones directly
        set.add(attrs, '"prefer-vector-width"="512"')
        set.add(attrs, '"min-legal-vector-width"="512"')
        return context.get_dummy_value()

    return sig, codegen


# ---- streaming (non-temporal) stores -----------------------------------------------------------
# A kernel writing a large output with ordinary stores first reads every output line into the
# cache (read for ownership): 3 bytes of traffic per 2 a memory copy moves. Large outputs are
# computed into a tile in L1 and written out with non-temporal 64-byte stores instead.

STREAM_TILE = 4096          # float32 elements of the L1 tile


@intrinsic
def _stream16(typingctx, dst, doff, src, soff):
    """dst[doff:doff+16] = src[soff:soff+16] as one non-temporal 64-byte store (dst aligned)."""
    sig = types.none(dst, doff, src, soff)

    def codegen(context, builder, signature, args):
        from numba.np.arrayobj import make_array
        dstty, _, srcty, _ = signature.args
        d = make_array(dstty)(context, builder, args[0])
        s_ = make_array(srcty)(context, builder, args[2])
        vty = ir.VectorType(ir.FloatType(), 16)
        sp = builder.bitcast(builder.gep(s_.data, [args[3]]), vty.as_pointer())
        value = builder.load(sp, align=4)
        dp = builder.bitcast(builder.gep(d.data, [args[1]]), vty.as_pointer())
        store = builder.store(value, dp, align=64)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def sfence(typingctx):
    """Order the non-temporal stores before whatever reads the output next."""
    sig = types.none()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                            "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@njit(**_OPTS)
def stream_out(out, start, tile, n):
    """out[start:start+n] = tile[:n], the 64-byte-aligned middle with non-temporal stores."""
    wide_vectors()
    addr = out.ctypes.data + 4 * start
    head = n
    if addr % 4 == 0:
        head = min(((64 - addr % 64) % 64) // 4, n)
    for i in range(head):
        out[U(start + i)] = tile[U(i)]
    i = head
    while i + 16 <= n:
        _stream16(out, U(start + i), tile, U(i))
        i += 16
    for j in range(i, n):
        out[U(start + j)] = tile[U(j)]


# ---- BLAS sgemm with strides, transposes and beta (SciPy's OpenBLAS, what np.dot uses) ----------

def _register_sgemm() -> None:
    """Make SciPy's Fortran sgemm callable by the symbol name `eqsat_fuse_sgemm`: compiled code
    refers to the name, which LLVM resolves in each process, so kernels that call it can be
    cached on disk (a ctypes pointer would be a per-process constant, which Numba refuses to
    cache)."""
    import llvmlite.binding as llvm
    from numba.extending import get_cython_function_address
    llvm.add_symbol("eqsat_fuse_sgemm",
                    get_cython_function_address("scipy.linalg.cython_blas", "sgemm"))


_register_sgemm()


@intrinsic
def _sgemm(typingctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Call sgemm with 13 pointer arguments (given as integer addresses)."""
    sig = types.none(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def codegen(context, builder, signature, args):
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [ptr] * 13)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "eqsat_fuse_sgemm")
        builder.call(fn, [builder.inttoptr(v, ptr) for v in args])
        return context.get_dummy_value()

    return sig, codegen


@njit(**_OPTS)
def gemm(trans_a, trans_b, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    """Row-major C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, on flat float32 arrays.

    A starts at a[a_off] with leading dimension lda (elements between rows of A as stored;
    op(A) = A.T when trans_a), likewise B and C: a strided or transposed operand needs no copy,
    and beta=1 accumulates. Fortran BLAS is column-major, so this computes C.T = op(B).T op(A).T.
    """
    ints = np.empty(6, np.int32)
    ints[0] = n
    ints[1] = m
    ints[2] = k
    ints[3] = ldb
    ints[4] = lda
    ints[5] = ldc
    floats = np.empty(2, np.float32)
    floats[0] = alpha
    floats[1] = beta
    chars = np.empty(2, np.uint8)
    chars[0] = 84 if trans_b else 78          # 'T' / 'N'
    chars[1] = 84 if trans_a else 78
    pi = ints.ctypes.data
    pf = floats.ctypes.data
    pc = chars.ctypes.data
    _sgemm(pc, pc + 1, pi, pi + 4, pi + 8, pf, b.ctypes.data + 4 * b_off, pi + 12,
           a.ctypes.data + 4 * a_off, pi + 16, pf + 4, c.ctypes.data + 4 * c_off, pi + 20)


@njit(parallel=True, **_OPTS)
def gemm_parallel(trans_a, trans_b, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, beta, c,
                  c_off, ldc, parts):
    """`gemm` split into `parts` blocks, one serial BLAS call per thread (BLAS itself runs
    single-threaded while a program runs: its own workers would fight Numba's for the cores,
    see `eqsat_fuse.threads`). Columns of C are split when C is at least as wide as it is tall
    (each thread then reads its share of B, the weights), rows otherwise; blocks are whole
    multiples of 16 columns or 8 rows."""
    if n >= m:
        step = ((n + parts - 1) // parts + 15) // 16 * 16
        for p in prange(parts):
            j0 = min(p * step, n)
            j1 = min(j0 + step, n)
            if j1 > j0:
                gemm(trans_a, trans_b, m, j1 - j0, k, alpha, a, a_off, lda, b,
                     b_off + (j0 * ldb if trans_b else j0), ldb, beta, c, c_off + j0, ldc)
    else:
        step = ((m + parts - 1) // parts + 7) // 8 * 8
        for p in prange(parts):
            i0 = min(p * step, m)
            i1 = min(i0 + step, m)
            if i1 > i0:
                gemm(trans_a, trans_b, i1 - i0, n, k, alpha, a,
                     a_off + (i0 if trans_a else i0 * lda), lda, b, b_off, ldb, beta, c,
                     c_off + i0 * ldc, ldc)


@njit(**_OPTS)
def pad_planes(x, xoff, C, H, W, ph, pw, Hp, Wp, xp):
    """xp[c, h, w] (Hp x Wp planes, then a zero tail) = x[c, h - ph, w - pw], 0 outside."""
    wide_vectors()
    for i in range(xp.size):
        xp[U(i)] = np.float32(0)
    for c in range(C):
        for h in range(H):
            d = c * Hp * Wp + (h + ph) * Wp + pw
            s = xoff + (c * H + h) * W
            for q in range(W):
                xp[U(d + q)] = x[U(s + q)]


@njit(**_OPTS)
def compact_rows(src, M, OH, OW, Wp, dst, doff):
    """dst[doff + (m, oh, ow)] = src[m, oh, ow] for rows of Wp in src, of OW in dst."""
    wide_vectors()
    for m in range(M):
        for h in range(OH):
            s = (m * OH + h) * Wp
            d = doff + (m * OH + h) * OW
            for q in range(OW):
                dst[U(d + q)] = src[U(s + q)]


@njit(inline="always", **_OPTS)
def _gather_row(dst, d, src, s, lo, hi, step):
    """dst[d + q] = src[s + q * step] for q in [lo, hi): a contiguous copy (the loop LLVM
    vectorizes) when step is 1, strided otherwise."""
    if step == 1:
        for q in range(lo, hi):
            dst[U(d + q)] = src[U(s + q)]
    else:
        for q in range(lo, hi):
            dst[U(d + q)] = src[U(s + q * step)]


@njit(**_OPTS)
def phase_planes(x, xoff, C, H, W, ph, pw, sh, sw, phases, Hq, Wq, xp):
    """The zero-padded input split by stride phase, for convolutions as GEMMs on row offsets:
    plane (c, f) (Hq x Wq, in the order of the (a, b) pairs in `phases`) holds
    padded[c, r * sh + a, s * sw + b], where padded[c, h, w] = x[c, h - ph, w - pw] (0
    outside). Tap (i, j) of output (oh, ow) then reads plane phase (i dh % sh, j dw % sw) at row
    oh + i dh // sh, column ow + j dw // sw: a shift of one plane. A tail of Wq + 16 zeros
    follows the planes (the wrapped columns of the last rows read it)."""
    wide_vectors()
    NP = phases.shape[0] // 2
    pq = Hq * Wq
    for i in range(C * NP * pq, xp.size):
        xp[U(i)] = np.float32(0)
    for c in range(C):
        for f in range(NP):
            a = phases[2 * f]
            b = phases[2 * f + 1]
            # the plane columns s whose input column s * sw + b - pw lies in [0, W)
            lo = (pw - b + sw - 1) // sw if pw > b else 0
            t = W - 1 + pw - b
            hi = min(Wq, t // sw + 1) if t >= 0 else 0
            lo = min(lo, hi)
            base = (c * NP + f) * pq
            for r in range(Hq):
                ih = r * sh + a - ph
                row = base + r * Wq
                if ih < 0 or ih >= H:
                    for q in range(Wq):
                        xp[U(row + q)] = np.float32(0)
                    continue
                for q in range(lo):
                    xp[U(row + q)] = np.float32(0)
                _gather_row(xp, row, x, xoff + (c * H + ih) * W + b - pw, lo, hi, sw)
                for q in range(hi, Wq):
                    xp[U(row + q)] = np.float32(0)


@njit(**_OPTS)
def compact_cols(src, rows, lds, c0, c1, Wq, OW, dst, doff, ldd):
    """Positions [c0, c1) of rows computed Wq wide (src[r * lds + p - c0]) into rows OW wide:
    dst[doff + r * ldd + oh * OW + ow] for p = oh * Wq + ow, ow < OW (the others are dropped)."""
    wide_vectors()
    for r in range(rows):
        s = r * lds - c0
        d = doff + r * ldd
        p = c0
        while p < c1:
            oh = p // Wq
            start = oh * Wq
            end = min(c1, start + OW)
            o = d + oh * OW - start
            for q in range(p, end):
                dst[U(o + q)] = src[U(s + q)]
            p = start + Wq


@njit(**_OPTS)
def transpose_into(src, s_off, lds, rows, cols, dst, d_off, ldd):
    """dst[d_off + c * ldd + r] = src[s_off + r * lds + c] for r < rows, c < cols, in 16 x 16
    blocks (`transpose16`): a positions-major GEMM result into channel rows."""
    for r0 in range(0, rows, LANES):
        for c0 in range(0, cols, LANES):
            transpose16(dst.ctypes.data + 4 * (d_off + c0 * ldd + r0), ldd,
                        src.ctypes.data + 4 * (s_off + r0 * lds + c0), lds,
                        min(LANES, rows - r0), min(LANES, cols - c0))


@njit(**_OPTS)
def im2col(x, xoff, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, cols):
    """cols[(c, i, j), (oh, ow)] = x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside)."""
    wide_vectors()
    P = OH * OW
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                row = ((c * kh + i) * kw + j) * P
                for oh in range(OH):
                    ih = oh * sh - ph + i * dh
                    base = row + oh * OW
                    if ih < 0 or ih >= H:
                        for ow in range(OW):
                            cols[U(base + ow)] = 0.0
                        continue
                    src = xoff + (c * H + ih) * W
                    lo = 0
                    # first ow whose input column is >= 0, last one < W
                    while lo < OW and lo * sw - pw + j * dw < 0:
                        cols[U(base + lo)] = 0.0
                        lo += 1
                    hi = OW
                    while hi > lo and (hi - 1) * sw - pw + j * dw >= W:
                        hi -= 1
                        cols[U(base + hi)] = 0.0
                    _gather_row(cols, base, x, src - pw + j * dw, lo, hi, sw)


@njit(**_OPTS)
def widen_f16(x, xoff, n, out):
    """out[:n] = float32(x[xoff:xoff+n]) for float16 held as uint16."""
    for i in range(n):
        out[i] = f16_to_f32(x[U(xoff + i)])


@njit(**_OPTS)
def _dw3x3(pad, b0, b1, b2, rs, os, w, c, OH, OW, acc, dst):
    """One channel of a 3x3 depthwise Conv with the nine taps summed in registers and each
    output written once: tap (i, j) of output (oh, ow) reads pad[b_j + oh * os + i * rs + ow]
    (b_j: where tap column j starts), into acc[dst + oh * OW + ow]. The sum starts from +0,
    as an accumulator does (onnxruntime's too): nine products that are all -0 (a negative
    weight times a zero) sum to +0, not -0."""
    zero = np.float32(0)
    w00 = w[U(c * 9)]
    w01 = w[U(c * 9 + 1)]
    w02 = w[U(c * 9 + 2)]
    w10 = w[U(c * 9 + 3)]
    w11 = w[U(c * 9 + 4)]
    w12 = w[U(c * 9 + 5)]
    w20 = w[U(c * 9 + 6)]
    w21 = w[U(c * 9 + 7)]
    w22 = w[U(c * 9 + 8)]
    for oh in range(OH):
        q0 = b0 + oh * os
        q1 = b1 + oh * os
        q2 = b2 + oh * os
        o = dst + oh * OW
        for ow in range(OW):
            acc[U(o + ow)] = (zero + w00 * pad[U(q0 + ow)] + w01 * pad[U(q1 + ow)]
                              + w02 * pad[U(q2 + ow)]
                              + w10 * pad[U(q0 + rs + ow)] + w11 * pad[U(q1 + rs + ow)]
                              + w12 * pad[U(q2 + rs + ow)]
                              + w20 * pad[U(q0 + 2 * rs + ow)] + w21 * pad[U(q1 + 2 * rs + ow)]
                              + w22 * pad[U(q2 + 2 * rs + ow)])


@njit(**_OPTS)
def depthwise2d(x, xoff, w, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, c0, c1, pad, acc,
                accoff):
    """acc[c, oh, ow] = sum_ij w[c, i, j] x[c, ...] for channels c0..c1 (one input channel each).

    Channel-blocked (`_dw_blocked`) but for the 3 x 3 stride-1 convolutions of wide planes,
    which run one channel at a time: `pad` is scratch for one zero-padded plane (zeroed once:
    each channel overwrites only its interior), and `_dw3x3` sums the nine taps of a row in
    registers, on rows of the padded width, so the inner loops have no bounds checks.
    """
    wide_vectors()
    if dw_blocked(kh, kw, sh, sw, dh, dw, OW):
        _dw_blocked(x, xoff, w, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, c0, c1, pad, acc,
                    accoff)
        return
    HP, WP = OH + 2, OW + 2                     # the padded rows and columns the taps read
    ia, ib = max(0, -ph), min(H, HP - ph)
    ja, jb = max(0, -pw), min(W, WP - pw)
    for k in range(HP * WP):
        pad[U(k)] = np.float32(0)
    for c in range(c0, c1):
        src = xoff + c * H * W
        for ih in range(ia, ib):
            for iw in range(ja, jb):
                pad[U((ih + ph) * WP + iw + pw)] = x[U(src + ih * W + iw)]
        _dw3x3(pad, 0, 1, 2, WP, WP, w, c, OH, OW, acc, accoff + (c - c0) * OH * OW)


DW_LANES = LANES      # channels per block of `_dw_blocked`: one 512-bit vector of float32
DW_PLANE_MIN = 29     # output width from which a 3 x 3 stride-1 convolution runs per channel


@njit(**_OPTS)
def dw_blocked(kh, kw, sh, sw, dh, dw, OW):
    """Whether `depthwise2d` runs channel-blocked: all but the undilated 3 x 3 stride-1
    convolutions at least `DW_PLANE_MIN` wide. Measured per call on this machine (one
    thread, per-channel -> blocked): 3 x 3 stride 1 at 112 x 112 162 -> 266 us and 56 x 56
    189 -> 253, even at 28 x 28 (79 -> 80), faster at 14 x 14 (79 -> 65) and 7 x 7 (94 ->
    55); stride 2 at 112 x 112 640 -> 296; 5 x 5 at 7 x 7 318 -> 97; ConvNeXt's 7 x 7 at
    56 x 56 1009 -> 629 and 7 x 7 410 -> 109."""
    three = kh == 3 and kw == 3 and dh == 1 and dw == 1
    return not (three and sh == 1 and sw == 1 and OW >= DW_PLANE_MIN)


@njit(**_OPTS)
def _dw_blocked(x, xoff, w, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, c0, c1, scratch, acc,
                accoff):
    """`depthwise2d` on 16 channels at a time, the lanes of one vector, as onnxruntime's NCHWc
    kernels do. A block's zero-padded input is laid out [row][column][16 channels] in
    `scratch`, so tap (i, j) of output (oh, ow) is one vector load at a fixed offset whatever
    the stride, kernel size or plane width; the sums of four outputs stay in registers over
    all taps (`vectors.tap_sums4`), summed in the same order as the per-channel loops, from
    +0; each output row is then written back to the channels' planes."""
    L = DW_LANES
    HB = (OH - 1) * sh + (kh - 1) * dh + 1      # the padded rows and columns the taps read
    WB = (OW - 1) * sw + (kw - 1) * dw + 1
    T = kh * kw
    blk = scratch[:HB * WB * L]
    row = scratch[HB * WB * L:HB * WB * L + OW * L]
    wt = np.empty(T * L, np.float32)
    offs = np.empty(T, np.int64)
    for i in range(kh):
        for j in range(kw):
            offs[i * kw + j] = (i * dh * WB + j * dw) * L
    ia, ib = max(0, -ph), min(H, HB - ph)
    ja, jb = max(0, -pw), min(W, WB - pw)
    for k in range(HB * WB * L):
        blk[U(k)] = np.float32(0)
    step = sw * L
    for cb in range(c0, c1, L):
        n = min(L, c1 - cb)         # a last, partial block: lanes from n on are not written back
        for t in range(0, T, L):            # the weights [channel][tap] -> [tap][channel]
            transpose16(wt.ctypes.data + 4 * t * L, L, w.ctypes.data + 4 * (cb * T + t), T, n,
                        min(L, T - t))
        for ih in range(ia, ib):            # 16 x 16 tiles of (channel, column), transposed
            for iw in range(ja, jb, L):
                transpose16(blk.ctypes.data + 4 * (((ih + ph) * WB + pw + iw) * L), L,
                            x.ctypes.data + 4 * (xoff + cb * H * W + ih * W + iw), H * W,
                            n, min(L, jb - iw))
        for oh in range(OH):
            base = blk.ctypes.data + 4 * oh * sh * WB * L
            ow = 0
            while ow + 4 <= OW:
                tap_sums4(row.ctypes.data + 4 * ow * L, base + 4 * ow * step, wt.ctypes.data,
                          offs.ctypes.data, T, step)
                ow += 4
            while ow < OW:
                tap_sums1(row.ctypes.data + 4 * ow * L, base + 4 * ow * step, wt.ctypes.data,
                          offs.ctypes.data, T, step)
                ow += 1
            dst = acc.ctypes.data + 4 * (accoff + (cb - c0) * OH * OW + oh * OW)
            for ow in range(0, OW, L):
                transpose16(dst + 4 * ow, OH * OW, row.ctypes.data + 4 * ow * L, L,
                            min(L, OW - ow), n)


depthwise2d_entry = runtime_entry(depthwise2d, "K.depthwise2d",
                               [F32_ARRAY, I64, F32_ARRAY] + [I64] * 14
                               + [F32_ARRAY, F32_ARRAY, I64])


def depthwise_pad_size(H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW) -> int:
    """Elements of the scratch `depthwise2d` needs: one padded plane, or for the channel-
    blocked path a block's padded input and one output row."""
    if dw_blocked(kh, kw, sh, sw, dh, dw, OW):
        HB = (OH - 1) * sh + (kh - 1) * dh + 1
        WB = (OW - 1) * sw + (kw - 1) * dw + 1
        return (HB * WB + OW) * DW_LANES
    return (OH + 2) * (OW + 2)


@njit(**_OPTS)
def _taps(o, s, p, d, k, lo, hi):
    """The range [a, b) of window taps i in [0, k) with lo <= o*s - p + i*d < hi."""
    base = o * s - p
    a = 0
    if base < lo:
        a = (lo - base + d - 1) // d
    b = k
    if base + (k - 1) * d >= hi:
        b = (hi - base + d - 1) // d if hi > base else 0
    a = min(max(a, 0), k)
    b = min(max(b, a), k)
    return a, b


@njit(**_OPTS)
def _pool_taps(acc, k0, x, base, oa, ob, sw, is_max):
    """acc[k0 + ow] = max or sum with x[base + ow*sw] for ow in [oa, ob) (constant strides
    1 and 2 get their own loops, which LLVM vectorizes). In a max a NaN cell counts as float32's
    lowest value (the max pools' NaN rule: `numpy.pooling.max_pool`, docs/reliability.md)."""
    if is_max:
        lowest = np.float32(-3.4028234663852886e38)
        if sw == 1:
            for ow in range(oa, ob):
                v = x[U(base + ow)]
                v = v if v == v else lowest
                b = acc[U(k0 + ow)]
                acc[U(k0 + ow)] = v if v > b else b
        elif sw == 2:
            for ow in range(oa, ob):
                v = x[U(base + 2 * ow)]
                v = v if v == v else lowest
                b = acc[U(k0 + ow)]
                acc[U(k0 + ow)] = v if v > b else b
        else:
            for ow in range(oa, ob):
                v = x[U(base + ow * sw)]
                v = v if v == v else lowest
                b = acc[U(k0 + ow)]
                acc[U(k0 + ow)] = v if v > b else b
    else:
        if sw == 1:
            for ow in range(oa, ob):
                acc[U(k0 + ow)] += x[U(base + ow)]
        elif sw == 2:
            for ow in range(oa, ob):
                acc[U(k0 + ow)] += x[U(base + 2 * ow)]
        else:
            for ow in range(oa, ob):
                acc[U(k0 + ow)] += x[U(base + ow * sw)]


@njit(**_OPTS)
def pool2d(x, xoff, planes, H, W, kh, kw, sh, sw, ph, pw, pe_h, pe_w, dh, dw, OH, OW,
           is_max, include_pad, acc):
    """Max or average pooling over `planes` planes of H x W into acc (planes x OH x OW).

    Tap by tap over whole output rows (the ow loop vectorizes), visiting only taps inside the
    input, rows and columns: a window far larger than the input (a global pool written as
    AveragePool, EfficientNet's 320x320 over 2x2) costs its inside taps only. Pad cells never win a max; an average divides by the taps inside
    the input (or inside the padded input with include_pad), never by ceil-mode overhang; an
    all-padding max window gives the lowest float32, as onnxruntime.
    """
    wide_vectors()
    lowest = np.float32(-3.4028234663852886e38)
    start = np.float32(-np.inf) if is_max else np.float32(0)
    # per output column: taps inside the input, and inside the padded input
    inside_w = np.empty(OW, np.int64)
    padded_w = np.empty(OW, np.int64)
    empty_cols = False
    for ow in range(OW):
        ja, jb = _taps(ow, sw, pw, dw, kw, 0, W)
        inside_w[ow] = jb - ja
        empty_cols = empty_cols or ja == jb
        da, db = _taps(ow, sw, pw, dw, kw, -pw, W + pe_w)
        padded_w[ow] = db - da
    # the column taps that reach inside the input for some output column, with that range
    ranges = np.empty((kw, 2), np.int64)
    active = np.empty(kw, np.int64)
    n_active = 0
    lo, hi = 0, OW          # the output columns all of whose column taps are inside
    for j in range(kw):
        oa, ob = _inside(j * dw - pw, sw, OW, W)
        ranges[j, 0] = oa
        ranges[j, 1] = ob
        lo, hi = max(lo, oa), min(hi, ob)
        if oa < ob:
            active[n_active] = j
            n_active += 1
    # a max with stride 1 or 2 takes those columns 16 at a time, every tap's max in registers
    # (`vectors.tap_max1/2`: 64 x 112 x 112 -> 56 x 56, 3 x 3 taps, 1.1 ms a tap at a time)
    vec = is_max and (sw == 1 or sw == 2) and hi - lo >= LANES
    if not vec:
        lo, hi = OW, OW
    offs = np.empty(kh * kw, np.int64)
    for p in range(planes):
        src = xoff + p * H * W
        for oh in range(OH):
            ia, ib = _taps(oh, sh, ph, dh, kh, 0, H)
            k0 = (p * OH + oh) * OW
            if OW < 4:
                _pool_cols(acc, k0, x, src + (oh * sh - ph) * W - pw, ia, ib, W, 0, OW, sw, pw,
                           dh, dw, kw, start, is_max)
            elif lo < hi and ia < ib:
                base = src + (oh * sh - ph) * W - pw
                _pool_cols(acc, k0, x, base, ia, ib, W, 0, lo, sw, pw, dh, dw, kw, start, is_max)
                _pool_cols(acc, k0, x, base, ia, ib, W, hi, OW, sw, pw, dh, dw, kw, start,
                           is_max)
                nt = 0
                for i in range(ia, ib):
                    for j in range(kw):
                        offs[nt] = src + (oh * sh - ph + i * dh) * W + j * dw - pw
                        nt += 1
                for ow0 in range(lo, hi, LANES):
                    dst = acc.ctypes.data + 4 * (k0 + ow0)
                    at = x.ctypes.data + 4 * ow0 * sw
                    if sw == 1:
                        tap_max1(dst, at, offs.ctypes.data, nt, min(LANES, hi - ow0))
                    else:
                        tap_max2(dst, at, offs.ctypes.data, nt, min(LANES, hi - ow0))
            else:
                for ow in range(OW):
                    acc[U(k0 + ow)] = start
                for i in range(ia, ib):
                    row = src + (oh * sh - ph + i * dh) * W
                    for t in range(n_active):
                        j = active[t]
                        _pool_taps(acc, k0, x, row + j * dw - pw, ranges[j, 0], ranges[j, 1],
                                   sw, is_max)
            rows_in = ib - ia
            if is_max:
                if rows_in == 0:
                    for ow in range(OW):
                        acc[U(k0 + ow)] = lowest
                elif empty_cols:
                    for ow in range(OW):
                        if inside_w[ow] == 0:
                            acc[U(k0 + ow)] = lowest
            else:
                ca, cb = _taps(oh, sh, ph, dh, kh, -ph, H + pe_h)
                rows_pad = cb - ca
                for ow in range(OW):
                    counted = rows_pad * padded_w[ow] if include_pad else rows_in * inside_w[ow]
                    acc[U(k0 + ow)] = acc[U(k0 + ow)] / np.float32(max(counted, 1))


pool2d_entry = runtime_entry(pool2d, "K.pool2d", [F32_ARRAY, I64] + [I64] * 17 + [F32_ARRAY])


@njit(**_OPTS)
def _pool_cols(acc, k0, x, base, ia, ib, W, c0, c1, sw, pw, dh, dw, kw, start, is_max):
    """Outputs [c0, c1) of one row, each output's inside taps in turn, in `pool2d`'s order
    (rows, then columns): a row of fewer than 4 outputs (a global pool written as AveragePool:
    1 x 1; looping over the taps with the output row innermost took 850 us for EfficientNet-B0's
    1280 planes of 7 x 7, call overhead for every tap), and the edge columns of a vector row."""
    lowest = np.float32(-3.4028234663852886e38)
    for ow in range(c0, c1):
        ja, jb = _taps(ow, sw, pw, dw, kw, 0, W)
        s = start
        for i in range(ia, ib):
            row = base + i * dh * W + ow * sw
            for j in range(ja, jb):
                v = x[U(row + j * dw)]
                if is_max:
                    v = v if v == v else lowest
                    s = v if v > s else s
                else:
                    s += v
        acc[U(k0 + ow)] = s


@njit(**_OPTS)
def _inside(first, step, n, W):
    """The range [a, b) of ow in [0, n) with 0 <= first + ow*step < W (`_taps` of one window
    starting at `first`)."""
    return _taps(0, 0, -first, step, n, 0, W)


# ---- row reductions in 16 independent lanes ---------------------------------------------------
# A float sum or max over a row is a loop-carried dependency LLVM may only vectorize when it may
# reassociate (fastmath "reassoc"), which would also let it rewrite the range reduction of
# exp_f32. Sixteen explicit partial results are sixteen independent chains: the lane loop is
# one vector operation and the order of additions within each lane is fixed.

LANES = 16


@njit(**_OPTS)
def _row_extreme(row, n, largest):
    """max (largest) or min of row[:n], contiguous, in 16 lanes (-inf / +inf for an empty row;
    NaN if any element is NaN)."""
    wide_vectors()
    full = n - n % LANES
    if largest:
        best = lane_max(row.ctypes.data, full // LANES, np.float32(0))
    else:
        best = lane_min(row.ctypes.data, full // LANES, np.float32(0))
    for c in range(full, n):
        v = row[U(c)]
        best = v if ((v > best if largest else v < best) or v != v) else best
    return best


@njit(**_OPTS)
def row_max(row, n):
    """max(row[:n]) of a contiguous row (`_row_extreme`)."""
    return _row_extreme(row, n, True)


@njit(**_OPTS)
def row_min(row, n):
    """min(row[:n]) of a contiguous row (`_row_extreme`)."""
    return _row_extreme(row, n, False)


@njit(**_OPTS)
def row_sum(row, n):
    """sum(row[:n]) of a contiguous row in float32, in 16 lanes."""
    wide_vectors()
    full = n - n % LANES
    total = lane_sum(row.ctypes.data, full // LANES, np.float32(0))
    for c in range(full, n):
        total += row[U(c)]
    return total


@njit(**_OPTS)
def row_sumsq(row, n, mean):
    """sum((row[:n] - mean)**2) of a contiguous row in float32, in 16 lanes."""
    wide_vectors()
    full = n - n % LANES
    total = lane_sumsq(row.ctypes.data, full // LANES, mean)
    for c in range(full, n):
        d = row[U(c)] - mean
        total += d * d
    return total


@njit(**_OPTS)
def exp_shift(row, n, shift):
    """row[:n] = exp(row[:n] - shift)."""
    wide_vectors()
    for c in range(n):
        row[U(c)] = exp_f32(row[U(c)] - shift)
