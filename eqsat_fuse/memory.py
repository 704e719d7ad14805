"""Static memory planning: buffer lifetimes over the kernel order, and their placement.

Each kernel output lives from the kernel that writes it to the last kernel that reads it (graph
outputs to the end). An alias kernel (a view) allocates nothing: it extends the lifetime of the
buffer it views. Buffers are placed in one arena by best-fit offsets; the report compares the
arena's size with the liveness lower bound (the most bytes ever live at once) and with giving
every buffer its own allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import KernelPlan


@dataclass
class MemoryPlan:
    lifetimes: dict[str, tuple[int, int]]   # storage buffer -> (first step, last step)
    offsets: dict[str, int]                 # storage buffer -> arena offset (bytes)
    sizes: dict[str, int]
    storage_of: dict[str, str]              # every buffer -> the buffer whose storage it uses
    last_use: dict[str, int]                # every buffer -> the last step that reads it
    arena_bytes: int
    lower_bound_bytes: int
    separate_bytes: int
    free_after: list[list[str]] = field(default_factory=list)   # buffers dead after each step


def plan_memory(plan: KernelPlan) -> MemoryPlan:
    """Lifetimes, best-fit arena offsets and the peak figures of a kernel plan."""
    steps = len(plan.kernels)
    storage_of: dict[str, str] = {}
    for kernel in plan.kernels:
        if kernel.kind == "alias" and kernel.inputs and kernel.inputs[0] in storage_of:
            storage_of[kernel.output] = storage_of[kernel.inputs[0]]
        elif kernel.kind == "alias":
            storage_of[kernel.output] = kernel.inputs[0] if kernel.inputs else kernel.output
        else:
            storage_of[kernel.output] = kernel.output
    defined = {k.output: i for i, k in enumerate(plan.kernels)}
    last_use: dict[str, int] = {name: i for name, i in defined.items()}
    for i, kernel in enumerate(plan.kernels):
        for name in kernel.inputs:
            last_use[name] = i
    for ref in plan.outputs.values():
        last_use[ref] = steps
    lifetimes: dict[str, tuple[int, int]] = {}
    for name, step in defined.items():
        root = storage_of[name]
        if root not in defined:       # a view of a graph input or constant: owns no storage
            continue
        start, end = lifetimes.get(root, (defined[root], defined[root]))
        lifetimes[root] = (min(start, step), max(end, last_use.get(name, step)))
    sizes = {name: plan.buffers[name].nbytes for name in lifetimes}

    # best fit: place big, long-lived buffers first; each at the lowest offset free for its life
    placed: list[tuple[int, int, int, int]] = []       # (offset, size, start, end)
    offsets: dict[str, int] = {}
    for name in sorted(lifetimes, key=lambda n: (-sizes[n], lifetimes[n][0])):
        start, end = lifetimes[name]
        busy = sorted((o, o + s) for o, s, a, b in placed if a <= end and start <= b)
        offset, best = 0, None
        for lo, hi in busy:
            gap = lo - offset
            if gap >= sizes[name] and (best is None or gap < best[1]):
                best = (offset, gap)
            offset = max(offset, hi)
        offsets[name] = best[0] if best else offset
        placed.append((offsets[name], sizes[name], start, end))
    arena = max((o + s for o, s, _, _ in placed), default=0)
    lower = max((sum(sizes[n] for n, (a, b) in lifetimes.items() if a <= t <= b)
                 for t in range(steps + 1)), default=0)
    free_after: list[list[str]] = [[] for _ in range(steps)]
    for name, step in last_use.items():
        if name in defined and step < steps:
            free_after[step].append(name)
    return MemoryPlan(lifetimes=lifetimes, offsets=offsets, sizes=sizes, storage_of=storage_of,
                      last_use=last_use, arena_bytes=arena, lower_bound_bytes=lower,
                      separate_bytes=sum(sizes.values()), free_after=free_after)
