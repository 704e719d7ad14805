"""The data model of kernel generation: operands as `Tensor`s (storage, dtype, layout), the
iteration space (the output viewed as rows x columns) and the layout arithmetic that maps each
operand onto it; `Unsupported` when a kernel does not fit, so it runs through NumPy instead."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...lowering.layout import Layout


class Unsupported(Exception):
    """The generator cannot build this kernel: it runs through the NumPy evaluation instead."""


@dataclass
class Tensor:
    """A tensor operand of a generated kernel: storage name, dtype as stored, and its layout."""

    storage: str
    dtype: str              # logical dtype (the plan's)
    stored: str             # dtype in memory ("float16" for float32 values stored in float16)
    layout: Layout


@dataclass
class Space:
    """An iteration space: the output viewed as rows x columns."""

    shape: tuple[int, ...]
    split: int            # dims < split are rows, dims >= split the merged column axis

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:self.split], dtype=np.int64))

    @property
    def cols(self) -> int:
        return int(np.prod(self.shape[self.split:], dtype=np.int64))


def c_strides(shape) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def broadcast_layout(layout: Layout, shape: tuple[int, ...]) -> Layout:
    """The layout of `layout` broadcast (NumPy rules) to `shape`: stride 0 on broadcast dims."""
    extra = len(shape) - len(layout.shape)
    if extra < 0:
        raise Unsupported("operand of higher rank than the output")
    strides = [0] * extra
    for n_in, s_in, n_out in zip(layout.shape, layout.strides, shape[extra:]):
        if n_in == n_out:
            strides.append(s_in if n_in != 1 else 0)
        elif n_in == 1:
            strides.append(0)
        else:
            raise Unsupported(f"operand shape {layout.shape} does not broadcast to {shape}")
    return Layout(layout.storage, layout.offset, tuple(shape), tuple(strides))


def column_split(layouts: list[Layout], shape: tuple[int, ...], min_cols_dims: int = 1) -> int:
    """The first dim j such that dims j.. merge into one strided column axis for every operand.

    At least the last `min_cols_dims` dims are columns (raises Unsupported if they cannot be).
    """
    n = len(shape)
    if n == 0:
        return 0

    def mergeable(d: int) -> bool:       # can dim d merge with the dims after it?
        # size-1 dims are skipped: dim d merges with the next dim of size > 1 (a unit dim
        # between them must not hide a broadcast: [2,1,1] against [2,1,3])
        if shape[d] == 1:
            return True
        e = d + 1
        while e < n and shape[e] == 1:
            e += 1
        if e == n:
            return True
        for lay in layouts:
            if lay.strides[d] != lay.strides[e] * shape[e]:
                return False
        return True

    j = n - 1
    while j > 0 and mergeable(j - 1):
        j -= 1
    if n - j < min_cols_dims:
        raise Unsupported("operand strides do not allow the kernel's column blocks")
    return j


def col_stride(lay: Layout, j: int) -> int:
    """The stride of the merged column axis (dims j..) of a layout."""
    for d in range(len(lay.shape) - 1, j - 1, -1):
        if lay.shape[d] != 1:
            return lay.strides[d]
    return 0


def row_table(lay: Layout, j: int) -> np.ndarray:
    """Element offsets of each row (multi-index over dims < j) of a layout."""
    rows = lay.shape[:j]
    table = np.full(rows if rows else (), lay.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(rows, lay.strides[:j])):
        idx = np.arange(n, dtype=np.int64) * s
        table = table + idx.reshape((1,) * d + (n,) + (1,) * (len(rows) - d - 1))
    return np.ascontiguousarray(table.reshape(-1))


def probe_layout(shape) -> Layout:
    return Layout("", 0, tuple(shape), c_strides(shape))


def batch_map(bdims, sub) -> np.ndarray:
    """For each batch index over `bdims` (row-major), the flat index into a broadcast `sub`."""
    if not bdims:
        return np.zeros(1, dtype=np.int64)
    idx = np.arange(int(np.prod(sub)) if sub else 1, dtype=np.int64).reshape(sub if sub else ())
    return np.ascontiguousarray(np.broadcast_to(idx, bdims).reshape(-1))
