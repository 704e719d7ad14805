"""Compile a program's generated kernel modules on every core: worker processes compile some
modules with `cache=True` (writing Numba's cache files beside them) while this process compiles
the others; this process then loads the workers' machine code from those files.

Numba compiles one function at a time under a global lock, so threads cannot share the work;
processes can, because each generated module is a file with its own cache entry. A worker is a
fresh interpreter running this module (`python -m`; not `multiprocessing`, whose spawned
children re-run the caller's main script, and forking a process whose threading layer has
started is not safe), so it pays the imports of eqsat-fuse and Numba (1-2 s): the work is
shared only when enough of it is left to compile (modules without a cache index). The modules
wait in one queue, largest first; a thread per worker hands it the next one each time it
finishes one, while this process compiles from the queue's other end. Anything that goes
wrong in a worker leaves its modules to this process, which compiles whatever it does not find
in the cache, as it would without workers.

Worker protocol: one line per module on stdin (`name<TAB>path`), one line back on stdout
(`ok` or `error <reason>`); end of input ends the worker.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

MIN_MODULES = 4           # fewer modules to compile than this: no workers
MIN_PER_WORKER = 3        # at least this many modules per worker (its start costs 1-2 s)


def uncached(fns: list) -> list:
    """The kernels among `fns` that neither are compiled in this process nor have a cache
    index on disk (a cache entry for another machine or source is rare; it only costs the
    share a worker would have taken)."""
    out = []
    for fn in fns:
        if fn.overloads:
            continue
        cache = getattr(fn, "_cache", None)
        index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
        if index is not None and Path(index).exists():
            continue
        out.append(fn)
    return out


def _module_of(fn) -> tuple[str, str]:
    name = fn.py_func.__module__
    return name, sys.modules[name].__file__


def _start_worker() -> subprocess.Popen | None:
    package_root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        return subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=env, bufsize=1)
    except OSError:
        return None


def _close(worker: subprocess.Popen) -> None:
    """End a worker's input (it exits) and wait for it."""
    try:
        worker.stdin.close()
    except OSError:
        pass
    worker.wait()


def compile_all(fns: list, cores: int, compile_here) -> tuple[int, int]:
    """Compile the kernels `fns` (dispatchers of generated modules) on up to `cores` cores,
    `compile_here(fn)` being how this process compiles one; returns how many worker processes
    helped and how many modules they compiled."""
    todo = uncached(list({id(f): f for f in fns}.values()))
    count = min(cores - 1, len(todo) // MIN_PER_WORKER)
    if len(todo) < MIN_MODULES or count < 1:
        for fn in todo:
            compile_here(fn)
        return 0, 0
    todo.sort(key=lambda fn: -Path(_module_of(fn)[1]).stat().st_size)
    queue = collections.deque(todo)
    lock = threading.Lock()
    failed: list = []
    done = [0]

    def feed(worker: subprocess.Popen) -> None:
        try:
            while True:
                with lock:
                    if not queue:
                        break
                    fn = queue.popleft()
                try:
                    worker.stdin.write("\t".join(_module_of(fn)) + "\n")
                    worker.stdin.flush()
                    answer = worker.stdout.readline()
                except (OSError, ValueError):
                    answer = ""
                if answer.strip() == "ok":
                    with lock:
                        done[0] += 1
                else:                       # failed or died: this process compiles it
                    with lock:
                        failed.append(fn)
                    if not answer:
                        break
        finally:
            _close(worker)

    workers = [w for w in (_start_worker() for _ in range(count)) if w is not None]
    feeders = [threading.Thread(target=feed, args=(w,), daemon=True) for w in workers]
    for t in feeders:
        t.start()
    while True:
        with lock:
            if not queue:
                break
            fn = queue.pop()
        compile_here(fn)
    for t in feeders:
        t.join()
    for fn in failed:
        compile_here(fn)
    return len(workers), done[0]


def compile_in_background(fns: list, done) -> threading.Thread:
    """Compile the kernels `fns` in one worker process, off this process's critical path (a
    thread waits for it); then `done(ok)`, with ok False when the worker could not start or
    failed on a module (the next lowering then compiles those here, as it always could)."""
    def work() -> None:
        todo = uncached(list({id(f): f for f in fns}.values()))
        worker = _start_worker() if todo else None
        ok = not todo
        if worker is not None:
            try:
                ok = True
                for fn in todo:
                    worker.stdin.write("\t".join(_module_of(fn)) + "\n")
                    worker.stdin.flush()
                    ok = ok and worker.stdout.readline().strip() == "ok"
            except (OSError, ValueError):
                ok = False
            finally:
                _close(worker)
        done(ok)

    thread = threading.Thread(target=work, daemon=True, name="eqsat-fuse-jit")
    thread.start()
    return thread


def _compile_module(name: str, path: str) -> None:
    """Load the generated module `name` from `path` and compile its kernel for the one kernel
    signature, which writes its cache files."""
    from numba import typeof

    from .calls import entry_point, launch_threading_layer
    from .segments import KERNEL_SIGNATURE_EXAMPLE
    launch_threading_layer()
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    entry_point(module.kernel, tuple(typeof(x) for x in KERNEL_SIGNATURE_EXAMPLE))


def _worker() -> None:
    for line in sys.stdin:
        name, _, path = line.rstrip("\n").partition("\t")
        try:
            _compile_module(name, path)
            answer = "ok"
        except Exception as why:            # reported; the parent compiles it itself
            answer = "error " + " ".join(str(why).split())[:200]
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _worker()
