"""The one thread setting (`eqsat_fuse.threads`): what `compile(threads=...)` accepts, that
products run split among Numba's threads with BLAS single-threaded inside them, that a run
puts the process's thread settings back, and that results do not depend on the count."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import threadpoolctl
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import packed_gemm as PG
from eqsat_fuse.errors import EqsatFuseError
from eqsat_fuse.threads import resolve

from conftest import compile_in_two_processes, make_model

needs_two = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                               reason="this process has one Numba thread")


def _attention_like(rng, heads=8, seq=128, dim=64):
    """softmax(q @ k^T * s) @ v over activations: batched products of two buffers, which
    run through BLAS on every CPU."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = [heads, seq, dim]
    return make_model(nodes, [("q", shape), ("k", shape), ("v", shape)], [("y", shape)],
                      {"scale": np.array(dim ** -0.5, np.float32)})


def _dense(rng, rows=128, k=256, n=384):
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    b = rng.normal(0, 0.1, n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    return make_model(nodes, [("x", [rows, k])], [("y", [rows, n])], {"w": w, "b": b})


def _sources(folder) -> str:
    return "".join(p.read_text() for p in folder.glob("k_*.py"))


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_a_thread_count_that_is_not_a_whole_number_above_zero_is_refused(bad, rng):
    with pytest.raises(EqsatFuseError, match="threads must be a whole number"):
        ef.compile(_dense(rng), threads=bad)


def test_more_threads_than_numbas_pool_is_refused_with_the_way_out():
    with pytest.raises(EqsatFuseError, match="NUMBA_NUM_THREADS"):
        resolve(numba.config.NUMBA_NUM_THREADS + 1)


def test_the_default_is_the_cores_this_process_may_use_within_numbas_count():
    import os
    before = numba.get_num_threads()
    assert resolve(None) == min(len(os.sched_getaffinity(0)), before)
    numba.set_num_threads(1)            # a caller who lowered Numba's count gets it
    try:
        assert resolve(None) == 1
    finally:
        numba.set_num_threads(before)


@needs_two
def test_batched_products_are_shared_among_threads_and_match(tmp_path, rng):
    model = _attention_like(rng)
    one = ef.compile(model, backend="numba", cache_dir=tmp_path / "one", threads=1)
    two = ef.compile(model, backend="numba", cache_dir=tmp_path / "two", threads=2)
    assert one.report.backend_report["threads"] == 1
    assert two.report.backend_report["threads"] == 2
    assert "for bi in prange(" in _sources(tmp_path / "two")
    assert "parallel=True" not in _sources(tmp_path / "one")
    for program in (one, two):
        result = program.verify(seed=2)
        assert result.ok, result.summary()
    feeds = {name: rng.standard_normal((8, 128, 64)).astype(np.float32) for name in "qkv"}
    np.testing.assert_allclose(two.run(feeds)["y"], one.run(feeds)["y"], rtol=1e-5, atol=1e-6)


@needs_two
@pytest.mark.skipif(PG.AVAILABLE, reason="AVX-512 runs constant-weight products packed, "
                                         "not through BLAS (tests/test_packed_gemm.py)")
def test_blas_products_with_an_epilogue_split_among_threads(tmp_path, rng):
    program = ef.compile(_dense(rng), backend="numba", cache_dir=tmp_path, threads=2)
    sources = _sources(tmp_path)
    assert "K.gemm_parallel(" in sources and "for r in prange(r0, r1):" in sources
    result = program.verify(seed=4)
    assert result.ok, result.summary()


@needs_two
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_run_puts_the_process_thread_settings_back(backend, tmp_path, rng):
    program = ef.compile(_attention_like(rng), backend=backend, cache_dir=tmp_path, threads=2)
    feeds = {name: rng.standard_normal((8, 128, 64)).astype(np.float32) for name in "qkv"}
    before_blas = [lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                   if lib["user_api"] == "blas"]
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        program.run(feeds)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
    after_blas = [lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                  if lib["user_api"] == "blas"]
    assert after_blas == before_blas


def test_a_second_process_runs_parallel_kernels_from_the_cache(tmp_path, rng):
    # a large product with a constant weight is split among threads by kernels.gemm_parallel (a
    # prange), called from a kernel that has no parallel loop of its own: loaded from the cache
    # in a fresh process, with nothing there that started Numba's threading layer, linking it
    # aborted the process ("LLVM ERROR: Symbol not found: allocate_sched")
    w = (rng.standard_normal((512, 512)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    path = tmp_path / "product.onnx"
    path.write_bytes(make_model(nodes, [("x", [1024, 512])], [("y", [1024, 512])],
                                {"w": w}).SerializeToString())
    first, second = compile_in_two_processes(path, tmp_path / "cache", threads=2)
    assert first[0] > 0 and first[2]
    assert second == (0, first[0], True)        # every kernel from the cache, and it verifies
