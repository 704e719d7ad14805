"""The Numba backend behind the backend interface (`backends.base`): `NumbaAdapter` holds a
`NumbaBackend` (`backends.numba.backend`, which generates and compiles the kernels) and binds
its compiled kernels to the arena with `_NumbaBinder`.

Runs of consecutive compiled kernels are bound into segments: one hand-written compiled loop
(`calls.run_calls`) calls a segment's kernels in order from tables (`segments`), so a run
pays Python's dispatch once per segment. Kernels the generator cannot build (`Unsupported`)
and opaque kernels run as NumPy steps between segments. BLAS runs single-threaded inside
Numba's parallel loops.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir import Kernel, KernelPlan, itemsize
from ...lowering.arena import Arena
from ...lowering.memory import MemoryPlan
from ...lowering.program import BackendReport, contiguous
from ..base import BackendContext, Prepared, Steps, Unsupported
from ..numpy.backend import NumpyKernel
from .backend import Impl, NumbaBackend
from .backend import Unsupported as CannotGenerate
from .calls import run_calls
from .geometry import geometry, kernel_names, renamed, shareable
from .parallel_jit import uncached
from .segments import KernelCall, segment_tables
from .source import held_dtype


def warm_up() -> None:
    """Load what every Numba program needs before its kernels: the threading layer, the
    packed GEMM's microkernel and `run_calls`' machine code (from their caches, with Numba's
    own first-use set-up, about 0.1 s, on the way). `eqsat_fuse.load` runs it while a thread
    reads and hashes the artifact's files, which leaves the interpreter free most of the time."""
    from . import packed_gemm as PG
    from .calls import entry_point, launch_threading_layer
    from numba import typeof
    launch_threading_layer()
    if PG.AVAILABLE:
        PG.ensure_compiled()
    ints, floats = typeof(np.zeros(1, np.int64)), typeof(np.zeros(1, np.float32))
    entry_point(run_calls, (ints, ints, ints, ints, floats))


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
                                    context.numerics, context.shared)

        self.deferred: list = []      # kernels left to compile in the background (defer_jit)
        self.generated: dict = {}     # implementations by geometry (`_generate`)

    def prepare(self, kernel: Kernel) -> Impl | Unsupported:
        shared = self.context.shared
        impl = None
        if shared is not None:       # a kernel the last shape had, over the same operands
            seen, operands = shared.setdefault("seen", {}), self._operands(kernel)
            last = seen.get(kernel.name)
            if last is not None and last[0] is kernel and last[1] == operands:
                impl = last[2]
        if impl is None:
            impl = self._generate(kernel, self.generated if shared is None
                                  else shared.setdefault("generated", {}))
            if isinstance(impl, Unsupported):
                return impl
            if shared is not None:
                seen[kernel.name] = (kernel, operands, impl)
        if self.context.defer_jit and uncached([impl.fn]):
            self.deferred.append(impl.fn)
            return Unsupported("compiling in the background (a shape seen for the first time)")
        return impl

    def _operands(self, kernel: Kernel) -> tuple:
        """What a new shape can change of a kernel the shapes share (`specialize` keeps a
        kernel whose symbols keep their values): its operands' layouts, and their storages'
        dtypes, infos and whether the caller gives them. The rest is the kernel's own."""
        backend = self.backend
        layouts = [backend.layouts.get(name) for name in kernel_names(kernel)]
        storages = {lay.storage for lay in layouts if lay is not None}
        return tuple(layouts), tuple((s, backend.stored.get(s), s in backend.external,
                                      backend.plan.buffers.get(s)) for s in sorted(storages))

    def _generate(self, kernel: Kernel, generated: dict) -> Impl | Unsupported:
        """The kernel's implementation: generated, or the one generated for a kernel of the
        same geometry (`geometry`), renamed where that kernel's names were others (the layers
        of a transformer). The lowerings of one plan at several shapes share `generated`
        (`lowering.generic`): a new shape generates only the kernels whose geometry it changed
        (in a decode step, those that read the growing cache), once per layer's kernel."""
        key, storages = geometry(self.backend, kernel)
        exact = (key, tuple(storages))
        impl = generated.get(exact)
        if impl is not None:
            return impl
        found = generated.get(key)
        if found is not None:
            impl = renamed(found[0], found[1], storages)
        else:
            try:
                impl = self.backend.prepare(kernel)
            except CannotGenerate as why:
                return Unsupported(str(why))
            if shareable(impl, storages):
                generated[key] = (impl, storages)
        generated[exact] = impl
        return impl

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
        self.backend.precompile([p.impl.fn for p in prepared
                                 if not isinstance(p.impl, NumpyKernel)])

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
                steps.append(_KernelStep(binder, call, "+".join(p.kernel.ops)))
                pending.append(call)
        flush()
        binder._tables()
        self.backend.finish_packing()            # the weights' panels are filled
        return Steps(kernel_steps=steps, run_steps=run_steps, reads=reads)

    def fill_report(self, report: BackendReport) -> None:
        stats = self.backend.stats
        report.jit_seconds = stats.seconds
        report.jit_compiled = stats.compiled
        report.jit_workers = stats.workers
        report.jit_loaded = stats.loaded
        report.sources = stats.sources
        report.generated_kernels = stats.kernels
        report.jit_deferred = len({id(fn) for fn in self.deferred})


class _KernelStep:
    """One kernel alone, one dispatch (`_NumbaBinder.step`), built on its first call: a run
    calls the segments, and only per-kernel timing calls these."""

    def __init__(self, binder: "_NumbaBinder", call: KernelCall, label: str):
        self.binder, self.call, self.label = binder, call, label
        self.step: Callable[[dict], None] | None = None

    def __call__(self, dyn: dict) -> None:
        if self.step is None:
            self.step = self.binder.step(self.call)
        self.step(dyn)


class _NumbaBinder:
    """Binds compiled kernels to the arena: for each kernel call its address table (where each
    array it reads and writes lives), its parameters, a per-kernel step (for profiling) and
    segments (runs of consecutive calls that `calls.run_calls` makes in one dispatch)."""

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
        self.scratch_address = self.scratch.ctypes.data
        self.base = arena.ctypes.data if arena.size else self.scratch_address
        self.keep: list[np.ndarray] = []            # arrays whose addresses the tables hold
        self.kept: set[tuple] = set()
        self.a: list[int] = []
        self.gp: list[np.ndarray] = []
        self.fp: list[np.ndarray] = []
        self.gp_size = 0
        self.fp_size = 0
        self.A = None
        self.GP = None
        self.FP = None

    def _dyn_info(self, storage: str):
        return self.plan.inputs.get(storage) or self.plan.buffers[storage]

    def _const(self, array: np.ndarray) -> tuple:
        """(address, dims, dtype as held) of a constant, kept alive by the binder."""
        if not (array.flags.c_contiguous and array.ndim):
            array = contiguous(array)
        data = array.__array_interface__["data"][0]
        key = (data, array.shape, array.dtype.str)
        if key not in self.kept:
            self.kept.add(key)
            self.keep.append(array)
        address = data if array.size else self.scratch_address
        return address, tuple(int(n) for n in array.shape) or (1,), held_dtype(array.dtype)

    def _storage(self, storage: str, dyn: list, at: int) -> tuple:
        """(address, dims, dtype as held) of a buffer; a run's own arrays get address 0 here
        and their position in `dyn`."""
        storage = self.final_storage(storage)
        if storage in self.dynamic:
            info = self._dyn_info(storage)
            dyn.append((at, storage))
            return 0, (int(np.prod(info.shape, dtype=np.int64)),), held_dtype(info.dtype)
        if storage in self.constants:
            return self._const(self.constants[storage].reshape(-1))
        dtype = self.stored_dtype(storage)
        size = self.memory.sizes[storage] // itemsize(dtype)
        return self.base + self.memory.offsets[storage], (size,), held_dtype(dtype)

    def call(self, impl, kernel: Kernel, step: int) -> KernelCall:
        """The kernel's call: its address table appended to the program's, checked against the
        array types its source declares."""
        dyn: list[tuple[int, str]] = []
        a0 = len(self.a)
        places = []
        at = a0
        for spec in [("storage", self.backend.layouts[kernel.output].storage), *impl.args]:
            place = self._storage(spec[1], dyn, at) if spec[0] == "storage" \
                else self._const(spec[1])
            places.append(place)
            at += 1 + len(place[1])
        ws = self.memory.workspace.get(step)
        if ws is not None:
            places.append((self.base + self.memory.offsets[ws],
                           (self.memory.sizes[ws] // 4,), "float32"))
        else:
            places.append((self.scratch_address, (1,), "float32"))
        declared = [(dtype, len(dims)) for _, dims, dtype in places]
        if declared != impl.arg_types:
            raise AssertionError(f"kernel {kernel.name}: its source reads {impl.arg_types}, "
                                 f"the program binds {declared}")
        for address, dims, _ in places:
            self.a += [address, *dims]
        g0, f0 = self.gp_size, self.fp_size
        self.gp.append(impl.params)
        self.fp.append(impl.fparams)
        self.gp_size += impl.params.size
        self.fp_size += impl.fparams.size
        entry = self.backend.entry(impl.fn)
        return KernelCall(impl.fn, impl.source_hash, entry, (a0, len(self.a)),
                          (g0, self.gp_size), (f0, self.fp_size), dyn)

    def _tables(self) -> None:
        if self.A is None or self.A.size != max(len(self.a), 1):
            self.A = np.asarray(self.a or [0], dtype=np.int64)
        if self.GP is None or self.GP.size != max(self.gp_size, 1):
            self.GP = np.concatenate(self.gp) if self.gp else np.zeros(1, np.int64)
            self.FP = np.concatenate(self.fp) if self.fp else np.zeros(1, np.float32)

    def _patcher(self, calls: list[KernelCall]) -> Callable[[dict], None]:
        """Writes a run's own arrays' addresses (the feeds, the caller's outputs) into A."""
        positions: dict[str, list[int]] = {}
        for call in calls:
            for at, storage in call.dyn:
                positions.setdefault("flat:" + storage, []).append(at)
        slots = [(key, np.asarray(at, dtype=np.int64)) for key, at in positions.items()]
        binder = self

        def patch(dyn: dict) -> None:
            A = binder.A
            for key, at in slots:
                A[at] = dyn[key].ctypes.data
        return patch

    def step(self, call: KernelCall) -> Callable[[dict], None]:
        """The kernel alone, one dispatch: for per-kernel timing."""
        patch = self._patcher([call])
        fn, binder = call.fn, self
        (a0, a1), (g0, g1), (f0, f1) = call.a, call.g, call.f

        def step(dyn: dict) -> None:
            binder._tables()
            patch(dyn)
            fn(binder.A[a0:a1], binder.GP[g0:g1], binder.FP[f0:f1])

        return step

    def segment(self, calls: list[KernelCall]) -> Callable[[dict], None]:
        """The run step calling `calls` in order in one dispatch (`calls.run_calls`)."""
        entries, bounds = segment_tables(calls)
        patch = self._patcher(calls)
        binder = self

        def run(dyn: dict) -> None:
            patch(dyn)
            run_calls(entries, bounds, binder.A, binder.GP, binder.FP)
        run.segment = True
        run.calls = len(calls)
        return run
