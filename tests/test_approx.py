"""The float32 approximations of the Numba backend stay within their documented errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numba import njit

from eqsat_fuse.backends.numba import approx
from eqsat_fuse.backends.numba import kernels as K

finite = st.floats(-100, 100, width=32, allow_nan=False, allow_infinity=False)
inputs = arrays(np.float32, st.integers(1, 256), elements=finite)


def _vectorized(fn):
    """A loop over `fn` compiled as the generated kernels are (same flags, 512-bit vectors)."""
    @njit(error_model="numpy", fastmath={"contract", "nsz", "arcp"})
    def apply(x, out):
        K.wide_vectors()
        for i in range(x.shape[0]):
            out[i] = fn(x[i])
    def run(x):
        out = np.empty_like(x)
        apply(x, out)
        return out
    return run


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1.0 + scipy.special.erf(x / np.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


CASES = {
    "exp": (approx.exp_f32, np.exp),
    "tanh": (approx.tanh_f32, np.tanh),
    "sigmoid": (approx.sigmoid_f32, _sigmoid),
    "erf": (approx.erf_f32, scipy.special.erf),
    "gelu": (approx.gelu_f32, _gelu),
    "gelu_tanh": (approx.gelu_tanh_f32, _gelu_tanh),
}
KERNELS = {name: _vectorized(fn) for name, (fn, _) in CASES.items()}


def _check(name, x):
    got = KERNELS[name](x).astype(np.float64)
    with np.errstate(over="ignore", under="ignore"):
        want = CASES[name][1](x.astype(np.float64))
        want32 = want.astype(np.float32).astype(np.float64)    # the best float32 answer
    err = np.abs(got - want)
    if name == "exp":
        normal = (x > -87.33) & np.isfinite(want32)
        rel = err[normal] / want[normal]
        assert rel.max(initial=0) <= approx.MAX_REL_ERROR["exp"] + 6e-8
        assert np.all(got[x < -87.34] == 0)
        assert np.all(np.isinf(got[~np.isfinite(want32)]))
        return
    scale = np.maximum(1.0, np.abs(x)) if name.startswith("gelu") else 1.0
    assert (err / scale).max(initial=0) <= approx.MAX_ABS_ERROR[name] + 6e-8 * np.max(
        np.abs(want32) / scale, initial=0)
    if name in approx.MAX_REL_ERROR:
        big = np.abs(want) > (1e-3 if name == "erf" else 1e-6)
        rel = err[big] / np.abs(want[big])
        assert rel.max(initial=0) <= approx.MAX_REL_ERROR[name] + 6e-8


@pytest.mark.parametrize("name", list(CASES))
@settings(max_examples=60, deadline=None)
@given(x=inputs)
def test_approximation_within_documented_error(name, x):
    _check(name, x)


@pytest.mark.parametrize("name", list(CASES))
def test_approximation_on_a_dense_sweep(name):
    x = np.linspace(-20, 20, 200_001, dtype=np.float32)
    if name == "exp":
        x = np.linspace(-100, 100, 200_001, dtype=np.float32)
    _check(name, x)


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("gelu")])
def test_nan_and_infinities(name):
    # NaN and +-inf among ordinary values, at positions the vector loop and its scalar
    # remainder both reach (the functions have no NaN select: the clamps pass NaN through)
    x = np.random.default_rng(1).standard_normal(203).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    where = np.arange(0, 203, 7)
    x[where] = special[np.arange(where.size) % 3]
    got = KERNELS[name](x)
    assert np.all(np.isnan(got[where[::3]]))
    finite = np.isfinite(x)
    assert not np.any(np.isnan(got[finite]))
    with np.errstate(all="ignore"):
        want = CASES[name][1](x.astype(np.float64)).astype(np.float32)
    inf = np.isinf(x)
    np.testing.assert_array_equal(got[inf], want[inf])


def test_float16_conversions_round_to_nearest():
    @njit
    def round_trip(bits, out):
        for i in range(bits.shape[0]):
            out[i] = approx.f32_to_f16(approx.f16_to_f32(bits[i]) * np.float32(3.0))
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float16)
    out = np.empty(x.shape, dtype=np.uint16)
    round_trip(x.view(np.uint16), out)
    np.testing.assert_array_equal(out.view(np.float16), (x.astype(np.float32) * 3).astype(np.float16))
