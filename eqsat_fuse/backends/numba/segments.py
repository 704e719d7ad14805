"""Program segments: a run of compiled kernels called in order by one hand-written loop
(`calls.run_calls`) reading tables, so a run pays Python's dispatch once per segment and no
code is compiled per segment.

Every generated kernel has one signature, `kernel(A, G, FP)`: `A` its address table (for each
array it reads or writes, in the order of `ModuleSource.arg_types`: the address, then the
dims), `G` its integer parameters and `FP` its float ones. A segment is then a table of entry
points and slices of the program's A, G and F tables, which `run_calls` walks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# the argument types every generated kernel is compiled for: A, G, FP
KERNEL_SIGNATURE_EXAMPLE = (np.zeros(1, np.int64), np.zeros(1, np.int64),
                            np.zeros(1, np.float32))


@dataclass
class KernelCall:
    """One call of a compiled kernel: `fn` at entry point `entry`, its slices of the program's
    tables (`a`: the address table, `g`/`f`: the int and float parameters, each (start,
    stop)), and `dyn`: (position in A, storage) of every address a run supplies (the graph's
    inputs and the caller's outputs)."""

    fn: Any
    digest: str
    entry: int
    a: tuple[int, int]
    g: tuple[int, int]
    f: tuple[int, int]
    dyn: list[tuple[int, str]]


def segment_tables(calls: list[KernelCall]) -> tuple[np.ndarray, np.ndarray]:
    """`run_calls`' E (entry points) and T (six table bounds per call) for a run of calls."""
    entries = np.asarray([c.entry for c in calls], dtype=np.int64)
    bounds = np.asarray([v for c in calls for v in (*c.a, *c.g, *c.f)], dtype=np.int64)
    return entries, bounds
