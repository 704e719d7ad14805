"""One thread setting for a compiled program: Numba's parallel loops, OpenMP and BLAS together.

A process here holds three thread pools that know nothing of each other: Numba's (its threading
layer, OpenMP on this machine), SciPy's OpenBLAS (what `np.dot` inside compiled kernels calls)
and NumPy's OpenBLAS. Each pool's workers busy-wait for a while after their work, so when two of
them run on the same cores one after the other, each finds the cores taken by the other's
spinning workers (shared/NOTES-kernels.md: two-thread runs 1.5-4x slower than one thread).

So a program owns the thread count it was compiled for, and while it runs exactly one pool
works in parallel:

- the Numba backend runs its parallel loops (elementwise, GEMM drivers, batched products) on
  `threads` Numba threads, and every BLAS call inside them is single-threaded: the kernels split
  a product into blocks themselves and hand each thread one serial BLAS call;
- the NumPy backend is BLAS calls between NumPy operations: BLAS gets the `threads`.

`governed(threads, blas_threads)` sets both for the duration of a run and puts back what the
process had before (a few microseconds), so a caller's own NumPy keeps its BLAS threads.

The default thread count is the number of cores this process may run on (its CPU affinity),
within Numba's thread count for the calling thread (`numba.get_num_threads()`: the pool size
`NUMBA_NUM_THREADS` unless the caller lowered it with `numba.set_num_threads`).

## Under load: a run takes only the cores other processes leave free

`threads` is the most threads a run uses. Each run's parallel loops split their work into
`threads` equal parts and wait at the end of the loop for the slowest part (an OpenMP barrier;
BLAS waits the same way). When another process keeps one of the cores busy, the thread that
shares a core with it runs in the time slices the scheduler leaves it, and every parallel loop
waits for it: a model's hundreds of loops then wait a time slice each. Measured on 2 cores with
a busy-loop process beside it, MobileNetV2-224 took 24-47 ms a run at 2 threads (at times over a
second) against 12.7 ms at 1 thread, and onnxruntime took 17 ms at its default.

So before a run `governed` looks at how busy this process's cores are: at most every
`LOAD_WINDOW` seconds it reads the CPU time the kernel has counted on them (`/proc/stat`: busy
and stolen time) and subtracts this process's own CPU time (all its threads, the spinning
workers included, and its children that have ended and been waited for: a compile's JIT
workers). What is left is the load of other processes, in cores, and a run uses one thread per
core that load leaves free, within `threads` and never fewer than one: with 2 cores,
2 threads while other processes use less than `IDLE_LOAD` of a core, 1 thread from there on. Kernels compiled for two threads run
correctly on one: a `prange` over parts runs the parts one after another. On a machine without
`/proc/stat` a run uses `threads`. Nothing is changed in the environment or in the thread pools
beyond the run (`governed` restores them), and the caller's own threads count as this process's
(two programs run from two Python threads at once see each other as their own load).

The wait policy stays OpenMP's own (libgomp spins for a while at a barrier, then sleeps) and the
threading layer Numba's default (`omp` here; TBB is not installed): with the load taken out of
the count they were the fastest measured. `OMP_WAIT_POLICY=PASSIVE` (sleep at once) cost
MobileNetV2-224 2-3x on an idle machine (27-37 ms against 13) for 16-17 ms under load, the
`workqueue` layer 3-7x idle and 31 ms under load; a short spin (`GOMP_SPINCOUNT=10000`) was as
fast idle and 10x slower under load. Setting any of these would also have to happen before the
OpenMP library loads, which a caller may already have done.
"""

from __future__ import annotations

import math
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from .errors import EqsatFuseError


def _affinity() -> set[int]:
    """The cores this process may run on (all online cores on platforms without affinity)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):      # pragma: no cover - platforms without affinity
        return set(range(os.cpu_count() or 1))


def available_cores() -> int:
    """Cores this process may run on (its affinity mask; all online cores without one)."""
    return max(1, len(_affinity()))


def pool_size() -> int:
    """Numba's thread pool size: the most threads a parallel loop can use in this process."""
    import numba
    return int(numba.config.NUMBA_NUM_THREADS)


def resolve(threads: int | None) -> int:
    """The thread count a program runs with: `threads`, or the default (see the module doc).

    A count above Numba's pool size is refused: the pool is fixed when Numba starts."""
    LOAD.sample()                          # the first load window starts with the first compile
    if threads is None:
        import numba
        return max(1, min(available_cores(), numba.get_num_threads()))
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise EqsatFuseError(f"threads must be a whole number >= 1, got {threads!r}")
    if threads > pool_size():
        raise EqsatFuseError(
            f"threads={threads} is more than Numba's thread pool of {pool_size()} "
            f"(NUMBA_NUM_THREADS); set NUMBA_NUM_THREADS before Python starts to use more")
    return threads


_BLAS: list | None = None


def _blas() -> list:
    """The BLAS libraries of this process, found once by threadpoolctl: NumPy's and SciPy's
    (imported first, so a program that runs before the Numba backend loads it still sees it)."""
    global _BLAS
    if _BLAS is None:
        import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's OpenBLAS)
        import threadpoolctl
        _BLAS = threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers
    return _BLAS


LOAD_WINDOW = 0.25      # seconds between two looks at the cores' load (a read costs ~25 us)
IDLE_LOAD = 0.2         # other processes' load, in cores, below which a core still counts free


class CoreLoad:
    """How many of this process's cores other processes leave free, over the last window.

    `/proc/stat` counts each core's busy time in clock ticks (10 ms); over a window of
    `LOAD_WINDOW` seconds on two cores that is 50 ticks, enough to tell a busy core from an
    idle one. The first window starts when the first program is compiled (`resolve`), so the
    first run already has one."""

    def __init__(self, stat_path: str = "/proc/stat"):
        self.stat_path = stat_path
        self.cpus = {f"cpu{c}" for c in _affinity()}
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self.lock = threading.Lock()
        self.last: tuple[float, float, float] | None = None   # wall, cores' busy, own CPU (s)
        self.free = len(self.cpus) or available_cores()

    def busy_seconds(self) -> float | None:
        """CPU time the kernel has counted busy (or stolen by the hypervisor) on our cores."""
        try:
            with open(self.stat_path, "rb") as f:
                text = f.read()
        except OSError:
            return None
        ticks = 0
        for line in text.split(b"\n"):
            if not line.startswith(b"cpu"):
                break
            fields = line.split()
            if fields[0].decode() in self.cpus:
                # user nice system idle iowait irq softirq steal (guest is inside user)
                ticks += sum(int(v) for v in fields[1:4]) + sum(int(v) for v in fields[6:9])
        return ticks * self.tick

    def sample(self) -> None:
        """Look at the load if the window has passed (the first call only starts a window)."""
        now = time.monotonic()
        if self.last is not None and now - self.last[0] < LOAD_WINDOW:
            return
        with self.lock:
            if self.last is not None and now - self.last[0] < LOAD_WINDOW:
                return
            busy, own = self.busy_seconds(), time.process_time() + _children_cpu()
            if busy is None:
                return
            if self.last is not None:
                wall, busy0, own0 = self.last
                others = max(0.0, (busy - busy0) - (own - own0)) / (now - wall)
                self.free = max(1, math.floor(len(self.cpus) - others + IDLE_LOAD))
            self.last = (now, busy, own)

    def usable(self, threads: int) -> int:
        """The threads a run of a `threads`-thread program uses now (see the module doc)."""
        if threads == 1:
            return 1
        self.sample()
        return max(1, min(threads, self.free))


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended and been waited for: the Numba
    backend's JIT workers (`backends.numba.parallel_jit`) are this process's work, not other
    load; counted as other load, a compile's workers made the first runs after it take one
    thread (the window of the first look spans the compile)."""
    t = os.times()
    return t.children_user + t.children_system


LOAD = CoreLoad()


@contextmanager
def governed(threads: int, blas_threads: int, numba_threads: bool = True) -> Iterator[None]:
    """Run the body with `threads` Numba threads (when `numba_threads`) and `blas_threads` in
    every BLAS library, each lowered to the cores other processes leave free (`CoreLoad`), then
    restore the process's settings."""
    usable = LOAD.usable(max(threads, blas_threads))
    threads, blas_threads = min(threads, usable), min(blas_threads, usable)
    saved_numba = None
    if numba_threads:
        import numba
        saved_numba = numba.get_num_threads()
        if saved_numba != threads:
            numba.set_num_threads(threads)
    saved = []
    for lib in _blas():
        before = lib.num_threads
        if before != blas_threads:
            lib.set_num_threads(blas_threads)
            saved.append((lib, before))
    try:
        yield
    finally:
        for lib, before in saved:
            lib.set_num_threads(before)
        if saved_numba is not None and saved_numba != threads:
            import numba
            numba.set_num_threads(saved_numba)
