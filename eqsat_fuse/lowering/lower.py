"""Stage 6, lower: fold constants, plan memory and build the backend's program.

`lower` evaluates every `ConstExpr` once (compile-time constant folding), resolves every view to
a layout over some storage (`layout.view_layouts`), asks the backend for one step per kernel,
plans memory (`memory.plan_memory`: lifetimes, in-place reuse, workspaces, best-fit offsets in
one arena) and binds each step to its arena slots. `Program.run` then allocates nothing but the
graph outputs (which the caller keeps): kernels write into preallocated views of the arena.
`Program.run(feeds, out=...)` writes the outputs into arrays the caller passes (and reuses
across runs, e.g. from `Program.empty_outputs()`), so a run allocates nothing at all.

With the Numba backend, runs of consecutive compiled kernels are bound into segments: one
compiled function per segment calls the kernels in order (see `backend_numba`), so a run pays
Python's dispatch once per segment. `Program.steps` keeps one step per kernel for profiling; a
caller that replaces `steps` gets them run one by one.

With `storage_dtype="float16"`, intermediates computed as float32 are stored as float16 (the
kernels load float16, compute float32 and store float16); graph inputs and outputs keep the
model's dtypes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..backends.numpy.backend import OpaqueNodes, evaluate_body, make_step
from ..errors import EqsatFuseError, FeedError, RunError
from ..ir import BodyNode, Kernel, KernelPlan, Operand
from .layout import Layout, view_layouts
from .memory import ALIGN, MemoryPlan, plan_memory, view_roots
from ..ops import OPS
from ..threads import governed, resolve as resolve_threads

BACKENDS = ("numpy", "numba")
STORAGE_DTYPES = ("float32", "float16")


@dataclass
class BackendReport:
    """What the backend did: compiled kernels, JIT time, fallbacks."""

    backend: str
    storage_dtype: str = "float32"
    kernels: int = 0                      # compute kernels (not views)
    compiled_kernels: int = 0             # run as generated code
    fallback_kernels: list[str] = field(default_factory=list)    # "name: op+op (why)"
    copy_kernels: int = 0                 # movement kernels run as NumPy copies
    opaque_kernels: int = 0               # run by onnx.reference
    jit_seconds: float = 0.0
    jit_compiled: int = 0                 # compiled in this process
    jit_loaded: int = 0                   # loaded from the disk cache
    sources: int = 0                      # distinct generated sources
    threads: int = 1
    removed_kernels: int = 0              # recomputed buffers read from the inline copy instead
    segments: int = 0                     # compiled functions a run calls (kernels in sequence)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


@dataclass
class Program:
    """A lowered kernel plan that runs: `run(feeds) -> {output name: array}`."""

    plan: KernelPlan
    backend: str
    constants: dict[str, np.ndarray]
    steps: list[Callable[[dict], None]]
    memory: MemoryPlan
    fold_seconds: float
    storage_dtype: str = "float32"
    report: BackendReport | None = None
    arena: np.ndarray | None = None
    threads: int = 1                       # the one thread setting of its runs (see threads)
    layouts: dict[str, Layout] = field(default_factory=dict)
    _fresh: list = field(default_factory=list)        # (storage, numel, dtype) per run
    _dynamic_views: list = field(default_factory=list)
    _outputs: list = field(default_factory=list)
    _copy_outputs: set = field(default_factory=set)

    _kernel_steps: list = field(default_factory=list)  # `steps` as lowering built them
    _run_steps: list = field(default_factory=list)     # what a run executes (Numba segments)
    _direct: dict = field(default_factory=dict)        # output name -> the storage it fills
    _output_info: dict = field(default_factory=dict)   # output name -> (shape, dtype)
    _feed_specs: list = field(default_factory=list)    # (input name, dtype, shape)

    def empty_outputs(self) -> dict[str, np.ndarray]:
        """Fresh output arrays of the right shapes and dtypes, for `run(feeds, out=...)`."""
        return {name: np.empty(shape, dtype) for name, (shape, dtype) in self._output_info.items()}

    def run(self, feeds: dict[str, Any], out: dict[str, np.ndarray] | None = None
            ) -> dict[str, np.ndarray]:
        """Run the program. Outputs are new arrays the caller owns; with `out` (output name ->
        array of the output's shape and dtype, e.g. from `empty_outputs()`), the outputs it
        names are written into those arrays instead and returned as they are, so repeated runs
        allocate nothing. `out` arrays must not overlap the feeds or each other.
        """
        dyn: dict[str, Any] = {}
        specs = self._feed_specs
        if type(feeds) is dict and len(feeds) == len(specs):      # the common case, checked fast
            for name, dtype, shape in specs:
                value = feeds.get(name)
                if type(value) is not np.ndarray or value.dtype != dtype \
                        or value.shape != shape:
                    break
                if not value.flags.c_contiguous:
                    value = contiguous(value)
                dyn[name] = value
                dyn["flat:" + name] = value.reshape(-1)
        if len(dyn) != 2 * len(specs) or not specs:
            dyn = {}
            for name, value in check_feeds(self.plan, feeds).items():
                value = contiguous(value)
                dyn[name] = value
                dyn["flat:" + name] = value.reshape(-1)
        targets = self._check_out(out, dyn) if out is not None else None
        for storage, numel, dtype in self._fresh:
            flat = None
            if targets:
                name = self._direct.get(storage)
                target = targets.get(name) if name is not None else None
                if target is not None and target.flags.c_contiguous:
                    flat = target.reshape(-1)
            dyn["flat:" + storage] = np.empty(numel, dtype=dtype) if flat is None else flat
        for name, key, view in self._dynamic_views:
            dyn[name] = view(dyn[key])
        # the segments, unless a caller swapped `steps` (per-kernel timing runs them one by one)
        steps = self._run_steps if self._run_steps and self.steps is self._kernel_steps \
            else self.steps
        try:
            with governed(self.threads, 1 if self.backend == "numba" else self.threads,
                          numba_threads=self.backend == "numba"):
                for step in steps:
                    step(dyn)
        except IndexError as why:
            # a Gather index fed at run time (both backends check and raise this message);
            # any other IndexError is a bug in eqsat-fuse and stays as it is
            if not str(why).startswith("Gather: index out of range"):
                raise
            raise RunError(f"{why}: an index fed at run time is outside the axis it indexes"
                           ) from None
        result = {}
        for name, ref, static in self._outputs:
            value = static if static is not None else dyn[ref]
            if targets is not None and name in targets:
                target = targets[name]
                if not np.shares_memory(target, value):
                    np.copyto(target, value)
                result[name] = target
                continue
            if static is not None or name in self._copy_outputs or not value.flags.c_contiguous:
                value = np.array(value, copy=True)
            result[name] = value
        return result

    def _check_out(self, out: dict, dyn: dict) -> dict[str, np.ndarray]:
        if not isinstance(out, dict):
            raise FeedError(f"out must be a dict of output name -> array, not "
                            f"{type(out).__name__}")
        for name, target in out.items():
            if name not in self._output_info:
                raise FeedError(f"unknown output {name!r} in out; the model's outputs are "
                                f"{', '.join(self._output_info)}")
            shape, dtype = self._output_info[name]
            if not isinstance(target, np.ndarray) or target.dtype != dtype \
                    or tuple(target.shape) != tuple(shape) or not target.flags.writeable:
                raise FeedError(f"out[{name!r}] must be a writeable {dtype} array of shape "
                                f"{list(shape)}")
            for feed, value in dyn.items():
                if not feed.startswith("flat:") and np.may_share_memory(target, value):
                    raise FeedError(f"out[{name!r}] overlaps the input {feed!r}")
        arrays = list(out.values())
        for i, a in enumerate(arrays):
            for b in arrays[i + 1:]:
                if np.may_share_memory(a, b):
                    raise FeedError("two out arrays overlap")
        return out


def _strided(flat: np.ndarray, layout: Layout, dtype) -> np.ndarray:
    """The N-d view `layout` of a flat storage array."""
    if not layout.shape:
        return flat[layout.offset:layout.offset + 1].reshape(())
    if layout.contiguous:
        return flat[layout.offset:layout.offset + layout.size].reshape(layout.shape)
    item = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[layout.offset:], shape=layout.shape,
        strides=tuple(s * item for s in layout.strides))


def contiguous(value) -> np.ndarray:
    """`value` as a C-contiguous array of the same shape (`np.ascontiguousarray` alone turns a
    0-d array into shape (1,))."""
    return np.ascontiguousarray(value).reshape(np.shape(value))


def check_feeds(plan: KernelPlan, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
    """The feeds as arrays, or a FeedError naming the input that is missing or wrong."""
    if not isinstance(feeds, dict):
        raise FeedError(f"feeds must be a dict of input name -> array, not {type(feeds).__name__}")
    unknown = [name for name in feeds if name not in plan.inputs]
    if unknown:
        raise FeedError(f"unknown input {unknown[0]!r}; the model's inputs are "
                        f"{', '.join(plan.inputs) or '(none)'}")
    arrays = {}
    for name, info in plan.inputs.items():
        if name not in feeds:
            raise FeedError(f"missing input {name!r} (shape {list(info.shape)}, {info.dtype})")
        try:
            value = np.asarray(feeds[name])
        except (ValueError, TypeError) as why:      # a ragged nested list, for one
            raise FeedError(f"input {name!r} is not an array: {why}") from None
        if value.dtype != np.dtype(info.dtype):
            raise FeedError(f"input {name!r} has dtype {value.dtype}, the model expects "
                            f"{info.dtype}")
        if tuple(value.shape) != tuple(info.shape):
            raise FeedError(f"input {name!r} has shape {list(value.shape)}, the model was "
                            f"compiled for {list(info.shape)}")
        arrays[name] = value
    return arrays


def fold_constants(plan: KernelPlan, opaque: OpaqueNodes) -> dict[str, np.ndarray]:
    """Evaluate every constant expression of the plan once (as contiguous arrays)."""
    values: dict[str, np.ndarray] = {}

    def operand_value(operand: Operand):
        if operand.kind == "initializer":
            return plan.initializers[operand.ref]
        raise EqsatFuseError(f"constant expression reads {operand.kind} {operand.ref!r}")

    for name, expr in plan.constants.items():
        value = np.asarray(evaluate_body(expr.body, operand_value, opaque))
        if expr.info is not None and tuple(value.shape) != tuple(expr.info.shape):
            raise EqsatFuseError(f"constant {name}: folded to shape {list(value.shape)}, "
                                 f"expected {list(expr.info.shape)}")
        value = contiguous(value)
        value.flags.writeable = False
        values[name] = value
    return values


# ---- reading a buffer that a kernel also recomputes inline ----------------------------------

def _node_keys(body: list[BodyNode]) -> list[str]:
    keys: list[str] = []
    for node in body:
        args = [keys[a.ref] if a.kind == "node" else f"{a.kind}:{a.ref!r}" for a in node.args]
        keys.append(f"{node.op}{sorted(node.attrs.items())!r}({','.join(args)})")
    return keys


def reuse_inline_copies(plan: KernelPlan) -> tuple[KernelPlan, int]:
    """Kernels that read buffer B and also compute B's body inline read the inline value.

    Extraction can leave `x * f(x)` as a kernel that recomputes `x = MatMul+Add` inline for
    `f` and reads the materialized `x` for the product (both copies are equal values). Reading
    the inline value instead is exact, and when nothing else reads B its kernel is dropped
    (one GEMM less). Returns the new plan and how many kernels it removed.
    """
    outputs = set(plan.outputs.values())
    by_key = {}
    for kernel in plan.kernels:
        if kernel.kind == "compute" and len(kernel.body) > 0:
            by_key[_node_keys(kernel.body)[-1]] = kernel.output
    kernels = [Kernel(k.name, k.output, list(k.inputs), list(k.body), k.kind, k.info, k.eclass)
               for k in plan.kernels]
    changed = False
    for kernel in kernels:
        if kernel.kind != "compute":
            continue
        keys = _node_keys(kernel.body)
        inline = {by_key[key]: i for i, key in enumerate(keys[:-1]) if key in by_key}
        inline = {b: i for b, i in inline.items() if b in kernel.inputs and b != kernel.output}
        if not inline:
            continue
        body = []
        for node in kernel.body:
            args = [Operand("node", inline[a.ref]) if a.kind == "buffer" and a.ref in inline
                    and inline[a.ref] < len(body) else a for a in node.args]
            body.append(BodyNode(node.op, args, node.attrs))
        kernel.body = body
        kernel.inputs = list(dict.fromkeys(a.ref for b in body for a in b.args
                                           if a.kind == "buffer"))
        changed = True
    if not changed:
        return plan, 0
    # drop kernels nobody reads any more (repeat: a dropped kernel may free its own inputs)
    removed = 0
    while True:
        read = {name for k in kernels for name in k.inputs} | outputs
        alive = [k for k in kernels if k.output in read]
        if len(alive) == len(kernels):
            break
        removed += len(kernels) - len(alive)
        kernels = alive
    new = KernelPlan(kernels=kernels, buffers={k.output: k.info for k in kernels},
                     inputs=plan.inputs, outputs=plan.outputs, constants=plan.constants,
                     initializers=plan.initializers, opaque_nodes=plan.opaque_nodes)
    return new, removed


# ---- lowering ---------------------------------------------------------------------------------

def _dense_elementwise_inputs(kernel: Kernel, layouts: dict[str, Layout],
                              stored: Callable[[str], str]) -> set[str]:
    """Inputs an elementwise kernel reads at the index it writes (it may overwrite them)."""
    if any(OPS.get(n.op) is None or OPS[n.op].kind != "elementwise" for n in kernel.body):
        return set()
    out = []
    shape = tuple(kernel.info.shape)
    for name in kernel.inputs:
        lay = layouts.get(name)
        if lay is None or lay.shape != shape or not lay.contiguous or lay.offset != 0:
            continue
        if stored(lay.storage) != stored(kernel.output):
            continue
        if any(n.op == "BatchNormalization" and any(a.kind == "buffer" and a.ref == name
                                                     for a in n.args[1:]) for n in kernel.body):
            continue
        out.append(name)
    return set(out)


def lower(plan: KernelPlan, backend: str = "numpy", opset: int = 21,
          storage_dtype: str = "float32", cache_dir: str | None = None,
          threads: int | None = None, reuse_inline: bool = True) -> Program:
    """Fold constants, plan memory, and build the steps of `backend` ("numpy" or "numba").

    `storage_dtype` "float16" stores float32 intermediates as float16; `cache_dir` is where the
    Numba backend keeps generated kernels (default: $EQSAT_FUSE_CACHE_DIR or the user cache);
    `threads` is the program's one thread setting (default: this process's cores, see
    `threads`): the Numba backend's parallel loops, with BLAS single-threaded inside them, or
    the NumPy backend's BLAS.
    """
    if backend not in BACKENDS:
        raise EqsatFuseError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if storage_dtype not in STORAGE_DTYPES:
        raise EqsatFuseError(f"unknown storage dtype {storage_dtype!r}; choose one of "
                             f"{', '.join(STORAGE_DTYPES)}")
    threads = resolve_threads(threads)
    started = time.perf_counter()
    opaque = OpaqueNodes(plan, opset)
    constants = fold_constants(plan, opaque)
    fold_seconds = time.perf_counter() - started
    removed = 0
    if reuse_inline:
        plan, removed = reuse_inline_copies(plan)
        opaque.plan = plan

    layouts, copies = view_layouts(plan, constants)
    storage_of = view_roots(plan, copies)
    outputs = set(plan.outputs.values())
    external = {layouts[ref].storage for ref in outputs
                if ref in plan.buffers and layouts[ref].storage in plan.buffers}
    stored: dict[str, str] = {}
    for kernel in plan.kernels:
        root = layouts[kernel.output].storage
        if root == kernel.output:
            dtype = kernel.info.dtype
            if storage_dtype == "float16" and dtype == "float32" and root not in external:
                dtype = "float16"
            stored[root] = dtype

    def stored_dtype(name: str) -> str:
        if name in stored:
            return stored[name]
        if name in constants:
            return str(constants[name].dtype)
        return plan.inputs[name].dtype

    report = BackendReport(backend=backend, storage_dtype=storage_dtype, removed_kernels=removed,
                           threads=threads)
    numba_backend = None
    if backend == "numba":
        from ..backends.numba.backend import NumbaBackend
        numba_backend = NumbaBackend(plan, constants, layouts, stored, cache_dir, threads)

    # one implementation per step: generated code, or the NumPy evaluation
    impls: dict[int, Any] = {}
    workspace: dict[int, int] = {}
    inplace_inputs: dict[int, set[str]] = {}
    for i, kernel in enumerate(plan.kernels):
        if kernel.kind == "alias" and kernel.output not in copies:
            continue
        report.kernels += 1
        if kernel.kind == "opaque":
            report.opaque_kernels += 1
            continue
        ops = {OPS[n.op].kind for n in kernel.body if n.op in OPS}
        if numba_backend is not None:
            from ..backends.numba.backend import Unsupported
            movement = kernel.output in copies or "movement" in ops
            try:
                impl = numba_backend.prepare(kernel)
            except Unsupported as why:
                if movement:        # a copy the generator does not cover: a NumPy copy
                    report.copy_kernels += 1
                else:
                    report.fallback_kernels.append(
                        f"{kernel.name}: {'+'.join(kernel.ops)} ({why})")
            else:
                impls[i] = impl
                workspace[i] = impl.workspace_bytes
                inplace_inputs[i] = impl.inplace_inputs
                report.compiled_kernels += 1
                continue
        inplace_inputs[i] = _dense_elementwise_inputs(kernel, layouts, stored_dtype)

    memory = plan_memory(
        plan, storage_of=storage_of,
        nbytes=lambda name: plan.buffers[name].size * np.dtype(stored_dtype(name)).itemsize,
        workspace=workspace,
        inplace_ok=lambda i, kernel, name: name in inplace_inputs.get(i, ()),
        external=external)

    # the arena and every storage's flat array in it
    arena = np.empty(memory.arena_bytes + ALIGN, dtype=np.uint8)
    shift = (-arena.ctypes.data) % ALIGN
    arena = arena[shift:shift + memory.arena_bytes]
    merged = memory.storage_of

    def final_storage(storage: str) -> str:
        return merged.get(storage, storage)

    flats: dict[str, np.ndarray] = {}
    for storage, offset in memory.offsets.items():
        if storage.startswith("workspace#"):
            continue
        dtype = np.dtype(stored_dtype(storage))
        flats[storage] = arena[offset:offset + memory.sizes[storage]].view(dtype)
    for name, value in constants.items():
        flats[name] = value.reshape(-1)
    workspaces = {}
    for step, storage in memory.workspace.items():
        offset = memory.offsets[storage]
        workspaces[step] = arena[offset:offset + memory.sizes[storage]].view(np.float32)

    dynamic_storages = set(plan.inputs) | external
    static_env: dict[str, np.ndarray] = {}
    dynamic_views = []
    names = list(plan.inputs) + list(constants) + [k.output for k in plan.kernels]
    for name in names:
        lay = layouts[name]
        storage = final_storage(lay.storage)
        dtype = np.dtype(stored_dtype(lay.storage))
        if storage in dynamic_storages:
            if name not in plan.inputs:
                dynamic_views.append((name, storage, lay, dtype))
            continue
        static_env[name] = constants[name] if name in constants else \
            _strided(flats[storage], lay, dtype)

    def value_of(name: str, dyn: dict):
        value = static_env.get(name)
        return dyn[name] if value is None else value

    steps: list[Callable[[dict], None]] = []
    run_steps: list[Callable[[dict], None]] = []
    binder = _NumbaBinder(numba_backend, plan, memory, arena, flats, workspaces, constants,
                          dynamic_storages, final_storage, stored_dtype) \
        if numba_backend is not None else None
    pending: list = []

    def flush() -> None:
        if pending:
            run_steps.append(binder.segment(list(pending)))
            pending.clear()

    for i, kernel in enumerate(plan.kernels):
        if kernel.kind == "alias" and kernel.output not in copies:
            continue          # a view: bound once above (or per run for inputs/outputs)
        if i in impls:
            call = binder.call(impls[i], kernel, i)
            step = binder.step(call)
            step.label = "+".join(kernel.ops)
            steps.append(step)
            pending.append(call)
        else:
            step = _numpy_step(kernel, opaque, value_of, plan)
            steps.append(step)
            if binder is not None:
                flush()
                run_steps.append(step)
    if binder is not None:
        flush()
        binder._tables()

    if numba_backend is not None:
        stats = numba_backend.stats
        report.jit_seconds = stats.seconds
        report.jit_compiled = stats.compiled
        report.jit_loaded = stats.loaded
        report.sources = stats.sources
        report.segments = sum(1 for s in run_steps if getattr(s, "segment", False))

    program = Program(plan=plan, backend=backend, constants=constants, steps=steps,
                      memory=memory, fold_seconds=fold_seconds, storage_dtype=storage_dtype,
                      report=report, arena=arena, layouts=layouts, threads=threads)
    program._kernel_steps = steps
    program._run_steps = run_steps if binder is not None else []
    program._fresh = [(root, plan.buffers[root].size, np.dtype(plan.buffers[root].dtype))
                      for root in sorted(external)]
    roots_of_outputs: dict[str, list[str]] = {}
    for name, ref in plan.outputs.items():
        if ref in constants:
            program._outputs.append((name, ref, constants[ref]))
            info = constants[ref]
            program._output_info[name] = (tuple(info.shape), info.dtype)
            continue
        program._outputs.append((name, ref, static_env.get(ref)))
        info = plan.buffers.get(ref) or plan.inputs[ref]
        program._output_info[name] = (tuple(info.shape), np.dtype(info.dtype))
        lay = layouts[ref]
        if lay.storage not in external:     # a view of an input or constant
            program._copy_outputs.add(name)
        elif lay.contiguous and lay.offset == 0 and lay.size == plan.buffers[lay.storage].size:
            roots_of_outputs.setdefault(lay.storage, []).append(name)
    # an output that is its whole storage (and the only output of it) is written in place
    program._direct = {root: names[0] for root, names in roots_of_outputs.items()
                       if len(names) == 1 and sum(1 for r in plan.outputs.values()
                                                  if layouts[r].storage == root) == 1}
    # views of inputs/outputs made per run: only those a NumPy step or an output reads
    if binder is not None:
        read = set(plan.outputs.values())
        for i, kernel in enumerate(plan.kernels):
            if i not in impls and not (kernel.kind == "alias" and kernel.output not in copies):
                read.add(kernel.output)
                read.update(a.ref for n in kernel.body for a in n.args
                            if a.kind == "buffer")
        dynamic_views = [v for v in dynamic_views if v[0] in read]
    program._dynamic_views = [(name, "flat:" + storage, _view_maker(lay, dtype))
                              for name, storage, lay, dtype in dynamic_views]
    program._feed_specs = [(name, np.dtype(info.dtype), tuple(info.shape))
                           for name, info in plan.inputs.items()]
    return program


def _view_maker(layout: Layout, dtype) -> Callable[[np.ndarray], np.ndarray]:
    """`_strided(flat, layout, dtype)` with the layout's arithmetic done once."""
    shape, offset = tuple(layout.shape), layout.offset
    if not shape:
        return lambda flat: flat[offset:offset + 1].reshape(())
    if layout.contiguous:
        end = offset + layout.size
        return lambda flat: flat[offset:end].reshape(shape)
    return lambda flat: _strided(flat, layout, dtype)


def _numpy_step(kernel: Kernel, opaque: OpaqueNodes, value_of, plan: KernelPlan
                ) -> Callable[[dict], None]:
    """The NumPy evaluation of a kernel, written into its slot (float16 slots widened on read)."""
    body = kernel.body
    logical = {name: np.dtype(info.dtype) for name, info in plan.buffers.items()}
    output = kernel.output

    def operand_value(operand: Operand, dyn: dict):
        if operand.kind == "absent":
            return None
        value = value_of(operand.ref, dyn)
        dtype = logical.get(operand.ref)
        if dtype is not None and value.dtype != dtype:
            return value.astype(dtype)
        return value

    def step(dyn: dict) -> None:
        result = evaluate_body(body, lambda o: operand_value(o, dyn), opaque)
        with np.errstate(over="ignore"):      # float16 storage: beyond 65504 becomes inf
            np.copyto(value_of(output, dyn), result, casting="unsafe")

    step.label = "+".join(kernel.ops)
    return step


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
        from ..backends.numba.backend import KernelCall
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
