"""N-d pooling reference kernels: MaxPool (with its Indices output too) and AveragePool, and
their window geometry, following onnxruntime's CPU provider (see `ops` for the conventions)."""

from __future__ import annotations

import builtins
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .arrays import _down, _ints, _is_float, _spatial_slices, _up


def _pool_out_size(n, k, pb, pe, s, d, ceil_mode):
    """Output length of one pooled axis, following onnxruntime (incl. the ceil-mode start rule)."""
    num = n + pb + pe - ((k - 1) * d + 1)
    if ceil_mode:
        out = -(-num // s) + 1
        # the last window must start inside the input or the left padding
        if (out - 1) * s >= n + pb:
            out -= 1
    else:
        out = num // s + 1
    return out


def _pool_geometry(x, kernel_shape, pads, strides, dilations, ceil_mode):
    nd = x.ndim - 2
    ks = _ints(kernel_shape)
    pads = _ints(pads)
    st = _ints(strides)
    dil = _ints(dilations)
    pb, pe = pads[:nd], pads[nd:]
    out_sp = [_pool_out_size(n, k, a, e, s, d, ceil_mode)
              for n, k, a, e, s, d in zip(x.shape[2:], ks, pb, pe, st, dil)]
    if any(o < 0 for o in out_sp):
        raise ValueError(f"pool: negative output size {out_sp}")
    # extra cells needed past the right pad by ceil-mode windows
    extra = [builtins.max(0, (o - 1) * s + (k - 1) * d + 1 - (n + a + e))
             for o, s, k, d, n, a, e in zip(out_sp, st, ks, dil, x.shape[2:], pb, pe)]
    return nd, ks, pb, pe, st, dil, out_sp, extra


# Above this many taps a window is reduced in one call over a strided window view (a Python
# loop over the taps of a 320x320 window took 0.4 s); below it, a loop of whole-tensor ops.
_MANY_TAPS = 32
# Large windows and at most this many outputs: reduced window by window, unpadded.
_FEW_WINDOWS = 64


def _window_reduce(xp, ks, dil, out_sp, st, reduce):
    """`reduce` (np.add / np.maximum) over every pooling window of padded `xp`, in one call."""
    nd = len(ks)
    eff = [(k - 1) * d + 1 for k, d in zip(ks, dil)]
    v = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    sel = (builtins.slice(None),) * 2
    sel += tuple(builtins.slice(0, (o - 1) * s + 1, s) for o, s in zip(out_sp, st))
    sel += tuple(builtins.slice(None, None, d) for d in dil)
    return reduce.reduce(v[sel], axis=tuple(range(2 + nd, 2 + 2 * nd)))


def _few_large_windows(ks, dil, out_sp) -> bool:
    """Whether a pool has few outputs of large undilated windows (see `_few_windows`)."""
    return math.prod(ks) > _MANY_TAPS and math.prod(out_sp) <= _FEW_WINDOWS and \
        all(d == 1 for d in dil)


def _few_windows(x, ks, pb, st, out_sp, reduce, empty):
    """`reduce` (np.add / np.maximum) over the input's own cells of every window, window by
    window with no padded copy (`empty` where a window holds none): a window far larger than
    the input (a global pool written as AveragePool 320x320 over 2x2 in ceil mode) would
    otherwise pad the input to its size."""
    out = np.empty(x.shape[:2] + tuple(out_sp), dtype=x.dtype)
    axes = tuple(range(2, x.ndim))
    for idx in np.ndindex(*out_sp):
        window = tuple(builtins.slice(builtins.max(o * s - a, 0), builtins.min(o * s - a + k, n))
                       for o, k, a, s, n in zip(idx, ks, pb, st, x.shape[2:]))
        cells = x[(builtins.slice(None),) * 2 + window]
        out[(builtins.slice(None),) * 2 + idx] = reduce.reduce(cells, axis=axes) \
            if cells.size else empty
    return out


def _pool_taps(ks, dil, out_sp, st):
    """Yield, for every kernel tap, the index selecting that tap of every window."""
    for tap in np.ndindex(*ks):
        yield (builtins.slice(None),) * 2 + _spatial_slices(
            [i * d for i, d in zip(tap, dil)],
            [i * d + (o - 1) * s + 1 for i, d, o, s in zip(tap, dil, out_sp, st)],
            st)


def max_pool(x, *, kernel_shape, pads, strides, dilations, ceil_mode):
    """N-d max pooling; pad cells never win (-inf); all-pad windows give dtype lowest, as ORT.

    A NaN cell counts as the dtype's lowest finite value (`_without_nan`): NaN never wins
    against a number, and a window of NaN (and padding) only gives lowest. The spec is silent
    on NaN; this is the "NaN ignored" of onnxruntime's kernels (docs/reliability.md).
    """
    x = _without_nan(np.asarray(x))
    nd, ks, pb, pe, st, dil, out_sp, extra = _pool_geometry(
        x, kernel_shape, pads, strides, dilations, ceil_mode)
    if 0 in out_sp:             # a window larger than the padded input: no output, as ORT
        return np.empty(x.shape[:2] + tuple(out_sp), dtype=x.dtype)
    if _few_large_windows(ks, dil, out_sp):     # a window of padding only gives lowest, as ORT
        lowest = np.finfo(x.dtype).min if _is_float(x.dtype) else np.iinfo(x.dtype).min
        return _few_windows(x, ks, pb, st, out_sp, np.maximum, lowest)
    if _is_float(x.dtype):
        fill = -np.inf
    else:
        fill = np.iinfo(x.dtype).min
    xp = np.pad(x, [(0, 0), (0, 0)] + [(a, e + c) for a, e, c in zip(pb, pe, extra)],
                constant_values=np.asarray(fill).astype(x.dtype))
    out = None
    if math.prod(ks) > _MANY_TAPS:
        out = _window_reduce(xp, ks, dil, out_sp, st, np.maximum)
    else:
        for sel in _pool_taps(ks, dil, out_sp, st):
            out = xp[sel].copy() if out is None else np.maximum(out, xp[sel], out=out)
    if _is_float(x.dtype) and any(d > 1 for d in dil):
        # with dilation a window can hold padding only; onnxruntime yields the dtype's
        # lowest finite value there (its running max starts at lowest()), not -inf
        empty = np.zeros((), dtype=bool)
        for n, k, a, e, s, d, o in zip(x.shape[2:], ks, pb, pe, st, dil, out_sp):
            empty = np.logical_or.outer(empty, _axis_counts(n, k, a, e, s, d, o, 0, n) == 0)
        if empty.any():
            out[..., empty] = np.finfo(x.dtype).min
    return out


def _lowest(dtype) -> np.generic:
    """The dtype's lowest value: a running max's start in onnxruntime's pools."""
    info = np.finfo(dtype) if _is_float(dtype) else np.iinfo(dtype)
    return np.asarray(info.min, dtype=dtype)[()]


def _without_nan(x: np.ndarray) -> np.ndarray:
    """x with each NaN cell replaced by the dtype's lowest finite value (x itself if none): the
    max pools' NaN rule, the same in the Numba backend's `gen_pool`."""
    if not _is_float(x.dtype):
        return x
    nan = np.isnan(x)
    return np.where(nan, _lowest(x.dtype), x) if nan.any() else x


def max_pool_with_indices(x, *, kernel_shape, pads, strides, dilations, ceil_mode,
                          storage_order=0):
    """MaxPool with its Indices output: (values, indices), the values those of `max_pool`.

    An index is flat over the whole input (N, C and the spatial axes), the spatial part in
    row-major order (storage_order 0) or column-major (1), as onnxruntime writes it. On ties
    the first cell of the window in row-major order wins; NaN counts as the lowest value, as
    in `max_pool`. A window of padding only (reachable with dilation) gives lowest and the
    index of its plane's first cell.
    """
    x = _without_nan(np.asarray(x))
    nd, ks, pb, pe, st, dil, out_sp, extra = _pool_geometry(
        x, kernel_shape, pads, strides, dilations, ceil_mode)
    spatial = x.shape[2:]
    plane = math.prod(spatial)
    order = "F" if int(storage_order) else "C"
    where = np.arange(plane, dtype=np.int64).reshape(spatial, order=order)
    widths = [(0, 0), (0, 0)] + [(a, e + c) for a, e, c in zip(pb, pe, extra)]
    xp = np.pad(x, widths)
    inside = np.pad(np.ones(x.shape, dtype=bool), widths)
    wp = np.pad(np.broadcast_to(where, x.shape), widths)
    best = np.full(x.shape[:2] + tuple(out_sp), _lowest(x.dtype), dtype=x.dtype)
    index = np.zeros(best.shape, dtype=np.int64)
    seen = np.zeros(best.shape, dtype=bool)
    for sel in _pool_taps(ks, dil, out_sp, st):
        value, real = xp[sel], inside[sel]
        wins = real & (~seen | (value > best))
        best = np.where(wins, value, best)
        index = np.where(wins, wp[sel], index)
        seen |= real
    planes = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2])
    index += (planes * plane).reshape(x.shape[:2] + (1,) * nd)
    return best, index


def _axis_counts(n, k, a, e, s, d, out, lo, hi):
    """Per output position, the number of window taps whose input coordinate is in [lo, hi)."""
    starts = np.arange(out, dtype=np.int64)[:, None] * s - a
    pos = starts + np.arange(k, dtype=np.int64)[None, :] * d
    return np.count_nonzero((pos >= lo) & (pos < hi), axis=1)


def average_pool(x, *, kernel_shape, pads, strides, dilations, ceil_mode, count_include_pad):
    """N-d average pooling; divisor counts pads iff count_include_pad, never ceil-mode overhang."""
    x = np.asarray(x)
    nd, ks, pb, pe, st, dil, out_sp, extra = _pool_geometry(
        x, kernel_shape, pads, strides, dilations, ceil_mode)
    if 0 in out_sp:
        return np.empty(x.shape[:2] + tuple(out_sp), dtype=x.dtype)
    xw = _up(x)
    if _few_large_windows(ks, dil, out_sp):
        out = _few_windows(xw, ks, pb, st, out_sp, np.add, 0)
    else:
        xp = np.pad(xw, [(0, 0), (0, 0)] + [(a, e + c) for a, e, c in zip(pb, pe, extra)])
        if math.prod(ks) > _MANY_TAPS:
            out = _window_reduce(xp, ks, dil, out_sp, st, np.add)
        else:
            out = np.zeros(x.shape[:2] + tuple(out_sp), dtype=xw.dtype)
            for sel in _pool_taps(ks, dil, out_sp, st):
                out += xp[sel]
    count = np.ones((), dtype=np.int64)
    for n, k, a, e, s, d, o in zip(x.shape[2:], ks, pb, pe, st, dil, out_sp):
        lo, hi = (-a, n + e) if count_include_pad else (0, n)
        c = _axis_counts(n, k, a, e, s, d, o, lo, hi)
        count = np.multiply.outer(count, c)
    # a window made only of padding (reachable with dilation) sums to 0; ORT outputs 0 there
    count = np.maximum(count, 1)
    out /= count.astype(xw.dtype)
    return _down(out, x.dtype)
