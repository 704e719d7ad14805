"""The FusedAttention runtime: softmax(q @ kt (* or / scale) (+ mask)) @ v, flash style, on
the packed GEMM's microkernel (`packed_gemm`), the scores never in memory.

Each head is one task (threads take heads in turn). A task packs its kt into panels of NR
columns and its v into panels of NR columns (`packed_gemm.pack`'s layout: the microkernel's B),
then walks its queries in blocks of BQ rows, packed into row tiles of MR (the microkernel's A).
For each block of BK keys: the block's scores (one microkernel call per row tile and panel, into
an L2-resident BQ x BK tile), the model's scale (times or over the one-element `sc`, `how` 1 or
2) and mask, then the online softmax: a running row max m, sum l and output accumulator, the
accumulator rescaled by exp(m_old - m_new) when the max grows; the probabilities are packed
into row tiles and multiplied by the block's rows of v. The scale and the mask are applied as
the model applies them (no fused multiply-add: this module has no fast-math flags), so the
scores are the unfused program's; the sums differ by their order only.

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
from .packed_gemm import MR, NR, _tile

U = np.uint64      # unsigned indices: no wraparound checks, the packing loops vectorize
_OPTS = dict(cache=True, error_model="numpy")


def workspace(Sq: int, Sk: int, D: int, Dv: int, BQ: int, BK: int) -> int:
    """Floats of workspace one task (thread) needs."""
    tiles = -(-BQ // MR) * MR
    return (-(-Sk // NR) * NR * D + -(-Dv // NR) * NR * Sk + tiles * D + BQ * BK
            + tiles * BK + 2 * BQ * Dv + 2 * BQ + 64)


@njit(**_OPTS)
def _panels(x, off, sr, sc, rows, cols, dst, d0):
    """dst[d0 + (p rows + r) NR + j] = x[off + r sr + (p NR + j) sc], zero past `cols`: the
    matrix in panels of NR columns (`packed_gemm.pack`)."""
    for p in range(-(-cols // NR)):
        base = d0 + p * rows * NR
        c0 = p * NR
        nc = min(NR, cols - c0)
        for r in range(rows):
            src = off + r * sr + c0 * sc
            for j in range(nc):
                dst[U(base + r * NR + j)] = x[U(src + j * sc)]
            for j in range(nc, NR):
                dst[U(base + r * NR + j)] = np.float32(0)


@njit(**_OPTS)
def _row_tiles(x, off, sr, sc, rows, cols, dst, d0):
    """dst[d0 + t MR cols + c MR + i] = x[off + (t MR + i) sr + c sc], zero past `rows`: the
    matrix in row tiles of MR (`packed_gemm.pack_rows`)."""
    for t in range(-(-rows // MR)):
        base = d0 + t * MR * cols
        top = t * MR
        nr = min(MR, rows - top)
        for c in range(cols):
            for i in range(nr):
                dst[U(base + c * MR + i)] = x[U(off + (top + i) * sr + c * sc)]
            for i in range(nr, MR):
                dst[U(base + c * MR + i)] = np.float32(0)


@njit(**_OPTS)
def _product(ws, a0, m, k, b0, bstride, n, c0, ldc):
    """ws[c0 + i ldc + j] = sum_k A[i, k] B[k, j], i < m, j < n: A in row tiles from a0, B in
    panels from b0, `bstride` floats from one panel to the next."""
    pw = ws.ctypes.data
    for t in range(-(-m // MR)):
        mr = min(MR, m - t * MR)
        for p in range(-(-n // NR)):
            _tile(mr, pw + 4 * (a0 + t * MR * k), pw + 4 * (b0 + p * bstride),
                  pw + 4 * (c0 + t * MR * ldc + p * NR), ldc, k, min(NR, n - p * NR))


@njit(**_OPTS)
def _head(q, q0, qr, qc, kt, k0, kr, kc, v, v0, vr, vc, mask, m0, mq, mk, has_mask, sc, how,
          out, o0, Sq, Sk, D, Dv, ws, w0, BQ, BK):
    """One head: out[o0 + i Dv + j] for i < Sq, j < Dv (see the module doc)."""
    tiles = -(-BQ // MR) * MR
    KP = w0
    VP = KP + -(-Sk // NR) * NR * D
    QA = VP + -(-Dv // NR) * NR * Sk
    S = QA + tiles * D
    PA = S + BQ * BK
    T = PA + tiles * BK
    A = T + BQ * Dv
    M = A + BQ * Dv
    L = M + BQ
    _panels(kt, k0, kr, kc, D, Sk, ws, KP)
    _panels(v, v0, vr, vc, Sk, Dv, ws, VP)
    for i0 in range(0, Sq, BQ):
        m = min(BQ, Sq - i0)
        _row_tiles(q, q0 + i0 * qr, qr, qc, m, D, ws, QA)
        for i in range(m):
            ws[U(M + i)] = -np.inf
            ws[U(L + i)] = 0.0
        for i in range(m * Dv):
            ws[U(A + i)] = 0.0
        for j0 in range(0, Sk, BK):
            n = min(BK, Sk - j0)
            _product(ws, QA, m, D, KP + j0 * D, D * NR, n, S, BK)
            for i in range(m):
                row = ws[S + i * BK:S + i * BK + n]
                if how == 1:
                    for j in range(n):
                        row[U(j)] = row[U(j)] * sc[0]
                elif how == 2:
                    for j in range(n):
                        row[U(j)] = row[U(j)] / sc[0]
                if has_mask:
                    r0 = m0 + (i0 + i) * mq + j0 * mk
                    for j in range(n):
                        row[U(j)] = row[U(j)] + mask[U(r0 + j * mk)]
                old = ws[U(M + i)]
                top = row_max(row, n)
                new = top if (top > old or top != top) else old
                corr = exp_f32(old - new) if old > -np.inf else np.float32(0.0)
                if new == -np.inf:          # no finite score yet: these keys weigh 0
                    for j in range(n):
                        row[U(j)] = np.float32(0.0)
                else:
                    exp_shift(row, n, new)
                ws[U(L + i)] = ws[U(L + i)] * corr + row_sum(row, n)
                ws[U(M + i)] = new
                if corr != 1.0:
                    for d in range(Dv):
                        ws[U(A + i * Dv + d)] *= corr
            _row_tiles(ws, S, BK, 1, m, n, ws, PA)
            _product(ws, PA, m, n, VP + j0 * NR, Sk * NR, Dv, T, Dv)
            for i in range(m * Dv):
                ws[U(A + i)] += ws[U(T + i)]
        for i in range(m):
            o = o0 + (i0 + i) * Dv
            if Sk == 0:
                for d in range(Dv):
                    out[U(o + d)] = 0.0
                continue
            inv = np.float32(1.0) / ws[U(L + i)]
            for d in range(Dv):
                out[U(o + d)] = ws[U(A + i * Dv + d)] * inv


@njit(parallel=True, **_OPTS)
def attention(q, qo, qb, qh, qr, qc, kt, ko, kb, kh, kr, kc, v, vo, vb, vh, vr, vc,
              mask, mo, mb, mh, mq, mk, has_mask, sc, how, out, H, BH, Sq, Sk, D, Dv,
              ws, wo, per, BQ, BK, parts):
    """FusedAttention over BH = B x H heads (see the module doc); `parts` threads, each with
    `per` floats of workspace from ws[wo]."""
    for p in prange(parts):
        for bh in range(p, BH, parts):
            b = bh // H
            h = bh - b * H
            _head(q, qo + b * qb + h * qh, qr, qc, kt, ko + b * kb + h * kh, kr, kc,
                  v, vo + b * vb + h * vh, vr, vc, mask, mo + b * mb + h * mh, mq, mk,
                  has_mask, sc, how, out, bh * Sq * Dv, Sq, Sk, D, Dv, ws, wo + p * per,
                  BQ, BK)


attention_entry = runtime_entry(
    attention, "FA.attention",
    [F32_ARRAY] + [I64] * 5 + [F32_ARRAY] + [I64] * 5 + [F32_ARRAY] + [I64] * 5
    + [F32_ARRAY] + [I64] * 6 + [F32_ARRAY, I64, F32_ARRAY] + [I64] * 6
    + [F32_ARRAY] + [I64] * 5)
