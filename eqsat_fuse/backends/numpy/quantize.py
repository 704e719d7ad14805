"""Reference NumPy kernels of the quantization operators: QuantizeLinear and DequantizeLinear.

Both follow the ONNX spec (opset 21) exactly, with the per-axis form already made a broadcast
by the importer: a scale and zero point of shape `[C, 1, 1]` against an `[N, C, H, W]` input
(`frontend/normalize.py`). The arithmetic is onnxruntime's: the quotient `x / scale` in the
float dtype of `x` and `scale`, rounded half to even, the zero point added, the sum saturated
to the integer dtype; NaN saturates to the dtype's lowest value (onnxruntime's kernels clamp
with `max` first, which keeps the bound when the other operand is NaN).
"""

from __future__ import annotations

import numpy as np

from .arrays import _work_dtype


def _float_dtype(*arrays: np.ndarray) -> np.dtype:
    return np.result_type(*(_work_dtype(np.asarray(a).dtype) for a in arrays))


def quantize_linear(x, scale, zero_point):
    """saturate(round_half_even(x / scale) + zero_point), in the zero point's integer dtype."""
    x, scale, zero_point = np.asarray(x), np.asarray(scale), np.asarray(zero_point)
    dt = zero_point.dtype
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    work = _float_dtype(x, scale)
    with np.errstate(all="ignore"):
        v = np.rint(x.astype(work, copy=False) / scale.astype(work, copy=False))
        v = v + zero_point.astype(work)
        v = np.where(v >= lo, np.minimum(v, work.type(hi)), work.type(lo))
    return v.astype(dt)


def dequantize_linear(x, scale, zero_point):
    """(x - zero_point) * scale, the difference taken in integers, the product in the scale's
    float dtype."""
    x, scale, zero_point = np.asarray(x), np.asarray(scale), np.asarray(zero_point)
    work = _work_dtype(scale.dtype)
    diff = x.astype(np.int64) - zero_point.astype(np.int64)
    return (diff.astype(work) * scale.astype(work, copy=False)).astype(scale.dtype, copy=False)


# ---- integer contractions --------------------------------------------------------------------
# The products of 8-bit integers and their sums are integers below 2^53 for any K under 2^37, so
# float64 arithmetic (BLAS) computes them exactly; the int32 result wraps as int32 arithmetic
# does (a sum past 2^31 needs K > 33,000 terms of the largest products).

def _shifted(x, zero_point) -> np.ndarray:
    x = np.asarray(x).astype(np.float64)
    return x if zero_point is None else x - np.asarray(zero_point).astype(np.float64)


def _wrap_int32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.int64).astype(np.int32)


def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """(a - a_zero_point) @ (b - b_zero_point) in int32 (ONNX MatMulInteger): a zero point of
    `a` per row ([M] for a 2-D a, [..., M, 1] otherwise), of `b` per column, or one each."""
    a = np.asarray(a)
    if a_zero_point is not None:
        a_zero_point = np.asarray(a_zero_point)
        if a.ndim == 2 and a_zero_point.ndim == 1 and a_zero_point.size == a.shape[0] > 1:
            a_zero_point = a_zero_point.reshape(-1, 1)
    return _wrap_int32(np.matmul(_shifted(a, a_zero_point), _shifted(b, b_zero_point)))


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, pads, strides, dilations,
                 group):
    """The convolution of (x - x_zero_point) by (w - w_zero_point) in int32 (ONNX ConvInteger):
    padding is the zero point, a zero point of `w` one per output channel or one."""
    from .ops import conv

    w = np.asarray(w)
    if w_zero_point is not None:
        w_zero_point = np.asarray(w_zero_point)
        if w_zero_point.ndim == 1 and w_zero_point.size == w.shape[0] > 1:
            w_zero_point = w_zero_point.reshape((-1,) + (1,) * (w.ndim - 1))
    out = conv(_shifted(x, x_zero_point), _shifted(w, w_zero_point), pads=pads, strides=strides,
               dilations=dilations, group=group)
    return _wrap_int32(out)
