"""The planned memory made real: one aligned arena, every storage's flat array in it, each
step's workspace, and every value bound to an array (a view of the arena or a constant) or,
for graph inputs and outputs, to a view made per run from that run's arrays.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir import KernelPlan
from .layout import Layout
from .memory import ALIGN, MemoryPlan
from .storage import Storage


class Arena:
    """The arena of one program and the arrays of its values.

    `array` is the arena (bytes); `flats` storage -> its flat array (arena slices, and the
    constants); `workspaces` step -> its float32 scratch; `dynamic_storages` the storages a
    run supplies (graph inputs, and the caller's outputs); `static(name)` the array of every
    value not in those (made on first use: compiled kernels read the arena through address
    tables, and only NumPy steps and the outputs need most of these views); `dynamic_views`
    (value, storage, layout, dtype) for those that are (graph inputs excepted: a feed is its
    own value).
    """

    def __init__(self, plan: KernelPlan, memory: MemoryPlan, storage: Storage):
        self.plan = plan
        self.memory = memory
        self.storage = storage
        constants = storage.constants
        arena = np.empty(memory.arena_bytes + ALIGN, dtype=np.uint8)
        shift = (-arena.ctypes.data) % ALIGN
        self.array = arena = arena[shift:shift + memory.arena_bytes]

        self.flats: dict[str, np.ndarray] = {}
        for name, offset in memory.offsets.items():
            if name.startswith("workspace#"):
                continue
            dtype = np.dtype(storage.stored_dtype(name))
            self.flats[name] = arena[offset:offset + memory.sizes[name]].view(dtype)
        for name, value in constants.items():
            self.flats[name] = value.reshape(-1)
        self.workspaces: dict[int, np.ndarray] = {}
        for step, name in memory.workspace.items():
            offset = memory.offsets[name]
            self.workspaces[step] = arena[offset:offset + memory.sizes[name]].view(np.float32)

        self.dynamic_storages = set(plan.inputs) | storage.external
        self._static: dict[str, np.ndarray] = {}
        self._views: dict[str, tuple[str, Layout, str]] = {}     # made by `static`
        self.dynamic_views: list[tuple[str, str, Layout, np.dtype]] = []
        names = list(plan.inputs) + list(constants) + [k.output for k in plan.kernels]
        for name in names:
            lay = storage.layouts[name]
            root = self.final_storage(lay.storage)
            if root in self.dynamic_storages:
                if name not in plan.inputs:
                    self.dynamic_views.append((name, root, lay,
                                               np.dtype(storage.stored_dtype(lay.storage))))
            elif name in constants:
                self._static[name] = constants[name]
            else:
                self._views[name] = (root, lay, storage.stored_dtype(lay.storage))

    def final_storage(self, name: str) -> str:
        """The storage `name` ended in (in-place reuse merges storages)."""
        return self.memory.storage_of.get(name, name)

    def static(self, name: str) -> np.ndarray | None:
        """The array of value `name` if the program holds it (a constant, or a view of the
        arena), else None (a graph input, or a view of the caller's outputs)."""
        value = self._static.get(name)
        if value is None and name in self._views:
            root, lay, dtype = self._views[name]
            value = self._static[name] = strided(self.flats[root], lay, np.dtype(dtype))
        return value

    def value_of(self, name: str, dyn: dict):
        """The array of value `name` in a run whose per-run arrays are `dyn`."""
        value = self.static(name)
        return dyn[name] if value is None else value


def strided(flat: np.ndarray, layout: Layout, dtype) -> np.ndarray:
    """The N-d view `layout` of a flat storage array."""
    if not layout.shape:
        return flat[layout.offset:layout.offset + 1].reshape(())
    if layout.contiguous:
        return flat[layout.offset:layout.offset + layout.size].reshape(layout.shape)
    item = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[layout.offset:], shape=layout.shape,
        strides=tuple(s * item for s in layout.strides))


def view_maker(layout: Layout, dtype) -> Callable[[np.ndarray], np.ndarray]:
    """`strided(flat, layout, dtype)` with the layout's arithmetic done once."""
    shape, offset = tuple(layout.shape), layout.offset
    if not shape:
        return lambda flat: flat[offset:offset + 1].reshape(())
    if layout.contiguous:
        end = offset + layout.size
        return lambda flat: flat[offset:end].reshape(shape)
    return lambda flat: strided(flat, layout, dtype)
