"""How fast an int8 GEMM can be here: a register-blocked AVX-512 VNNI microkernel in LLVM IR
(llvmlite), against the float32 packed GEMM the Numba backend uses, same shapes, same run.

    .venv/bin/python bench/vnni_probe.py [--shapes MxKxN ...]

A probe for issue 18's integer kernels, not a part of the compiler: uint8 activations A[M, K]
times int8 weights B[K, N] with int32 accumulation, `vpdpbusd` (64 u8 x s8 products into 16
int32 lanes per instruction), tiles of 8 rows x 32 columns (16 accumulator registers), A and B
packed in groups of 4 along K beforehand (B once, as constant weights would be; A's packing is
timed apart). The result is checked against an int64 NumPy product, then timed; the float32
packed GEMM (`eqsat_fuse.backends.numba.packed_gemm.gemm`) on the same M x K x N beside it.
One thread. Prints GMAC/s (multiply-adds per second) and the int8 / float32 time ratio.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

set_threads(sys.argv)

import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402

MR, NR = 8, 32


def _ir() -> str:
    """`gemm(A, B, C, mt, np, k4, ldc)`: C[t*MR + i, p*NR + j] = sum over k of A x B, for mt
    row tiles and np column panels; A tile t at A + t*k4*MR words (word (kk, i) = A[i, 4kk..]),
    B panel p at B + p*k4*NR words (words (kk, j) = B[4kk.., j])."""
    acc = [(i, h) for i in range(MR) for h in range(2)]
    lines = [
        "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)",
        "define void @gemm(ptr noalias %A, ptr noalias %B, ptr noalias %C, i64 %mt, i64 %np, "
        "i64 %k4, i64 %ldc) {",
        "entry:", "  br label %tile",
        "tile:", "  %t = phi i64 [0, %entry], [%t2, %tile_end]", "  br label %panel",
        "panel:", "  %p = phi i64 [0, %tile], [%p2, %panel_end]",
        "  %ta = mul i64 %t, %k4", "  %tb = mul i64 %ta, " + str(MR),
        "  %pa = mul i64 %p, %k4", "  %pb = mul i64 %pa, " + str(NR),
        "  br label %k",
        "k:", "  %kk = phi i64 [0, %panel], [%kk2, %k]",
    ]
    for i, h in acc:
        lines.append(f"  %c{i}_{h} = phi <16 x i32> [zeroinitializer, %panel], "
                     f"[%n{i}_{h}, %k]")
    lines += [f"  %bo = mul i64 %kk, {NR}", "  %bi = add i64 %pb, %bo",
              "  %bp0 = getelementptr i32, ptr %B, i64 %bi",
              "  %bp1 = getelementptr i32, ptr %bp0, i64 16",
              "  %b0 = load <16 x i32>, ptr %bp0, align 4",
              "  %b1 = load <16 x i32>, ptr %bp1, align 4",
              f"  %ao = mul i64 %kk, {MR}", "  %ai = add i64 %tb, %ao"]
    for i in range(MR):
        lines += [f"  %ap{i} = getelementptr i32, ptr %A, i64 %ai",
                  f"  %aq{i} = getelementptr i32, ptr %ap{i}, i64 {i}",
                  f"  %aw{i} = load i32, ptr %aq{i}, align 4",
                  f"  %as{i} = insertelement <16 x i32> poison, i32 %aw{i}, i64 0",
                  f"  %av{i} = shufflevector <16 x i32> %as{i}, <16 x i32> poison, "
                  "<16 x i32> zeroinitializer"]
        for h in range(2):
            lines.append(f"  %n{i}_{h} = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512("
                         f"<16 x i32> %c{i}_{h}, <16 x i32> %av{i}, <16 x i32> %b{h})")
    lines += ["  %kk2 = add i64 %kk, 1", "  %kdone = icmp eq i64 %kk2, %k4",
              "  br i1 %kdone, label %store, label %k", "store:",
              f"  %row0 = mul i64 %t, {MR}", f"  %col = mul i64 %p, {NR}"]
    for i, h in acc:
        lines += [f"  %r{i}_{h} = add i64 %row0, {i}",
                  f"  %o{i}_{h} = mul i64 %r{i}_{h}, %ldc",
                  f"  %q{i}_{h} = add i64 %o{i}_{h}, %col",
                  f"  %s{i}_{h} = add i64 %q{i}_{h}, {16 * h}",
                  f"  %cp{i}_{h} = getelementptr i32, ptr %C, i64 %s{i}_{h}",
                  f"  store <16 x i32> %n{i}_{h}, ptr %cp{i}_{h}, align 4"]
    lines += ["  br label %panel_end", "panel_end:", "  %p2 = add i64 %p, 1",
              "  %pdone = icmp eq i64 %p2, %np", "  br i1 %pdone, label %tile_end, label %panel",
              "tile_end:", "  %t2 = add i64 %t, 1", "  %tdone = icmp eq i64 %t2, %mt",
              "  br i1 %tdone, label %exit, label %tile", "exit:", "  ret void", "}"]
    return "\n".join(lines)


def compile_gemm():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    if "avx512vnni" not in llvm.get_host_cpu_features().flatten():
        raise SystemExit("this CPU has no AVX-512 VNNI")
    module = llvm.parse_assembly(_ir())
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3), *([ctypes.c_int64] * 4))(
        engine.get_function_address("gemm"))
    return fn, engine


def pack_a(a: np.ndarray) -> np.ndarray:
    """A[M, K] uint8 -> row tiles of MR rows, words of 4 consecutive k (M, K padded)."""
    m, k = a.shape
    mp, kp = -(-m // MR) * MR, -(-k // 4) * 4
    padded = np.zeros((mp, kp), np.uint8)
    padded[:m, :k] = a
    return np.ascontiguousarray(padded.reshape(mp // MR, MR, kp // 4, 4).transpose(0, 2, 1, 3))


def pack_b(b: np.ndarray) -> np.ndarray:
    """B[K, N] int8 -> column panels of NR columns, words of 4 consecutive k."""
    k, n = b.shape
    kp, npad = -(-k // 4) * 4, -(-n // NR) * NR
    padded = np.zeros((kp, npad), np.int8)
    padded[:k, :n] = b
    return np.ascontiguousarray(padded.reshape(kp // 4, 4, npad // NR, NR).transpose(2, 0, 3, 1))


def _median(fn, repeat=30) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv: list[str]) -> int:
    shapes = [(128, 768, 3072), (128, 3072, 768), (3136, 576, 64), (784, 1152, 128)]
    if "--shapes" in argv:
        shapes = [tuple(int(v) for v in s.split("x")) for s in argv[argv.index("--shapes") + 1:]]
    from eqsat_fuse.backends.numba import packed_gemm as PG
    from eqsat_fuse.backends.numba.contraction import gemm_block

    fn, _engine = compile_gemm()
    PG.ensure_compiled()
    rng = np.random.default_rng(0)
    print("one thread; GMAC/s; int8: vpdpbusd 8x32 tiles, A and B packed beforehand")
    print(f"{'M x K x N':>18s} {'int8':>8s} {'pack A':>8s} {'float32':>8s} "
          f"{'int8/float32 time':>18s}")
    for m, k, n in shapes:
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
        pa, pb = pack_a(a), pack_b(b)
        mt, npan, k4 = pa.shape[0], pb.shape[0], pa.shape[1]
        c = np.zeros((mt * MR, npan * NR), np.int32)

        def run():
            fn(pa.ctypes.data, pb.ctypes.data, c.ctypes.data, mt, npan, k4, c.shape[1])

        run()
        want = a.astype(np.int64) @ b.astype(np.int64)
        if not np.array_equal(c[:m, :n], want):
            raise SystemExit(f"{m}x{k}x{n}: the int8 kernel is wrong")
        t_int8 = _median(run)
        t_pack = _median(lambda: pack_a(a))
        af = rng.standard_normal(m * k).astype(np.float32)
        bf = PG.pack(rng.standard_normal((k, n)).astype(np.float32))
        cf = np.empty(m * n, np.float32)
        block = gemm_block(m, n)          # row blocks, as the generated kernels call it
        ws = np.empty(PG.a_workspace(min(m, block), k), np.float32)

        def run_f32():
            for r0 in range(0, m, block):
                PG.gemm(af, 0, k, r0, min(r0 + block, m), bf, n, k, cf, 0, n, ws)

        t_f32 = _median(run_f32)
        macs = m * k * n
        print(f"{m:>6d}x{k:>5d}x{n:>5d} {macs / t_int8 / 1e9:8.1f} {t_pack * 1e3:7.3f}ms "
              f"{macs / t_f32 / 1e9:8.1f} {t_int8 / t_f32:18.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
