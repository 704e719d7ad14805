"""The array helpers the NumPy reference kernels share: working dtypes (float16 computed in
float32), conversions back, and int lists and slices read from attributes."""

from __future__ import annotations

import builtins

import numpy as np


def _work_dtype(dt: np.dtype) -> np.dtype:
    """Dtype used for arithmetic: float16 is computed in float32."""
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt == np.float16 else dt


def _up(x: np.ndarray) -> np.ndarray:
    """x converted to its working dtype (no copy when already there)."""
    x = np.asarray(x)
    return x.astype(_work_dtype(x.dtype), copy=False)


def _down(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """y converted back to the ONNX output dtype dt."""
    return np.asarray(y).astype(dt, copy=False)


def _is_float(dt: np.dtype) -> bool:
    return np.issubdtype(dt, np.floating)


def _ints(v) -> list[int]:
    """A 1-D int array / sequence as a list of Python ints."""
    return [int(i) for i in np.asarray(v).reshape(-1)]


def _spatial_slices(starts, stops, steps):
    return tuple(builtins.slice(a, b, s) for a, b, s in zip(starts, stops, steps))
