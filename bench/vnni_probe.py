"""How fast the int8 GEMM is here: the VNNI microkernel of `backends/numba/int8_gemm.py`
(called as the generated kernels call it, packing of A included), against the float32 packed
GEMM the Numba backend uses, same shapes, same run.

    .venv/bin/python bench/vnni_probe.py [--shapes MxKxN ...]

uint8 activations A[M, K]
times int8 weights B[K, N] with int32 accumulation, `vpdpbusd` (64 u8 x s8 products into 16
int32 lanes per instruction), tiles of 8 rows x 32 columns (16 accumulator registers), A and B
packed in groups of 4 along K (B once, as constant weights are; A per call, and its packing
alone timed apart). The result is checked against an int64 NumPy product, then timed; the float32
packed GEMM (`eqsat_fuse.backends.numba.packed_gemm.gemm`) on the same M x K x N beside it.
One thread. Prints GMAC/s (multiply-adds per second) and the int8 / float32 time ratio.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

set_threads(sys.argv)

import numpy as np  # noqa: E402

from eqsat_fuse.backends.numba import int8_gemm as I8  # noqa: E402

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

    if not I8.AVAILABLE:
        raise SystemExit("this CPU has no AVX-512 VNNI")
    I8.ensure_compiled()
    PG.ensure_compiled()
    rng = np.random.default_rng(0)
    print("one thread; GMAC/s; int8: vpdpbusd 8x32 tiles, A and B packed beforehand")
    print(f"{'M x K x N':>18s} {'int8':>8s} {'pack A':>8s} {'float32':>8s} "
          f"{'int8/float32 time':>18s}")
    for m, k, n in shapes:
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
        pb, ldc = I8.pack_b(b), I8.c_cols(n)
        c = np.zeros(I8.c_rows(m) * ldc, np.int32)
        ws = np.zeros(I8.a_workspace(m, k), np.uint8)
        sums, flat = np.zeros(ldc, np.int32), a.reshape(-1)

        def run():
            I8.gemm(flat, 0, k, 0, m, pb, n, k, c, ldc, ws, sums, 0)

        run()
        want = a.astype(np.int64) @ b.astype(np.int64)
        if not np.array_equal(c.reshape(-1, ldc)[:m, :n], want):
            raise SystemExit(f"{m}x{k}x{n}: the int8 kernel is wrong")
        t_int8 = _median(run)
        t_pack = _median(lambda: I8.pack_a(flat, 0, k, 0, m, k, ws))
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
