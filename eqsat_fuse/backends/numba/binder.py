"""The Numba backend behind the backend interface (`backends.base`): `NumbaAdapter` holds a
`NumbaBackend` (`backends.numba.backend`, which generates and compiles the kernels) and binds
its compiled kernels to the arena with `_NumbaBinder`.

Runs of consecutive compiled kernels are bound into segments: one compiled function per
segment calls the kernels in order (`NumbaBackend.segment`), so a run pays Python's dispatch
once per segment. Kernels the generator cannot build (`Unsupported`) and opaque kernels run as
NumPy steps between segments. BLAS runs single-threaded inside Numba's parallel loops.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir import Kernel, KernelPlan
from ...lowering.arena import Arena
from ...lowering.memory import MemoryPlan
from ...lowering.program import BackendReport, contiguous
from ..base import BackendContext, Prepared, Steps, Unsupported
from ..numpy.backend import NumpyKernel
from .backend import Impl, KernelCall, NumbaBackend
from .backend import Unsupported as CannotGenerate


class NumbaAdapter:
    """The Numba backend as lowering drives it: prepare = generate and compile one kernel."""

    name = "numba"
    blas_threads = 1              # BLAS single-threaded inside the parallel loops
    numba_threads = True

    def __init__(self, context: BackendContext):
        storage = context.storage
        self.context = context
        self.backend = NumbaBackend(context.plan, context.constants, storage.layouts,
                                    storage.stored, context.cache_dir, context.threads,
                                    context.numerics)

    def prepare(self, kernel: Kernel) -> Impl | Unsupported:
        try:
            return self.backend.prepare(kernel)
        except CannotGenerate as why:
            return Unsupported(str(why))

    def bind(self, arena: Arena, prepared: list[Prepared]) -> Steps:
        """A step per kernel (for profiling) and the run steps: segments of compiled kernels,
        with the NumPy steps (fallbacks, opaque kernels) between them."""
        context = self.context
        binder = _NumbaBinder(self.backend, context.plan, arena.memory, arena.array,
                              arena.flats, arena.workspaces, context.constants,
                              arena.dynamic_storages, arena.final_storage,
                              context.storage.stored_dtype)
        steps: list[Callable[[dict], None]] = []
        run_steps: list[Callable[[dict], None]] = []
        reads: set[str] = set()
        pending: list = []

        def flush() -> None:
            if pending:
                run_steps.append(binder.segment(list(pending)))
                pending.clear()

        for p in prepared:
            if isinstance(p.impl, NumpyKernel):
                step = p.impl.bind(arena)
                steps.append(step)
                flush()
                run_steps.append(step)
                reads |= p.impl.reads()
            else:
                call = binder.call(p.impl, p.kernel, p.index)
                step = binder.step(call)
                step.label = "+".join(p.kernel.ops)
                steps.append(step)
                pending.append(call)
        flush()
        binder._tables()
        return Steps(kernel_steps=steps, run_steps=run_steps, reads=reads)

    def fill_report(self, report: BackendReport) -> None:
        stats = self.backend.stats
        report.jit_seconds = stats.seconds
        report.jit_compiled = stats.compiled
        report.jit_loaded = stats.loaded
        report.sources = stats.sources


class _NumbaBinder:
    """Binds compiled kernels to the arena: one `KernelCall` per kernel (where each argument
    lives), a per-kernel step for profiling, and segments (runs of consecutive calls compiled
    into one function, so Python dispatches once per segment rather than once per kernel)."""

    def __init__(self, backend, plan: KernelPlan, memory: MemoryPlan, arena: np.ndarray,
                 flats: dict, workspaces: dict, constants: dict, dynamic_storages: set,
                 final_storage, stored_dtype):
        self.backend = backend
        self.plan = plan
        self.memory = memory
        self.arena = arena
        self.flats = flats
        self.workspaces = workspaces
        self.constants = constants
        self.dynamic = dynamic_storages
        self.final_storage = final_storage
        self.stored_dtype = stored_dtype
        self.scratch = np.zeros(16, dtype=np.float32)
        self.keep: list[np.ndarray] = []            # arrays whose addresses P holds
        self.pointers: list[int] = [arena.ctypes.data if arena.size else self.scratch.ctypes.data,
                                    self.scratch.ctypes.data]
        self.const_index: dict[tuple, int] = {}
        self.gp: list[np.ndarray] = []
        self.fp: list[np.ndarray] = []
        self.gp_size = 0
        self.fp_size = 0
        self.P = None
        self.GP = None
        self.FP = None
        self.segments: list = []

    @staticmethod
    def _as_stored(dtype) -> str:
        dtype = np.dtype(dtype)
        return "uint16" if dtype == np.float16 else str(dtype)

    def _dyn_dtype(self, storage: str) -> np.dtype:
        info = self.plan.inputs.get(storage) or self.plan.buffers[storage]
        return np.dtype(info.dtype)

    def _const(self, array: np.ndarray) -> tuple:
        array = contiguous(array)
        key = (array.__array_interface__["data"][0], array.shape, array.dtype.str)
        index = self.const_index.get(key)
        if index is None:
            index = len(self.pointers)
            self.const_index[key] = index
            self.keep.append(array)
            self.pointers.append(array.ctypes.data if array.size else self.scratch.ctypes.data)
        return ("const", index, tuple(array.shape), self._as_stored(array.dtype))

    def _storage(self, storage: str) -> tuple:
        storage = self.final_storage(storage)
        if storage in self.dynamic:
            return ("dyn", storage, self._as_stored(self._dyn_dtype(storage)))
        if storage in self.constants:
            return self._const(self.constants[storage].reshape(-1))
        dtype = np.dtype(self.stored_dtype(storage))
        size = self.memory.sizes[storage] // dtype.itemsize
        return ("arena", self.memory.offsets[storage], size, self._as_stored(dtype))

    def call(self, impl, kernel: Kernel, step: int):
        args = [self._storage(self.backend.layouts[kernel.output].storage)]
        for spec in impl.args:
            args.append(self._storage(spec[1]) if spec[0] == "storage" else self._const(spec[1]))
        g0, f0 = self.gp_size, self.fp_size
        self.gp.append(impl.params)
        self.fp.append(impl.fparams)
        self.gp_size += impl.params.size
        self.fp_size += impl.fparams.size
        args += [("gp", g0, self.gp_size), ("fp", f0, self.fp_size)]
        ws = self.memory.workspace.get(step)
        if ws is not None:
            args.append(("arena", self.memory.offsets[ws], self.memory.sizes[ws] // 4, "float32"))
        else:
            args.append(("scratch",))
        return KernelCall(impl.fn, impl.source_hash, args)

    def _tables(self) -> None:
        if self.P is None or len(self.P) != len(self.pointers):
            self.P = np.asarray(self.pointers, dtype=np.int64)
        if self.GP is None or self.GP.size != max(self.gp_size, 1):
            self.GP = np.concatenate(self.gp) if self.gp else np.zeros(1, np.int64)
            self.FP = np.concatenate(self.fp) if self.fp else np.zeros(1, np.float32)

    def step(self, call) -> Callable[[dict], None]:
        """The kernel alone (Python binds its arrays each call): for per-kernel timing."""
        fixed: list = []
        dynamic: list[tuple[int, str, bool]] = []
        for spec in call.args:
            kind = spec[0]
            if kind == "arena":
                _, offset, numel, dtype = spec
                fixed.append(self.arena[offset:offset + numel * np.dtype(dtype).itemsize]
                             .view(np.dtype(dtype)))
            elif kind == "const":
                fixed.append(self.keep[spec[1] - 2].reshape(spec[2]) if spec[2] else
                             self.keep[spec[1] - 2])
            elif kind == "dyn":
                dynamic.append((len(fixed), spec[1], spec[2] == "uint16"))
                fixed.append(None)
            elif kind == "gp":
                fixed.append((kind, spec[1], spec[2]))
            elif kind == "fp":
                fixed.append((kind, spec[1], spec[2]))
            else:
                fixed.append(self.scratch)
        fn = call.fn
        binder = self

        def step(dyn: dict) -> None:
            binder._tables()
            args = list(fixed)
            for i, a in enumerate(args):
                if isinstance(a, tuple):
                    args[i] = (binder.GP if a[0] == "gp" else binder.FP)[a[1]:a[2]]
            for index, storage, half in dynamic:
                flat = dyn["flat:" + storage]
                args[index] = flat.view(np.uint16) if half else flat
            fn(*args)

        return step

    def segment(self, calls: list) -> Callable[[dict], None]:
        """One compiled function running `calls`; returns the run step that calls it."""
        order: list[str] = []
        for call in calls:
            for spec in call.args:
                if spec[0] == "dyn" and spec[1] not in order:
                    order.append(spec[1])
        index = {storage: i for i, storage in enumerate(order)}
        calls = [type(c)(c.fn, c.digest, [("dyn", index[s[1]], s[2]) if s[0] == "dyn" else s
                                          for s in c.args]) for c in calls]
        dtypes = [(s, np.dtype(self._as_stored(self._dyn_dtype(s)))) for s in order]
        half = [dtype == np.uint16 and self._dyn_dtype(s) == np.float16 for s, dtype in dtypes]
        self._tables()
        fn = self.backend.segment(calls, dtypes)
        binder = self
        keys = ["flat:" + s for s in order]

        if not any(half):
            def run(dyn: dict) -> None:
                fn(binder.P, binder.GP, binder.FP, *[dyn[k] for k in keys])
        else:
            def run(dyn: dict) -> None:
                fn(binder.P, binder.GP, binder.FP,
                   *[dyn[k].view(np.uint16) if h else dyn[k] for k, h in zip(keys, half)])
        run.segment = True
        run.calls = len(calls)
        return run
