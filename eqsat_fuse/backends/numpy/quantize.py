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
