"""The requantizing epilogue of an integer contraction in float32, exact as in float64.

The rules of `rules/quant.egg` leave an integer contraction's epilogue as an affine map of the
int32 sum in float64 and a QuantizeLinear of its value: per output row (channel)
``q = saturate(rint((acc * alpha + beta) / s) + z)``, with alpha and beta float64 values of the
row or of the column (scales, bias) and s, z scalars; what the epilogue computes from q (a
DequantizeLinear, a residual Add and another QuantizeLinear) follows. Evaluated so, per element,
it costs a float64 division and float64 arithmetic on 8 lanes: on MobileNetV2's 1x1
convolutions most of the kernel's time (a 1.2M-element output: 420 us, against 215 us so).

`fast_requantization` writes it in float32 instead, ``t = f32(acc) * QA + QB`` with
QA = f32(alpha / s), QB = f32(beta / s), and keeps it exact: t is within 2^-22 (|acc QA| + |QB|)
of the real (acc alpha + beta) / s, as is the float64 quotient (within 2^-51), so the two round
to the same integer unless the real value lies within that distance of a half-integer. An
element whose t lies within 2^-19 (|acc QA| + |QB|) of one (8x the bound) is counted; a block of
256 columns with any such element is computed again the float64 way, every element of it. A
row whose QA or QB is not below 1e28 in magnitude goes the float64 way whole. Per-row
coefficients are computed in the kernel (from constants or values of the run: dynamic
quantization's scales); per-column ones (MatMul's) here, from constants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .scalars import NP_TYPES, _float_text, compute_dtype, literal

if TYPE_CHECKING:
    from .emitter import Emitter

BLOCK = 256                   # columns checked together; a block with a near tie is redone
TOLERANCE = 2.0 ** -19        # times |acc QA| + |QB|: 8x the float32 evaluation's error bound


def _row_constant(e: "Emitter", i: int, slot: int, hoist: list[str], uses, space) -> str | None:
    """The expression of argument `slot` of body node i when it is the same along a row: a
    literal, or a load hoisted out of the column loop; None otherwise."""
    arg = e.body[i].args[slot]
    const = e.scalar_const(arg)
    if const is not None:
        return literal(np.asarray(const).reshape(()),
                       compute_dtype(e.backend.operand_dtype(arg)))
    if (i, slot) not in uses:
        return None
    scratch: list[str] = []
    name = e.operand_expr(i, slot, arg, uses, space, "r", "c", hoist, scratch, "")
    return name if any(h.startswith(f"{name} = ") for h in hoist) else None


class _Source:
    """Arithmetic on expressions of generated source."""

    one, zero = "np.float64(1.0)", "np.float64(0.0)"

    @staticmethod
    def apply(op: str, x: str, k: str) -> str:
        return f"(-{x})" if op == "neg" else f"({x} {op} {k})"


class _Values:
    """The same arithmetic on float64 arrays."""

    one, zero = np.float64(1.0), np.float64(0.0)

    @staticmethod
    def apply(op: str, x, k):
        return -x if op == "neg" else {"*": np.multiply, "+": np.add, "-": np.subtract,
                                       "/": np.divide}[op](x, k)


def _affine(e: "Emitter", a: int, chain: list[int], operand, arith):
    """(alpha, beta) such that the chain of nodes after anchor a computes acc * alpha + beta,
    in `arith` (`_Source` or `_Values`) over the operands `operand(i, slot)` gives (None: one
    it cannot give), or None when the chain is no such map."""
    alpha, beta, value = arith.one, arith.zero, a
    f = arith.apply
    for i in chain:
        node = e.body[i]
        links = [s for s, x in enumerate(node.args) if x.kind == "node"]
        if len(links) != 1 or node.args[links[0]].ref != value or e.dtypes[i] != "float64":
            return None
        slot = links[0]
        others = [operand(i, s) for s in range(len(node.args)) if s != slot]
        if any(k is None for k in others):
            return None
        k = others[0] if len(others) == 1 else None
        if node.op == "Cast" and not others and e.dtypes[value] in ("int32", "float64"):
            pass
        elif node.op == "Mul" and k is not None:
            alpha, beta = f("*", alpha, k), f("*", beta, k)
        elif node.op == "Add" and k is not None:
            beta = f("+", beta, k)
        elif node.op == "Sub" and k is not None:
            alpha, beta = (alpha, f("-", beta, k)) if slot == 0 else \
                (f("neg", alpha, None), f("-", k, beta))
        elif node.op == "Div" and k is not None and slot == 0:
            alpha, beta = f("/", alpha, k), f("/", beta, k)
        elif node.op == "Neg" and not others:
            alpha, beta = f("neg", alpha, None), f("neg", beta, None)
        else:
            return None
        value = i
    return (alpha, beta) if value != a else None


def _constant(e: "Emitter", i: int, slot: int):
    """Argument `slot` of body node i as a float64 array when it is a constant, else None."""
    x = e.body[i].args[slot]
    const = e.scalar_const(x)
    if const is None and x.kind == "const" and x.ref in e.backend.constants:
        const = e.backend.constants[x.ref]
    return None if const is None else np.asarray(const, np.float64)


def _affine_columns(e: "Emitter", a: int, chain: list[int], shape, split: int,
                    scale: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(QA, QB) as float32 arrays over the columns (the dims from `split` on) when every
    operand of the chain is a constant that is the same along the rows (MatMul's per-column
    scales and bias), or None."""
    with np.errstate(all="ignore"):
        found = _affine(e, a, chain, lambda i, s: _constant(e, i, s), _Values)
        if found is None:
            return None
        try:
            alpha, beta = (np.broadcast_to(v, shape) for v in found)
        except ValueError:
            return None
        cols = int(np.prod(shape[split:], dtype=np.int64))
        qa, qb = ((v.reshape(-1, cols) / scale).astype(np.float32) for v in (alpha, beta))
    if not (np.all(qa == qa[:1]) and np.all(qb == qb[:1])) or \
            not (np.all(np.abs(qa) < 1e28) and np.all(np.abs(qb) < 1e28)):
        return None
    return np.ascontiguousarray(qa[0]), np.ascontiguousarray(qb[0])


def _requantized_chain(e: "Emitter", a: int, epilogue: list[int]) -> tuple[int, list[int]] | None:
    """The first QuantizeLinear to 8 bits of the epilogue and the chain of nodes from the
    anchor to it (each read by the next one only), or None."""
    readers: dict[int, list[int]] = {}
    for i in epilogue:
        for x in e.body[i].args:
            if x.kind == "node":
                readers.setdefault(x.ref, []).append(i)
    chain, value = [], a
    while True:
        nxt = readers.get(value, [])
        if len(nxt) != 1:
            return None
        i = nxt[0]
        if e.body[i].op == "QuantizeLinear":
            if e.body[i].args[0].kind != "node" or e.body[i].args[0].ref != value or \
                    e.dtypes[i] not in ("uint8", "int8") or not chain:
                return None
            return i, chain
        chain.append(i)
        value = i


def fast_requantization(e: "Emitter", a: int, epilogue: list[int], uses, space,
                        hoist: list[str], exact: list[str], last: str, indent: str,
                        acc_load: str, store: str, cols: tuple[str, str]) -> list[str] | None:
    """The row loop's body after its hoisted loads (the coefficients, then the columns in
    blocks, each checked and redone from `exact`, the float64 lines, when near a tie), or None
    where the epilogue does not requantize an integer sum's affine map to 8 bits. What the
    epilogue computes from the quantized value (a DequantizeLinear, a residual Add, another
    QuantizeLinear) follows it as `exact` has it."""
    if e.dtypes[a] != "int32":
        return None
    found = _requantized_chain(e, a, epilogue)
    if found is None:
        return None
    qi, chain = found
    q = e.body[qi]
    scale, zero = (e.scalar_const(x) if x.kind not in ("node", "absent") else None
                   for x in q.args[1:3])
    if scale is None or zero is None or e.dtypes[chain[-1]] != "float64":
        return None
    coefficients = _affine(e, a, chain,
                           lambda i, s: _row_constant(e, i, s, hoist, uses, space), _Source)
    per_column = None
    if coefficients is None:
        per_column = _affine_columns(e, a, chain, space.shape, space.split,
                                     float(np.asarray(scale).reshape(())))
        if per_column is None:
            return None
    # the lines after the QuantizeLinear's own: what reads the quantized value
    at = [n for n, line in enumerate(exact) if line.lstrip().startswith(f"v{qi} = ")]
    if len(at) != 1:
        return None
    # the lines before it but the chain's (values other nodes read: a residual's load, a
    # prologue's DequantizeLinear), and those after it
    mine = tuple(f"v{i} = " for i in chain)
    rest = [line for line in exact[:at[0]] if not line.lstrip().startswith(mine)]
    rest += exact[at[0] + 1:]
    s = _float_text(float(np.asarray(scale).reshape(())), "np.float64")
    T = NP_TYPES[e.dtypes[qi]]
    info = np.iinfo(e.dtypes[qi])
    lo, hi = _float_text(info.min, "F32"), _float_text(info.max, "F32")
    z = _float_text(float(np.asarray(zero).reshape(())), "F32")
    p = e.code.int_param
    if per_column is None:        # the same along the row
        alpha, beta = coefficients
        body = [f"QA = F32({alpha} / {s})", f"QB = F32({beta} / {s})",
                "QX = np.int32(0 if (abs(QA) < F32(1e28) and abs(QB) < F32(1e28)) else 1)",
                f"QT = abs(QB) * F32({TOLERANCE!r})"]
        qa_c, qb_c, qt_c = "QA", "QB", "QT"
    else:                         # one per column, computed here
        qa_arr = e.code.array(("QA", e.kernel.name), ("array", per_column[0]))
        qb_arr = e.code.array(("QB", e.kernel.name), ("array", per_column[1]))
        body = ["QX = np.int32(0)"]
        qa_c, qb_c = f"{qa_arr}[U(c)]", f"{qb_arr}[U(c)]"
        qt_c = f"abs({qb_c}) * F32({TOLERANCE!r})"
    body += [
        f"for cb in range({cols[0]}, {cols[1]}, {p(BLOCK)}):",
        f"    ce = min(cb + {p(BLOCK)}, {cols[1]})",
        "    NEAR = QX",
        "    for c in range(cb, ce):",
        f"        {acc_load}",
        f"        qa = F32(acc_v) * {qa_c}",
        f"        qt = qa + {qb_c}",
        "        qr = np.rint(qt)",
        # counted in int32 (an int64 count took the loop from 0.10 to 0.26 ns an element)
        f"        NEAR = np.int32(NEAR + np.int32(abs(qt - qr) + abs(qa) * F32({TOLERANCE!r}) "
        f"+ {qt_c} >= F32(0.5)))",
        f"        qz = qr + {z}",
        f"        v{qi} = {T}({lo}) if not (qz >= {lo}) else "
        f"({T}(qz) if qz <= {hi} else {T}({hi}))"]
    body += [line[len(indent):] for line in rest]     # (in order: none reads the chain)
    body += [f"        out[U({store})] = {e.store_expr(last)}",
             "    if NEAR:",
             "        for c in range(cb, ce):",
             f"            {acc_load}"]
    body += ["    " + line[len(indent):] for line in exact]
    body.append(f"            out[U({store})] = {e.store_expr(last)}")
    return [f"{indent}    {line}" for line in body]
