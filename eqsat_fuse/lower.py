"""Stage 6, lower: fold constants, plan memory and build the backend's program.

`lower` evaluates every `ConstExpr` once (compile-time constant folding), resolves every view to
a layout over some storage (`layout.view_layouts`), asks the backend for one step per kernel,
plans memory (`memory.plan_memory`: lifetimes, in-place reuse, workspaces, best-fit offsets in
one arena) and binds each step to its arena slots. `Program.run` then allocates nothing but the
graph outputs (which the caller keeps): kernels write into preallocated views of the arena.

With `storage_dtype="float16"`, intermediates computed as float32 are stored as float16 (the
kernels load float16, compute float32 and store float16); graph inputs and outputs keep the
model's dtypes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .backend_numpy import OpaqueNodes, evaluate_body, make_step
from .errors import EqsatFuseError, FeedError
from .ir import BodyNode, Kernel, KernelPlan, Operand
from .layout import Layout, view_layouts
from .memory import ALIGN, MemoryPlan, plan_memory, view_roots
from .ops import OPS

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
    layouts: dict[str, Layout] = field(default_factory=dict)
    _fresh: list = field(default_factory=list)        # (storage, numel, dtype) per run
    _dynamic_views: list = field(default_factory=list)
    _outputs: list = field(default_factory=list)
    _copy_outputs: set = field(default_factory=set)

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        dyn: dict[str, Any] = {}
        for name, value in check_feeds(self.plan, feeds).items():
            value = np.ascontiguousarray(value)
            dyn[name] = value
            dyn["flat:" + name] = value.reshape(-1)
        for storage, numel, dtype in self._fresh:
            flat = np.empty(numel, dtype=dtype)
            dyn["flat:" + storage] = flat
        for name, storage, layout, dtype in self._dynamic_views:
            dyn[name] = _strided(dyn["flat:" + storage], layout, dtype)
        for step in self.steps:
            step(dyn)
        result = {}
        for name, ref, static in self._outputs:
            value = static if static is not None else dyn[ref]
            if static is not None or name in self._copy_outputs or not value.flags.c_contiguous:
                value = np.array(value, copy=True)
            result[name] = value
        return result


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
        value = np.asarray(feeds[name])
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
        value = np.ascontiguousarray(value)
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
    `threads` caps the Numba backend's parallel loops (default: Numba's thread count).
    """
    if backend not in BACKENDS:
        raise EqsatFuseError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if storage_dtype not in STORAGE_DTYPES:
        raise EqsatFuseError(f"unknown storage dtype {storage_dtype!r}; choose one of "
                             f"{', '.join(STORAGE_DTYPES)}")
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

    report = BackendReport(backend=backend, storage_dtype=storage_dtype, removed_kernels=removed)
    numba_backend = None
    if backend == "numba":
        from .backend_numba import NumbaBackend
        numba_backend = NumbaBackend(plan, constants, layouts, stored, cache_dir, threads)
        report.threads = numba_backend.threads

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
        if numba_backend is not None and (kernel.output in copies or "movement" in ops):
            report.copy_kernels += 1
        elif numba_backend is not None:
            from .backend_numba import Unsupported
            try:
                impl = numba_backend.prepare(kernel)
            except Unsupported as why:
                report.fallback_kernels.append(f"{kernel.name}: {'+'.join(kernel.ops)} ({why})")
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
    dyn_views = {v[0] for v in dynamic_views}
    for i, kernel in enumerate(plan.kernels):
        if kernel.kind == "alias" and kernel.output not in copies:
            continue          # a view: bound once above (or per run for inputs/outputs)
        if i in impls:
            steps.append(_numba_step(numba_backend, impls[i], kernel, final_storage, flats,
                                     dynamic_storages, workspaces.get(i)))
        else:
            steps.append(_numpy_step(kernel, opaque, value_of, plan))

    if numba_backend is not None:
        stats = numba_backend.stats
        report.jit_seconds = stats.seconds
        report.jit_compiled = stats.compiled
        report.jit_loaded = stats.loaded
        report.sources = stats.sources

    program = Program(plan=plan, backend=backend, constants=constants, steps=steps,
                      memory=memory, fold_seconds=fold_seconds, storage_dtype=storage_dtype,
                      report=report, arena=arena, layouts=layouts)
    program._fresh = [(root, plan.buffers[root].size, np.dtype(plan.buffers[root].dtype))
                      for root in sorted(external)]
    for name, ref in plan.outputs.items():
        if ref in constants:
            program._outputs.append((name, ref, constants[ref]))
        else:
            program._outputs.append((name, ref, static_env.get(ref)))
            if layouts[ref].storage not in external:     # a view of an input or constant
                program._copy_outputs.add(name)
    program._dynamic_views = dynamic_views
    return program


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

    return step


def _numba_step(backend, impl, kernel: Kernel, final_storage, flats: dict,
                dynamic_storages: set, workspace: np.ndarray | None) -> Callable[[dict], None]:
    """A call of the compiled kernel with its arena views bound once."""
    out_storage = final_storage(backend.layouts[kernel.output].storage)
    slots: list = [None]
    dynamic: list[tuple[int, str]] = []
    if out_storage in dynamic_storages:
        dynamic.append((0, out_storage))
    else:
        flat = flats[out_storage]
        slots[0] = flat.view(np.uint16) if flat.dtype == np.float16 else flat
    for spec in impl.args:
        if spec[0] == "storage":
            storage = final_storage(spec[1])
            if storage in dynamic_storages:
                dynamic.append((len(slots), storage))
                slots.append(None)
            else:
                flat = flats[storage]
                slots.append(flat.view(np.uint16) if flat.dtype == np.float16 else flat)
        else:
            slots.append(spec[1])
    ws = workspace if workspace is not None else np.zeros(1, dtype=np.float32)
    slots += [impl.params, impl.fparams, ws]
    fn = impl.fn
    # compile now (or load from the disk cache) for the exact argument types
    example = list(slots)
    for index, storage in dynamic:
        if storage in backend.plan.inputs:
            info = backend.plan.inputs[storage]
        else:
            info = backend.plan.buffers[storage]
        dtype = np.dtype(info.dtype)
        example[index] = np.empty(info.size, dtype=np.uint16 if dtype == np.float16 else dtype)
    backend.compile(fn, tuple(example))
    half = {storage for _, storage in dynamic
            if np.dtype((backend.plan.inputs.get(storage) or backend.plan.buffers[storage]).dtype)
            == np.float16}
    if not dynamic:
        args = tuple(slots)
        return lambda dyn: fn(*args)

    def step(dyn: dict) -> None:
        for index, storage in dynamic:
            flat = dyn["flat:" + storage]
            slots[index] = flat.view(np.uint16) if storage in half else flat
        fn(*slots)

    return step
