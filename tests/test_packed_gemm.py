"""The packed-weight GEMM (AVX-512 microkernel in LLVM IR): exact shapes and strides against
NumPy, memory outside C untouched, and the Numba backend taking it for constant weights, in
this process, across threads and in a second process that loads the kernels from disk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import packed_gemm as PG

from conftest import compile_in_two_processes, make_model

pytestmark = pytest.mark.skipif(not PG.AVAILABLE, reason="the packed GEMM needs AVX-512")


@pytest.fixture(autouse=True, scope="module")
def _microkernel():
    PG.ensure_compiled()       # what a generated kernel module does when it is imported


def test_pack_lays_out_column_panels():
    b = np.arange(5 * 70, dtype=np.float32).reshape(5, 70)
    p = PG.pack(b)
    assert p.shape == (3, 5, PG.NR)
    np.testing.assert_array_equal(p[1, :, :], b[:, PG.NR:2 * PG.NR])
    np.testing.assert_array_equal(p[2, :, :70 - 2 * PG.NR], b[:, 2 * PG.NR:])
    assert not p[2, :, 70 - 2 * PG.NR:].any()


@pytest.mark.parametrize("threads", [1, 2])
def test_the_backend_packs_weights_in_a_worker_thread_and_waits_for_them(threads, monkeypatch):
    # with more than one thread `packed` hands back the array at once and fills it in a
    # worker (`finish_packing` waits); a transposed view is packed as its values
    import threading

    from eqsat_fuse.backends.numba.backend import NumbaBackend
    backend = NumbaBackend.__new__(NumbaBackend)
    backend.threads, backend._packer, backend._packing = threads, None, []
    backend._packed = {}
    fillers = []
    real = PG.pack_into

    def pack_into(b, out):
        fillers.append(threading.current_thread() is threading.main_thread())
        real(b, out)

    monkeypatch.setattr(PG, "pack_into", pack_into)
    weights = [np.random.default_rng(i).standard_normal((40, 75)).astype(np.float32)
               for i in range(3)]
    outs = [backend.packed(w) for w in weights[:2]] + [backend.packed(weights[2].T.copy().T)]
    backend.finish_packing()
    # the same weights (the same memory, as the lowerings of one plan at several shapes share
    # them) are packed once
    assert backend.packed(weights[0]) is outs[0] and len(fillers) == 3
    for w, out in zip(weights, outs):
        np.testing.assert_array_equal(out, PG.pack(w))
    assert fillers[:3] == [threads == 1] * 3
    assert backend._packing == [] and backend._packer is None


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(0, 70), n=st.integers(1, 100),
       pad_a=st.integers(0, 5), pad_c=st.integers(0, 5), r0=st.integers(0, 4),
       parallel=st.booleans(), seed=st.integers(0, 2**16))
def test_gemm_matches_numpy_and_writes_only_c(m, k, n, pad_a, pad_c, r0, parallel, seed):
    rng = np.random.default_rng(seed)
    rows = r0 + m
    lda, ldc = k + pad_a, n + pad_c
    a_off, c_off = 3, 7
    a = rng.standard_normal(a_off + rows * lda).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full(c_off + rows * ldc + 5, 9.5, np.float32)
    fn = PG.gemm_parallel if parallel else PG.gemm
    work = np.full(PG.a_workspace(m, k), np.nan, np.float32)
    fn(a, a_off, lda, r0, rows, PG.pack(b), n, k, c, c_off, ldc, work)
    A = a[a_off:].reshape(rows, lda)[r0:, :k].astype(np.float64)
    C = c[c_off:c_off + rows * ldc].reshape(rows, ldc)
    want = A @ b.astype(np.float64)
    np.testing.assert_allclose(C[r0:, :n], want, rtol=1e-5, atol=1e-5 * max(k, 1))
    # rows before r0, the padding columns of each row, and everything outside C stay as they were
    assert np.all(C[:r0] == 9.5) and np.all(C[:, n:] == 9.5)
    assert np.all(c[:c_off] == 9.5) and np.all(c[c_off + rows * ldc:] == 9.5)


def test_pack_rows_lays_out_row_tiles():
    a = np.arange(14 * 5, dtype=np.float32).reshape(14, 5)
    p = PG.pack_rows(a)
    assert p.shape == (2, 5, PG.MR)
    np.testing.assert_array_equal(p[0], a[:PG.MR].T)
    np.testing.assert_array_equal(p[1, :, :2], a[PG.MR:].T)
    assert not p[1, :, 2:].any()


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 40), n=st.integers(1, 100),
       b_off=st.integers(0, 9), pad_c=st.integers(0, 5), parallel=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gemm_rows_reads_b_through_the_row_table(m, k, n, b_off, pad_c, parallel, seed):
    # rows of B anywhere in b (overlapping, out of order, repeated): what a convolution's taps
    # over padded planes look like; the last row ends exactly at the end of b (masked loads)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    span = 3 * n
    offsets = rng.integers(0, span - n + 1, k)
    offsets[-1] = span - n
    b = rng.standard_normal(b_off + span).astype(np.float32)
    ldc = n + pad_c
    c_off = 4
    c = np.full(c_off + m * ldc + 5, 9.5, np.float32)
    fn = PG.gemm_rows_parallel if parallel else PG.gemm_rows
    fn(PG.pack_rows(a), 0, m, k, b, b_off, PG.row_table(offsets), n, c, c_off, ldc)
    B = np.stack([b[b_off + o:b_off + o + n] for o in offsets]).astype(np.float64)
    C = c[c_off:c_off + m * ldc].reshape(m, ldc)
    np.testing.assert_allclose(C[:, :n], a.astype(np.float64) @ B, rtol=1e-5, atol=1e-5 * k)
    assert np.all(C[:, n:] == 9.5)
    assert np.all(c[:c_off] == 9.5) and np.all(c[c_off + m * ldc:] == 9.5)


@settings(max_examples=60, deadline=None)
@given(lines=st.integers(1, 4), lw=st.integers(1, 30), k=st.integers(1, 40),
       n=st.integers(1, 80), x_off=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_gemm_gather_reads_a_straight_from_the_planes(lines, lw, k, n, x_off, seed):
    # A[l, i, k] = x[x_off + l * stride + T[k] + i]: lw consecutive positions per line, the
    # taps anywhere (out of order, repeated); one panel of C (NR columns, the last masked),
    # the rows past the block and the columns past the panel untouched
    rng = np.random.default_rng(seed)
    stride = lw + int(rng.integers(0, 4))
    table = rng.integers(0, 3 * lw + 1, k).astype(np.int64)
    x = rng.standard_normal(x_off + (lines + 1) * stride + 4 * lw + 1).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bp = PG.pack(w)
    l0, l1 = (1, lines) if lines > 1 else (0, 1)
    for p in range(bp.shape[0]):
        c = np.full((l1 - l0) * lw * PG.NR + 7, 9.5, np.float32)
        PG.gemm_gather(x, x_off, table, l0, l1, lw, stride, bp, p, n, k, c, 3)
        rows = [x_off + l * stride + i for l in range(l0, l1) for i in range(lw)]
        A = np.stack([x[r + table] for r in rows]).astype(np.float64)
        cols = min(PG.NR, n - p * PG.NR)
        C = c[3:3 + len(rows) * PG.NR].reshape(len(rows), PG.NR)
        np.testing.assert_allclose(C[:, :cols], A @ w[:, p * PG.NR:p * PG.NR + cols],
                                   rtol=1e-5, atol=1e-5 * k)
        assert np.all(C[:, cols:] == 9.5) and np.all(c[:3] == 9.5)
        assert np.all(c[3 + len(rows) * PG.NR:] == 9.5)


def test_gemm_rows_starts_at_a_row_tile_of_a_larger_matrix(rng):
    # the backend passes rows [m0, m1) of packed weights as an offset of m0 * k (m0 % MR == 0)
    a = rng.standard_normal((30, 7)).astype(np.float32)
    b = rng.standard_normal((7, 20)).astype(np.float32)
    c = np.zeros(18 * 20, np.float32)
    PG.gemm_rows(PG.pack_rows(a), PG.MR * 7, 18, 7, b.reshape(-1), 0,
                 PG.row_table(np.arange(7) * 20), 20, c, 0, 20)
    np.testing.assert_allclose(c.reshape(18, 20), a[PG.MR:] @ b, rtol=1e-5, atol=1e-5)


def _mlp(rng, rows, k, n, gemm=False):
    w1 = (rng.standard_normal((n, k) if gemm else (k, n)) * 0.1).astype(np.float32)
    b1 = rng.normal(0, 0.1, n).astype(np.float32)
    w2 = (rng.standard_normal((n, 40)) * 0.1).astype(np.float32)
    first = (helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1) if gemm else
             helper.make_node("MatMul", ["x", "w1"], ["h0"]))
    nodes = [first] if gemm else [first, helper.make_node("Add", ["h0", "b1"], ["h"])]
    nodes += [helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return make_model(nodes, [("x", [rows, k])], [("y", [rows, 40])],
                      {"w1": w1, "b1": b1, "w2": w2})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("gemm", [False, True])
def test_backend_runs_constant_weight_gemms_packed(threads, gemm, tmp_path, rng):
    # 64 x 256 x 300: large enough for the threaded driver when threads > 1
    import numba
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"Numba has {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model = _mlp(rng, 64, 256, 300, gemm=gemm)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)        # the backend plans for the caller's thread count
    try:
        program = ef.compile(model, backend="numba", cache_dir=tmp_path)
    finally:
        numba.set_num_threads(before)
    result = program.verify(seed=3)
    assert result.ok, result.summary()
    assert program.report.backend_report["fallback_kernels"] == []
    sources = "".join(p.read_text() for p in tmp_path.glob("k_*.py"))
    assert "PG.gemm_entry(" in sources
    assert ("PG.gemm_parallel_entry(" in sources) == (threads > 1)
    assert "np.dot(" not in sources


def test_second_process_loads_packed_kernels_from_the_cache(tmp_path, rng):
    import onnx
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(rng, 10, 33, 70), path)
    runs = compile_in_two_processes(path, tmp_path / "cache")
    (compiled_1, _, ok_1), (compiled_2, loaded_2, ok_2) = runs
    assert ok_1 and ok_2
    assert compiled_1 > 0 and compiled_2 == 0 and loaded_2 > 0


_MICROKERNEL_SCRIPT = """
import numpy as np
from eqsat_fuse.backends.numba import packed_gemm as PG
PG.ensure_compiled()
rng = np.random.default_rng(0)
a, b = rng.standard_normal((7, 40), np.float32), rng.standard_normal((40, 50), np.float32)
c = np.zeros(7 * 50, np.float32)
PG.gemm(a.reshape(-1), 0, 40, 0, 7, PG.pack(b), 50, 40, c, 0, 50,
        np.zeros(PG.a_workspace(7, 40), np.float32))
print(float(np.abs(c.reshape(7, 50) - a @ b).max()))
"""


def test_the_microkernel_is_compiled_once_per_machine_and_a_bad_copy_is_not_run(tmp_path):
    """A process stores the microkernel's object code; the next loads it instead of
    compiling (0.3-0.4 s), and a truncated copy is compiled again, never loaded."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def run() -> float:
        proc = subprocess.run([sys.executable, "-c", _MICROKERNEL_SCRIPT], env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return float(proc.stdout.split()[-1])

    assert run() < 1e-4
    [stored] = (tmp_path / "eqsat_fuse_runtime").glob("microkernel-*.o")
    stamp = stored.stat().st_mtime_ns
    assert run() < 1e-4
    assert stored.stat().st_mtime_ns == stamp            # loaded, not written again
    stored.write_bytes(stored.read_bytes()[:-100])       # truncated
    assert run() < 1e-4
    assert stored.stat().st_size > 32 and stored.stat().st_mtime_ns != stamp
