"""Int8 GEMM for CPUs with AVX-512 VNNI: uint8 A times int8 B into int32 C, exactly, by a
register-blocked microkernel in LLVM IR.

The microkernel computes an MR x NR (8 x 32) tile of C over the whole K with `vpdpbusd`, which
multiplies 4 unsigned bytes of A by 4 signed bytes of B and adds the 4 products to one int32
lane, 64 products per instruction: each step of 4 along K loads two 16-lane words of B and
broadcasts one word (4 bytes) of each of the MR rows of A, 16 accumulators in registers. No
product or sum rounds or saturates (int32 wraps only past 2^31, beyond any K under 66,000).

- B, the constant weights, is packed once (`pack_b`): panels of NR columns, each K/4 rows of NR
  words of 4 consecutive k (zero-padded in k and in columns);
- A is packed per call (`pack_a`) into row tiles of MR rows, each K/4 words per row;
- C is written whole tiles at a time: the caller's C has rows and columns padded to MR and NR
  (`c_rows`, `c_cols`).

Measured on this machine (bench/vnni_probe.py, one thread, A's packing included): 199-218
GMAC/s at BERT-base shapes (128 x 768 x 3072 and back), 74-88 at tall, narrow ResNet-like
shapes where packing A byte by byte dominates, against 43-57 for the float32 packed GEMM
(`packed_gemm.py`) on the same shapes.
The IR is compiled and cached like that GEMM's (`cache.load_ir`); `AVAILABLE` is False on a CPU
without VNNI, where integer contractions run through the NumPy fallback.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from .cache import load_ir
from .calls import I64, runtime_entry
from .kernels import WIDE_VECTORS
from .packed_gemm import _call_codegen

MR, NR = 8, 32
SYMBOL = "eqsat_fuse_i8mk"
U8_ARRAY = types.Array(types.uint8, 1, "C")
I8_ARRAY = types.Array(types.int8, 1, "C")
I32_ARRAY = types.Array(types.int32, 1, "C")


def _vnni() -> bool:
    if not WIDE_VECTORS:
        return False
    import llvmlite.binding as llvm
    return "avx512vnni" in llvm.get_host_cpu_features().flatten()


AVAILABLE = _vnni()


def microkernel_ir() -> str:
    """`void eqsat_fuse_i8mk(A, B, C, ldc, k4)`: C[i, j] = sum_k A[i, k] B[k, j], i < MR, j < NR,
    A one row tile of `pack_a` (word (kk, i) at A + 4 (kk MR + i)), B one panel of `pack_b`
    (words (kk, j) at B + 4 (kk NR + j)), C int32 with row stride ldc (elements)."""
    acc = [(i, h) for i in range(MR) for h in range(2)]
    lines = [
        "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)",
        f"define void @{SYMBOL}(ptr noalias %A, ptr noalias %B, ptr noalias %C, i64 %ldc, "
        "i64 %k4) #0 {",
        "entry:", "  br label %k", "k:", "  %kk = phi i64 [0, %entry], [%kk2, %k]"]
    lines += [f"  %c{i}_{h} = phi <16 x i32> [zeroinitializer, %entry], [%n{i}_{h}, %k]"
              for i, h in acc]
    lines += [f"  %bo = mul i64 %kk, {NR}", "  %bp0 = getelementptr i32, ptr %B, i64 %bo",
              "  %bp1 = getelementptr i32, ptr %bp0, i64 16",
              "  %b0 = load <16 x i32>, ptr %bp0, align 4",
              "  %b1 = load <16 x i32>, ptr %bp1, align 4", f"  %ao = mul i64 %kk, {MR}"]
    for i in range(MR):
        lines += [f"  %ai{i} = add i64 %ao, {i}",
                  f"  %ap{i} = getelementptr i32, ptr %A, i64 %ai{i}",
                  f"  %aw{i} = load i32, ptr %ap{i}, align 4",
                  f"  %as{i} = insertelement <16 x i32> poison, i32 %aw{i}, i64 0",
                  f"  %av{i} = shufflevector <16 x i32> %as{i}, <16 x i32> poison, "
                  "<16 x i32> zeroinitializer"]
        lines += [f"  %n{i}_{h} = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> "
                  f"%c{i}_{h}, <16 x i32> %av{i}, <16 x i32> %b{h})" for h in range(2)]
    lines += ["  %kk2 = add i64 %kk, 1", "  %more = icmp ult i64 %kk2, %k4",
              "  br i1 %more, label %k, label %store", "store:"]
    for i, h in acc:
        lines += [f"  %o{i}_{h} = mul i64 %ldc, {i}", f"  %q{i}_{h} = add i64 %o{i}_{h}, {16 * h}",
                  f"  %cp{i}_{h} = getelementptr i32, ptr %C, i64 %q{i}_{h}",
                  f"  store <16 x i32> %n{i}_{h}, ptr %cp{i}_{h}, align 4"]
    lines += ["  ret void", "}",
              'attributes #0 = { nounwind "prefer-vector-width"="512" '
              '"min-legal-vector-width"="512" }']
    return "\n".join(lines)


_ENGINE = None


def ensure_compiled() -> None:
    """Load the microkernel's machine code and register its symbol, once per process."""
    global _ENGINE
    if _ENGINE is None:
        if not AVAILABLE:
            raise RuntimeError("the int8 GEMM needs AVX-512 VNNI")
        _ENGINE = load_ir(microkernel_ir(), "int8-microkernel", (SYMBOL,))


def k_words(k: int) -> int:
    return -(-k // 4)


def c_rows(rows: int) -> int:
    """Rows of the C buffer `gemm` writes for `rows` rows of A (whole tiles)."""
    return -(-rows // MR) * MR


def c_cols(n: int) -> int:
    """Columns of the C buffer (whole panels): its row stride."""
    return -(-n // NR) * NR


def a_workspace(rows: int, k: int) -> int:
    """Bytes of workspace `gemm` packs `rows` rows of A into."""
    return c_rows(rows) * k_words(k) * 4


def pack_b(b: np.ndarray) -> np.ndarray:
    """B[K, N] int8 -> panels (ceil(N / NR), ceil(K / 4), NR, 4) int8, flat; zero-padded."""
    k, n = b.shape
    padded = np.zeros((k_words(k) * 4, c_cols(n)), np.int8)
    padded[:k, :n] = b
    panels = padded.reshape(k_words(k), 4, c_cols(n) // NR, NR).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(panels).reshape(-1)


@intrinsic
def _tile(typingctx, a, b, c, ldc, k4):
    """The microkernel on integer addresses of A, B and C."""
    return types.none(a, b, c, ldc, k4), _call_codegen(SYMBOL, {0, 1, 2})


_OPTS = dict(cache=True, error_model="numpy")


@njit(**_OPTS)
def pack_a(a, a_off, lda, r0, r1, k, out):
    """Rows [r0, r1) of A (a[a_off + r lda + j], uint8) into row tiles of MR rows, zero-padded:
    out[4 (t MR k4 + kk MR + i) + q] = A[r0 + t MR + i, 4 kk + q]."""
    k4 = -(-k // 4)
    m = r1 - r0
    for t in range(-(-m // MR)):
        for i in range(MR):
            r = r0 + t * MR + i
            for kk in range(k4):
                base = 4 * (t * MR * k4 + kk * MR + i)
                for q in range(4):
                    j = 4 * kk + q
                    out[base + q] = a[a_off + r * lda + j] if r < r1 and j < k else np.uint8(0)


@njit(**_OPTS)
def gemm(a, a_off, lda, r0, r1, bp, n, k, c, ldc, ws, colsum, za):
    """C[r, j] = sum_k (A[r, k] - za) B[k, j] for rows [r0, r1) (and the tile's padding rows
    after them), every column of whole panels: A uint8 at a[a_off + r lda + k], B packed by
    `pack_b` (n columns, k rows), C int32 at c[r ldc + j] (ldc = c_cols(n)), ws uint8 of at
    least `a_workspace(r1 - r0, k)` bytes; colsum B's column sums (c_cols(n) entries), which
    compensate A's zero point za: sum_k (a - za) b = sum_k a b - za sum_k b."""
    k4 = -(-k // 4)
    pack_a(a, a_off, lda, r0, r1, k, ws)
    tiles = -(-(r1 - r0) // MR)
    for p in range(-(-n // NR)):
        pb = bp.ctypes.data + p * k4 * NR * 4
        for t in range(tiles):
            _tile(ws.ctypes.data + t * MR * k4 * 4, pb,
                  c.ctypes.data + 4 * ((r0 + t * MR) * ldc + p * NR), ldc, k4)
    if za != 0:
        zi = np.int32(za)
        for r in range(r0, r0 + tiles * MR):
            for j in range(ldc):
                c[r * ldc + j] -= zi * colsum[j]


gemm_entry = runtime_entry(gemm, "I8.gemm", [U8_ARRAY, I64, I64, I64, I64, I8_ARRAY, I64, I64,
                                             I32_ARRAY, I64, U8_ARRAY, I32_ARRAY, I64])
