"""Stage 4, lowering: fold constants, plan memory and build the backend's program.

`lower` is a short list of stages: check the options; evaluate every `ConstExpr` once
(compile-time constant folding, `fold`) and read buffers a kernel recomputes inline from the
inline copy; resolve every view to a layout over some storage and choose each storage's dtype
(`storage`); ask the backend for an implementation of each kernel (`backends.base`: one it
cannot run runs as the NumPy evaluation); plan memory (`memory.plan_memory`: lifetimes,
in-place reuse, workspaces, best-fit offsets in one arena); make the arena and bind every value
to it (`arena`); have the backend bind its steps; and construct the `program.Program`.

With the Numba backend, runs of consecutive compiled kernels are bound into segments
(`backends.numba.binder`), so a run pays Python's dispatch once per segment.
"""

from __future__ import annotations

import time

import numpy as np

from ..backends import backend_names, check_backend, create_backend
from ..backends.base import Backend, BackendContext, Prepared, Steps, Unsupported
from ..backends.numpy.backend import NumpyBackend, NumpyKernel, OpaqueNodes
from ..errors import EqsatFuseError
from ..ir import KernelPlan
from ..ops import OPS
from ..threads import resolve as resolve_threads
from .arena import Arena, view_maker
from .fold import fold_constants, reuse_inline_copies
from .memory import MemoryPlan, plan_memory
from .program import BackendReport, Program, check_feeds, contiguous  # noqa: F401 (re-exported)
from .storage import LOWERED_STORAGE_DTYPES, Storage, plan_storage

BACKENDS = backend_names()          # the registered backends' names (`backends.BACKENDS`)


def lower(plan: KernelPlan, backend: str = "numpy", opset: int = 21,
          storage_dtype: str = "float32", cache_dir: str | None = None,
          threads: int | None = None, reuse_inline: bool = True,
          numerics: str = "exact", defer_jit: bool = False,
          shared: dict | None = None) -> Program:
    """Fold constants, plan memory, and build the steps of `backend` (a name in BACKENDS).

    `storage_dtype` "float16" stores float32 intermediates as float16; `cache_dir` is where the
    Numba backend keeps generated kernels (default: $EQSAT_FUSE_CACHE_DIR or the user cache);
    `threads` is the program's one thread setting (default: this process's cores, see
    `threads`): the Numba backend's parallel loops, with BLAS single-threaded inside them, or
    the NumPy backend's BLAS. `numerics` ("exact" or "fast") picks the kernels' floating-point
    flags (`eqsat_fuse.numerics`). `defer_jit`: a kernel that would need JIT compilation runs
    as its NumPy evaluation, and the backend's `deferred` lists what to compile in the
    background (see `lowering.generic`); `shared` is state the lowerings of one plan at several
    shapes share: the folded constants (which no symbol changes) and the packed weights.
    """
    check_options(backend, storage_dtype)
    threads = resolve_threads(threads)
    started = time.perf_counter()
    opaque = OpaqueNodes(plan, opset)
    if shared is not None and "constants" in shared:
        constants = shared["constants"]
    else:
        constants = fold_constants(plan, opaque)
        if shared is not None:
            shared["constants"] = constants
    fold_seconds = time.perf_counter() - started
    removed = 0
    if reuse_inline:
        plan, removed = reuse_inline_copies(plan)
        opaque.plan = plan
    storage = plan_storage(plan, constants, storage_dtype, shared)
    context = BackendContext(plan, constants, storage, opaque, cache_dir, threads, numerics,
                             defer_jit, shared)
    chosen = create_backend(backend, context)
    report = BackendReport(backend=backend, storage_dtype=storage_dtype, removed_kernels=removed,
                           threads=threads, numerics=numerics)
    prepared = prepare_kernels(plan, storage, chosen, NumpyBackend(context), report)
    memory = plan_kernel_memory(plan, storage, prepared, shared)
    arena = Arena(plan, memory, storage)
    steps = chosen.bind(arena, prepared)
    chosen.fill_report(report)
    report.segments = sum(1 for s in steps.run_steps if getattr(s, "segment", False))
    program = build_program(plan, chosen, storage, arena, steps, report, fold_seconds)
    program.deferred = list(getattr(chosen, "deferred", ()))   # to compile in the background
    return program


def check_options(backend: str, storage_dtype: str) -> None:
    """Raise EqsatFuseError for a backend or storage dtype lowering does not know."""
    check_backend(backend)
    if storage_dtype not in LOWERED_STORAGE_DTYPES:
        raise EqsatFuseError(f"unknown storage dtype {storage_dtype!r}; choose one of "
                             f"{', '.join(LOWERED_STORAGE_DTYPES)}")


def prepare_kernels(plan: KernelPlan, storage: Storage, backend: Backend,
                    fallback: NumpyBackend, report: BackendReport) -> list[Prepared]:
    """One implementation per kernel that computes: the backend's, or the NumPy evaluation
    (`fallback`) for opaque kernels and those the backend cannot run (counted in `report`)."""
    prepared: list[Prepared] = []
    for i, kernel in enumerate(plan.kernels):
        if kernel.kind == "alias" and kernel.output not in storage.copies:
            continue          # a view: bound once (or per run for inputs/outputs), no step
        report.kernels += 1
        if kernel.kind == "opaque":
            report.opaque_kernels += 1
            prepared.append(Prepared(i, kernel, fallback.prepare(kernel)))
            continue
        impl = backend.prepare(kernel)
        if isinstance(impl, Unsupported):
            ops = {OPS[n.op].kind for n in kernel.body if n.op in OPS}
            if kernel.output in storage.copies or "movement" in ops:
                report.copy_kernels += 1     # a copy the generator does not cover: NumPy's
            else:
                report.fallback_kernels.append(f"{kernel.name}: {'+'.join(kernel.ops)} ({impl})")
            impl = fallback.prepare(kernel)
        elif not isinstance(impl, NumpyKernel):
            report.compiled_kernels += 1
        prepared.append(Prepared(i, kernel, impl))
    return prepared


def plan_kernel_memory(plan: KernelPlan, storage: Storage, prepared: list[Prepared],
                       shared: dict | None = None) -> MemoryPlan:
    """The memory plan, with each implementation's workspace and in-place inputs (`shared`:
    the lowerings of one plan at several shapes also share their placement order)."""
    inplace = {p.index: p.impl.inplace_inputs for p in prepared}
    return plan_memory(
        plan, storage_of=storage.storage_of, nbytes=storage.nbytes,
        workspace={p.index: p.impl.workspace_bytes for p in prepared},
        inplace_ok=lambda i, kernel, name: name in inplace.get(i, ()),
        external=storage.external,
        placement=None if shared is None else shared.setdefault("placement", {}))


def build_program(plan: KernelPlan, backend: Backend, storage: Storage, arena: Arena,
                  steps: Steps, report: BackendReport, fold_seconds: float) -> Program:
    """The `Program`: the steps, and the tables a run reads its feeds and outputs through."""
    outputs, output_info, copy_outputs, direct = output_tables(plan, storage, arena)
    external = storage.external
    # views of inputs/outputs made per run: only those a step or an output reads by name
    read = set(plan.outputs.values()) | steps.reads
    dynamic_views = [(name, "flat:" + root, view_maker(lay, dtype))
                     for name, root, lay, dtype in arena.dynamic_views if name in read]
    return Program(
        plan=plan, backend=backend.name, constants=storage.constants,
        steps=steps.kernel_steps, run_steps=steps.run_steps, memory=arena.memory,
        fold_seconds=fold_seconds, storage_dtype=report.storage_dtype, report=report,
        arena=arena.array, threads=report.threads, blas_threads=backend.blas_threads,
        numba_threads=backend.numba_threads, layouts=storage.layouts,
        fresh=[(root, plan.buffers[root].size, np.dtype(plan.buffers[root].dtype))
               for root in sorted(external)],
        dynamic_views=dynamic_views, outputs=outputs, copy_outputs=copy_outputs,
        direct=direct, output_info=output_info,
        feed_specs=[(name, np.dtype(info.dtype), tuple(info.shape))
                    for name, info in plan.inputs.items()])


def output_tables(plan: KernelPlan, storage: Storage, arena: Arena
                  ) -> tuple[list, dict, set, dict]:
    """How a run hands back each output: (output name, value name, static array or None) in
    order, output name -> (shape, dtype), the outputs that view an input or constant (copied),
    and storage -> the one output that is all of it (written in place into an `out` array)."""
    constants, layouts, external = storage.constants, storage.layouts, storage.external
    outputs: list = []
    output_info: dict = {}
    copy_outputs: set = set()
    roots_of_outputs: dict[str, list[str]] = {}
    for name, ref in plan.outputs.items():
        if ref in constants:
            outputs.append((name, ref, constants[ref]))
            info = constants[ref]
            output_info[name] = (tuple(info.shape), info.dtype)
            continue
        outputs.append((name, ref, arena.static(ref)))
        info = plan.buffers.get(ref) or plan.inputs[ref]
        output_info[name] = (tuple(info.shape), np.dtype(info.dtype))
        lay = layouts[ref]
        if lay.storage not in external:     # a view of an input or constant
            copy_outputs.add(name)
        elif lay.contiguous and lay.offset == 0 and lay.size == plan.buffers[lay.storage].size:
            roots_of_outputs.setdefault(lay.storage, []).append(name)
    # an output that is its whole storage (and the only output of it) is written in place
    direct = {root: names[0] for root, names in roots_of_outputs.items()
              if len(names) == 1 and sum(1 for r in plan.outputs.values()
                                         if layouts[r].storage == root) == 1}
    return outputs, output_info, copy_outputs, direct
