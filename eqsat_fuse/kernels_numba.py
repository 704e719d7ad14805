"""Hand-written Numba building blocks that generated kernels call: im2col, depthwise
convolution, pooling, float16 widening (float16 inputs of these are widened to float32 first).

They take flat (1-D, contiguous) arrays plus integer geometry, so one compiled version serves
every kernel of the same dtypes; the generated kernel applies its fused epilogue on the rows
each block produces while they are still in cache. Loops are serial: the backend calls them
next to BLAS, where OpenMP threads would fight OpenBLAS's (shared/NOTES-kernels.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .approx import f16_to_f32

_OPTS = dict(cache=True, error_model="numpy", fastmath={"contract", "nsz", "arcp"})


@njit(**_OPTS)
def im2col(x, xoff, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, cols):
    """cols[(c, i, j), (oh, ow)] = x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside)."""
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
                            cols[base + ow] = 0.0
                        continue
                    src = xoff + (c * H + ih) * W
                    lo = 0
                    # first ow whose input column is >= 0, last one < W
                    while lo < OW and lo * sw - pw + j * dw < 0:
                        cols[base + lo] = 0.0
                        lo += 1
                    hi = OW
                    while hi > lo and (hi - 1) * sw - pw + j * dw >= W:
                        hi -= 1
                        cols[base + hi] = 0.0
                    off = src - pw + j * dw
                    if sw == 1:
                        for ow in range(lo, hi):
                            cols[base + ow] = x[off + ow]
                    else:
                        for ow in range(lo, hi):
                            cols[base + ow] = x[off + ow * sw]


@njit(**_OPTS)
def widen_f16(x, xoff, n, out):
    """out[:n] = float32(x[xoff:xoff+n]) for float16 held as uint16."""
    for i in range(n):
        out[i] = f16_to_f32(x[xoff + i])


@njit(**_OPTS)
def depthwise2d(x, xoff, w, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, c0, c1, pad, acc,
                accoff):
    """acc[c, oh, ow] = sum_ij w[c, i, j] x[c, ...] for channels c0..c1 (one input channel each).

    `pad` is scratch for one zero-padded plane, so the inner loop has no bounds checks.
    """
    HP = H + 2 * ph + sh * 2 + dh * kh
    WP = W + 2 * pw + sw * 2 + dw * kw
    for c in range(c0, c1):
        for k in range(HP * WP):
            pad[k] = 0.0
        src = xoff + c * H * W
        for ih in range(H):
            for iw in range(W):
                pad[(ih + ph) * WP + iw + pw] = x[src + ih * W + iw]
        dst = accoff + (c - c0) * OH * OW
        for k in range(OH * OW):
            acc[dst + k] = 0.0
        for i in range(kh):
            for j in range(kw):
                wv = w[(c * kh + i) * kw + j]
                for oh in range(OH):
                    prow = (oh * sh + i * dh) * WP + j * dw
                    orow = dst + oh * OW
                    if sw == 1:
                        for ow in range(OW):
                            acc[orow + ow] += wv * pad[prow + ow]
                    else:
                        for ow in range(OW):
                            acc[orow + ow] += wv * pad[prow + ow * sw]


def depthwise_pad_size(H, W, kh, kw, sh, sw, ph, pw, dh, dw) -> int:
    """Elements of the padded-plane scratch `depthwise2d` needs."""
    return (H + 2 * ph + sh * 2 + dh * kh) * (W + 2 * pw + sw * 2 + dw * kw)


@njit(**_OPTS)
def pool2d(x, xoff, planes, H, W, kh, kw, sh, sw, ph, pw, pe_h, pe_w, dh, dw, OH, OW,
           is_max, include_pad, acc):
    """Max or average pooling over `planes` planes of H x W into acc (planes x OH x OW).

    Pad cells never win a max; an average divides by the taps inside the input (or inside the
    padded input with include_pad), never by ceil-mode overhang; an all-padding max window
    gives the lowest float32, as onnxruntime.
    """
    lowest = np.float32(-3.4028234663852886e38)
    for p in range(planes):
        src = xoff + p * H * W
        for oh in range(OH):
            for ow in range(OW):
                if is_max:
                    best = -np.inf
                else:
                    best = 0.0
                taps = 0
                counted = 0
                for i in range(kh):
                    ih = oh * sh - ph + i * dh
                    for j in range(kw):
                        iw = ow * sw - pw + j * dw
                        inside = ih >= 0 and ih < H and iw >= 0 and iw < W
                        if include_pad:
                            if ih >= -ph and ih < H + pe_h and iw >= -pw and iw < W + pe_w:
                                counted += 1
                        elif inside:
                            counted += 1
                        if inside:
                            taps += 1
                            v = x[src + ih * W + iw]
                            if is_max:
                                if v > best or v != v:
                                    best = v
                            else:
                                best += v
                k = (p * OH + oh) * OW + ow
                if is_max:
                    acc[k] = best if taps > 0 else lowest
                else:
                    acc[k] = best / max(counted, 1)
