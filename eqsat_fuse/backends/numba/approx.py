"""Branch-free float32 approximations of exp, tanh, erf, sigmoid and GELU for Numba loops.

libm's `expf`/`tanhf`/`erff` are scalar calls inside a Numba loop and stop it from vectorizing
(about 10x slower than a memory copy, see shared/NOTES-kernels.md). These are polynomials and
selects only, so LLVM vectorizes the loops that call them (AVX-512 on this machine).

Maximum errors over float32 inputs (measured against NumPy/SciPy in float64, checked by
tests/test_approx.py with hypothesis; ulp = 2**-23 relative):

| function      | max relative error          | max absolute error | notes                      |
|---------------|-----------------------------|--------------------|----------------------------|
| `exp_f32`     | 2e-7 (normal results)       | -                  | 0 below -87.33 (results    |
|               |                             |                    | that would be subnormal)   |
| `tanh_f32`    | 5e-7                        | 3e-7               | exactly +-1 beyond 7.9     |
| `sigmoid_f32` | 6e-7                        | 1e-7               | 0 below -87 (true: < 2e-38)|
| `erf_f32`     | 5e-7 (|x| >= 1e-3)          | 5e-7               | exactly +-1 beyond 3.83    |
| `gelu_f32`    | -                           | 3e-7 * max(1,|x|)  | erf form                   |
| `gelu_tanh_f32` | -                         | 3e-7 * max(1,|x|)  | tanh form                  |

NaN propagates through every function; +-inf give the limits. tanh and erf carry no NaN
select: their input clamps (Numba's max/min) return a NaN first argument unchanged. The
constants are those of Cephes (expf) and of the float32 rational tanh and erf used by
Eigen/XLA.

`f16_to_f32` / `f32_to_f16` convert float16 values held as uint16 (Numba has no float16 type)
with the hardware conversion instructions (F16C), for kernels that store activations in
float16 and compute in float32.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["exp_f32", "tanh_f32", "sigmoid_f32", "erf_f32", "gelu_f32", "gelu_tanh_f32",
           "f16_to_f32", "f32_to_f16", "MAX_REL_ERROR", "MAX_ABS_ERROR"]

# The documented bounds (the tests check them).
MAX_REL_ERROR = {"exp": 2e-7, "tanh": 5e-7, "sigmoid": 6e-7, "erf": 5e-7}
MAX_ABS_ERROR = {"tanh": 3e-7, "sigmoid": 1e-7, "erf": 5e-7, "gelu": 3e-7, "gelu_tanh": 3e-7}


@intrinsic
def _bits_add_f32(typingctx, value, bits):
    """The float32 whose bit pattern is value's plus an int32 (scales by 2**k for k << 23)."""
    sig = types.float32(types.float32, types.int32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        total = builder.add(builder.bitcast(args[0], i32), args[1])
        return builder.bitcast(total, ir.FloatType())

    return sig, codegen


@intrinsic
def f16_to_f32(typingctx, bits):
    """A float16 held as uint16 -> float32 (exact)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        value = args[0]
        if value.type.width != 16:
            value = builder.trunc(value, ir.IntType(16))
        return builder.fpext(builder.bitcast(value, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16(typingctx, value):
    """float32 -> the nearest float16 (round to nearest even), as uint16 bits."""
    sig = types.uint16(value)

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type != ir.FloatType():
            v = builder.fptrunc(v, ir.FloatType())
        return builder.bitcast(builder.fptrunc(v, ir.HalfType()), ir.IntType(16))

    return sig, codegen


_F = np.float32
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
_EXP_HI = _F(88.7228317)
_EXP_LO = _F(-87.3365447)


@njit(inline="always", cache=True, error_model="numpy")
def _exp_scaled(n, r):
    """2**n * e**r for r in [-ln2/2, ln2/2] and n in [-126, 128] (a float holding an integer).

    2**n is applied by adding n to p(r)'s exponent bits: p(r) lies in [0.7, 1.42], and at both
    ends of n's range the exponent stays normal (n = 128 only with r < 0, so p < 1; n = -126
    only with r >= 0, so p >= 1).
    """
    p = _F(1.9875691500e-4)
    p = p * r + _F(1.3981999507e-3)
    p = p * r + _F(8.3334519073e-3)
    p = p * r + _F(4.1665795894e-2)
    p = p * r + _F(1.6666665459e-1)
    p = p * r + _F(5.0000001201e-1)
    p = p * r * r + r + _F(1.0)
    return _bits_add_f32(p, np.int32(n) << np.int32(23))


@njit(inline="always", cache=True, error_model="numpy")
def _exp_reduce(xc):
    """(n, r) with xc = n ln 2 + r: n = round(xc / ln 2), r in [-ln2/2, ln2/2] (ln 2 in two
    parts, so r keeps float32 precision)."""
    n = np.floor(xc * _LOG2E + _F(0.5))
    r = xc - n * _LN2_HI
    return n, r - n * _LN2_LO


@njit(inline="always", cache=True, error_model="numpy")
def _exp_core(xc):
    """e**xc for xc already in [_EXP_LO, _EXP_HI] (not NaN): 2**n * p(r), n = round(xc/ln 2)."""
    n, r = _exp_reduce(xc)
    # at n = -126 rounding can leave r a hair below 0 and the result below 2**-126: a
    # subnormal, which costs a microcode assist per element (masked attention scores all land
    # here). r >= 0 there keeps every intermediate normal (error < 1 ulp).
    r = max(r, _F(0.0)) if n < _F(-125.5) else r
    return _exp_scaled(n, r)


@njit(inline="always", cache=True, error_model="numpy")
def _exp_normal(xc):
    """e**xc for xc in [-86.5, _EXP_HI] (not NaN): n >= -125, so no guard against subnormals
    is needed (four vector instructions fewer than _exp_core)."""
    n, r = _exp_reduce(xc)
    return _exp_scaled(n, r)


@njit(inline="always", cache=True, error_model="numpy")
def exp_f32(x):
    """e**x in float32 (Cephes expf: range reduction by ln 2, degree-6 polynomial)."""
    x = _F(x)
    y = _exp_core(min(max(x, _EXP_LO), _EXP_HI))
    y = _F(0.0) if x < _EXP_LO else y
    y = _F(np.inf) if x > _EXP_HI else y
    return x if x != x else y


_TANH_CLAMP = _F(7.90531110763549805)


@njit(inline="always", cache=True, error_model="numpy")
def tanh_f32(x):
    """tanh(x) in float32: rational x P(x^2) / Q(x^2) on [-7.9, 7.9] (Eigen's), +-1 beyond."""
    x = _F(x)
    xc = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    z = xc * xc
    p = _F(-2.76076847742355e-16)
    p = p * z + _F(2.00018790482477e-13)
    p = p * z + _F(-8.60467152213735e-11)
    p = p * z + _F(5.12229709037114e-08)
    p = p * z + _F(1.48572235717979e-05)
    p = p * z + _F(6.37261928875436e-04)
    p = p * z + _F(4.89352455891786e-03)
    q = _F(1.19825839466702e-06)
    q = q * z + _F(1.18534705686654e-04)
    q = q * z + _F(2.26843463243900e-03)
    q = q * z + _F(4.89352518554385e-03)
    y = xc * p / q
    # exact +-1 beyond the clamp (with fused multiply-adds the rational is 4 ulp short there)
    y = _F(1.0) if x >= _TANH_CLAMP else y
    return _F(-1.0) if x <= -_TANH_CLAMP else y


_SIG_LO = _F(-87.0)       # below, sigmoid is < 1.7e-38: 0 (float32's normals end at 1.2e-38)
_SIG_HI = _F(86.5)        # above, e**-x < 2.6e-38 and sigmoid rounds to 1


@njit(inline="always", cache=True, error_model="numpy")
def sigmoid_f32(x):
    """1 / (1 + e**-x) in float32 (0 below -87, NaN stays NaN).

    e**-x runs on -x clamped to [-86.5, 87]: every intermediate stays a normal float32 (no
    subnormal assists) and the exponential needs no guard of its own.
    """
    x = _F(x)
    y = _F(1.0) / (_F(1.0) + _exp_normal(min(max(-x, -_SIG_HI), -_SIG_LO)))
    y = _F(0.0) if x < _SIG_LO else y
    return x if x != x else y


_ERF_CLAMP = _F(3.832506856900711)


@njit(inline="always", cache=True, error_model="numpy")
def erf_f32(x):
    """erf(x) in float32: rational x P(x^2) / Q(x^2) on [-3.83, 3.83], +-1 beyond."""
    x = _F(x)
    xc = min(max(x, -_ERF_CLAMP), _ERF_CLAMP)
    z = xc * xc
    p = _F(-2.72614225801306e-10)
    p = p * z + _F(2.77068142495902e-08)
    p = p * z + _F(-2.10102402082508e-06)
    p = p * z + _F(-5.69250639462346e-05)
    p = p * z + _F(-7.34990630326855e-04)
    p = p * z + _F(-2.95459980854025e-03)
    p = p * z + _F(-1.60960333262415e-02)
    q = _F(-1.45660718464996e-05)
    q = q * z + _F(-2.13374055278905e-04)
    q = q * z + _F(-1.68282697438203e-03)
    q = q * z + _F(-7.37332916720468e-03)
    q = q * z + _F(-1.42647390514189e-02)
    y = xc * p / q
    y = _F(1.0) if x >= _ERF_CLAMP else y
    return _F(-1.0) if x <= -_ERF_CLAMP else y


_INV_SQRT2 = _F(0.7071067811865476)
_SQRT_2_OVER_PI = _F(0.7978845608028654)


@njit(inline="always", cache=True, error_model="numpy")
def gelu_f32(x):
    """0.5 x (1 + erf(x / sqrt 2))."""
    x = _F(x)
    return _F(0.5) * x * (_F(1.0) + erf_f32(x * _INV_SQRT2))


@njit(inline="always", cache=True, error_model="numpy")
def gelu_tanh_f32(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _F(x)
    inner = _SQRT_2_OVER_PI * (x + _F(0.044715) * x * x * x)
    return _F(0.5) * x * (_F(1.0) + tanh_f32(inner))
