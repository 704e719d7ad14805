"""The walks every stage needs over a graph given by a `children` function: the serialized
e-graph's classes, a kernel plan's buffers, a fused body's nodes.

Both are iterative (real models are deeper than Python's recursion limit) and visit each node
once. `children(node)` returns the node's children in the order they are to be visited.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, TypeVar

N = TypeVar("N", bound=Hashable)


def postorder(roots: Iterable[N], children: Callable[[N], Iterable[N]]) -> list[N]:
    """Every node reachable from `roots`, each once, children before parents.

    Children are visited in the order `children` gives them, roots in the order given."""
    order: list[N] = []
    done: set[N] = set()
    for root in roots:
        stack: list[tuple[N, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if expanded:
                done.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(list(children(node)))
                         if child not in done)
    return order


def reachable(roots: Iterable[N], children: Callable[[N], Iterable[N]]) -> set[N]:
    """Every node reachable from `roots` (the roots included)."""
    seen: set[N] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(child for child in children(node) if child not in seen)
    return seen
