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

A Conv (`conv_columns`) runs the other way round, on a second microkernel whose operands are
swapped (`SYMBOL_T`: A signed, B unsigned): the signed weights are A, packed once (`conv_a`),
and the unsigned activations B, read from the image's zero-point-padded planes 4 channels to a
word (`quad_planes`, k ordered (quad, tap, channel)), so C comes out channels x positions, as
the epilogue writes it. The microkernel reads B's row kk at an offset of its own, so a stride-1
Conv reads the image itself, no packing: its positions are the columns of rows as wide as the
padded plane, and the columns past each output row are dropped. Other strides gather each
panel's words first. The sums start from the zero point's share, -zx times a channel's weight
sum. Grouped Convs run by direct loops (`conv_direct`).

Measured on this machine (bench/vnni_probe.py, one thread, A's packing included, before A was
packed a word at a time): 199-218 GMAC/s at BERT-base shapes (128 x 768 x 3072 and back), 74-88
at tall, narrow ResNet-like shapes where packing A byte by byte dominated, against 43-57 for the
float32 packed GEMM (`packed_gemm.py`) on the same shapes.
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
from .packed_gemm import _call_codegen, splat_ir

MR, NR = 8, 32
SYMBOL = "eqsat_fuse_i8mk"
SYMBOL_T = "eqsat_fuse_i8mk_t"
U8_ARRAY = types.Array(types.uint8, 1, "C")
I8_ARRAY = types.Array(types.int8, 1, "C")
U = np.uint64          # unsigned indices (see pack_a)
I32_ARRAY = types.Array(types.int32, 1, "C")


def _vnni() -> bool:
    if not WIDE_VECTORS:
        return False
    import llvmlite.binding as llvm
    return "avx512vnni" in llvm.get_host_cpu_features().flatten()


AVAILABLE = _vnni()


def microkernel_ir(symbol: str = "", swapped: bool = False) -> str:
    """`void eqsat_fuse_i8mk(A, B, C, ldc, k4)`: C[i, j] = sum_k A[i, k] B[k, j], i < MR, j < NR,
    A one row tile of `pack_a` (word (kk, i) at A + 4 (kk MR + i)), B one panel of `pack_b`
    (words (kk, j) at B + 4 (kk NR + j)), C int32 with row stride ldc (elements). The swapped
    kernel takes two more: O, int64 word offsets of B's rows (words (kk, j) at
    B + 4 (O[kk] + j), so that B may be a panel, O[kk] = kk NR, or the image itself), and Z,
    MR int32 that row i of C starts from (the activations' zero point, -zx rowsum[i])."""
    acc = [(i, h) for i in range(MR) for h in range(2)]
    lines = [
        "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)",
        f"define void @{symbol or SYMBOL}(ptr noalias %A, ptr noalias %B, ptr noalias %C, "
        "i64 %ldc, i64 %k4" + (", ptr noalias %O, ptr noalias %Z" if swapped else "") + ") #0 {",
        "entry:"]
    start = {i: "zeroinitializer" for i in range(MR)}
    if swapped:
        for i in range(MR):
            lines += splat_ir("i32", "%Z", str(i), (f"%zp{i}", f"%zw{i}", f"%zs{i}", f"%z{i}"))
            start[i] = f"%z{i}"
    lines += ["  br label %k", "k:", "  %kk = phi i64 [0, %entry], [%kk2, %k]"]
    lines += [f"  %c{i}_{h} = phi <16 x i32> [{start[i]}, %entry], [%n{i}_{h}, %k]"
              for i, h in acc]
    # the swapped kernel reads B's row kk at word O[kk] (a panel's kk NR, or an image's tap)
    lines += ["  %op = getelementptr i64, ptr %O, i64 %kk", "  %bo = load i64, ptr %op, align 8"]\
        if swapped else [f"  %bo = mul i64 %kk, {NR}"]
    lines += ["  %bp0 = getelementptr i32, ptr %B, i64 %bo",
              "  %bp1 = getelementptr i32, ptr %bp0, i64 16",
              "  %b0 = load <16 x i32>, ptr %bp0, align 4",
              "  %b1 = load <16 x i32>, ptr %bp1, align 4", f"  %ao = mul i64 %kk, {MR}"]
    for i in range(MR):
        lines += [f"  %ai{i} = add i64 %ao, {i}"]
        lines += splat_ir("i32", "%A", f"%ai{i}", (f"%ap{i}", f"%aw{i}", f"%as{i}", f"%av{i}"))
        # vpdpbusd multiplies unsigned bytes of its second operand by signed bytes of its third
        for h in range(2):
            u8, s8 = (f"%b{h}", f"%av{i}") if swapped else (f"%av{i}", f"%b{h}")
            lines.append(f"  %n{i}_{h} = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512("
                         f"<16 x i32> %c{i}_{h}, <16 x i32> {u8}, <16 x i32> {s8})")
    lines += ["  %kk2 = add i64 %kk, 1", "  %more = icmp ult i64 %kk2, %k4",
              "  br i1 %more, label %k, label %store", "store:"]
    for i, h in acc:
        lines += [f"  %o{i}_{h} = mul i64 %ldc, {i}", f"  %q{i}_{h} = add i64 %o{i}_{h}, {16 * h}",
                  f"  %cp{i}_{h} = getelementptr i32, ptr %C, i64 %q{i}_{h}",
                  f"  store <16 x i32> %n{i}_{h}, ptr %cp{i}_{h}, align 4"]
    lines += ["  ret void", "}"]
    if symbol:                   # one function of a module that `module_ir` completes
        return "\n".join(lines[1:])
    lines += ['attributes #0 = { nounwind "prefer-vector-width"="512" '
              '"min-legal-vector-width"="512" }']
    return "\n".join(lines)


def module_ir() -> str:
    """Both microkernels: `SYMBOL` (A unsigned, B signed) and `SYMBOL_T` (A signed, B
    unsigned: signed weights as A, unsigned activations as B)."""
    return "\n".join([
        "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)",
        microkernel_ir(SYMBOL), microkernel_ir(SYMBOL_T, swapped=True),
        'attributes #0 = { nounwind "prefer-vector-width"="512" '
        '"min-legal-vector-width"="512" }'])


_ENGINE = None


def ensure_compiled() -> None:
    """Load the microkernel's machine code and register its symbol, once per process."""
    global _ENGINE
    if _ENGINE is None:
        if not AVAILABLE:
            raise RuntimeError("the int8 GEMM needs AVX-512 VNNI")
        _ENGINE = load_ir(module_ir(), "int8-microkernel", (SYMBOL, SYMBOL_T))


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


@intrinsic
def _tile_t(typingctx, a, b, c, ldc, k4, o, z):
    """The swapped-operand microkernel (A signed, B unsigned, B's rows at the word offsets o,
    C's rows starting from z) on integer addresses."""
    return types.none(a, b, c, ldc, k4, o, z), _call_codegen(SYMBOL_T, {0, 1, 2, 5, 6})


_OPTS = dict(cache=True, error_model="numpy")


@njit(**_OPTS)
def pack_a(a, a_off, lda, r0, r1, k, out):
    """Rows [r0, r1) of A (a[a_off + r lda + j], uint8) into row tiles of MR rows, zero-padded:
    out[4 (t MR k4 + kk MR + i) + q] = A[r0 + t MR + i, 4 kk + q]. A word (4 bytes of a row) at
    a time, indices unsigned (U) so that the row's loop vectorizes."""
    k4 = -(-k // 4)
    full = k // 4
    m = r1 - r0
    o = out.view(np.int32)
    for t in range(-(-m // MR)):
        for i in range(MR):
            r = r0 + t * MR + i
            dst = U(t * MR * k4 + i)
            if r >= r1:
                for kk in range(U(k4)):
                    o[dst + kk * U(MR)] = 0
                continue
            src = U(a_off + r * lda)
            for kk in range(U(full)):
                j = src + U(4) * kk
                o[dst + kk * U(MR)] = np.int32(
                    np.uint32(a[j]) | (np.uint32(a[j + U(1)]) << np.uint32(8))
                    | (np.uint32(a[j + U(2)]) << np.uint32(16))
                    | (np.uint32(a[j + U(3)]) << np.uint32(24)))
            if full < k4:
                v = np.uint32(0)
                for q in range(k - 4 * full):
                    v |= np.uint32(a[src + U(4 * full + q)]) << np.uint32(8 * q)
                o[dst + U(full * MR)] = np.int32(v)


@njit(**_OPTS)
def tiles(ws, rows, bp, n, k, c, c_row, ldc, colsum, za):
    """C[c_row + r, j] = sum_k (A[r, k] - za) B[k, j] for the rows of A that `ws` holds packed
    (`pack_a`), every column of whole panels: B packed by `pack_b` (n columns,
    k rows), C int32 at c[r ldc + j] (ldc = c_cols(n)); colsum B's column sums (c_cols(n)
    entries), which compensate A's zero point: sum_k (a - za) b = sum_k a b - za sum_k b."""
    k4 = -(-k // 4)
    count = -(-rows // MR)
    for p in range(-(-n // NR)):
        pb = bp.ctypes.data + p * k4 * NR * 4
        for t in range(count):
            _tile(ws.ctypes.data + t * MR * k4 * 4, pb,
                  c.ctypes.data + 4 * ((c_row + t * MR) * ldc + p * NR), ldc, k4)
    if za != 0:
        zi = np.int32(za)
        for r in range(c_row, c_row + count * MR):
            for j in range(ldc):
                c[r * ldc + j] -= zi * colsum[j]


@njit(**_OPTS)
def gemm(a, a_off, lda, r0, r1, bp, n, k, c, ldc, ws, colsum, za):
    """Rows r0 <= r < r1 of C = (A - za) B (`tiles`): A uint8 at a[a_off + r lda + k], ws
    uint8 of at least `a_workspace(r1 - r0, k)` bytes for its packing."""
    pack_a(a, a_off, lda, r0, r1, k, ws)
    tiles(ws, r1 - r0, bp, n, k, c, r0, ldc, colsum, za)


def quad_words(c: int) -> int:
    """Groups of 4 channels (a Conv's k words per tap) of `c` channels."""
    return -(-c // 4)


def quad_image_words(c: int, hp: int, wp: int) -> int:
    """Words of `quad_planes`' image: its quads of padded planes, and the slack that a
    stride-1 Conv's last panel reads past them (`conv_columns`)."""
    return quad_words(c) * hp * wp + wp + NR


@njit(**_OPTS)
def quad_planes(x, x_off, C, H, W, ph, pw, Hp, Wp, pad, flip, out):
    """One image's planes padded, 4 channels to a word: byte q of out[(cq Hp + h) Wp + w] is
    x[x_off + ((4 cq + q) H + h - ph) W + w - pw] inside the image, `pad` (the zero point)
    around it and in the channels past C; with `flip` each byte has its top bit flipped (int8
    read as uint8 + 128). A Conv's word of 4 consecutive k is then one word of this image."""
    top = np.uint32(0x80808080) if flip else np.uint32(0)
    fill = np.uint32(pad) * np.uint32(0x01010101)
    for cq in range(-(-C // 4)):
        for h in range(Hp):
            dst = U((cq * Hp + h) * Wp)
            if h < ph or h >= ph + H:
                for w in range(U(Wp)):
                    out[dst + w] = np.int32(fill)
                continue
            for w in range(U(pw)):
                out[dst + w] = np.int32(fill)
            for w in range(U(pw + W), U(Wp)):
                out[dst + w] = np.int32(fill)
            base = U(dst + U(pw))
            if 4 * cq + 4 <= C:
                s0 = U(x_off + ((4 * cq) * H + h - ph) * W)
                s1, s2, s3 = s0 + U(H * W), s0 + U(2 * H * W), s0 + U(3 * H * W)
                for w in range(U(W)):
                    out[base + w] = np.int32(
                        (np.uint32(x[s0 + w]) | (np.uint32(x[s1 + w]) << np.uint32(8))
                         | (np.uint32(x[s2 + w]) << np.uint32(16))
                         | (np.uint32(x[s3 + w]) << np.uint32(24))) ^ top)
            else:                   # the last quad, with channels past C
                for w in range(W):
                    v = fill
                    for q in range(C - 4 * cq):
                        b = np.uint32(x[U(x_off + ((4 * cq + q) * H + h - ph) * W + w)])
                        v = (v & ~(np.uint32(0xFF) << np.uint32(8 * q))) | \
                            ((b ^ (top & np.uint32(0xFF))) << np.uint32(8 * q))
                    out[base + U(w)] = np.int32(v)


@njit(**_OPTS)
def conv_columns(xq, offs, k4, Wp, sh, sw, OW, q0, q1, ap, m, rowsum, zx, c, ldc, bws, ptab,
                 ldv):
    """Output positions q0 <= q < q1 of a Conv (one group, one image) as c[m ldc + q - q0]
    int32, exactly: the signed weights are A (packed by `pack_a` in `conv_a`'s order, at
    compile time), the unsigned activations B, words of the quad image xq (`quad_planes`) in
    which word kk of position (oh, ow) lies at offs[kk] + oh sh Wp + ow sw; the product by the
    swapped-operand microkernel, whose sums start from the zero point's share:
    sum_k w (x - zx) = sum_k w x - zx rowsum[m].

    - Stride 1 (q0 and q1 whole output rows): B is the image itself, no packing. Position
      (oh, ow) is column oh Wp + ow of a row Wp wide (the columns ow >= OW are discarded), so
      a panel of NR columns is NR consecutive words of each tap's row: the microkernel reads
      them at offs. C is computed ldv wide, then its rows of OW are moved into place (unless
      Wp is OW, as in an unpadded 1x1 Conv).
    - Other strides: each panel of NR positions is gathered into bws (words (kk, j) at
      kk NR + j, ptab[kk] = kk NR) on the way, one output row's run of positions at a time."""
    mt = -(-m // MR)
    z = np.zeros(mt * MR, np.int32)         # C's rows start from the zero point's share
    for r in range(m):
        z[r] = -np.int32(zx * rowsum[r])
    if sh == 1 and sw == 1:
        oh0, rows = q0 // OW, -(-(q1 - q0) // OW)
        panels = -(-(rows * Wp) // NR)
        for i in range(mt):
            for t in range(panels):
                _tile_t(ap.ctypes.data + i * MR * k4 * 4,
                        xq.ctypes.data + 4 * (oh0 * Wp + t * NR),
                        c.ctypes.data + 4 * (i * MR * ldv + t * NR), ldv, k4,
                        offs.ctypes.data, z.ctypes.data + 4 * i * MR)
        if Wp != OW or ldv != ldc:  # rows of OW out of rows of Wp, in place (dst <= src)
            for r in range(m):
                for oh in range(rows):
                    src, dst = U(r * ldv + oh * Wp), U(r * ldc + oh * OW)
                    for ow in range(U(OW)):
                        c[dst + ow] = c[src + ow]
        return
    n = q1 - q0
    panels = -(-n // NR)
    b32 = bws.view(np.int32)
    for t in range(panels):
        base = t * k4 * NR
        j = 0
        while j < NR:               # the panel's runs of positions on one output row
            q = q0 + t * NR + j
            if q >= q1:             # past the last position: zeros
                for kk in range(k4):
                    for i in range(j, NR):
                        b32[base + kk * NR + i] = 0
                break
            oh, ow = divmod(q, OW)
            run = min(NR - j, OW - ow, q1 - q)
            src = oh * sh * Wp + ow * sw
            for kk in range(k4):
                o, d = U(src + offs[kk]), U(base + kk * NR + j)
                for jj in range(U(run)):
                    b32[d + jj] = xq[o + jj * U(sw)]
            j += run
    for i in range(mt):
        for t in range(panels):
            _tile_t(ap.ctypes.data + i * MR * k4 * 4, bws.ctypes.data + t * k4 * NR * 4,
                    c.ctypes.data + 4 * (i * MR * ldc + t * NR), ldc, k4, ptab.ctypes.data,
                    z.ctypes.data + 4 * i * MR)


def conv_a(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Int8 Conv weights [M, C, kh, kw] as `conv_columns`' A (packed rows of M, k in the
    order (quad of 4 channels, tap, channel of the quad), channels past C zero) and their row
    sums."""
    m, c, kh, kw = w.shape
    quads = np.zeros((m, quad_words(c) * 4, kh, kw), np.int8)
    quads[:, :c] = w
    rows = np.ascontiguousarray(
        quads.reshape(m, -1, 4, kh, kw).transpose(0, 1, 3, 4, 2).reshape(m, -1))
    k = rows.shape[1]
    packed = np.zeros(a_workspace(m, k), np.uint8)
    pack_a(rows.view(np.uint8).reshape(-1), 0, k, 0, m, k, packed)
    return packed, w.reshape(m, -1).astype(np.int64).sum(axis=1).astype(np.int32)


def conv_offsets(c: int, kh: int, kw: int, hp: int, wp: int, dh: int, dw: int) -> np.ndarray:
    """Word offsets in `quad_planes`' image of a Conv's k words at position 0: (quad, tap)."""
    return np.array([(cq * hp + i * dh) * wp + j * dw for cq in range(quad_words(c))
                     for i in range(kh) for j in range(kw)], np.int64)


@njit(**_OPTS)
def conv_direct(x, x_off, C, H, W, M, G, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, w, zx, flip,
                c):
    """A grouped Conv (one image) by direct loops, exactly: c[(m OH + oh) OW + ow] =
    sum over its group's channels and taps of (x - zx) w in int32, padding contributing 0;
    w int8 [M, C/G, kh, kw] flat; with `flip` x is int8 read as uint8 + 128 (zx in that domain)."""
    cg, mg = C // G, M // G
    top = np.uint8(0x80) if flip else np.uint8(0)
    c[:M * OH * OW] = 0
    for m in range(M):
        g = m // mg
        for ci in range(cg):
            plane = x_off + (g * cg + ci) * H * W
            for ii in range(kh):
                for jj in range(kw):
                    wv = np.int32(w[((m * cg + ci) * kh + ii) * kw + jj])
                    # the output columns whose input column lies inside the image
                    lo = max(0, -(-(pw - jj * dw) // sw))
                    hi = min(OW, (W - 1 + pw - jj * dw) // sw + 1)
                    for oh in range(OH):
                        h = oh * sh - ph + ii * dh
                        if h < 0 or h >= H:
                            continue
                        src = plane + h * W - pw + jj * dw
                        dst = (m * OH + oh) * OW
                        for ow in range(lo, hi):
                            c[dst + ow] += (np.int32(x[src + ow * sw] ^ top) - zx) * wv


gemm_entry = runtime_entry(gemm, "I8.gemm", [U8_ARRAY, I64, I64, I64, I64, I8_ARRAY, I64, I64,
                                             I32_ARRAY, I64, U8_ARRAY, I32_ARRAY, I64])
I64_ARRAY = types.Array(types.int64, 1, "C")
quad_planes_entry = runtime_entry(quad_planes, "I8.quad_planes",
                                  [U8_ARRAY] + [I64] * 10 + [I32_ARRAY])
conv_columns_entry = runtime_entry(
    conv_columns, "I8.conv_columns",
    [I32_ARRAY, I64_ARRAY] + [I64] * 7 + [U8_ARRAY, I64, I32_ARRAY, I64, I32_ARRAY, I64,
                                          U8_ARRAY, I64_ARRAY, I64])
conv_direct_entry = runtime_entry(conv_direct, "I8.conv_direct",
                                  [U8_ARRAY] + [I64] * 16 + [I8_ARRAY, I64, I64, I32_ARRAY])
