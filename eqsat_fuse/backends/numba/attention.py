"""The FusedAttention kernel: one call of the flash-style runtime `flash.attention`.

q, kt and v are read where they lie, through their strides: a view of a projection (a
Transpose of a Reshape) needs no copy, since the runtime packs each head for the microkernel
anyway. Batch dims (at most two, B and H) may broadcast; so may the mask. The scale is the
model's one-element constant. No prologue and no epilogue: FusedAttention is alone in its
kernel (it is no `fusable` producer, and no rule fuses into it). The runtime runs on the
packed GEMM's AVX-512 microkernel; without it the kernel is left to the NumPy backend.
"""

from __future__ import annotations

import numpy as np

from . import packed_gemm
from .emitter import Emitter
from .flash import workspace
from .spaces import Unsupported, broadcast_layout

# queries and keys per block: the block's scores (BK x BQ floats, 240 KiB) stay in L2; BK a
# multiple of the microkernel's 12 rows and 32 columns
BLOCK_QUERIES = 128
BLOCK_KEYS = 480


def _strides(lay, shape) -> list[int]:
    """Offset, batch strides (b, h) and the matrix's two strides of a layout broadcast to
    `shape` (batch dims, then the matrix)."""
    full = broadcast_layout(lay, shape)
    batch = [0] * (2 - (len(shape) - 2)) + list(full.strides[:-2])
    return [full.offset, *batch, *full.strides[-2:]]


def gen_attention(e: Emitter, a: int, prologue: list[int], epilogue: list[int]) -> None:
    node = e.body[a]
    code = e.code
    if not packed_gemm.AVAILABLE:
        raise Unsupported("FusedAttention without the AVX-512 microkernel")
    if prologue or epilogue:
        raise Unsupported("FusedAttention with fused ops around it")
    how = {"none": 0, "mul": 1, "div": 2}.get(node.attrs["how"])
    if how is None:
        raise Unsupported(f"FusedAttention how={node.attrs['how']!r}")
    out_shape = tuple(e.kernel.info.shape)
    if e.dtypes[a] != "float32" or e.out_stored != "float32" or not 2 <= len(out_shape) <= 4:
        raise Unsupported("FusedAttention that is not float32 of rank 2 to 4")
    batch = out_shape[:-2]
    Sq, Dv = out_shape[-2:]
    tq, tk, tv = (e.anchor_tensor(a, i) for i in range(3))
    D, Sk = tq.layout.shape[-1], tk.layout.shape[-1]
    args = []
    for t, shape in ((tq, (*batch, Sq, D)), (tk, (*batch, D, Sk)), (tv, (*batch, Sk, Dv))):
        if t.dtype != "float32" or t.stored != "float32":
            raise Unsupported("FusedAttention operand that is not stored float32")
        args.append(", ".join([e.storage_array(t)]
                              + [code.int_param(v) for v in _strides(t.layout, shape)]))
    if node.args[3].kind != "absent":
        tm = e.anchor_tensor(a, 3)
        if tm.dtype != "float32" or tm.stored != "float32":
            raise Unsupported("a FusedAttention mask that is not stored float32")
        strides = _strides(tm.layout, (*batch, Sq, Sk))
        args.append(", ".join([e.storage_array(tm)] + [code.int_param(v) for v in strides]
                              + ["1"]))
    else:
        args.append(f"{e.storage_array(tq)}, 0, 0, 0, 0, 0, 0")
    scale = 1.0
    if how:
        value = e.scalar_const(node.args[4])
        if value is None:
            raise Unsupported("a FusedAttention scale that is not a one-element constant")
        scale = float(np.asarray(value).reshape(()))
    sc = code.array(("array", "attention-scale"),
                    ("array", np.array([scale], dtype=np.float32)))
    H = batch[-1] if batch else 1
    BH = int(np.prod(batch, dtype=np.int64)) if batch else 1
    BQ = min(BLOCK_QUERIES, max(Sq, 1))
    BK = min(BLOCK_KEYS, max(Sk, 1))
    parts = max(1, min(e.backend.threads, BH))
    per = workspace(Sq, Sk, D, Dv, BQ, BK)
    ws = e.alloc(parts * per)
    code.uses_packed_gemm = True
    code.uses_flash = True
    geo = [code.int_param(v) for v in (H, BH, Sq, Sk, D, Dv)]
    code.lines.append(f"FA.attention_entry(({', '.join(args)}, {sc}, {code.int_param(how)}, "
                      f"out, {', '.join(geo)}, WS, {ws}, {code.int_param(per)}, "
                      f"{code.int_param(BQ)}, {code.int_param(BK)}, {code.int_param(parts)}))")
