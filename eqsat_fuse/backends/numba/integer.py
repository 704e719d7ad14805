"""The integer contraction family: MatMulInteger of uint8 activations by constant int8 weights,
on the VNNI int8 GEMM (`int8_gemm.py`), exactly, with its elementwise epilogue.

The weights are packed once, here, with their column sums; the activations' zero point (one
for the tensor: a constant, or a value computed at run time as DynamicQuantizeLinear computes
it, or none) is compensated by them, sum_k (a - za) b = sum_k a b - za sum_k b. Weights with a
zero point of their own (other than zeros), activations of another dtype or layout, and CPUs
without VNNI raise `Unsupported`: such a kernel runs through the NumPy fallback (exact too).
"""

from __future__ import annotations

import numpy as np

from . import int8_gemm as I8
from .emitter import Emitter
from .spaces import Unsupported


def _zero_point(e: Emitter, a: int, slot: int) -> tuple[np.ndarray | None, str]:
    """The zero point in `slot` of anchor `a`: its constant value (None when absent or computed
    at run time), and the source of its one element ("0" when absent)."""
    arg = e.body[a].args[slot] if slot < len(e.body[a].args) else None
    if arg is None or arg.kind == "absent":
        return None, "0"
    t = e.tensor(arg)
    if t.storage in e.backend.constants and np.all(np.asarray(e.backend.constants[t.storage]) == 0):
        return np.zeros(1, np.int64), "0"            # zeros, one or one per row or column
    if t.layout.size != 1:
        raise Unsupported("a zero point per row or column")
    if t.storage in e.backend.constants:
        value = np.asarray(e.backend.constants[t.storage])
        return value, str(int(value.reshape(-1)[0]))
    return None, f"np.int64({e.load_expr(t, str(t.layout.offset))})"


def gen_matmul_integer(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    """MatMulInteger: A [..., K] uint8 (batch folded into rows) times constant B [K, N] int8
    into int32 tiles, then the epilogue over the rows."""
    if not I8.AVAILABLE:
        raise Unsupported("an int8 GEMM needs AVX-512 VNNI")
    # nodes that do not read the product (a scale of scales) are computed with the epilogue:
    # the anchor reads tensors only (`anchor_tensor`), never one of them
    epilogue = sorted(prologue + epilogue)
    code = e.code
    ta, tb = e.anchor_tensor(a, 0), e.anchor_tensor(a, 1)
    if ta.dtype != "uint8" or tb.dtype != "int8":
        raise Unsupported(f"MatMulInteger of {ta.dtype} by {tb.dtype}")
    if tb.storage not in e.backend.constants or len(tb.layout.shape) != 2 or \
            len(ta.layout.shape) < 2 or not ta.layout.contiguous:
        raise Unsupported("MatMulInteger other than activations by constant weights")
    _, za = _zero_point(e, a, 2)
    zb, zb_source = _zero_point(e, a, 3)
    if zb_source != "0" and (zb is None or np.any(zb != 0)):
        raise Unsupported("weights with a zero point")
    k, n = tb.layout.shape
    rows = int(np.prod(ta.layout.shape[:-1]))
    if tuple(e.kernel.info.shape) != (*ta.layout.shape[:-1], n):
        raise Unsupported("a broadcasting epilogue")
    b = np.asarray(e.backend.constants[tb.storage]).reshape(k, n)
    ldc = I8.c_cols(n)
    colsum = np.zeros(ldc, np.int32)
    colsum[:n] = b.astype(np.int64).sum(axis=0)
    bp = code.array(("I8B", e.kernel.name), ("array", I8.pack_b(b)))
    sums = code.array(("I8S", e.kernel.name), ("array", colsum))
    block = min(I8.c_rows(rows), max(I8.MR, (1 << 21) // (4 * ldc) // I8.MR * I8.MR))
    pack_bytes = I8.a_workspace(block, k)
    ap = e.alloc(-(-pack_bytes // 4))
    acc = e.alloc(I8.c_rows(rows) * ldc)
    arr = e.storage_array(ta)
    code.lines += [
        f"EC = {code.int_param(n)}",
        f"LDC = {code.int_param(ldc)}",
        f"A8 = {arr}[{code.int_param(ta.layout.offset)}:"
        f"{code.int_param(ta.layout.offset)} + {code.int_param(ta.layout.size)}]",
        f"AP = WS[{ap}:{ap} + {code.int_param(-(-pack_bytes // 4))}].view(np.uint8)",
        f"C32 = WS[{acc}:{acc} + {code.int_param(I8.c_rows(rows) * ldc)}].view(np.int32)",
        f"for r0 in range(0, {code.int_param(rows)}, {code.int_param(block)}):",
        f"    r1 = min(r0 + {code.int_param(block)}, {code.int_param(rows)})",
        f"    I8.gemm_entry((A8, 0, {code.int_param(k)}, r0, r1, {bp}, EC, {code.int_param(k)}, "
        f"C32, LDC, AP, {sums}, {za}))"]
    code.uses_int8_gemm = True
    lines, space = e.emit_epilogue(a, epilogue, (*ta.layout.shape[:-1], n), 1, "r * LDC + c",
                                   "    ", "C32")
    if space.cols != n:
        raise Unsupported("epilogue column blocking")
    code.lines += lines
