"""A lowered program that runs: `Program` (its feeds checked, its steps run over the arena, its
outputs handed back) and `BackendReport` (what the backend did with each kernel).

`Program.run` allocates nothing but the graph outputs (which the caller keeps): kernels write
into preallocated views of the arena. `Program.run(feeds, out=...)` writes the outputs into
arrays the caller passes (and reuses across runs, e.g. from `Program.empty_outputs()`), so a run
allocates nothing at all. `Program.steps` keeps one step per kernel for profiling; a caller
that replaces `steps` gets them run one by one instead of the backend's run steps (segments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import FeedError, RunError
from ..ir import KernelPlan
from ..threads import governed
from .layout import Layout
from .memory import MemoryPlan


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
    jit_compiled: int = 0                 # compiled in this process or its workers
    jit_workers: int = 0                  # worker processes that compiled kernels
    jit_loaded: int = 0                   # loaded from the disk cache
    sources: int = 0                      # distinct generated sources
    threads: int = 1
    numerics: str = "exact"               # the numerics mode (eqsat_fuse.numerics)
    removed_kernels: int = 0              # recomputed buffers read from the inline copy instead
    segments: int = 0                     # dispatches a run makes (each: kernels in sequence)
    jit_deferred: int = 0                 # kernels run by NumPy while they compile elsewhere
    generated_kernels: int = 0            # written by the generator; the others share one

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


Step = Callable[[dict], None]


class Program:
    """A lowered kernel plan that runs: `run(feeds) -> {output name: array}`.

    Built once by `lowering.lower.lower`, which passes every field. Public: `plan`, `backend`
    (its name), `constants` (folded), `steps` (one per kernel), `memory`, `fold_seconds`,
    `storage_dtype`, `report`, `arena`, `threads`, `layouts`. The run tables (underscored) are
    what `run` reads: `fresh` (storage, elements, dtype) made per run (the graph outputs'),
    `dynamic_views` (name, "flat:" storage, view maker) of those and of the inputs,
    `outputs` (output name, value name, static array or None), `copy_outputs` (outputs that
    view an input or constant: copied), `direct` (storage -> the one output it is, written in
    place when `out` names it), `output_info` (output name -> shape, dtype), `feed_specs`
    (input name, dtype, shape). `run_steps` is what a run executes while `steps` is the list
    lowering built; `blas_threads` and `numba_threads` how a run sets the thread pools.
    """

    def __init__(self, *, plan: KernelPlan, backend: str, constants: dict[str, np.ndarray],
                 steps: list[Step], run_steps: list[Step], memory: MemoryPlan,
                 fold_seconds: float, storage_dtype: str, report: BackendReport,
                 arena: np.ndarray, threads: int, blas_threads: int, numba_threads: bool,
                 layouts: dict[str, Layout], fresh: list, dynamic_views: list, outputs: list,
                 copy_outputs: set, direct: dict, output_info: dict, feed_specs: list):
        self.plan = plan
        self.backend = backend
        self.constants = constants
        self.steps = steps
        self.memory = memory
        self.fold_seconds = fold_seconds
        self.storage_dtype = storage_dtype
        self.report = report
        self.arena = arena
        self.threads = threads                 # the one thread setting of its runs (threads)
        self.blas_threads = blas_threads
        self.numba_threads = numba_threads
        self.layouts = layouts
        self._fresh = fresh                    # (storage, numel, dtype) per run
        self._dynamic_views = dynamic_views
        self._outputs = outputs
        self._copy_outputs = copy_outputs
        self._kernel_steps = steps             # `steps` as lowering built them
        self._run_steps = run_steps            # what a run executes (Numba segments)
        self._direct = direct                  # storage -> the output name it fills
        self._output_info = output_info        # output name -> (shape, dtype)
        self._feed_specs = feed_specs          # (input name, dtype, shape)

    @property
    def run_steps(self) -> list[Step]:
        """What a run executes, in order (the Numba backend's segments run several kernels
        each; `steps` has one per kernel)."""
        return self._run_steps or self._kernel_steps

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
        dyn = self._feeds(feeds)
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
            with governed(self.threads, self.blas_threads, numba_threads=self.numba_threads):
                for step in steps:
                    step(dyn)
        except IndexError as why:
            # a Gather index fed at run time (both backends check and raise this message);
            # any other IndexError is a bug in eqsat-fuse and stays as it is
            if not str(why).startswith("Gather: index out of range"):
                raise
            raise RunError(f"{why}: an index fed at run time is outside the axis it indexes"
                           ) from None
        return self._results(dyn, targets)

    def _feeds(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """The run's environment of inputs: each feed and its flat view ("flat:" name)."""
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
        return dyn

    def _results(self, dyn: dict, targets: dict | None) -> dict[str, np.ndarray]:
        """The outputs of a finished run: in `targets` where named, else arrays of their own."""
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
