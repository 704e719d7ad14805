"""One program, many shapes: a kernel plan over symbolic dims, lowered once per concrete shape.

Saturation, extraction and decoding run once, over the symbolic dims (`frontend.symbolic`,
`dims.DimCodes`); what they give is a `KernelPlan` whose shapes and view attributes hold
`dims.Dim`s. `ShapeGeneric` keeps that plan and, the first time a run's feeds bind the symbols
to values it has not seen, evaluates the plan at those values (`specialize`) and lowers it
(`lower.lower`: constant folding, memory plan, the backend's steps) into a `Program`, which it
keeps for the next run of that shape. Kernels take their geometry at run time and share their
source between shapes; where the generator picks another loop for new sizes (a dim of 1, a
product too small to split among threads), that kernel runs as its NumPy evaluation while a
worker process compiles it, so a new shape waits for no JIT. The lowerings share the folded
constants and packed weights (`shared`); the derived inputs (`signature.Signature.derive`:
masks, positions) are computed once per shape.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import numpy as np

from ..dims import Dim, evaluate_all, has_dims
from ..errors import FeedError
from ..ir import ConstExpr, Kernel, KernelPlan, TensorInfo
from ..signature import BindError, Signature, binding_text, bucket_of

# concrete shapes kept lowered at once (each holds its own arena), the least recently run
# dropped first: at most this many, and arenas of at most MAX_ARENA_BYTES together (a decode
# loop of a few hundred tokens keeps every step)
MAX_SHAPES = 512
MAX_ARENA_BYTES = 2 << 30


def _symbols(value) -> frozenset[str]:
    """The symbols of the dims in `value` (a dim, or lists and tuples of them)."""
    if isinstance(value, Dim):
        return value.symbols
    if isinstance(value, (list, tuple)):
        return frozenset().union(*(_symbols(v) for v in value))
    return frozenset()


def _symbolic_info(info: TensorInfo | None) -> bool:
    return info is not None and any(isinstance(d, Dim) for d in info.shape)


class Template:
    """Which parts of a symbolic plan hold dims (found once): `specialize` rebuilds those and
    shares the rest (kernels, infos and constants without dims) as they are."""

    def __init__(self, plan: KernelPlan):
        # per kernel, the body nodes with a dim in an attribute, and those attributes; a kernel
        # is symbolic if it has one, or its own shape holds a dim
        self.attrs = [[(i, names) for i, n in enumerate(k.body)
                       if (names := [a for a, v in n.attrs.items() if has_dims(v)])]
                      for k in plan.kernels]
        self.kernels = [bool(attrs) or _symbolic_info(k.info)
                        for k, attrs in zip(plan.kernels, self.attrs)]
        # per symbolic kernel, the symbols its dims name, and its last specialization: a
        # binding that gives those symbols the same values gets the same Kernel (in a decode
        # step, every kernel that does not read the cache), so what the backend keeps of it
        # for the last shape is found by identity
        self.symbols = [sorted(_symbols(k.info.shape if k.info is not None else ()).union(
            *(_symbols(k.body[i].attrs[a]) for i, names in attrs for a in names)))
            for k, attrs in zip(plan.kernels, self.attrs)]
        self.last: dict[int, tuple[tuple, Kernel]] = {}
        self.buffers = [n for n, i in plan.buffers.items() if _symbolic_info(i)]
        self.inputs = [n for n, i in plan.inputs.items() if _symbolic_info(i)]
        # a constant expression whose shape is a dim (a rule broadcast a constant to a value
        # of symbolic shape): folded again for each shape, so no lowering shares constants
        self.constants = [n for n, c in plan.constants.items()
                          if _symbolic_info(c.info)
                          or any(has_dims(list(b.attrs.values())) for b in c.body)]


def specialize(plan: KernelPlan, binding: dict[str, int],
               template: Template | None = None) -> KernelPlan:
    """`plan` with every symbolic dim evaluated under `binding` (what holds none is shared
    with `plan` as it is)."""
    template = template or Template(plan)

    shapes: dict[tuple, tuple] = {}       # many values share one symbolic shape

    def info(i: TensorInfo) -> TensorInfo:
        shape = tuple(i.shape)
        value = shapes.get(shape)
        if value is None:
            value = shapes[shape] = tuple(d.evaluate(binding) if isinstance(d, Dim) else d
                                          for d in shape)
        return TensorInfo(value, i.dtype)

    def kernel(k: Kernel, attrs: list[tuple[int, list[str]]]) -> Kernel:
        body = list(k.body)
        for i, names in attrs:            # only the nodes, and attributes, that hold dims
            node = body[i]
            body[i] = replace(node, attrs={**node.attrs, **{
                a: evaluate_all(node.attrs[a], binding) for a in names}})
        return Kernel(name=k.name, output=k.output, inputs=list(k.inputs), body=body,
                      kind=k.kind, info=info(k.info) if _symbolic_info(k.info) else k.info,
                      eclass=k.eclass)

    buffers = dict(plan.buffers)
    buffers.update((n, info(plan.buffers[n])) for n in template.buffers)
    inputs = dict(plan.inputs)
    inputs.update((n, info(plan.inputs[n])) for n in template.inputs)
    constants = dict(plan.constants)
    for n in template.constants:
        c = plan.constants[n]
        constants[n] = ConstExpr(c.name, [replace(b, attrs={a: evaluate_all(v, binding)
                                                            for a, v in b.attrs.items()})
                                          for b in c.body],
                                 info(c.info) if _symbolic_info(c.info) else c.info)
    kernels = []
    for i, (k, symbolic, attrs) in enumerate(zip(plan.kernels, template.kernels,
                                               template.attrs)):
        if symbolic:
            values = tuple(binding[s] for s in template.symbols[i])
            last = template.last.get(i)
            if last is None or last[0] != values:
                last = template.last[i] = (values, kernel(k, attrs))
            k = last[1]
        kernels.append(k)
    return KernelPlan(kernels=kernels,
                      buffers=buffers, inputs=inputs, outputs=dict(plan.outputs),
                      constants=constants, initializers=plan.initializers,
                      opaque_nodes=plan.opaque_nodes)


class ShapeGeneric:
    """The symbolic plan, its signature, and a Program per concrete shape seen so far."""

    def __init__(self, plan: KernelPlan, signature: Signature, lower_options: dict[str, Any]):
        from .fold import reuse_inline_copies
        # once, over the symbolic plan, not at every shape: a kernel's inline copy of a buffer
        # that is equal at every binding (the same expression of the symbols)
        if lower_options.get("reuse_inline", True):
            plan, self.removed = reuse_inline_copies(plan)
        else:
            self.removed = 0
        self.plan = plan
        self.template = Template(plan)
        self.signature = signature
        self.options = lower_options                 # as given: for the buckets' families
        self.lower_options = {**lower_options, "reuse_inline": False}
        self.programs: OrderedDict[tuple, tuple[Any, dict[str, np.ndarray]]] = OrderedDict()
        self.background_jit = True          # a new shape's uncached kernels compile elsewhere
        self.compiled_since: set[tuple] = set()   # shapes whose deferred kernels are now cached
        self.jobs: list = []
        self.lock = threading.Lock()        # the sets below are written by the jobs' threads
        self.in_flight: set[str] = set()    # kernel modules a worker is compiling
        self.waiting: set[tuple] = set()    # shapes lowered while some were in flight
        self.buckets: list[tuple[dict[str, int], ShapeGeneric, float]] = []  # add_bucket
        # folded constants, packed weights, unchanged kernels (lower's `shared`); nothing is
        # shared when a constant's own shape is symbolic
        self.shared: dict | None = None if self.template.constants else {}

    def key(self, binding: dict[str, int]) -> tuple:
        return tuple(sorted(binding.items()))

    def bind(self, feeds: dict[str, Any]) -> dict[str, int]:
        shapes = {}
        for name in self.signature.inputs:
            if name not in feeds:
                raise FeedError(f"missing input {name!r} (inputs: {list(self.signature.inputs)})")
            shapes[name] = tuple(np.shape(feeds[name]))
        try:
            return self.signature.bind(shapes)
        except BindError as exc:
            raise FeedError(str(exc)) from None

    def program_for(self, binding: dict[str, int], defer_jit: bool | None = None):
        """The Program and derived inputs of one binding: lowered on first sight, then kept.

        A kernel of a new shape whose machine code is not cached (the generator chose another
        loop for these sizes) runs as its NumPy evaluation while a worker process compiles it
        (`defer_jit`, default: on unless a background compile failed); the first run after the
        worker is done lowers the shape again, all of its kernels compiled."""
        key = self.key(binding)
        found = self.programs.get(key)
        with self.lock:
            again = key in self.compiled_since
            self.compiled_since.discard(key)
        if found is not None and not again:
            self.programs.move_to_end(key)
            return found
        from ..collector import paused
        from .lower import lower
        defer = self.background_jit if defer_jit is None else defer_jit
        with paused():             # the new program's objects live on: no collector walks
            program = lower(specialize(self.plan, binding, self.template),
                            **self.lower_options, defer_jit=defer, shared=self.shared)
        program.report.removed_kernels = self.removed
        found = (program, found[1] if found else self._derive(binding))
        self.programs[key] = found
        self.programs.move_to_end(key)
        while len(self.programs) > 1 and (
                len(self.programs) > MAX_SHAPES
                or sum(p.arena.nbytes for p, _ in self.programs.values()) > MAX_ARENA_BYTES):
            self.programs.popitem(last=False)
        if program.deferred:
            self._compile_later(key, program.deferred)
        return found

    def _compile_later(self, key: tuple, fns: list) -> None:
        """Compile `fns` in a worker process, each kernel once however many shapes wait for it
        (a shape whose kernels another job is compiling is lowered again when that one ends)."""
        from ..backends.numba.parallel_jit import compile_in_background
        with self.lock:
            self.waiting.add(key)
            todo = [fn for fn in fns if fn.py_func.__module__ not in self.in_flight]
            names = {fn.py_func.__module__ for fn in todo}
            self.in_flight |= names
        if not todo:
            return

        def done(ok: bool) -> None:          # in the job's thread
            with self.lock:
                if not ok:
                    self.background_jit = False      # compile in this process from now on
                self.in_flight -= names
                self.compiled_since |= self.waiting
                self.waiting = set()

        self.jobs.append(compile_in_background(todo, done))

    def _derive(self, binding: dict[str, int]) -> dict[str, np.ndarray]:
        try:
            return self.signature.derive(binding)
        except (RuntimeError, ValueError, IndexError) as why:
            reason = str(why).strip().splitlines()[0] if str(why).strip() else repr(why)
            raise FeedError(f"the model cannot run at {binding_text(binding)}: what it computes "
                            f"from these sizes alone fails ({reason[:300]})") from None

    def add_bucket(self, binding: dict[str, int], plan: KernelPlan,
                   cost_us: float) -> ShapeGeneric:
        """Another shape bucket: `plan`, extracted for `binding`, serves the shapes nearest it
        (`signature.bucket_of`); this object's own plan serves the representative binding's.
        Returns the bucket's program family."""
        family = ShapeGeneric(plan, self.signature, self.options)
        self.buckets.append((binding, family, cost_us))
        return family

    def serving(self, binding: dict[str, int]) -> ShapeGeneric:
        """The bucket's program family that runs `binding` (this one without buckets)."""
        if not self.buckets:
            return self
        families = [self, *(g for _, g, _ in self.buckets)]
        bindings = [self.signature.representative, *(b for b, _, _ in self.buckets)]
        return families[bucket_of(bindings, binding)]

    def wait(self) -> None:
        """Wait for the kernels compiling in the background (tests, benchmarks)."""
        for job in self.jobs:
            job.join()
        self.jobs.clear()
        for _, bucket, _ in self.buckets:
            bucket.wait()

    def program_at(self, feeds: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The lowered program that runs `feeds` (its bucket's, for their shape) and the feeds
        it takes: `feeds` with the derived inputs of that shape added."""
        binding = self.bind(feeds)
        program, derived = self.serving(binding).program_for(binding)
        return program, {**feeds, **derived}

    def run(self, feeds: dict[str, Any], out: dict[str, np.ndarray] | None = None
            ) -> dict[str, np.ndarray]:
        unknown = set(feeds) - set(self.signature.inputs)
        if unknown:
            raise FeedError(f"unknown input{'s' if len(unknown) > 1 else ''} {sorted(unknown)} "
                            f"(inputs: {list(self.signature.inputs)})")
        program, fed = self.program_at(feeds)
        return program.run(fed, out=out)
