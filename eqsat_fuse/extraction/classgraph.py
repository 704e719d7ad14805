"""The class graph of an e-graph (class -> the classes its nodes read): an order with children
first, and its strongly connected components, the only places a choice can close a cycle."""

from __future__ import annotations

from ..saturation.serialized import SerializedEGraph


def class_order(eg: SerializedEGraph) -> tuple[list[int], bool]:
    """A position per class, children before parents where the e-graph has no cycle, and
    whether it has a cycle through several classes (a node's child in its own class aside)."""
    position = [-1] * eg.num_classes
    nodes = eg.nodes
    children = [{ch for n in eg.class_nodes[c] for ch in nodes[n].children} - {c}
                for c in range(eg.num_classes)]
    counter = 0
    cycle = False
    for start in range(eg.num_classes):
        if position[start] >= 0:
            continue
        position[start] = -2
        stack = [(start, iter(children[start]))]
        while stack:
            c, it = stack[-1]
            for ch in it:
                if position[ch] == -1:
                    position[ch] = -2
                    stack.append((ch, iter(children[ch])))
                    break
                if position[ch] == -2:
                    cycle = True                  # a back edge: ch is on the DFS stack
            else:
                stack.pop()
                position[c] = counter
                counter += 1
    return position, cycle


def strongly_connected(edges: dict[int, list[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iterative: the strongly connected components of a graph."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges.get(w, ()))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                components.append(component)
    return components


def cyclic_classes(eg: SerializedEGraph) -> list[int]:
    """The classes of the strongly connected components of several classes: only there can a
    choice close a cycle (a node whose child is its own class never can be chosen)."""
    edges = {c: list({ch for n in eg.class_nodes[c] for ch in eg.nodes[n].children} - {c})
             for c in range(eg.num_classes)}
    cyclic = []
    for component in strongly_connected(edges):
        if len(component) > 1:
            cyclic.extend(component)
    return sorted(cyclic)
