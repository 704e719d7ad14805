"""Reference NumPy implementations of the ONNX operators covered by eqsat-fuse.

Every function implements ONNX opset-21 semantics, with attributes already
normalized by the importer (explicit values, no defaults, no ``auto_pad``,
non-negative axes unless a docstring says otherwise).  Optional inputs arrive
as ``None``.  Functions are pure: they never write into their inputs and return
a new array or a view.  Output dtypes follow ONNX exactly (NumPy 2 promotion is
never allowed to upcast, e.g. float32 stays float32); float16 math is carried
out in float32 and rounded back, as onnxruntime does on CPU.  Behaviour in
corner cases (integer division, casts, pooling windows, pads) follows
onnxruntime's CPU provider.
"""

from __future__ import annotations

import builtins
import math
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .arrays import _down, _ints, _is_float, _spatial_slices, _up, _work_dtype  # noqa: F401
from .pooling import (_pool_geometry, _pool_out_size, average_pool,  # noqa: F401
                      max_pool, max_pool_with_indices)

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _pair(x, w) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A contraction's operands: both as arrays, then both in x's working dtype."""
    x, w = np.asarray(x), np.asarray(w)
    xw = _up(x)
    return x, w, xw, w.astype(xw.dtype, copy=False)


def _unary_float(fn: Callable[[np.ndarray], np.ndarray], x) -> np.ndarray:
    """Apply fn in the working dtype of x and return x's dtype."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        return _down(fn(_up(x)), x.dtype)


def float_kernel(fn: Callable[..., np.ndarray], doc: str = "") -> Callable[..., np.ndarray]:
    """The kernel of an elementwise op computing `fn` of its float inputs (in their working
    dtype; the result in the first one's), attributes as keywords: an operator-table entry's
    `ref=float_kernel(np.sin)` (docs/adding-an-op.md) instead of a function here."""
    def kernel(*tensors, **attrs):
        arrays = [np.asarray(t) for t in tensors]
        with np.errstate(all="ignore"):
            return _down(fn(*[_up(a) for a in arrays], **attrs), arrays[0].dtype)
    kernel.__doc__ = doc or fn.__doc__
    return kernel


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero (C semantics); a, b same int dtype."""
    with np.errstate(all="ignore"):
        q = np.floor_divide(a, b)
        r = np.remainder(a, b)
    if np.issubdtype(q.dtype, np.signedinteger):
        fix = (r != 0) & ((a < 0) != (b < 0))
        q = q + fix.astype(q.dtype)
    return q


# --------------------------------------------------------------------------
# elementwise
# --------------------------------------------------------------------------

def relu(x):
    """max(x, 0) elementwise: 0 where x < 0, else x (NaN propagates, and -0 stays -0 as in
    onnxruntime, where np.maximum(-0, 0) would give +0)."""
    x = np.asarray(x)
    return np.where(x < 0, np.zeros((), x.dtype), x)


def leaky_relu(x, *, alpha):
    """x if x >= 0 else alpha * x."""
    def f(v):
        return np.where(v >= 0, v, v * v.dtype.type(alpha))
    return _unary_float(f, x)


def clip(x, min=None, max=None):  # noqa: A002 - ONNX input names
    """min(max(x, min), max); with min > max every value becomes max (as onnxruntime)."""
    x = np.asarray(x)
    y = x
    if min is not None:
        y = np.maximum(y, np.asarray(min).astype(x.dtype))
    if max is not None:
        y = np.minimum(y, np.asarray(max).astype(x.dtype))
    return y.copy() if y is x else y


def sigmoid(x):
    """1 / (1 + exp(-x)), computed without overflow for large |x|."""
    def f(v):
        e = np.exp(-np.abs(v))
        one = v.dtype.type(1)
        return np.where(v >= 0, one / (one + e), e / (one + e))
    return _unary_float(f, x)


def hard_sigmoid(x, *, alpha, beta):
    """max(0, min(1, alpha * x + beta))."""
    def f(v):
        t = v.dtype.type
        return np.clip(v * t(alpha) + t(beta), t(0), t(1))
    return _unary_float(f, x)


def hard_swish(x):
    """x * max(0, min(1, x / 6 + 1/2))."""
    def f(v):
        t = v.dtype.type
        return v * np.clip(v * t(1.0 / 6.0) + t(0.5), t(0), t(1))
    return _unary_float(f, x)


def tanh(x):
    """Hyperbolic tangent."""
    return _unary_float(np.tanh, x)


def _erf(v):
    """scipy.special.erf, imported on first use (SciPy's import is 0.18 s of every process's
    `import eqsat_fuse`, and most programs never evaluate an erf with NumPy)."""
    import scipy.special
    return scipy.special.erf(v)


def erf(x):
    """Gauss error function (scipy.special.erf)."""
    return _unary_float(_erf, x)


def gelu(x, *, approximate):
    """GELU: 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation if approximate == "tanh"."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu: unknown approximate={approximate!r}")

    def f(v):
        t = v.dtype.type
        if approximate == "tanh":
            inner = t(math.sqrt(2.0 / math.pi)) * (v + t(0.044715) * v * v * v)
            return t(0.5) * v * (t(1) + np.tanh(inner))
        return t(0.5) * v * (t(1) + _erf(v * t(1.0 / math.sqrt(2.0))))
    return _unary_float(f, x)


def _binary(fn, a, b):
    a = np.asarray(a)
    b = np.asarray(b)
    with np.errstate(all="ignore"):
        return _down(fn(_up(a), _up(b)), a.dtype)


def add(a, b):
    """a + b with multidirectional broadcasting."""
    return _binary(np.add, a, b)


def sub(a, b):
    """a - b with multidirectional broadcasting."""
    return _binary(np.subtract, a, b)


def mul(a, b):
    """a * b with multidirectional broadcasting."""
    return _binary(np.multiply, a, b)


def div(a, b):
    """a / b; integer inputs truncate toward zero like C (as onnxruntime)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if np.issubdtype(a.dtype, np.integer):
        return _trunc_div(a, b.astype(a.dtype, copy=False))
    return _binary(np.true_divide, a, b)


def pow(x, y):  # noqa: A001 - ONNX name
    """x ** y elementwise; result has x's dtype (integer x: double pow then truncation, as ORT)."""
    x = np.asarray(x)
    y = np.asarray(y)
    with np.errstate(all="ignore"):
        if _is_float(x.dtype):
            xw = _up(x)
            yw = y.astype(xw.dtype, copy=False)
            r = np.power(xw, yw)
            half = yw == 0.5
            if np.any(half):
                # NumPy computes x ** 0.5 as sqrt(x), which C's pow (and ONNX runtimes) do
                # not: pow(-inf, 0.5) is +inf and pow(-0, 0.5) is +0
                r = np.where(half, np.where(xw == -np.inf, np.inf, np.abs(r)), r)
            return _down(r, x.dtype)
        # integers: std::pow in double, then a truncating cast (onnxruntime)
        r = np.power(x.astype(np.float64), y.astype(np.float64))
        return np.trunc(r).astype(x.dtype)


def sqrt(x):
    """Square root."""
    return _unary_float(np.sqrt, x)


def exp(x):
    """Natural exponential."""
    return _unary_float(np.exp, x)


def log(x):
    """Natural logarithm."""
    return _unary_float(np.log, x)


def abs_(x):
    """|x| (integers wrap: the lowest value stays itself, as onnxruntime)."""
    return np.abs(np.asarray(x))


def neg(x):
    """-x (integers wrap)."""
    x = np.asarray(x)
    return np.negative(x)


def reciprocal(x):
    """1 / x."""
    return _unary_float(np.reciprocal, x)


def where(cond, x, y):
    """Elementwise select x where cond else y, with broadcasting."""
    x = np.asarray(x)
    return np.where(np.asarray(cond, dtype=bool), x, np.asarray(y).astype(x.dtype, copy=False))


def logical_and(a, b):
    """a and b elementwise on booleans, with broadcasting (ONNX And)."""
    return np.logical_and(np.asarray(a, dtype=bool), np.asarray(b, dtype=bool))


def logical_or(a, b):
    """a or b elementwise on booleans, with broadcasting (ONNX Or)."""
    return np.logical_or(np.asarray(a, dtype=bool), np.asarray(b, dtype=bool))


def logical_xor(a, b):
    """a != b elementwise on booleans, with broadcasting (ONNX Xor)."""
    return np.logical_xor(np.asarray(a, dtype=bool), np.asarray(b, dtype=bool))


def logical_not(x):
    """not x elementwise on booleans (ONNX Not)."""
    return np.logical_not(np.asarray(x, dtype=bool))


def cast(x, *, to):
    """x converted to dtype `to`; float->int truncates (NaN/inf/overflow -> INT_MIN, as ORT)."""
    x = np.asarray(x)
    dt = np.dtype(to)
    with np.errstate(all="ignore"):
        return x.astype(dt, copy=True)


def batch_normalization(x, scale, bias, mean, var, *, epsilon):
    """Inference batch norm over channel axis 1, (x - mean) / sqrt(var + eps) * scale + bias,
    computed as onnxruntime's kernel computes it: x * k + (bias - mean * k) with
    k = (1 / sqrt(var + eps)) * scale (x - mean alone can overflow where x * k does not)."""
    x = np.asarray(x)
    xw = _up(x)
    wd = xw.dtype
    bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)

    def p(v):
        return np.asarray(v).astype(wd, copy=False).reshape(bshape)
    k = (wd.type(1) / np.sqrt(p(var) + wd.type(epsilon))) * p(scale)
    y = xw * k + (p(bias) - p(mean) * k)
    return _down(y, x.dtype)


def identity(x):
    """x unchanged (returns a view)."""
    return np.asarray(x).view()


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

def conv(x, w, b=None, *, pads, strides, dilations, group):
    """N-d (1-D/2-D/3-D) grouped cross-correlation NC[D][H]W with weights M x C/group x k..."""
    x, w, xw, ww = _pair(x, w)
    out_dtype = x.dtype
    nd = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    ks = tuple(w.shape[2:])
    G = int(group)
    Cg, Mg = C // G, M // G
    if w.shape[1] != Cg or C % G or M % G:
        raise ValueError(f"Conv: bad shapes x{x.shape} w{w.shape} group={G}")
    pads = _ints(pads)
    strides = _ints(strides)
    dil = _ints(dilations)
    pb, pe = pads[:nd], pads[nd:]
    if any(pads):
        xw = np.pad(xw, [(0, 0), (0, 0)] + list(zip(pb, pe)))
    in_sp = xw.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(ks, dil)]
    out_sp = [(n - e) // s + 1 for n, e, s in zip(in_sp, eff, strides)]
    if any(o <= 0 for o in out_sp):
        raise ValueError(f"Conv: empty output {out_sp}")
    K = int(np.prod(ks))
    P = int(np.prod(out_sp))
    wg = ww.reshape(G, Mg, Cg, K)

    if K == 1 and all(s == 1 for s in strides):
        # 1x1 convolution: a plain (batched) matmul, no copy of x
        cols = xw.reshape(N, G, Cg, P)
        out = np.matmul(wg[..., 0], cols).reshape((N, M) + tuple(out_sp))
    else:
        # im2col through a strided window view, then one matmul per (n, group);
        # this is also the fastest NumPy route for depthwise (Cg == 1) kernels
        v = sliding_window_view(xw, eff, axis=tuple(range(2, 2 + nd)))
        sel = (builtins.slice(None), builtins.slice(None))
        sel += tuple(builtins.slice(0, (o - 1) * s + 1, s) for o, s in zip(out_sp, strides))
        sel += tuple(builtins.slice(None, None, d) for d in dil)
        v = v[sel]  # (N, C, *out_sp, *ks)
        perm = (0, 1) + tuple(range(2 + nd, 2 + 2 * nd)) + tuple(range(2, 2 + nd))
        cols = v.transpose(perm).reshape(N, G, Cg * K, P)
        out = np.matmul(wg.reshape(G, Mg, Cg * K), cols).reshape((N, M) + tuple(out_sp))
    if b is not None:
        out += np.asarray(b).astype(out.dtype, copy=False).reshape((1, M) + (1,) * nd)
    return _down(out, out_dtype)


def conv_transpose(x, w, b=None, *, pads, strides, dilations, group, output_padding):
    """N-d grouped transposed convolution (weights C x M/group x k...), pads already resolved."""
    x, w, xw, ww = _pair(x, w)
    out_dtype = x.dtype
    nd = x.ndim - 2
    N, C = x.shape[:2]
    in_sp = tuple(x.shape[2:])
    G = int(group)
    Cg = C // G
    Mg = w.shape[1]
    M = Mg * G
    ks = tuple(w.shape[2:])
    if w.shape[0] != C or C % G:
        raise ValueError(f"ConvTranspose: bad shapes x{x.shape} w{w.shape} group={G}")
    pads = _ints(pads)
    strides = _ints(strides)
    dil = _ints(dilations)
    opad = _ints(output_padding) if output_padding is not None else [0] * nd
    pb, pe = pads[:nd], pads[nd:]
    K = int(np.prod(ks))
    P = int(np.prod(in_sp))
    full = [s * (n - 1) + (k - 1) * d + 1 + op
            for n, k, d, s, op in zip(in_sp, ks, dil, strides, opad)]
    # weights (C, Mg, K) -> (G, K*Mg, Cg) so that one matmul gives every tap's columns
    wg = ww.reshape(G, Cg, Mg, K).transpose(0, 3, 2, 1).reshape(G, K * Mg, Cg)
    cols = np.matmul(wg, xw.reshape(N, G, Cg, P))  # (N, G, K*Mg, P)
    cols = cols.reshape((N, G, K, Mg) + in_sp)
    out = np.zeros((N, G, Mg) + tuple(full), dtype=xw.dtype)
    for t, tap in enumerate(np.ndindex(*ks)):
        sl = _spatial_slices(
            [i * d for i, d in zip(tap, dil)],
            [i * d + (n - 1) * s + 1 for i, d, n, s in zip(tap, dil, in_sp, strides)],
            strides)
        out[(builtins.slice(None),) * 3 + sl] += cols[:, :, t]
    out = out.reshape((N, M) + tuple(full))
    # apply pads: positive pads crop, negative pads (importer-resolved output_shape) add zeros
    if any(p < 0 for p in pads):
        out = np.pad(out, [(0, 0), (0, 0)] + [(max(-a, 0), max(-e, 0)) for a, e in zip(pb, pe)])
        pb = [max(a, 0) for a in pb]
        pe = [max(e, 0) for e in pe]
    crop = tuple(builtins.slice(a, n - e) for a, e, n in zip(pb, pe, out.shape[2:]))
    out = out[(builtins.slice(None),) * 2 + crop]
    if b is not None:
        out = out + np.asarray(b).astype(out.dtype, copy=False).reshape((1, M) + (1,) * nd)
    return _down(out, out_dtype)


# --------------------------------------------------------------------------
# matmul family, normalizations, reductions
# --------------------------------------------------------------------------

def matmul(a, b):
    """Matrix product with numpy.matmul semantics (1-D promotion, batch broadcasting)."""
    a = np.asarray(a)
    b = np.asarray(b)
    return _down(np.matmul(_up(a), _up(b).astype(_work_dtype(a.dtype), copy=False)), a.dtype)


def gemm(a, b, c=None, *, alpha, beta, trans_a, trans_b):
    """alpha * op(A) @ op(B) + beta * C, C broadcast (unused if beta == 0, as ORT)."""
    a, b, aw, bw = _pair(a, b)
    out_dtype = a.dtype
    if trans_a:
        aw = aw.T
    if trans_b:
        bw = bw.T
    y = np.matmul(aw, bw)
    if np.issubdtype(y.dtype, np.integer):
        # integral alpha/beta keep exact integer math; otherwise go through float64
        def scale(v, s):
            if float(s) == int(s):
                return v * y.dtype.type(int(s)) if s != 1 else v
            return np.trunc(v.astype(np.float64) * float(s)).astype(y.dtype)
    else:
        def scale(v, s):
            return v * v.dtype.type(s) if s != 1 else v
    y = scale(y, alpha)
    if c is not None and beta != 0:
        cw = np.broadcast_to(np.asarray(c).astype(y.dtype, copy=False), y.shape)
        y = y + scale(cw, beta)
    return _down(y, out_dtype)


def softmax(x, *, axis):
    """exp(x - max) / sum(exp(x - max)) along one axis (opset-13 semantics)."""
    x = np.asarray(x)
    xw = _up(x)
    with np.errstate(all="ignore"):
        m = np.max(xw, axis=axis, keepdims=True)
        e = np.exp(xw - m)
        y = e / np.sum(e, axis=axis, keepdims=True)
    return _down(y, x.dtype)


# query rows per block of `fused_attention`: its scores take at most this many rows at a time
ATTENTION_BLOCK_ROWS = 256


def fused_attention(q, kt, v, mask=None, scale=None, *, how):
    """softmax(q @ kt (* or / scale) (+ mask), last axis) @ v, computed as those ops compute
    it, a block of query rows at a time: the scores of a long sequence never exist whole.
    q [..., Sq, D], kt [..., D, Sk], v [..., Sk, Dv], batch dims and mask broadcast."""
    q = np.asarray(q)
    rows = q.shape[-2]
    blocks = []
    for r0 in range(0, max(rows, 1), ATTENTION_BLOCK_ROWS):
        qb = q[..., r0:r0 + ATTENTION_BLOCK_ROWS, :]
        s = matmul(qb, kt)
        if how == "mul":
            s = mul(s, scale)
        elif how == "div":
            s = div(s, scale)
        elif how != "none":
            raise ValueError(f"FusedAttention: unknown how={how!r}")
        if mask is not None:
            m = np.asarray(mask)
            if m.ndim >= 2 and m.shape[-2] != 1:
                m = m[..., r0:r0 + ATTENTION_BLOCK_ROWS, :]
            s = add(s, m)
        blocks.append(matmul(softmax(s, axis=-1), v))
    return np.concatenate(blocks, axis=-2) if len(blocks) > 1 else blocks[0]


def layer_normalization(x, scale, bias=None, *, axis, epsilon):
    """(x - mean) / sqrt(var + eps) * scale + bias over axes axis..rank-1 (fp16 in fp32)."""
    x = np.asarray(x)
    if axis < 0:
        axis += x.ndim
    xw = _up(x)
    axes = tuple(range(axis, x.ndim))
    mean = np.mean(xw, axis=axes, keepdims=True)
    d = xw - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + xw.dtype.type(epsilon))
    y = y * np.asarray(scale).astype(xw.dtype, copy=False)
    if bias is not None:
        y = y + np.asarray(bias).astype(xw.dtype, copy=False)
    return _down(y, x.dtype)


def reduce_sum(x, *, axes, keepdims):
    """Sum over `axes` in the input dtype (no int32 -> int64 promotion)."""
    x = np.asarray(x)
    xw = _up(x)
    y = np.sum(xw, axis=tuple(int(a) for a in axes), keepdims=bool(keepdims), dtype=xw.dtype)
    return _down(y, x.dtype)


def _reduce_extreme(fn, x, axes, keepdims, largest: bool):
    x = np.asarray(x)
    if x.dtype == np.bool_:
        initial = not largest
    elif np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        initial = info.min if largest else info.max
    else:
        initial = -np.inf if largest else np.inf
    return fn(x, axis=tuple(int(a) for a in axes), keepdims=bool(keepdims), initial=initial)


def reduce_max(x, *, axes, keepdims):
    """Largest element over `axes` (NaN propagates; over no elements: -inf, or the integer
    dtype's lowest, as the spec says)."""
    return _reduce_extreme(np.max, x, axes, keepdims, True)


def reduce_min(x, *, axes, keepdims):
    """Smallest element over `axes` (over no elements: +inf, or the integer dtype's highest)."""
    return _reduce_extreme(np.min, x, axes, keepdims, False)


def reduce_mean(x, *, axes, keepdims):
    """Mean over `axes`; integer means truncate toward zero (sum / count in-type, as ORT)."""
    x = np.asarray(x)
    axes = tuple(int(a) for a in axes)
    count = int(np.prod([x.shape[a] for a in axes]))
    if np.issubdtype(x.dtype, np.integer):
        s = reduce_sum(x, axes=axes, keepdims=keepdims)
        return _trunc_div(s, np.asarray(count, dtype=x.dtype))
    xw = _up(x)
    with np.errstate(all="ignore"):
        y = np.sum(xw, axis=axes, keepdims=bool(keepdims), dtype=xw.dtype) / xw.dtype.type(count)
    return _down(y, x.dtype)


# --------------------------------------------------------------------------
# pooling (the windowed pools are in pooling.py)
# --------------------------------------------------------------------------

def global_average_pool(x):
    """Mean over all spatial axes, keeping them as size-1 dims."""
    x = np.asarray(x)
    xw = _up(x)
    y = np.mean(xw, axis=tuple(range(2, x.ndim)), keepdims=True, dtype=xw.dtype)
    return _down(y, x.dtype)


def lrn(x, *, size, alpha, beta, bias):
    """Local response norm across channels: x / (bias + alpha/size * sum of squares)^beta."""
    x = np.asarray(x)
    xw = _up(x)
    t = xw.dtype.type
    C = x.shape[1]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    sq = xw * xw
    sqp = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    ss = np.zeros_like(sq)
    for i in range(size):
        ss += sqp[:, i:i + C]
    y = xw / (t(bias) + t(alpha / size) * ss) ** t(beta)
    return _down(y, x.dtype)


# --------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------

def transpose(x, *, perm):
    """Axis permutation (view)."""
    return np.transpose(np.asarray(x), tuple(int(p) for p in perm))


def reshape(x, shape, *, allowzero):
    """Reshape; 0 copies the input dim (unless allowzero) and one -1 is inferred."""
    x = np.asarray(x)
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    if dims.count(-1) > 1:
        raise ValueError("Reshape: more than one -1")
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        if known == 0:
            if x.size != 0:
                raise ValueError("Reshape: cannot infer -1 with a zero dimension")
            inferred = 0
        else:
            if x.size % known:
                raise ValueError(f"Reshape: cannot reshape {x.shape} to {dims}")
            inferred = x.size // known
        dims[dims.index(-1)] = inferred
    return x.reshape(dims)


def flatten(x, *, axis):
    """2-D view (prod(shape[:axis]), prod(shape[axis:]))."""
    x = np.asarray(x)
    if axis < 0:
        axis += x.ndim
    return x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))


def concat(xs, *, axis):
    """Concatenation along axis."""
    xs = [np.asarray(v) for v in xs]
    return np.concatenate(xs, axis=axis)


def split(x, split, *, axis, num_outputs=None):  # noqa: A002
    """Split along axis by sizes, or into num_outputs chunks of ceil(n/num) (last smaller)."""
    x = np.asarray(x)
    if axis < 0:
        axis += x.ndim
    n = x.shape[axis]
    if split is not None:
        sizes = _ints(split)
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise ValueError(f"Split: sizes {sizes} do not sum to {n}")
    else:
        if not num_outputs or num_outputs < 1:
            raise ValueError("Split: need split or num_outputs")
        chunk = -(-n // num_outputs)
        last = n - chunk * (num_outputs - 1)
        if last < 0:
            raise ValueError(f"Split: num_outputs={num_outputs} gives a negative final split")
        sizes = [chunk] * (num_outputs - 1) + [last]
    bounds = np.cumsum([0] + sizes)
    idx = [builtins.slice(None)] * x.ndim
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        idx[axis] = builtins.slice(int(lo), int(hi))
        outs.append(x[tuple(idx)])
    return outs


_END_SENTINELS = (np.iinfo(np.int32).max, np.iinfo(np.int64).max)


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001 - ONNX name
    """ONNX Slice as a view (ORT clamping: an INT_MAX end runs to the edge in step direction)."""
    x = np.asarray(x)
    starts = _ints(starts)
    ends = _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    idx = [builtins.slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if a < 0:
            a += x.ndim
        n = x.shape[a]
        if st == 0:
            raise ValueError("Slice: step must not be 0")
        if s < 0:
            s += n
        if e in _END_SENTINELS:
            # onnxruntime: INT32_MAX / INT64_MAX end means "to the end in the step's direction"
            e = n if st > 0 else -1
        elif e < 0:
            e += n
        if st > 0:
            s = builtins.min(builtins.max(s, 0), n)
            e = builtins.min(builtins.max(e, 0), n)
            idx[a] = builtins.slice(s, e, st)
        elif n == 0:
            idx[a] = builtins.slice(0, 0)
        else:
            s = builtins.min(builtins.max(s, 0), n - 1)
            e = builtins.min(builtins.max(e, -1), n - 1)
            # e == -1 means "one before index 0": Python needs None there
            idx[a] = builtins.slice(s, None if e < 0 else e, st)
    return x[tuple(idx)]


def gather(data, indices, *, axis):
    """data taken along axis at indices (negative indices count from the end)."""
    data = np.asarray(data)
    indices = np.asarray(indices).astype(np.int64, copy=False)
    if axis < 0:
        axis += data.ndim
    n = data.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"Gather: index out of range for dim {n}")
    return np.take(data, indices, axis=axis)


def _norm_axes(axes, rank):
    out = [a + rank if a < 0 else a for a in _ints(axes)]
    if len(set(out)) != len(out) or any(not 0 <= a < rank for a in out):
        raise ValueError(f"bad axes {axes} for rank {rank}")
    return tuple(sorted(out))


def unsqueeze(x, axes):
    """Insert size-1 dims at `axes` (relative to the output rank, may be negative)."""
    x = np.asarray(x)
    axes = _norm_axes(axes, x.ndim + len(_ints(axes)))
    return x.reshape(tuple(_unsq_shape(x.shape, axes)))


def _unsq_shape(shape, axes):
    it = iter(shape)
    return [1 if i in axes else next(it) for i in range(len(shape) + len(axes))]


def squeeze(x, axes=None):
    """Remove size-1 dims at `axes` (may be negative), or all size-1 dims if axes is None."""
    x = np.asarray(x)
    if axes is None:
        return np.squeeze(x)
    axes = _norm_axes(axes, x.ndim)
    if any(x.shape[a] != 1 for a in axes):
        raise ValueError(f"Squeeze: dims {axes} of {x.shape} are not all 1")
    return np.squeeze(x, axis=axes)


def expand(x, shape):
    """Bidirectional broadcast of x with `shape` (read-only view)."""
    x = np.asarray(x)
    out = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return np.broadcast_to(x, out)


def pad(x, pads, constant_value=None, axes=None, *, mode):
    """Pad (negative pads crop first, as ORT); modes constant/reflect/edge/wrap."""
    x = np.asarray(x)
    r = x.ndim
    pads = _ints(pads)
    ax = list(range(r)) if axes is None else [a + r if a < 0 else a for a in _ints(axes)]
    k = len(ax)
    if len(pads) != 2 * k:
        raise ValueError(f"Pad: {len(pads)} pads for {k} axes")
    before = [0] * r
    after = [0] * r
    for i, a in enumerate(ax):
        before[a] = pads[i]
        after[a] = pads[k + i]
    # negative pads crop
    crop = tuple(builtins.slice(builtins.max(-b, 0), n - builtins.max(-e, 0))
                 for b, e, n in zip(before, after, x.shape))
    xc = x[crop]
    width = [(builtins.max(b, 0), builtins.max(e, 0)) for b, e in zip(before, after)]
    if not any(b or e for b, e in width):
        return xc.copy()
    if mode == "constant":
        cv = 0 if constant_value is None else np.asarray(constant_value).reshape(())
        return np.pad(xc, width, mode="constant",
                      constant_values=np.asarray(cv).astype(x.dtype))
    if mode == "reflect":
        for (b, e), n in zip(width, xc.shape):
            if (b or e) and (n < 2 or b > n - 1 or e > n - 1):
                raise ValueError(f"Pad reflect: pads {(b, e)} too large for axis length {n}")
        return np.pad(xc, width, mode="reflect")
    if mode == "edge":
        if any((b or e) and n == 0 for (b, e), n in zip(width, xc.shape)):
            raise ValueError("Pad edge: cannot pad an empty axis")
        return np.pad(xc, width, mode="edge")
    if mode == "wrap":
        if any((b or e) and n == 0 for (b, e), n in zip(width, xc.shape)):
            raise ValueError("Pad wrap: cannot pad an empty axis")
        return np.pad(xc, width, mode="wrap")
    raise ValueError(f"Pad: unknown mode {mode!r}")


def shape(x, *, start=0, end=None):
    """int64 1-D array x.shape[start:end] (negative start/end count from the rank, clamped)."""
    x = np.asarray(x)
    return np.array(x.shape[start:end], dtype=np.int64)


# --------------------------------------------------------------------------
# op table
# --------------------------------------------------------------------------

OPS: dict[str, Callable] = {
    "Relu": relu,
    "LeakyRelu": leaky_relu,
    "Clip": clip,
    "Sigmoid": sigmoid,
    "HardSigmoid": hard_sigmoid,
    "HardSwish": hard_swish,
    "Tanh": tanh,
    "Erf": erf,
    "Gelu": gelu,
    "Add": add,
    "Sub": sub,
    "Mul": mul,
    "Div": div,
    "Pow": pow,
    "Sqrt": sqrt,
    "Exp": exp,
    "Log": log,
    "Neg": neg,
    "Abs": abs_,
    "Reciprocal": reciprocal,
    "Where": where,
    "Cast": cast,
    "BatchNormalization": batch_normalization,
    "Identity": identity,
    "Dropout": identity,
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "MatMul": matmul,
    "Gemm": gemm,
    "Softmax": softmax,
    "LayerNormalization": layer_normalization,
    "ReduceMean": reduce_mean,
    "ReduceSum": reduce_sum,
    "ReduceMax": reduce_max,
    "ReduceMin": reduce_min,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
    "LRN": lrn,
    "Transpose": transpose,
    "Reshape": reshape,
    "Flatten": flatten,
    "Concat": concat,
    "Split": split,
    "Slice": slice,
    "Gather": gather,
    "Unsqueeze": unsqueeze,
    "Squeeze": squeeze,
    "Expand": expand,
    "Pad": pad,
    "Shape": shape,
}
