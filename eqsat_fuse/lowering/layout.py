"""Where each tensor of a lowered program lives: its storage, element offset and strides.

Storage is fixed at compile time (the memory plan gives every intermediate an arena offset), so
the layout of every buffer, and of every view of one, is known before the program runs. Views
(Reshape, Transpose, Slice, ...) are resolved once here by applying them to probe arrays that
carry strides but no data; a view that strides cannot express (a Reshape of a transposed
buffer) is reported so that lowering materializes it with a copy instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import BodyNode, KernelPlan
from ..ops import OPS, evaluate

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


@dataclass(frozen=True)
class Layout:
    """A tensor as `storage[offset + sum(i_d * strides[d])]` (offsets and strides in elements)."""

    storage: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def contiguous(self) -> bool:
        expected, step = [], 1
        for n in reversed(self.shape):
            expected.append(step)
            step *= n
        return all(n == 1 or s == e for n, s, e in zip(self.shape, self.strides,
                                                       reversed(expected)))

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


_BASE = np.zeros(1, dtype=np.uint8)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element strides of a C-contiguous array of `shape` (a dim of 0 counts as 1)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def probe(shape: tuple[int, ...]) -> np.ndarray:
    """A C-contiguous array of `shape` over one byte: element strides as byte strides, no data.

    Never read from it: only views (which compute strides) may be applied.
    """
    return np.lib.stride_tricks.as_strided(_BASE, shape=tuple(shape),
                                           strides=contiguous_strides(shape), writeable=False)


def view_shape(op: str, attrs: dict, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of a view op on an input of `shape`."""
    return tuple(evaluate(op, [np.empty(shape, dtype=np.uint8)], attrs).shape)


def apply_view(node: BodyNode, x: np.ndarray) -> np.ndarray | None:
    """The view `node` computes on `x`, without copying; None when strides cannot express it."""
    if OPS[node.op].kind != "view":
        return None
    if node.op in RESHAPES:
        shape = view_shape(node.op, node.attrs, x.shape)
        try:
            return np.reshape(x, shape, copy=False)
        except ValueError:
            return None
    # Transpose, Slice, Split and Expand are NumPy views (strides only)
    return evaluate(node.op, [x], node.attrs)


def layout_of(array: np.ndarray, storage: str, root: np.ndarray) -> Layout:
    """The layout of a view `array` of the probe `root` that stands for `storage`."""
    offset = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return Layout(storage, int(offset), array.shape, array.strides)    # tuples of ints


def view_layouts(plan: KernelPlan, constants: dict[str, np.ndarray],
                 memo: dict | None = None) -> tuple[dict[str, Layout], set[str]]:
    """Layouts of every graph input, constant and buffer; and the alias kernels that must copy.

    Graph inputs and constants are contiguous storages of their own; a compute kernel's output
    is a contiguous storage; an alias kernel is a view of its input's storage when strides allow.
    A storage's probe array is made only when a view of it is resolved (most are never viewed,
    and making one costs more than the rest of a value's layout). `memo`, kept by the
    lowerings of one plan at several shapes, holds each view's layout by the view and the
    layout it is applied to: a new shape resolves only the views whose input changed.
    """
    probes: dict[str, np.ndarray] = {}
    roots: dict[str, str] = {}
    layouts: dict[str, Layout] = {}

    def own(name: str, shape) -> None:
        shape = tuple(int(n) for n in shape)
        roots[name] = name
        layouts[name] = Layout(name, 0, shape, contiguous_strides(shape))   # its own storage

    def probe_of(name: str) -> np.ndarray:
        if name not in probes:              # a storage of its own: its probe, made now
            probes[name] = probe(layouts[name].shape)
        return probes[name]

    for name, info in plan.inputs.items():
        own(name, info.shape)
    for name, value in constants.items():
        own(name, np.shape(value))
    copies: set[str] = set()
    for kernel in plan.kernels:
        if kernel.kind == "alias" and len(kernel.body) == 1 and kernel.inputs:
            node = kernel.body[0]
            source = node.args[0].ref if node.args and node.args[0].kind != "absent" else None
            if source in layouts:
                # every probe views the same byte (`_BASE`), so a view's probe and layout
                # hold for any lowering that applies it to the same layout
                key = (node.op, repr(node.attrs), layouts[source], tuple(kernel.info.shape))
                found = memo.get(key) if memo is not None else None
                if found is None:
                    view = apply_view(node, probe_of(source))
                    found = ()
                    if view is not None and tuple(view.shape) == tuple(kernel.info.shape):
                        found = (layout_of(view, roots[source], probe_of(roots[source])), view)
                    if memo is not None:
                        memo[key] = found
                if found:
                    layouts[kernel.output], probes[kernel.output] = found
                    roots[kernel.output] = roots[source]
                    continue
            copies.add(kernel.output)
        own(kernel.output, kernel.info.shape)
    return layouts, copies
