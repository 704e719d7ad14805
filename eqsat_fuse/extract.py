"""Stage 4, extract: choose one e-node per needed e-class, minimizing the program cost.

The program cost (DESIGN.md, "What a program costs") is computed in one place, `program_cost`:

    cost = sum over distinct kernels K of  launch(K) + write(K)
                                           + sum over distinct inline classes n of K: work(n)
                                           + sum over distinct classes K reads: read(bytes)

A kernel is a chosen `Mat` node (or a graph output whose chosen node is not materialized);
its body is the inline term under it down to boundaries: `Mat` classes, graph inputs and
constant classes (terms over constants only, folded once at compile time and free at run time
except for being read). A body whose root is a view (Reshape, Transpose...) is an alias: no
launch, no data moved.

Kernel legality comes from the target (`[fusion]` in its cost file): elementwise ops may hold
inline children; a contraction (Conv, MatMul, Gemm) reads only boundaries; a reduction reads
inline elementwise children only if the target lists it under `prologue`; data movement and
opaque nodes read boundaries and cannot sit inside another body; a body holds at most
`max_anchors` contractions and reductions. `check` rejects a choice that breaks any of this.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from .costmodel import CostModel, nbytes, node_flops
from .errors import EqsatFuseError
from .ops import OPS
from .serialized import ENode, SerializedEGraph

EPS_US = 1e-6        # price of one inline node: ties go to the smaller program
_CONST_LEAVES = {"Const", "Scalar", "Ints", "Absent"}


class ExtractionError(EqsatFuseError):
    """An extractor produced an invalid choice (a bug), or no legal program exists."""


@dataclass
class KernelCost:
    """One kernel's predicted cost, broken down."""

    eclass: int
    alias: bool
    launch_us: float
    read_bytes: float
    write_bytes: float
    flops: float
    us: float
    ops: list[str] = field(default_factory=list)


@dataclass
class Extraction:
    """The chosen program: a node per needed class, its cost and each kernel's share."""

    choice: dict[int, int]
    roots: list[int]
    constant: frozenset[int]
    cost: float
    kernels: dict[int, KernelCost]
    extractor: str
    seconds: float


# ---- facts every extractor needs ---------------------------------------------------------------

def constant_classes(eg: SerializedEGraph) -> dict[int, int]:
    """Classes computable at compile time, each with its smallest all-constant node."""
    size: dict[int, int] = {}
    pick: dict[int, int] = {}
    changed = True
    while changed:
        changed = False
        for index, node in enumerate(eg.nodes):
            if node.op in _CONST_LEAVES:
                total = 1
            elif node.op == "Input" or not all(ch in size for ch in node.children):
                continue
            else:
                total = 1 + sum(size[ch] for ch in node.children)
            if total < size.get(node.eclass, math.inf):
                size[node.eclass] = total
                pick[node.eclass] = index
                changed = True
    return pick


def class_bytes(eg: SerializedEGraph, c: int) -> float:
    return nbytes(eg.shapes.get(c), eg.dtypes.get(c))


def node_work_us(eg: SerializedEGraph, model: CostModel, index: int) -> tuple[float, float]:
    """(microseconds, FLOPs) of computing one inline node."""
    node = eg.nodes[index]
    if OPS[node.op].kind in ("leaf", "structure"):
        return 0.0, 0.0
    flops = node_flops(model, node.op, node.attrs, eg.shapes.get(node.eclass),
                       [eg.shapes.get(ch) for ch in node.children])
    return EPS_US + model.flops_us(flops, node.op), flops


def roots_of(eg: SerializedEGraph, output_vars: dict[str, str]) -> list[int]:
    return [eg.lets[var] for var in output_vars.values()]


# ---- the program cost and validity check -------------------------------------------------------

def _inline_allowed(model: CostModel, parent_op: str, child_anchors: int,
                    child_exclusive: bool) -> bool:
    """May an inline child body (with `child_anchors` anchors) sit under `parent_op`?"""
    kind = OPS[parent_op].kind
    if child_exclusive:
        return False
    if kind == "elementwise":
        return model.elementwise_fusion or child_anchors > 0
    if kind == "reduction" and parent_op in model.prologue:
        return child_anchors == 0
    return False


def _own_anchor(op: str) -> int:
    return 1 if OPS[op].kind in ("anchor", "reduction") else 0


def program_cost(eg: SerializedEGraph, model: CostModel, choice: dict[int, int],
                 roots: list[int], constant: frozenset[int] | set[int]
                 ) -> tuple[float, dict[int, KernelCost]]:
    """Check `choice` and price it: (total microseconds, cost of each kernel by its class).

    Raises ExtractionError when a needed class has no choice, a chosen node is not in its class,
    the chosen graph has a cycle, or a kernel body breaks the target's legality rules.
    """
    for c, n in choice.items():
        if not 0 <= n < len(eg.nodes) or eg.nodes[n].eclass != c:
            raise ExtractionError(f"class {eg.class_ids[c]}: chosen node {n} is not in the class")
    _check_acyclic(eg, choice, roots)

    def chosen(c: int) -> ENode:
        return eg.nodes[choice[c]]

    def is_boundary(c: int) -> bool:
        return c in constant or chosen(c).op in ("Mat", "Input")

    def walk_body(body_root: int, reads: set[int], inline: list[int]) -> int:
        """Visit a body's inline classes, check legality, return the body's anchor count."""
        anchors_of: dict[int, tuple[int, bool]] = {}
        stack: list[tuple[int, bool]] = [(body_root, False)]
        while stack:
            c, expanded = stack.pop()
            if c in anchors_of:
                continue
            node = chosen(c)
            if not expanded:
                stack.append((c, True))
                stack.extend((ch, False) for ch in node.children
                             if not is_boundary(ch) and ch not in anchors_of)
                continue
            anchors = _own_anchor(node.op)
            for ch in node.children:
                if is_boundary(ch):
                    reads.add(ch)
                    continue
                child_anchors, child_exclusive = anchors_of[ch]
                if eg.class_sort[ch] == "TList":      # the operand list of Concat / Opaque
                    anchors += child_anchors
                    continue
                if not _inline_allowed(model, node.op, child_anchors, child_exclusive):
                    raise ExtractionError(
                        f"illegal kernel body on target {model.target}: {chosen(ch).op} "
                        f"(class {eg.class_ids[ch]}) inline under {node.op} "
                        f"(class {eg.class_ids[c]})")
                anchors += child_anchors
            anchors_of[c] = (anchors, OPS[node.op].kind in ("movement", "opaque"))
            if eg.class_sort[c] == "T":
                inline.append(c)
        return anchors_of[body_root][0]

    def price(k: int) -> tuple[KernelCost, set[int]]:
        node = chosen(k)
        body = node.children[0] if node.op == "Mat" else k
        if node.op == "Mat" and is_boundary(body):       # a copy kernel
            read, write = class_bytes(eg, body), class_bytes(eg, k)
            return KernelCost(k, False, model.launch_us, read, write, 0.0,
                              model.launch_us + model.bytes_us(read + write), ["Copy"]), {body}
        reads: set[int] = set()
        inline: list[int] = []
        anchors = walk_body(body, reads, inline)
        if anchors > model.max_anchors:
            raise ExtractionError(f"kernel of class {eg.class_ids[k]} holds {anchors} "
                                  f"contractions/reductions; target {model.target} allows "
                                  f"{model.max_anchors}")
        work_us = flops = 0.0
        for c in inline:
            us, fl = node_work_us(eg, model, choice[c])
            work_us, flops = work_us + us, flops + fl
        ops = [chosen(c).op for c in reversed(inline)]
        if OPS[chosen(body).op].kind == "view":          # an alias: nothing moves
            return KernelCost(k, True, 0.0, 0.0, 0.0, 0.0, work_us, ops), reads
        read = sum(class_bytes(eg, r) for r in reads)
        write = class_bytes(eg, k)
        return KernelCost(k, False, model.launch_us, read, write, flops,
                          model.launch_us + model.bytes_us(read + write) + work_us, ops), reads

    kernels: dict[int, KernelCost] = {}
    pending = [r for r in roots if not (r in constant or chosen(r).op == "Input")]
    while pending:
        k = pending.pop()
        if k in kernels:
            continue
        kernels[k], reads = price(k)
        pending.extend(r for r in reads if r not in constant and chosen(r).op == "Mat")
    return sum(kc.us for kc in kernels.values()), kernels


def _check_acyclic(eg: SerializedEGraph, choice: dict[int, int], roots: list[int]) -> None:
    state: dict[int, int] = {}
    for root in roots:
        stack = [(root, False)]
        while stack:
            c, done = stack.pop()
            if done:
                state[c] = 2
                continue
            if state.get(c) == 2:
                continue
            if state.get(c) == 1:
                continue
            if c not in choice:
                raise ExtractionError(f"class {eg.class_ids[c]} is needed but has no chosen node")
            state[c] = 1
            stack.append((c, True))
            for ch in eg.nodes[choice[c]].children:
                if state.get(ch) == 1:
                    raise ExtractionError(f"the chosen program has a cycle through class "
                                          f"{eg.class_ids[ch]}")
                if state.get(ch) != 2:
                    stack.append((ch, False))


# ---- extractors ----------------------------------------------------------------------------------

@dataclass
class _Option:
    """The best way found so far to compute one class, as seen by its consumers."""

    node: int
    boundary: bool                 # Mat, Input or constant: consumers read it from memory
    anchors: int
    exclusive: bool                # movement/opaque: cannot sit inside another body
    kernels: dict[int, float]      # kernel class -> its cost
    open: dict[int, float]         # inline class (>= 0) -> work; -1-class -> read of a boundary
    total: float


def _merge(parts: list[dict[int, float]]) -> dict[int, float]:
    parts = [p for p in parts if p]
    if not parts:
        return {}
    parts.sort(key=len, reverse=True)
    merged = dict(parts[0])
    for part in parts[1:]:
        for key, value in part.items():
            if key not in merged:
                merged[key] = value
    return merged


class GreedyDagExtractor:
    """Bottom-up, DAG-aware, heuristic: each class keeps the option whose own program (the set of
    kernels and open inline work it needs, each counted once) costs least; consumers re-evaluate
    when a child's option changes. One node per class; legality is respected as options combine.
    """

    name = "greedy-dag"
    optimality = "heuristic"

    def __init__(self, model: CostModel):
        self.model = model

    def extract(self, eg: SerializedEGraph, roots: list[int]) -> Extraction:
        started = time.perf_counter()
        model = self.model
        constant = constant_classes(eg)
        best: list[_Option | None] = [None] * eg.num_classes
        for c, n in constant.items():
            best[c] = _Option(n, True, 0, False, {}, {}, 0.0)
        read_us = [model.bytes_us(class_bytes(eg, c)) for c in range(eg.num_classes)]
        parents: list[list[int]] = [[] for _ in range(eg.num_classes)]
        for index, node in enumerate(eg.nodes):
            for ch in set(node.children):
                parents[ch].append(index)

        def effective(option: _Option, c: int) -> float:
            return option.total + (read_us[c] if option.boundary else 0.0)

        def evaluate(index: int) -> _Option | None:
            node = eg.nodes[index]
            c, op = node.eclass, node.op
            if op == "Input":
                return _Option(index, True, 0, False, {}, {}, 0.0)
            if op == "TNil":
                return _Option(index, False, 0, False, {}, {}, 0.0)
            children = [best[ch] for ch in node.children]
            if any(o is None for o in children):
                return None
            for o in children:
                if c in o.kernels or c in o.open:
                    return None                      # would close a cycle
            if op == "Mat":
                (ch,), (o,) = node.children, children
                if o.boundary:
                    cost = model.launch_us + model.bytes_us(class_bytes(eg, c)) + read_us[ch]
                elif OPS[eg.nodes[o.node].op].kind == "view":
                    cost = sum(v for k, v in o.open.items() if k >= 0)
                else:
                    cost = (model.launch_us + model.bytes_us(class_bytes(eg, c))
                            + sum(o.open.values()))
                kernels = dict(o.kernels)
                kernels[c] = cost
                return _Option(index, True, 0, False, kernels, {}, sum(kernels.values()))
            if op == "TCons":
                (t, _), (ot, rest) = node.children, children
                if not ot.boundary:
                    return None
                kernels = _merge([ot.kernels, rest.kernels])
                open_ = _merge([rest.open, {-1 - t: read_us[t]}])
                return _Option(index, False, rest.anchors, False, kernels, open_,
                               sum(kernels.values()) + sum(open_.values()))
            work, _ = node_work_us(eg, model, index)
            kernel_parts, open_parts = [], [{c: work}]
            anchors = _own_anchor(op)
            for ch, o in zip(node.children, children):
                kernel_parts.append(o.kernels)
                if o.boundary:
                    open_parts.append({-1 - ch: read_us[ch]})
                elif eg.class_sort[ch] == "TList":
                    open_parts.append(o.open)
                else:
                    if not _inline_allowed(model, op, o.anchors, o.exclusive):
                        return None
                    anchors += o.anchors
                    open_parts.append(o.open)
            if anchors > model.max_anchors:
                return None
            kernels, open_ = _merge(kernel_parts), _merge(open_parts)
            return _Option(index, False, anchors, OPS[op].kind in ("movement", "opaque"),
                           kernels, open_, sum(kernels.values()) + sum(open_.values()))

        queue = deque(i for i, node in enumerate(eg.nodes) if node.eclass not in constant)
        queued = [node.eclass not in constant for node in eg.nodes]
        budget = 50 * len(eg.nodes) + 1000
        while queue and budget > 0:
            budget -= 1
            index = queue.popleft()
            queued[index] = False
            c = eg.nodes[index].eclass
            option = evaluate(index)
            current = best[c]
            if current is not None and current.node == index:
                # the class's chosen node, re-priced after a child changed: keep it current
                changed = option is None or effective(option, c) != effective(current, c)
                if option is None or effective(option, c) > effective(current, c):
                    for sibling in eg.class_nodes[c]:   # another node may now be cheaper
                        if not queued[sibling]:
                            queued[sibling] = True
                            queue.append(sibling)
                best[c] = option
            elif option is not None and (current is None or
                                         effective(option, c) < effective(current, c) - 1e-12):
                best[c] = option
                changed = True
            else:
                changed = False
            if changed:
                for parent in parents[c]:
                    if not queued[parent] and eg.nodes[parent].eclass not in constant:
                        queued[parent] = True
                        queue.append(parent)

        choice: dict[int, int] = {}
        stack = list(roots)
        while stack:
            c = stack.pop()
            if c in choice:
                continue
            if best[c] is None:
                raise ExtractionError(f"no legal program computes class {eg.class_ids[c]} "
                                      f"under target {model.target}")
            choice[c] = best[c].node
            stack.extend(eg.nodes[choice[c]].children)
        const = frozenset(constant)
        cost, kernels = program_cost(eg, model, choice, roots, const)
        return Extraction(choice, roots, const, cost, kernels, self.name,
                          time.perf_counter() - started)


EXTRACTORS = {"greedy-dag": GreedyDagExtractor}


def extract(eg: SerializedEGraph, roots: list[int], model: CostModel,
            extractor: str = "greedy-dag") -> Extraction:
    """Run the named extractor; the result has passed `program_cost`'s validity check."""
    if extractor not in EXTRACTORS:
        raise EqsatFuseError(f"unknown extractor {extractor!r}; choose one of "
                             f"{', '.join(EXTRACTORS)}")
    return EXTRACTORS[extractor](model).extract(eg, roots)
