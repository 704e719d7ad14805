"""Constant-weight GEMM: eqsat-fuse's packed microkernel against OpenBLAS (NumPy's matmul) and
onnxruntime's MatMul (MLAS), same run, GFLOP/s (medians).

    .venv/bin/python bench/gemm.py [--threads N]

Shapes are those of a BERT-base layer at sequence 128 and of a small MLP. "cold" rotates over
8 weight matrices (as a model does: its weights come from L3 or memory), "hot" reuses one.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

THREADS = set_threads(sys.argv)

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from _common import block_size, measure, ort_session  # noqa: E402
from eqsat_fuse.backends.numba import packed_gemm as PG  # noqa: E402

SHAPES = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768), (64, 256, 256)]


def _matmul_model(m, k, n, w):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    if not PG.AVAILABLE:
        sys.exit("gemm.py: this CPU has no AVX-512; the backend uses BLAS here")
    PG.ensure_compiled()
    gemm = PG.gemm_parallel if THREADS > 1 else PG.gemm
    rng = np.random.default_rng(0)
    print(f"threads: {THREADS}; GFLOP/s, medians; x = packed / peer")
    head = (f"{'M x K x N':18s} {'weights':7s} {'packed':>7s} {'OpenBLAS':>9s} {'ORT':>7s} "
            f"{'x OpenBLAS':>10s} {'x ORT':>6s}")
    print(head)
    print("-" * len(head))
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        ws = [rng.standard_normal((k, n)).astype(np.float32) for _ in range(8)]
        packed = [PG.pack(w) for w in ws]
        sessions = [ort_session(_matmul_model(m, k, n, w), THREADS, True) for w in ws]
        c = np.empty((m, n), np.float32)
        af, cf = a.reshape(-1), c.reshape(-1)
        work = np.empty(PG.a_workspace(m, k), np.float32)
        gemm(af, 0, k, 0, m, packed[0], n, k, cf, 0, n, work)
        assert np.allclose(c, a @ ws[0], rtol=1e-4, atol=1e-3)
        for label, count in (("hot", 1), ("cold", 8)):
            turn = [0]

            def nxt():
                turn[0] = (turn[0] + 1) % count
                return turn[0]

            t = measure({
                "packed": lambda: gemm(af, 0, k, 0, m, packed[nxt()], n, k, cf, 0, n, work),
                "openblas": lambda: np.matmul(a, ws[nxt()], out=c),
                "ort": lambda: sessions[nxt()].run(None, {"a": a}),
            }, repeat=40, block=block_size(THREADS))
            flops = 2.0 * m * k * n
            g = {key: flops / v / 1e9 for key, v in t.items()}
            print(f"{f'{m} x {k} x {n}':18s} {label:7s} {g['packed']:7.0f} {g['openblas']:9.0f} "
                  f"{g['ort']:7.0f} {g['packed'] / g['openblas']:10.2f} "
                  f"{g['packed'] / g['ort']:6.2f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
