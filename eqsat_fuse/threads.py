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
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from .errors import EqsatFuseError


def available_cores() -> int:
    """Cores this process may run on (its affinity mask; all online cores without one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):      # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


def pool_size() -> int:
    """Numba's thread pool size: the most threads a parallel loop can use in this process."""
    import numba
    return int(numba.config.NUMBA_NUM_THREADS)


def resolve(threads: int | None) -> int:
    """The thread count a program runs with: `threads`, or the default (see the module doc).

    A count above Numba's pool size is refused: the pool is fixed when Numba starts."""
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


@contextmanager
def governed(threads: int, blas_threads: int, numba_threads: bool = True) -> Iterator[None]:
    """Run the body with `threads` Numba threads (when `numba_threads`) and `blas_threads` in
    every BLAS library, then restore the process's settings."""
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
