"""The one thread setting (`eqsat_fuse.threads`): what `compile(threads=...)` accepts, that
products run split among Numba's threads with BLAS single-threaded inside them, that a run
puts the process's thread settings back, that results do not depend on the count, and that a
run takes only the cores other processes leave free (`CoreLoad`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numba
import numpy as np
import pytest
import threadpoolctl
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import packed_gemm as PG
from eqsat_fuse.errors import EqsatFuseError
from eqsat_fuse import threads as T
from eqsat_fuse.threads import resolve

from conftest import compile_in_two_processes, make_model

needs_two = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                               reason="this process has one Numba thread")


def _attention_like(rng, heads=8, seq=128, dim=64):
    """softmax(q @ k^T * s) @ v over activations: batched products of two buffers, which
    run through BLAS on every CPU. The scale is one per key, so no FusedAttention forms (its
    rules take a one-element scale): the products stay batched MatMuls."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = [heads, seq, dim]
    return make_model(nodes, [("q", shape), ("k", shape), ("v", shape)], [("y", shape)],
                      {"scale": np.full(seq, dim ** -0.5, np.float32)})


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
def test_a_positions_conv_shares_its_positions_among_threads_with_the_same_result(
        tmp_path, rng):
    # a 7 x 7 plane with many channels goes positions x channels (`conv_positions`); each
    # thread takes a range of output rows, with its own C block
    if not PG.AVAILABLE:
        pytest.skip("the packed convolution needs AVX-512")
    w = (rng.standard_normal((256, 128, 3, 3)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", [1, 128, 7, 7])], [("y", [1, 256, 7, 7])], {"w": w})
    one = ef.compile(model, backend="numba", cache_dir=tmp_path / "one", threads=1)
    two = ef.compile(model, backend="numba", cache_dir=tmp_path / "two", threads=2)
    shared = "".join(p.read_text() for p in (tmp_path / "two").glob("k_*.py"))
    assert "PG.gemm_gather_entry(" in shared and "for q in prange(" in shared
    feeds = {"x": rng.standard_normal((1, 128, 7, 7)).astype(np.float32)}
    np.testing.assert_array_equal(two.run(feeds)["y"], one.run(feeds)["y"])
    result = two.verify(seed=3)
    assert result.ok, result.summary()


def _conv_stack(rng):
    """A strided Conv (its output rows computed wider, then compacted), a depthwise Conv, a
    1x1 Conv, a Softmax and a ReduceMean, each large enough to be shared among threads."""
    def weight(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
             helper.make_node("Softmax", ["c3"], ["s"], axis=-1),
             helper.make_node("ReduceMean", ["s"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["s", "m"], ["y"])]
    inits = {"w1": weight(32, 8, 3, 3), "b1": weight(32), "w2": weight(32, 1, 3, 3),
             "w3": weight(32, 32, 1, 1), "b3": weight(32),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    return make_model(nodes, [("x", [1, 8, 128, 128])], [("y", [1, 32, 64, 64])], inits,
                      opset=17)


@needs_two
def test_convolutions_and_row_kernels_are_shared_among_threads_with_the_same_result(
        tmp_path, rng):
    # each kernel runs as one parallel region over blocks (channel blocks of the depthwise
    # Conv, column chunks of the packed ones, rows of Softmax and of the reduction), every
    # thread with its own scratch; an element's arithmetic does not depend on the split
    model = _conv_stack(rng)
    one = ef.compile(model, backend="numba", cache_dir=tmp_path / "one", threads=1)
    two = ef.compile(model, backend="numba", cache_dir=tmp_path / "two", threads=2)
    sources = [p.read_text() for p in (tmp_path / "two").glob("k_*.py")]
    shared = [s for s in sources if "for p in prange(" in s]
    assert any("K.depthwise2d_entry(" in s for s in shared), "the depthwise Conv is serial"
    if PG.AVAILABLE:
        assert sum("PG.gemm_rows_entry(" in s for s in shared) >= 2, "a packed Conv is serial"
    assert any("K.row_max(" in s for s in shared), "the Softmax is serial"
    assert any("y = K.row_sum(ROW, C)" in s for s in shared), "the ReduceMean is serial"
    assert "parallel=True" not in "".join(p.read_text()
                                          for p in (tmp_path / "one").glob("k_*.py"))
    feeds = {"x": rng.standard_normal((1, 8, 128, 128)).astype(np.float32)}
    np.testing.assert_array_equal(two.run(feeds)["y"], one.run(feeds)["y"])
    result = two.verify(seed=3)
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


# ---- under load: a run takes the cores other processes leave free -----------------------------

class _Machine:
    """A fake /proc/stat for cores cpu0 and cpu1 and fake clocks: `advance(seconds, busy=...)`
    moves wall time on with each core busy for the given seconds, `own` of them this process's."""

    def __init__(self, folder, monkeypatch):
        self.path = folder / "stat"
        self.wall = 100.0
        self.own = 0.0
        self.children = 0.0                   # CPU of our children that ended (waited for)
        self.ticks = [0, 0]                   # busy ticks of cpu0, cpu1 (100 a second)
        self.write()
        monkeypatch.setattr(T, "time", SimpleNamespace(monotonic=lambda: self.wall,
                                                       process_time=lambda: self.own))
        monkeypatch.setattr(T, "_children_cpu", lambda: self.children)
        self.load = T.CoreLoad(str(self.path))
        self.load.cpus = {"cpu0", "cpu1"}
        self.load.tick = 0.01

    def write(self):
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        for i, busy in enumerate(self.ticks):     # user nice system idle iowait irq softirq steal
            lines.append(f"cpu{i} {busy - busy // 4} 0 {busy // 4} 9999 0 0 0 0 0 0")
        self.path.write_text("\n".join(lines + ["intr 0", ""]))

    def advance(self, seconds, busy=(0.0, 0.0), own=0.0, children=0.0):
        self.wall += seconds
        self.own += own
        self.children += children
        self.ticks = [t + round(b * 100) for t, b in zip(self.ticks, busy)]
        self.write()


def test_a_core_kept_busy_by_another_process_leaves_a_run_one_thread(tmp_path, monkeypatch):
    m = _Machine(tmp_path, monkeypatch)
    m.load.sample()                                      # the first window starts (compile)
    m.advance(0.5, busy=(0.0, 0.5))                      # another process: cpu1 all the time
    assert m.load.usable(2) == 1
    assert m.load.usable(1) == 1
    m.advance(0.1, busy=(0.1, 0.0), own=0.1)             # within the window: no new look
    assert m.load.usable(2) == 1
    m.advance(0.5)                                       # the other process has ended
    assert m.load.usable(2) == 2


def test_this_processs_own_threads_do_not_count_as_load(tmp_path, monkeypatch):
    m = _Machine(tmp_path, monkeypatch)
    m.load.sample()
    m.advance(0.5, busy=(0.5, 0.5), own=1.0)             # our two threads (or spinning workers)
    assert m.load.usable(2) == 2
    m.advance(0.5, busy=(0.5, 0.05), own=0.5)            # others: a light 0.1 of a core
    assert m.load.usable(2) == 2
    m.advance(0.5, busy=(0.5, 0.2), own=0.5)             # others: 0.4 of a core
    assert m.load.usable(2) == 1


def test_a_compiles_finished_jit_workers_do_not_count_as_load(tmp_path, monkeypatch):
    m = _Machine(tmp_path, monkeypatch)
    m.load.sample()                                      # compile starts
    m.advance(5.0, busy=(5.0, 4.0), own=5.0, children=4.0)   # a JIT worker on cpu1, waited for
    assert m.load.usable(2) == 2                         # the first run after the compile
    m.advance(0.5, busy=(0.5, 0.5), own=0.5)             # a process that is not ours
    assert m.load.usable(2) == 1


def test_the_children_counted_are_the_ones_waited_for():
    before = T._children_cpu()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                    "while time.process_time() < end: pass"], check=True)
    assert T._children_cpu() - before >= 0.25


def test_without_proc_stat_a_run_uses_its_threads(tmp_path, monkeypatch):
    m = _Machine(tmp_path, monkeypatch)
    m.path.unlink()
    m.load.sample()
    m.advance(0.5)
    assert m.load.usable(2) == 2


@pytest.mark.skipif(T.available_cores() < 2, reason="needs two cores")
def test_a_real_busy_process_beside_us_takes_a_thread_away():
    cores = T.available_cores()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 5\n"
                             "while time.time() < end: pass"])
    try:
        load = T.CoreLoad()
        load.sample()
        time.sleep(2.5 * T.LOAD_WINDOW)
        assert load.usable(cores) <= cores - 1
    finally:
        busy.kill()
        busy.wait()


@needs_two
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_under_load_a_two_thread_program_runs_on_one_with_the_same_results(backend, tmp_path,
                                                                          rng, monkeypatch):
    program = ef.compile(_attention_like(rng), backend=backend, cache_dir=tmp_path, threads=2)
    feeds = {name: rng.standard_normal((8, 128, 64)).astype(np.float32) for name in "qkv"}
    idle = program.run(feeds)["y"]
    seen = []
    original = T.governed

    @contextmanager
    def spy(threads, blas_threads, numba_threads=True):
        with original(threads, blas_threads, numba_threads):
            seen.append((numba.get_num_threads() if numba_threads else None,
                         max(lib.num_threads for lib in T._blas())))
            yield

    env = dict(os.environ)
    monkeypatch.setattr(T.LOAD, "free", 1)
    monkeypatch.setattr(T.LOAD, "sample", lambda: None)
    from eqsat_fuse.lowering import program as P
    monkeypatch.setattr(P, "governed", spy)
    busy = program.run(feeds)["y"]
    # the Numba backend's loops on one thread (BLAS is single-threaded in them anyway); the
    # NumPy backend's BLAS on one thread instead of two
    assert seen == [(1 if backend == "numba" else None, 1)]
    np.testing.assert_allclose(busy, idle, rtol=1e-5, atol=1e-6)
    assert dict(os.environ) == env           # nothing set for the caller's child processes


# ---- --threads on the command line --------------------------------------------------------------

MODEL = "tests/models/mobilenetv2_tiny_op17.onnx"
COMMANDS = {"demo": ["demo"], "optimize": ["optimize", MODEL],
            "run": ["run", MODEL, "--inputs", "feeds.npz"], "verify": ["verify", MODEL],
            "compare": ["compare", MODEL, "-o", "out"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("bad, says", [("0", "got 0"), ("two", "got 'two'"), ("1.5", "got '1.5'"),
                                       ("9999", "more than Numba's thread pool")])
def test_a_wrong_threads_value_is_one_line_before_anything_compiles(command, bad, says, capsys):
    from eqsat_fuse.cli import main
    assert main([*COMMANDS[command], "--threads", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("eqsat-fuse: error: threads")
    assert says in err


@pytest.mark.parametrize("threads", [0, -1, 2.5, True])
def test_a_bad_thread_count_is_refused_before_any_stage_runs(threads):
    from conftest import conv_bn_relu_model
    stages: list[str] = []
    with pytest.raises(ef.EqsatFuseError, match="threads must be a whole number"):
        ef.compile(conv_bn_relu_model(np.random.default_rng(0)), threads=threads,
                   progress=stages.append)
    assert stages == []
