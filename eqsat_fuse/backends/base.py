"""The interface between lowering and a backend: what a backend is given, what it answers.

Lowering (`lowering.lower.lower`) drives every backend the same way:

1. `factory(context) -> backend`, the factory registered under the backend's name
   (`backends.BACKENDS`), given a `BackendContext`: the plan, its folded constants, where each
   value lives (`lowering.storage.Storage`), the Opaque-node runner, the cache folder and the
   thread setting;
2. `backend.prepare(kernel) -> implementation | Unsupported` for each kernel that computes
   (opaque kernels and views bound in place excepted). An implementation declares the scratch
   bytes it needs (`workspace_bytes`) and the inputs it may overwrite (`inplace_inputs`), which
   memory planning honours. `Unsupported(reason)` sends the kernel to the NumPy evaluation
   (`backends.numpy.backend.NumpyKernel`, the fallback every backend has), which the report
   counts as a fallback (or, for data movement, a copy);
3. `backend.bind(arena, prepared) -> Steps` once the arena is planned (`lowering.arena.Arena`:
   the arena, each storage's array in it, each step's workspace, and each value's array).
   `prepared` lists every kernel in plan order with its implementation: the backend's own, or
   a `NumpyKernel`, which binds itself (`NumpyKernel.bind(arena)`);
4. `backend.fill_report(report)` adds what the backend measured (JIT time, sources) to the
   program's `lowering.program.BackendReport`.

A run then sets the thread pools as the backend says (`blas_threads`, `numba_threads`) and
calls `Steps.run_steps` in order on the run's environment (feeds and per-run arrays by name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from ..ir import BodyNode, Kernel, KernelPlan

if TYPE_CHECKING:
    from ..lowering.arena import Arena
    from ..lowering.program import BackendReport
    from ..lowering.storage import Storage

Step = Callable[[dict], None]      # one step of a run, on the run's environment


@dataclass(frozen=True)
class Unsupported:
    """A backend's answer for a kernel it cannot run: why (it runs as the NumPy evaluation)."""

    reason: str

    def __str__(self) -> str:
        return self.reason


class Implementation(Protocol):
    """What `prepare` returns for a kernel the backend runs (the rest is the backend's own)."""

    workspace_bytes: int          # scratch bytes the kernel needs while it runs (0: none)
    inplace_inputs: set[str]      # inputs it may overwrite (read at the index it writes)


@dataclass
class BackendContext:
    """What a backend is built from: one plan, lowered."""

    plan: KernelPlan
    constants: dict[str, np.ndarray]         # folded constant expressions (read-only arrays)
    storage: "Storage"                       # layouts and stored dtypes of every value
    opaque: Callable[[BodyNode, list], np.ndarray]   # runs an Opaque node (onnx.reference)
    cache_dir: str | Path | None             # where generated code is kept (None: default)
    threads: int                             # the program's one thread setting (resolved)
    numerics: str = "exact"                  # "exact" or "fast" (eqsat_fuse.numerics)
    # a kernel whose machine code is neither loaded nor cached runs as the NumPy evaluation
    # while it compiles in the background (`Backend.deferred`): a new shape of a shape-generic
    # program (`lowering.generic`) waits for no JIT
    defer_jit: bool = False
    # state the lowerings of one plan at several shapes share (`lowering.generic`): the
    # folded constants and what a backend derives from them (the packed GEMM weights)
    shared: dict | None = None


@dataclass
class Prepared:
    """One kernel to bind: its step index in the plan, the kernel, its implementation."""

    index: int
    kernel: Kernel
    impl: Any                # the backend's implementation, or a NumpyKernel (the fallback)


@dataclass
class Steps:
    """What `bind` gives lowering."""

    kernel_steps: list[Step]     # one per prepared kernel, in plan order, each with a `label`
    run_steps: list[Step]        # what a run calls, in order (may run several kernels each)
    reads: set[str]              # values the steps read by name from a run's environment


class Backend(Protocol):
    """A backend as lowering drives it (see the module doc for the order of the calls)."""

    name: str                    # its name in the registry (`backends.BACKENDS`)
    blas_threads: int            # BLAS threads while a program runs
    numba_threads: bool          # whether a run sets Numba's thread count (to `threads`)

    def prepare(self, kernel: Kernel) -> Implementation | Unsupported:
        """How the backend runs `kernel`, or why it cannot."""
        ...

    def bind(self, arena: "Arena", prepared: list[Prepared]) -> Steps:
        """The steps of a run: every prepared kernel bound to its arrays in `arena`."""
        ...

    def fill_report(self, report: "BackendReport") -> None:
        """Add what the backend measured (JIT time, sources) to `report`."""
        ...


BackendFactory = Callable[[BackendContext], Backend]
