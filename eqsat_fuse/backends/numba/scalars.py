"""Scalar source text: the Python/Numba expression of one elementwise op on scalar arguments
(`scalar_expr`), literals, and the dtype every body node computes in (`node_dtypes`).

A plain op's expression is its operator-table template (`OpSpec.scalar`, `scalar_f32` in
eqsat_fuse/ops.py); the ops whose expression needs logic (Div, Clip, Where, Cast, Pow, Gelu)
are cases here."""

from __future__ import annotations

import math
import string
from typing import Any, Callable

import numpy as np

from ...ir import BodyNode, Operand
from ...ops import OPS, result_dtype
from .spaces import Unsupported

NP_TYPES = {"float32": "np.float32", "float64": "np.float64", "int64": "np.int64",
            "int32": "np.int32", "int8": "np.int8", "uint8": "np.uint8", "bool": "np.bool_",
            "int16": "np.int16", "uint16": "np.uint16", "uint32": "np.uint32",
            "uint64": "np.uint64", "float16": "np.float32"}


def flit(value: float) -> str:
    return _float_text(value, "F32")


def _float_text(value: float, T: str) -> str:
    """A float literal of type `T` (source text): inf and NaN by name, since `repr` writes
    them bare (`inf`), which no generated module defines."""
    value = float(value)
    if math.isnan(value):
        return f"{T}(np.nan)"
    if math.isinf(value):
        return f"{T}(np.inf)" if value > 0 else f"{T}(-np.inf)"
    return f"{T}({value!r})"


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic happens in (float16 values are computed in float32)."""
    return "float32" if dtype == "float16" else dtype


def node_dtypes(body: list[BodyNode], operand_dtype: Callable[[Operand], str]) -> list[str]:
    """The logical dtype of every body node."""
    out: list[str] = []

    def arg(a: Operand) -> str:
        return out[a.ref] if a.kind == "node" else operand_dtype(a)

    for node in body:
        args = node.args
        dtype = result_dtype(node.op, node.attrs, lambda i: arg(args[i])
                             if i < len(args) and args[i].kind != "absent" else None)
        out.append(dtype or "float32")
    return out


def scalar_expr(node: BodyNode, args: list[str], dtypes: list[str], out_dtype: str,
                const_value: Callable[[int], Any]) -> str:
    """Python/Numba source of one elementwise op on scalar arguments.

    `args` are expressions of the arguments (already in compute dtypes), `const_value(i)` is the
    constant value of argument i when it is a scalar constant (else None).
    """
    op = node.op
    t = compute_dtype(out_dtype)
    is_float = t in ("float32", "float64")
    f32 = t == "float32"
    T = NP_TYPES.get(t)
    if T is None:
        raise Unsupported(f"dtype {out_dtype}")

    def lit(v):
        return flit(v) if f32 else _float_text(v, T) if is_float else f"{T}({int(v)!r})"

    a = args[0] if args else None
    spec = OPS.get(op)
    if spec is not None and spec.scalar is not None:
        if (not is_float and not spec.integers) or (spec.domain == "bool" and t != "bool"):
            raise Unsupported(f"{op} on {out_dtype}")
        template = spec.scalar_f32 if f32 and spec.scalar_f32 is not None else spec.scalar
        return _TEMPLATE.vformat(template, args, _Literals(node.attrs, lit))
    if op == "Div":
        if not is_float:
            raise Unsupported("integer Div")
        return f"({a} / {args[1]})"
    if op == "QuantizeLinear":
        return _quantize_expr(args, dtypes, out_dtype)
    if op == "DequantizeLinear":
        if not is_float:
            raise Unsupported(f"DequantizeLinear to {out_dtype}")
        return f"({T}(np.int64({a}) - np.int64({args[2]})) * {args[1]})"
    if not is_float and op not in ("Where", "Cast", "Clip"):
        raise Unsupported(f"{op} on {out_dtype}")
    if op == "Clip":
        v = a
        if len(args) > 1 and node.args[1].kind != "absent":
            v = f"({args[1]} if {v} < {args[1]} else {v})"
        if len(args) > 2 and node.args[2].kind != "absent":
            v = f"({args[2]} if {v} > {args[2]} else {v})"
        return v
    if op == "Where":
        return f"({args[1]} if {a} else {args[2]})"
    if op == "Cast":
        return _cast_expr(node, a, dtypes)
    if op == "Pow":
        return _pow_expr(a, args, const_value(1), lit, dtypes[1], T)
    if op == "Gelu":
        if not f32:
            raise Unsupported("float64 Gelu")
        return f"gelu_tanh_f32({a})" if node.attrs.get("approximate") == "tanh" \
            else f"gelu_f32({a})"
    raise Unsupported(f"op {op}")


_TEMPLATE = string.Formatter()


class _Literals:
    """The keyword fields of a scalar template: each attribute as a literal of the compute
    dtype, and `lit`, which gives any number (`{lit[0.5]}`) as one."""

    def __init__(self, attrs: dict[str, Any], lit: Callable[[float], str]):
        self.attrs, self.lit = attrs, lit

    def __getitem__(self, key: str):
        if key == "lit":
            return _Numbers(self.lit)
        return self.lit(self.attrs[key])


class _Numbers:
    def __init__(self, lit: Callable[[float], str]):
        self.lit = lit

    def __getitem__(self, key) -> str:
        return self.lit(float(key) if isinstance(key, str) else key)


def _cast_expr(node: BodyNode, a: str, dtypes: list[str]) -> str:
    """A Cast of the scalar expression `a` (of dtype dtypes[0]) to the node's `to`."""
    to = str(np.dtype(node.attrs["to"]))
    if to == "bool":
        return f"({a} != 0)"
    if np.dtype(to).kind in "iu" and dtypes[0] in ("float32", "float64", "float16"):
        raise Unsupported("float to integer Cast")
    if to == "float16" and dtypes[0] != "float16":
        # float16 values are computed in float32: round to float16 here (ties to even)
        return f"f16_to_f32(f32_to_f16(np.float32({a})))"
    return f"{NP_TYPES[to]}({a})" if to in NP_TYPES else _unsupported(to)


def _quantize_expr(args: list[str], dtypes: list[str], out_dtype: str) -> str:
    """QuantizeLinear of x = args[0] by scale args[1] and zero point args[2]: x / scale in the
    float dtype, rounded half to even, the zero point added, saturated to `out_dtype`; NaN gives
    the lowest value (as the NumPy reference, `backends/numpy/quantize.py`)."""
    work = compute_dtype(dtypes[0])
    if work not in ("float32", "float64") or out_dtype not in NP_TYPES or \
            np.dtype(out_dtype).kind not in "iu":
        raise Unsupported(f"QuantizeLinear of {dtypes[0]} to {out_dtype}")
    F, T = NP_TYPES[work], NP_TYPES[out_dtype]
    info = np.iinfo(out_dtype)
    lo, hi = _float_text(info.min, F), _float_text(info.max, F)
    v = f"(np.rint({args[0]} / {F}({args[1]})) + {F}({args[2]}))"
    return f"({T}({lo}) if not ({v} >= {lo}) else {T}({v}) if {v} <= {hi} else {T}({hi}))"


def _pow_expr(a: str, args: list[str], y, lit: Callable[[float], str], y_dtype: str,
              T: str) -> str:
    """`a ** args[1]`; a constant exponent y of 1, 2, 3, 0.5 or -1 becomes products, a square
    root (with pow's values at -inf and -0) or a reciprocal. An integer exponent is made a float of the base's type `T` first:
    Numba computes float ** int by repeated products and raises ZeroDivisionError for a zero
    base and a negative exponent, where `pow` (and ONNX) give +-inf."""
    if y is not None and np.size(y) == 1:
        y = float(np.asarray(y).reshape(()))
        if y == 1.0:
            return a
        if y == 2.0:
            return f"({a} * {a})"
        if y == 3.0:
            return f"({a} * {a} * {a})"
        if y == 0.5:     # pow(-inf, 0.5) is +inf and pow(-0, 0.5) +0, where sqrt gives NaN, -0
            # the inf is of the base's type: a bare np.inf made the whole chain float64
            return f"(np.sqrt({a}) if {a} != -np.inf else {T}(np.inf)) + {lit(0)}"
        if y == -1.0:
            return f"({lit(1)} / {a})"
    if np.dtype(y_dtype).kind in "iub":
        return f"({a} ** {T}({args[1]}))"
    return f"({a} ** {args[1]})"


def _unsupported(what):
    raise Unsupported(what)


def literal(value, dtype: str) -> str:
    """A scalar `value` of `dtype` as source (float16 values are float32 in kernels)."""
    value = np.asarray(value).reshape(())
    if dtype in ("float32", "float16"):
        return flit(float(value))
    if dtype == "bool":
        return "True" if bool(value) else "False"
    if dtype in NP_TYPES:
        if np.dtype(dtype).kind == "f":
            return _float_text(float(value), NP_TYPES[dtype])
        return f"{NP_TYPES[dtype]}({int(value)!r})"
    raise Unsupported(f"literal of {dtype}")
