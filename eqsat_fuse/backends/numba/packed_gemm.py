"""Float32 GEMM kernels for CPUs with AVX-512: a register-blocked microkernel in LLVM IR.

The microkernel computes an MR x 32 tile of C (MR <= 12 rows, so 24 of the 32 zmm registers
hold accumulators) over the whole K; each step loads two 16-float vectors of B, broadcasts MR
values of A and does 2 MR fused multiply-adds; the last panel loads and stores under a mask.
A is always packed in row tiles, `pack_rows` (A[i, k] of a tile at k * MR + i: one contiguous
stream); B comes in one of two ways:

- `gemm`: B packed in panels of 32 columns, `pack(B)` = (ceil(N / 32), K, 32), zero-padded.
  A model's MatMul/Gemm weights are constants, so the backend packs them once, at compile
  time; A (the activations) is packed per call into a workspace (`a_workspace` floats), which
  costs 1-4% of the GEMM and gains 4-12% over reading A row-major (measured at 197 x 768 x
  3072 and 197 x 3072 x 768, the ViT-Base feed-forward; bench/gemm.py now runs level with MLAS);
- `gemm_rows`: B[k, j] at b[b_off + table[k] + j], a table of row offsets. For Conv, A is the
  constant weights and row (c, i, j) of the im2col matrix is a shifted view of an input plane,
  so no im2col matrix is built (backend_numba `conv_packed`);
- `gemm_gather`: the other way round, for Conv: A is the im2col matrix, positions x (c, i, j),
  read by the microkernel straight from the input planes (A[i, k] at x + T[k] + i for the
  consecutive positions i of an output row), B the weights packed by `pack`, so no output
  column is padding and nothing is packed per call (`contraction.conv_positions`).

llvmlite compiles the module to object code once per machine (0.3-0.4 s; kept in
`cache.runtime_cache_dir`, keyed by the IR, the CPU and llvmlite's version), each process
loads that object (about a millisecond) and registers the entries `eqsat_fuse_mk` and
`eqsat_fuse_mkt` as symbols, which compiled kernels call by name, so they stay cacheable on
disk (as with the BLAS sgemm symbol).

Measured on this machine by bench/gemm.py (one thread, 128 x 768 x 3072, the BERT-base
feed-forward, before A was packed): 200 GFLOP/s with the weights in cache and 170 with them
coming from L3, against 161 / 139 for OpenBLAS's sgemm and 212 / 177 for onnxruntime's MLAS.
Without AVX-512, `AVAILABLE` is False and the backend calls BLAS.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .cache import load_ir
from .calls import F32_ARRAY, F32_ARRAY3, I64, I64_ARRAY, runtime_entry
from .kernels import WIDE_VECTORS

U = np.uint64      # unsigned indices: no wraparound checks, the packing loops vectorize

NR = 32            # columns per panel: two 16-float vectors
MR = 12            # rows per microkernel call at most
SYMBOL = "eqsat_fuse_mk"
SYMBOL_TABLE = "eqsat_fuse_mkt"
SYMBOL_ATABLE = "eqsat_fuse_mka"
# floats of the B panel fetched ahead of the loads (16 steps of K): +7-12% when the weights come
# from L3, as they do in a model (measured 256 / 512 / 1024 ahead: the same within noise)
PREFETCH = 512
# rows of B fetched ahead by the row-table microkernel (its table has this many entries past
# the last row): +5% on the ResNet convolutions, whose B rows come from L2 (4 / 8 / 16 ahead:
# the same within noise)
TABLE_PREFETCH = 8

__all__ = ["AVAILABLE", "NR", "MR", "pack", "panels_for", "pack_into", "pack_rows",
           "a_workspace", "ensure_compiled", "gemm", "gemm_parallel", "gemm_rows", "gemm_rows_parallel", "row_table",
           "gemm_gather", "microkernel_ir"]


# the microkernel is AVX-512 code: available where the kernels vectorize 512 bits wide
AVAILABLE = WIDE_VECTORS


def pack(b: np.ndarray) -> np.ndarray:
    """B[K, N] -> panels (ceil(N / NR), K, NR) float32, columns past N zero."""
    out = panels_for(b)
    pack_into(b, out)
    return out


def panels_for(b: np.ndarray) -> np.ndarray:
    """The uninitialized array `pack(b)` fills."""
    k, n = b.shape
    return np.empty((-(-n // NR), k, NR), np.float32)


def pack_into(b: np.ndarray, out: np.ndarray) -> None:
    """Fill `out` (from `panels_for(b)`) with B's panels; the interpreter is free meanwhile."""
    _pack_into(np.ascontiguousarray(b, dtype=np.float32), out)


@njit(cache=True, nogil=True, error_model="numpy")
def _pack_into(b, out):
    """The copy `pack` makes, compiled: 1.7-2x NumPy's strided transpose copy (loading a saved
    1,869-node decoder packs 112 weight matrices, 180 MB: 0.13 s with NumPy)."""
    k, n = b.shape
    for p in range(out.shape[0]):
        j0 = p * NR
        w = min(NR, n - j0)
        for kk in range(k):
            for j in range(w):
                out[p, kk, j] = b[kk, j0 + j]
            for j in range(w, NR):
                out[p, kk, j] = np.float32(0)


def _tile_ir(mr: int, table: bool = False, a_table: bool = False) -> str:
    """`void mk<mr>(A, B, C, ldc, k, ncols)`: C[i, j] = sum_k A[i, k] B[k, j] for i < mr,
    j < ncols (<= NR); A one row tile of `pack_rows` (A[i, k] at A + k MR + i), B one panel
    (k rows of NR floats). With `a_table`, `void mka<mr>(A, T, B, C, ldc, k, ncols)`: A[i, k]
    at A + T[k] + i (an int64 table of offsets in floats), B one panel.

    With `table`, `void mkt<mr>(A, T, B, C, ldc, k, ncols)`: B[k, j] at B + T[k] + j, T an
    int64 table of row offsets (in floats); the loads of B are masked to j < ncols, so no
    column past the tile is read."""
    nv = NR // 16
    name, second = (f"mkt{mr}", "ptr noalias %T, ") if table else (f"mk{mr}", "")
    if a_table:
        name, second = f"mka{mr}", "ptr noalias %T, "
    lines = [f"define internal void @{name}(ptr noalias %A, {second}ptr noalias %B, "
             "ptr noalias %C, i64 %ldc, i64 %kc, i64 %ncols) #0 {", "entry:",
             "  %ncs = insertelement <16 x i64> poison, i64 %ncols, i64 0",
             "  %ncv = shufflevector <16 x i64> %ncs, <16 x i64> poison, "
             "<16 x i32> zeroinitializer"]
    for j in range(nv):
        lanes = ", ".join(f"i64 {x + 16 * j}" for x in range(16))
        lines.append(f"  %m{j} = icmp ult <16 x i64> <{lanes}>, %ncv")
    lines += ["  %empty = icmp eq i64 %kc, 0", "  br i1 %empty, label %exit, label %loop",
              "loop:", "  %k = phi i64 [0, %entry], [%k1, %loop]"]
    for i in range(mr):
        for j in range(nv):
            lines.append(f"  %c{i}_{j} = phi <16 x float> [zeroinitializer, %entry], "
                         f"[%n{i}_{j}, %loop]")
    if table:
        lines += ["  %tp = getelementptr i64, ptr %T, i64 %k", "  %boff = load i64, ptr %tp",
                  "  %bp = getelementptr float, ptr %B, i64 %boff"]
        for j in range(nv):
            lines += [f"  %bp{j} = getelementptr float, ptr %bp, i64 {16 * j}",
                      f"  %b{j} = call <16 x float> @llvm.masked.load.v16f32.p0(ptr %bp{j}, "
                      f"i32 4, <16 x i1> %m{j}, <16 x float> zeroinitializer)"]
        if TABLE_PREFETCH:
            # B row k + TABLE_PREFETCH (the table has that many entries past k - 1)
            lines += [f"  %tpf = getelementptr i64, ptr %tp, i64 {TABLE_PREFETCH}",
                      "  %pfoff = load i64, ptr %tpf",
                      "  %pfb = getelementptr float, ptr %B, i64 %pfoff"]
            for j in range(nv + 1):
                lines += [f"  %pf{j} = getelementptr float, ptr %pfb, i64 {16 * j}",
                          f"  call void @llvm.prefetch.p0(ptr %pf{j}, i32 0, i32 3, i32 1)"]
    else:
        lines += [f"  %boff = mul i64 %k, {NR}", "  %bp = getelementptr float, ptr %B, i64 %boff"]
        for j in range(nv):
            lines += [f"  %bp{j} = getelementptr float, ptr %bp, i64 {16 * j}",
                      f"  %b{j} = load <16 x float>, ptr %bp{j}, align 4"]
        # the panel streams in from L3 on the first tile: fetch ahead, a cache line per vector
        for j in range(nv):
            lines += [f"  %pf{j} = getelementptr float, ptr %bp{j}, i64 {PREFETCH}",
                      f"  call void @llvm.prefetch.p0(ptr %pf{j}, i32 0, i32 3, i32 1)"]
    if a_table:
        # A[i, k] at A + T[k] + i: mr consecutive positions of one input row, no packing
        lines += ["  %atp = getelementptr i64, ptr %T, i64 %k", "  %akoff = load i64, ptr %atp",
                  "  %ak = getelementptr float, ptr %A, i64 %akoff"]
    else:
        lines += [f"  %akoff = mul i64 %k, {MR}",
                  "  %ak = getelementptr float, ptr %A, i64 %akoff"]
    for i in range(mr):
        lines += splat_ir("float", "%ak", str(i), (f"%aq{i}", f"%as{i}", f"%ai{i}", f"%av{i}"))
        for j in range(nv):
            lines.append(f"  %n{i}_{j} = call <16 x float> @llvm.fma.v16f32(<16 x float> "
                         f"%av{i}, <16 x float> %b{j}, <16 x float> %c{i}_{j})")
    lines += ["  %k1 = add i64 %k, 1", "  %done = icmp eq i64 %k1, %kc",
              "  br i1 %done, label %exit, label %loop", "exit:"]
    for i in range(mr):
        for j in range(nv):
            lines.append(f"  %r{i}_{j} = phi <16 x float> [zeroinitializer, %entry], "
                         f"[%n{i}_{j}, %loop]")
    for i in range(mr):
        lines += [f"  %coff{i} = mul i64 %ldc, {i}",
                  f"  %cp{i} = getelementptr float, ptr %C, i64 %coff{i}"]
        for j in range(nv):
            lines += [f"  %cp{i}_{j} = getelementptr float, ptr %cp{i}, i64 {16 * j}",
                      f"  call void @llvm.masked.store.v16f32.p0(<16 x float> %r{i}_{j}, "
                      f"ptr %cp{i}_{j}, i32 4, <16 x i1> %m{j})"]
    lines += ["  ret void", "}"]
    return "\n".join(lines)


def splat_ir(ty: str, base: str, index: str, names: tuple[str, str, str, str]) -> list[str]:
    """IR lines that broadcast the `ty` at base[index] to a 16-lane vector, named (address,
    scalar, one-lane vector, result)."""
    at, scalar, lane, out = names
    return [f"  {at} = getelementptr {ty}, ptr {base}, i64 {index}",
            f"  {scalar} = load {ty}, ptr {at}, align 4",
            f"  {lane} = insertelement <16 x {ty}> poison, {ty} {scalar}, i64 0",
            f"  {out} = shufflevector <16 x {ty}> {lane}, <16 x {ty}> poison, "
            "<16 x i32> zeroinitializer"]


def _entry_ir(symbol: str, prefix: str, table: bool) -> str:
    """`symbol(mr, A, [T,] B, C, ldc, k, ncols)`: calls <prefix><mr>."""
    second = "ptr %T, " if table else ""
    cases = " ".join(f"i64 {mr}, label %d{mr}" for mr in range(1, MR))
    entry = [f"define void @{symbol}(i64 %mr, ptr %A, {second}ptr %B, ptr %C, i64 %ldc, "
             "i64 %kc, i64 %ncols) #0 {", "entry:", f"  switch i64 %mr, label %d{MR} [{cases}]"]
    for mr in range(1, MR + 1):
        entry += [f"d{mr}:", f"  call void @{prefix}{mr}(ptr %A, {second}ptr %B, ptr %C, "
                  "i64 %ldc, i64 %kc, i64 %ncols)", "  ret void"]
    return "\n".join(entry + ["}"])


def microkernel_ir() -> str:
    """The LLVM module: tiles mk1 ... mk12 behind the entry `eqsat_fuse_mk(mr, ...)` (B in
    panels), mkt1 ... mkt12 behind `eqsat_fuse_mkt(mr, ...)` (B by a row table), and mka1 ...
    mka12 behind `eqsat_fuse_mka(mr, ...)` (A by a table of offsets, B in panels)."""
    parts = ["declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
             "declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32, <16 x i1>)",
             "declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, "
             "<16 x float>)",
             "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"]
    parts += [_tile_ir(mr) for mr in range(1, MR + 1)]
    parts += [_tile_ir(mr, table=True) for mr in range(1, MR + 1)]
    parts += [_tile_ir(mr, a_table=True) for mr in range(1, MR + 1)]
    parts.append(_entry_ir(SYMBOL, "mk", False))
    parts.append(_entry_ir(SYMBOL_TABLE, "mkt", True))
    parts.append(_entry_ir(SYMBOL_ATABLE, "mka", True))
    parts.append('attributes #0 = { nounwind "prefer-vector-width"="512" '
                 '"min-legal-vector-width"="512" }')
    return "\n\n".join(parts)


_ENGINE = None


def ensure_compiled() -> None:
    """Load the microkernel's machine code for this CPU (compiled once per machine, see the
    module's docstring) and register its symbols, once per process. Generated kernel modules
    that call `gemm` run this when they are imported."""
    global _ENGINE
    if _ENGINE is not None:
        return
    if not AVAILABLE:
        raise RuntimeError("the packed GEMM needs AVX-512")
    _ENGINE = load_ir(microkernel_ir(), "microkernel", (SYMBOL, SYMBOL_TABLE, SYMBOL_ATABLE))


def _call_codegen(symbol: str, ptr_slots: set[int]):
    """Codegen of a call to the entry `symbol`: arguments in `ptr_slots` are addresses."""

    def codegen(context, builder, signature, values):
        ptr = ir.IntType(8).as_pointer()
        i64 = ir.IntType(64)
        n = len(values)
        fnty = ir.FunctionType(ir.VoidType(), [ptr if i in ptr_slots else i64 for i in range(n)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, symbol)
        ints = [context.cast(builder, v, t, types.int64) for v, t in zip(values, signature.args)]
        builder.call(fn, [builder.inttoptr(v, ptr) if i in ptr_slots else v
                          for i, v in enumerate(ints)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def _tile(typingctx, mr, a, b, c, ldc, kc, ncols):
    """The panel microkernel on integer addresses of A, B and C."""
    return types.none(mr, a, b, c, ldc, kc, ncols), _call_codegen(SYMBOL, {1, 2, 3})


@intrinsic
def _table_tile(typingctx, mr, a, t, b, c, ldc, kc, ncols):
    """The row-table microkernel on integer addresses of A, the table, B and C."""
    return (types.none(mr, a, t, b, c, ldc, kc, ncols),
            _call_codegen(SYMBOL_TABLE, {1, 2, 3, 4}))


@intrinsic
def _gather_tile(typingctx, mr, a, t, b, c, ldc, kc, ncols):
    """The A-table microkernel (A[i, k] at a + t[k] + i, B a panel) on integer addresses."""
    return (types.none(mr, a, t, b, c, ldc, kc, ncols),
            _call_codegen(SYMBOL_ATABLE, {1, 2, 3, 4}))


_OPTS = dict(cache=True, error_model="numpy")


def a_workspace(rows: int, k: int) -> int:
    """Floats of workspace `gemm` packs `rows` rows of A into."""
    return -(-rows // MR) * MR * k


@njit(**_OPTS)
def pack_a(a, a_off, lda, r0, r1, k, out):
    """Rows [r0, r1) of A (a[a_off + r * lda + j]) into row tiles of MR rows, zero-padded:
    out[t * MR * k + j * MR + i] = A[r0 + t * MR + i, j]."""
    m = r1 - r0
    for t in range(-(-m // MR)):
        base = t * MR * k
        top = r0 + t * MR
        nr = min(MR, r1 - top)
        for kk in range(k):
            for i in range(nr):
                out[U(base + kk * MR + i)] = a[U(a_off + (top + i) * lda + kk)]
            for i in range(nr, MR):
                out[U(base + kk * MR + i)] = np.float32(0)


@njit(**_OPTS)
def _panel(pa, m, bp, p, n, k, pc, ldc):
    nc = min(NR, n - p * NR)
    pb = bp.ctypes.data + 4 * p * k * NR
    for t in range(-(-m // MR)):
        _tile(min(MR, m - t * MR), pa + 4 * t * MR * k, pb, pc + 4 * (t * MR * ldc + p * NR),
              ldc, k, nc)


@njit(**_OPTS)
def gemm(a, a_off, lda, r0, r1, bp, n, k, c, c_off, ldc, ws):
    """C rows [r0, r1) = A rows [r0, r1) @ B, with A at a[a_off + r * lda + j] and C at
    c[c_off + r * ldc + j] (flat float32 arrays), B packed by `pack` (n columns, k rows); ws
    is float32 workspace of at least `a_workspace(r1 - r0, k)` floats. Panels outer: each
    panel of B is read from memory once, the packed rows of A stream past it from L2.
    Call `ensure_compiled()` first in the process (the microkernel symbol must exist)."""
    pack_a(a, a_off, lda, r0, r1, k, ws)
    pc = c.ctypes.data + 4 * (c_off + r0 * ldc)
    for p in range(bp.shape[0]):
        _panel(ws.ctypes.data, r1 - r0, bp, p, n, k, pc, ldc)


@njit(parallel=True, **_OPTS)
def gemm_parallel(a, a_off, lda, r0, r1, bp, n, k, c, c_off, ldc, ws):
    """`gemm` with the panels shared among the threads."""
    pack_a(a, a_off, lda, r0, r1, k, ws)
    pc = c.ctypes.data + 4 * (c_off + r0 * ldc)
    for p in prange(bp.shape[0]):
        _panel(ws.ctypes.data, r1 - r0, bp, p, n, k, pc, ldc)


def pack_rows(a: np.ndarray) -> np.ndarray:
    """A[M, K] -> tiles (ceil(M / MR), K, MR) float32, rows past M zero: what the microkernel
    reads (A[i, k] of a tile at k * MR + i), laid out by `pack_a`."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    m, k = a.shape
    out = np.empty(a_workspace(m, k), np.float32)
    pack_a(a.reshape(-1), 0, k, 0, m, k, out)
    return out.reshape(-(-m // MR), k, MR)


def row_table(offsets) -> np.ndarray:
    """The int64 row table `gemm_rows` reads: the offsets, then TABLE_PREFETCH copies of the
    first (rows the microkernel prefetches past the end)."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
    pad = np.full(TABLE_PREFETCH, offsets[0] if offsets.size else 0, np.int64)
    return np.concatenate([offsets, pad])


@njit(**_OPTS)
def _row_tile(ap, a_off, t, m, k, b, b_off, table, n, c, c_off, ldc):
    mr = min(MR, m - t * MR)
    pa = ap.ctypes.data + 4 * (a_off + t * MR * k)
    pb = b.ctypes.data + 4 * b_off
    pc = c.ctypes.data + 4 * (c_off + t * MR * ldc)
    for q in range(0, n, NR):
        _table_tile(mr, pa, table.ctypes.data, pb + 4 * q, pc + 4 * q, ldc, k, min(NR, n - q))


@njit(**_OPTS)
def gemm_rows(ap, a_off, m, k, b, b_off, table, n, c, c_off, ldc):
    """C[r, j] = sum_k A[r, k] B[k, j] for r < m, j < n: A packed by `pack_rows` (its tiles
    from ap[a_off]), B[k, j] = b[b_off + table[k] + j] (any row offsets: rows of a matrix, or
    the taps of a convolution over padded input planes; `row_table` appends the entries the
    prefetch reads), C at c[c_off + r * ldc + j].
    Row tiles outer, so each tile of A stays in L1 while the columns stream past it."""
    for t in range(-(-m // MR)):
        _row_tile(ap, a_off, t, m, k, b, b_off, table, n, c, c_off, ldc)


@njit(parallel=True, **_OPTS)
def gemm_rows_parallel(ap, a_off, m, k, b, b_off, table, n, c, c_off, ldc):
    """`gemm_rows` with the row tiles shared among the threads."""
    for t in prange(-(-m // MR)):
        _row_tile(ap, a_off, t, m, k, b, b_off, table, n, c, c_off, ldc)


@njit(**_OPTS)
def gemm_gather(x, x_off, table, l0, l1, lw, stride, bp, p, n, k, c, c_off):
    """C[(l - l0) lw + i, j] = sum_k A[l, i, k] B[k, p NR + j] for lines l in [l0, l1),
    i < lw, j < min(NR, n - p NR), with A[l, i, k] = x[x_off + l stride + table[k] + i] (lw
    consecutive positions of an output row; the im2col matrix is never built, nor packed: the
    microkernel broadcasts A straight from the input planes) and B packed by `pack`; C at
    c[c_off + row * NR + j]. Tiles of at most MR positions within a line."""
    pb = bp.ctypes.data + 4 * p * k * NR
    nc = min(NR, n - p * NR)
    xa = x.ctypes.data + 4 * x_off
    pt = table.ctypes.data
    pc = c.ctypes.data + 4 * c_off
    for line in range(l0, l1):
        row = (line - l0) * lw
        for i0 in range(0, lw, MR):
            _gather_tile(min(MR, lw - i0), xa + 4 * (line * stride + i0), pt, pb,
                         pc + 4 * (row + i0) * NR, NR, k, nc)


# what generated kernels call, through entry points (`calls.runtime_entry`)
_GEMM_ARGS = [F32_ARRAY, I64, I64, I64, I64, F32_ARRAY3, I64, I64, F32_ARRAY, I64, I64, F32_ARRAY]
_ROWS_ARGS = [F32_ARRAY, I64, I64, I64, F32_ARRAY, I64, I64_ARRAY, I64, F32_ARRAY, I64, I64]
gemm_entry = runtime_entry(gemm, "PG.gemm", _GEMM_ARGS)
gemm_parallel_entry = runtime_entry(gemm_parallel, "PG.gemm_parallel", _GEMM_ARGS)
gemm_rows_entry = runtime_entry(gemm_rows, "PG.gemm_rows", _ROWS_ARGS)
gemm_rows_parallel_entry = runtime_entry(gemm_rows_parallel, "PG.gemm_rows_parallel",
                                         _ROWS_ARGS)
gemm_gather_entry = runtime_entry(gemm_gather, "PG.gemm_gather",
                                  [F32_ARRAY, I64, I64_ARRAY, I64, I64, I64, I64, F32_ARRAY3,
                                   I64, I64, I64, F32_ARRAY, I64])
