"""The FusedAttention runtime: softmax(q @ kt (* or / scale) (+ mask)) @ v, flash style, on
the packed GEMM's microkernel (`packed_gemm`), the scores never in memory.

Each head is one task (threads take heads in turn). A head of fewer queries than the
microkernel's MR rows (a decode step) is computed row by row instead (`_head_rows`). A task packs its keys in row tiles of MR
(the microkernel's A, `packed_gemm.pack_rows`'s layout) and its v in panels of NR columns (its
B, `packed_gemm.pack`'s), then walks its queries in blocks of BQ, each block's q^T packed in
panels. For each block of BK keys: the block's scores, transposed (keys by queries: one
microkernel call per tile of keys and panel of queries, into an L2-resident BK x BQ tile), the
model's scale (times or over the one-element `sc`, `how` 1 or 2), the mask and the running max
in one pass over the tile, then the online
softmax along the queries: a running max m, sum l and output accumulator per query, the
accumulator rescaled by exp(m_old - m_new) when the max grows. The probabilities are read by
the A-table microkernel where they lie (A[i, k] at k BQ + i) and multiplied by the block's
rows of v: nothing is packed per block but q. A block of keys that the mask gives weight 0
for every query of the block (a causal mask's blocks above the diagonal) is skipped where that
is exact (`_head`). A mask the heads share has its blocks classified once per batch element
(`_classify`: their largest value, whether their rows agree); one whose rows differ within a
block (a causal mask) makes the heads run on blocks of FINE_KEYS keys, so that fewer blocks
straddle the diagonal and more are skipped. The scale and the mask are applied as the model
applies them (no fused multiply-add: this module has no fast-math flags), so the scores are the
unfused program's; the sums differ by their order only.

A row whose scores are all -inf, or hold +inf or NaN, gives NaN, as Softmax does (a block of
-inf scores before the row's first finite one weighs 0, as exp(-inf - max) does); with no keys
the output is 0 (an empty product). Operands are strided: element (i, j) of head (b, h) of q
at q[qo + b qb + h qh + i qr + j qc], likewise kt, v and the mask (whose strides may be 0:
broadcast). The output is contiguous, [BH, Sq, Dv].
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .approx import exp_f32
from .calls import F32_ARRAY, I64, runtime_entry
from .kernels import exp_shift, row_max, row_sum
from .packed_gemm import MR, NR, _gather_tile, _tile

U = np.uint64      # unsigned indices: no wraparound checks, the packing loops vectorize
FINE_KEYS = 96     # a mask with rows per query is classified in blocks of this many keys
_OPTS = dict(cache=True, error_model="numpy")


def workspace(Sq: int, Sk: int, D: int, Dv: int, BQ: int, BK: int) -> int:
    """Floats of workspace one task (thread) needs: its head's packed keys, values and block of
    queries (the block's scores and accumulators are the task's own arrays)."""
    return -(-Sk // MR) * MR * D + -(-Dv // NR) * NR * Sk + -(-BQ // NR) * NR * D + 64


@njit(**_OPTS)
def _panels(x, off, sr, sc, rows, cols, width, dst, d0):
    """dst[d0 + (p rows + r) width + j] = x[off + r sr + (p width + j) sc], zero past `cols`:
    the matrix in panels of `width` columns. Panels of NR are the microkernel's B
    (`packed_gemm.pack`); panels of MR of a matrix's transpose are its A (`pack_rows`)."""
    for p in range(-(-cols // width)):
        base = d0 + p * rows * width
        c0 = p * width
        nc = min(width, cols - c0)
        for r in range(rows):
            src = off + r * sr + c0 * sc
            for j in range(nc):
                dst[U(base + r * width + j)] = x[U(src + j * sc)]
            for j in range(nc, width):
                dst[U(base + r * width + j)] = np.float32(0)


@njit(**_OPTS)
def _scores(ws, KA, QP, j0, n, m, D, st, BQ):
    """st[k BQ + i] = sum_d K[j0 + k, d] Q[i, d], k < n, i < m: the block's scores transposed,
    keys by queries (K in row tiles from ws[KA], Q^T in panels from ws[QP])."""
    pw = ws.ctypes.data
    ps = st.ctypes.data
    for t in range(-(-n // MR)):
        mr = min(MR, n - t * MR)
        for p in range(-(-m // NR)):
            _tile(mr, pw + 4 * (KA + (j0 + t * MR) * D), pw + 4 * (QP + p * D * NR),
                  ps + 4 * (t * MR * BQ + p * NR), BQ, D, min(NR, m - p * NR))


@njit(**_OPTS)
def _weighted(st, table, ws, VP, j0, n, m, Sk, Dv, ot):
    """ot[i Dv + j] = sum_k st[k BQ + i] V[j0 + k, j]: the block's probabilities (transposed,
    read through the offsets `table`: A[i, k] at st + table[k] + i) times its rows of v (V in
    panels from ws[VP])."""
    pw = ws.ctypes.data
    ps = st.ctypes.data
    pt = table.ctypes.data
    po = ot.ctypes.data
    for q in range(-(-m // MR)):
        mr = min(MR, m - q * MR)
        for p in range(-(-Dv // NR)):
            _gather_tile(mr, ps + 4 * q * MR, pt, pw + 4 * (VP + p * Sk * NR + j0 * NR),
                         po + 4 * (q * MR * Dv + p * NR), Dv, n, min(NR, Dv - p * NR))


@njit(**_OPTS)
def _block_scaled_max(st, k0, m, factor, how, shifted, shift, new):
    """st[k0 + i] = st[k0 + i] * factor (how 1) or / factor (how 2), + shift if `shifted`,
    in the model's order, and new[i] = max(new[i], st[k0 + i]), NaN kept: one pass over a
    key's scores."""
    for i in range(m):
        s = st[U(k0 + i)]
        if how == 1:
            s = s * factor
        elif how == 2:
            s = s / factor
        if shifted:
            s = s + shift
        st[U(k0 + i)] = s
        t = new[U(i)]
        new[U(i)] = s if (s > t or s != s) else t


@njit(**_OPTS)
def _block_exp(st, k0, m, new, total):
    """st[k0 + i] = exp(st[k0 + i] - new[i]) (0 where new[i] is -inf: no finite score yet,
    these keys weigh 0), summed into total[i]."""
    for i in range(m):
        top = new[U(i)]
        e = np.float32(0.0) if top == -np.inf else exp_f32(st[U(k0 + i)] - top)
        st[U(k0 + i)] = e
        total[U(i)] += e


@njit(**_OPTS)
def _absmax(x, off, sr, sc, rows, cols):
    """max |x[off + r sr + c sc]|, inf if any element is NaN (0 for no element)."""
    top = np.float32(0.0)
    for r in range(rows):
        for c in range(cols):
            a = abs(x[U(off + r * sr + c * sc)])
            if not a <= top:
                top = a if a == a else np.float32(np.inf)
    return top


@njit(**_OPTS)
def _mask_block(mask, r0, m, n, mq, mk):
    """(the largest mask value of the block, NaN if it holds one; whether every query row of
    it equals the first): a padding mask expanded over the queries, or a causal mask's blocks
    off the diagonal, are one row of values for all queries."""
    top = np.float32(-np.inf)
    same = True
    for i in range(m if mq else 1):
        row = r0 + i * mq
        if mk == 1:
            t = row_max(mask[row:row + n], n)
        else:
            t = np.float32(-np.inf)
            for k in range(n):
                x = mask[U(row + k * mk)]
                t = x if (x > t or x != x) else t
        top = t if (t > top or t != t) else top
        if i and same:
            differ = 0
            for k in range(n):
                differ += mask[U(row + k * mk)] != mask[U(r0 + k * mk)]
            same = differ == 0
    return top, same


@njit(**_OPTS)
def _masked_rows_max(st, BQ, mask, r0, m, n, mq, mk, factor, how, new):
    """st[k BQ + i] = st[k BQ + i] * factor (how 1) or / factor (how 2) + mask[r0 + i mq +
    k mk], and new[i] = max(new[i], st[k BQ + i]), NaN kept: a mask whose rows differ, in one
    pass over the transposed scores, in strips of 16 keys (their lines of st stay in L1 along
    the queries)."""
    for k0 in range(0, n, 16):
        k1 = min(k0 + 16, n)
        for i in range(m):
            row = r0 + i * mq
            t = new[U(i)]
            for k in range(k0, k1):
                s = st[U(k * BQ + i)]
                if how == 1:
                    s = s * factor
                elif how == 2:
                    s = s / factor
                s = s + mask[U(row + k * mk)]
                st[U(k * BQ + i)] = s
                t = s if (s > t or s != s) else t
            new[U(i)] = t


def _classify(mask, mo, mb, mq, mk, B, Sq, Sk, BQ, BK, tops, sames):
    """`_mask_block` of every block of queries and keys of each of the B masks (one per batch
    element: a mask the heads share), into tops / sames[(b nq + block of queries) nk + block
    of keys]; the blocks in parallel."""
    nq = -(-Sq // BQ)
    nk = -(-Sk // BK)
    for t in prange(B * nq * nk):
        b = t // (nq * nk)
        iq = (t - b * nq * nk) // nk
        jk = t - b * nq * nk - iq * nk
        i0 = iq * BQ
        j0 = jk * BK
        tops[t], sames[t] = _mask_block(mask, mo + b * mb + i0 * mq + j0 * mk,
                                        min(BQ, Sq - i0), min(BK, Sk - j0), mq, mk)


_classify_parallel = njit(parallel=True, **_OPTS)(_classify)


@njit(**_OPTS)
def _merge(tops, sames, nkf, per, out_tops, out_sames, nk):
    """The classes of blocks of `per` consecutive blocks of keys (nkf of them per row of
    blocks) from theirs: the largest of their largest values, and whether the rows agree in
    each of them."""
    for r in range(len(out_tops) // nk):
        for jk in range(nk):
            top = np.float32(-np.inf)
            same = True
            for f in range(r * nkf + jk * per, r * nkf + min((jk + 1) * per, nkf)):
                x = tops[f]
                top = x if (x > top or x != x) else top
                same = same and sames[f]
            out_tops[r * nk + jk] = top
            out_sames[r * nk + jk] = same


@njit(**_OPTS)
def _head(q, q0, qr, qc, kt, k0, kr, kc, v, v0, vr, vc, mask, m0, mq, mk, has_mask, sc, how,
          out, o0, Sq, Sk, D, Dv, ws, w0, BQ, BK, blk, table, tops, sames, t0):
    """One head: out[o0 + i Dv + j] for i < Sq, j < Dv (see the module doc). The scores of a
    block are kept transposed (keys by queries), so the softmax's loops run along the queries
    (16 at a time) and the probabilities feed the second product as they lie. `blk` and
    `table` are the task's block arrays (`_blocks`); where the mask's blocks are classified
    already (t0 >= 0), block (iq, jk) is at tops / sames[t0 + iq nk + jk]."""
    KA = w0
    VP = KA + -(-Sk // MR) * MR * D
    QP = VP + -(-Dv // NR) * NR * Sk
    st = blk[:BK * BQ]
    ot = blk[BK * BQ:BK * BQ + BQ * Dv]
    acc = blk[BK * BQ + BQ * Dv:BK * BQ + 2 * BQ * Dv]
    rest = BK * BQ + 2 * BQ * Dv
    best = blk[rest:rest + BQ]
    new = blk[rest + BQ:rest + 2 * BQ]
    total = blk[rest + 2 * BQ:rest + 3 * BQ]
    corr = blk[rest + 3 * BQ:rest + 4 * BQ]
    nk = -(-Sk // BK)
    _panels(kt, k0, kr, kc, D, Sk, MR, ws, KA)         # K in row tiles: kt in panels of MR
    _panels(v, v0, vr, vc, Sk, Dv, NR, ws, VP)
    # a block of keys whose every probability is exactly 0 for every query of a block is
    # skipped: a causal mask above the diagonal (-inf, or the -3.4e38 of most exporters). That
    # holds when q, k and v are finite, |q.k| * scale <= `bound` (no overflow, no inf - inf),
    # and each query's running max, from the blocks before, exceeds the block's largest mask
    # value plus `bound` by more than 104: exp of the difference is 0 in float32 (subnormals
    # included), as the unfused softmax computes it, and 0 times a finite v adds 0. The
    # bounds (scans of k, v and the block's q) are computed when a block could be skipped
    # with a bound of 0 (its largest mask value is that far below), not before: -1 until then
    kbound = np.float32(-1.0)
    factor = sc[0] if how else np.float32(1.0)
    for i0 in range(0, Sq, BQ):
        m = min(BQ, Sq - i0)
        _panels(q, q0 + i0 * qr, qc, qr, D, m, NR, ws, QP)  # Q^T[d, i] = q[i, d]
        bound = np.float32(-1.0)
        best[:] = -np.inf
        total[:] = 0.0
        acc[:] = 0.0
        for j0 in range(0, Sk, BK):
            n = min(BK, Sk - j0)
            r0 = m0 + i0 * mq + j0 * mk
            same = True
            if has_mask:
                if t0 >= 0:
                    at = t0 + (i0 // BQ) * nk + j0 // BK
                    top, same = tops[at], sames[at]
                else:
                    top, same = _mask_block(mask, r0, m, n, mq, mk)
                if top < best[:m].min() - 104:              # a candidate: bound it
                    if kbound < 0:
                        kbound = np.float32(np.inf)
                        if _absmax(v, v0, vr, vc, Sk, Dv) < np.inf:
                            most = abs(sc[0]) if how == 1 else (
                                1 / abs(sc[0]) if how == 2 else 1.0)
                            kbound = D * _absmax(kt, k0, kr, kc, D, Sk) * most
                    if bound < 0:
                        bound = kbound * _absmax(q, q0 + i0 * qr, qr, qc, m, D)
                    if bound < 1e37 and top + bound < best[:m].min() - 104:
                        continue
            _scores(ws, KA, QP, j0, n, m, D, st, BQ)
            new[:] = best
            if has_mask and not same:
                _masked_rows_max(st, BQ, mask, r0, m, n, mq, mk, factor, how, new)
            else:               # the scale, the key's one mask value and the max in one pass
                for k in range(n):
                    shift = mask[U(r0 + k * mk)] if has_mask else np.float32(0.0)
                    _block_scaled_max(st, k * BQ, m, factor, how, has_mask, shift, new)
            for i in range(m):
                old = best[U(i)]
                corr[U(i)] = exp_f32(old - new[U(i)]) if old > -np.inf else np.float32(0.0)
                total[U(i)] *= corr[U(i)]
            best[:] = new
            for k in range(n):
                _block_exp(st, k * BQ, m, new, total)
            _weighted(st, table, ws, VP, j0, n, m, Sk, Dv, ot)
            for i in range(m):
                c = corr[U(i)]
                for d in range(Dv):
                    acc[U(i * Dv + d)] = acc[U(i * Dv + d)] * c + ot[U(i * Dv + d)]
        for i in range(m):
            o = o0 + (i0 + i) * Dv
            if Sk == 0:
                for d in range(Dv):
                    out[U(o + d)] = 0.0
                continue
            inv = np.float32(1.0) / total[U(i)]
            for d in range(Dv):
                out[U(o + d)] = acc[U(i * Dv + d)] * inv


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _dot(x, xo, xs, y, yo, ys, n):
    """sum(x[xo + i xs] * y[yo + i ys]) for i < n, in any order (`reassoc`: 16 lanes): a
    contraction's sum, whose order the numerics contract leaves open, as a blocked GEMM's."""
    total = np.float32(0.0)
    for i in range(n):
        total += x[U(xo + i * xs)] * y[U(yo + i * ys)]
    return total


@njit(**_OPTS)
def _head_rows(q, q0, qr, qc, kt, k0, kr, kc, v, v0, vr, vc, mask, m0, mq, mk, has_mask, sc,
               how, out, o0, Sq, Sk, D, Dv):
    """One head of fewer queries than a row tile (a decode step's one token): each query's
    scores, softmax and weighted sum of v in place, reading k and v once, unpacked (packing
    them would cost more than the products). The softmax is the unfused one's, row by row."""
    row = np.empty(Sk, np.float32)
    acc = np.empty(Dv, np.float32)
    for i in range(Sq):
        o = o0 + i * Dv
        if Sk == 0:
            for j in range(Dv):
                out[U(o + j)] = 0.0
            continue
        qi = q0 + i * qr
        for k in range(Sk):
            row[U(k)] = _dot(q, qi, qc, kt, k0 + k * kc, kr, D)
        if how == 1:
            row *= sc[0]
        elif how == 2:
            row /= sc[0]
        if has_mask:
            r0 = m0 + i * mq
            for k in range(Sk):
                row[U(k)] = row[U(k)] + mask[U(r0 + k * mk)]
        exp_shift(row, Sk, row_max(row, Sk))
        inv = np.float32(1.0) / row_sum(row, Sk)
        acc[:] = 0.0
        for k in range(Sk):
            weight = row[U(k)]
            base = v0 + k * vr
            for j in range(Dv):
                acc[U(j)] += weight * v[U(base + j * vc)]
        for j in range(Dv):
            out[U(o + j)] = acc[U(j)] * inv


@njit(**_OPTS)
def _blocks(BQ, BK, Dv):
    """A task's block arrays, made once for all its heads: the scores (BK x BQ), the block's
    product and accumulator (BQ x Dv), four vectors of BQ, and the A table of the
    probabilities (row k at k BQ; 16 rows of slack read as row 0)."""
    blk = np.empty(BK * BQ + 2 * BQ * Dv + 4 * BQ, np.float32)
    table = np.empty(BK + 16, np.int64)
    for k in range(BK + 16):
        table[k] = (k if k < BK else 0) * BQ
    return blk, table


@njit(parallel=True, **_OPTS)
def attention(q, qo, qb, qh, qr, qc, kt, ko, kb, kh, kr, kc, v, vo, vb, vh, vr, vc,
              mask, mo, mb, mh, mq, mk, has_mask, sc, how, out, H, BH, Sq, Sk, D, Dv,
              ws, wo, per, BQ, BK, parts):
    """FusedAttention over BH = B x H heads (see the module doc); `parts` threads, each with
    `per` floats of workspace from ws[wo]. A mask the heads share (a padding or causal mask)
    has its blocks classified once per batch element, not per head."""
    B = BH // H
    shared = has_mask and Sq >= MR and (mh == 0 or H == 1)
    nq = -(-Sq // BQ)
    nb = B * nq * -(-Sk // BK) if shared else 1
    tops = np.empty(nb, np.float32)
    sames = np.zeros(nb, np.bool_)
    bk = BK
    if shared and mq != 0:
        # a mask with rows per query: classified in blocks of fewer keys; if the rows of every
        # block agree (a padding mask expanded over the queries) the blocks are merged back,
        # else (a causal mask) the heads run on the small blocks, which the mask skips or
        # keeps whole more often
        fine = FINE_KEYS if BK >= 2 * FINE_KEYS else BK
        nf = B * nq * -(-Sk // fine)
        ftops = np.empty(nf, np.float32)
        fsames = np.zeros(nf, np.bool_)
        _classify_parallel(mask, mo, mb, mq, mk, B, Sq, Sk, BQ, fine, ftops, fsames)
        if fsames.all():
            _merge(ftops, fsames, nf // nq // B, -(-BK // fine), tops, sames, nb // nq // B)
        else:
            bk, nb, tops, sames = fine, nf, ftops, fsames
    elif shared:
        _classify_parallel(mask, mo, mb, mq, mk, B, Sq, Sk, BQ, BK, tops, sames)
    for p in prange(parts):
        blk, table = _blocks(BQ, bk, Dv)
        for bh in range(p, BH, parts):
            b = bh // H
            h = bh - b * H
            t0 = b * (nb // B) if shared else -1
            if Sq < MR:
                _head_rows(q, qo + b * qb + h * qh, qr, qc, kt, ko + b * kb + h * kh, kr, kc,
                           v, vo + b * vb + h * vh, vr, vc, mask, mo + b * mb + h * mh, mq,
                           mk, has_mask, sc, how, out, bh * Sq * Dv, Sq, Sk, D, Dv)
            else:
                _head(q, qo + b * qb + h * qh, qr, qc, kt, ko + b * kb + h * kh, kr, kc,
                      v, vo + b * vb + h * vh, vr, vc, mask, mo + b * mb + h * mh, mq, mk,
                      has_mask, sc, how, out, bh * Sq * Dv, Sq, Sk, D, Dv, ws,
                      wo + p * per, BQ, bk, blk, table, tops, sames, t0)


attention_entry = runtime_entry(
    attention, "FA.attention",
    [F32_ARRAY] + [I64] * 5 + [F32_ARRAY] + [I64] * 5 + [F32_ARRAY] + [I64] * 5
    + [F32_ARRAY] + [I64] * 6 + [F32_ARRAY, I64, F32_ARRAY] + [I64] * 6
    + [F32_ARRAY] + [I64] * 5)
