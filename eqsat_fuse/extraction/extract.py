"""Stage 4, extract: choose one e-node per needed e-class, minimizing the program cost.

The program cost (DESIGN.md, "What a program costs") is computed in one place, `program_cost`:

    cost = sum over distinct kernels K of  launch + bytes_cost(read(K) + write(K))
                                           + sum over distinct inline classes n of K: work(n)

where read(K) sums the bytes of the distinct boundary classes K reads. A kernel is a chosen `Mat`
node (or a graph output whose chosen node is not materialized); its body is the inline term
under it down to boundaries: `Mat` classes, graph inputs and constant classes (terms over
constants only, folded once at compile time and free at run time except for being read). A body
whose root is a view (Reshape, Transpose...) is an alias: no launch, no data moved. The prices
(`costmodel.Prices`) are those of one objective, latency (microseconds) or energy
(microjoules); `bytes_cost` charges on-chip rates when the kernel's bytes fit the target's
on-chip memory.

Kernel legality comes from the target (`[fusion]` in its cost file), edge by edge (`inline_legal`):
an elementwise op may hold an inline elementwise child if the target fuses elementwise ops; it
may hold a contraction or reduction (and the epilogue ops already on top of it) if the target
lets that anchor carry that epilogue op; a reduction listed under `prologue` may read inline
children that hold no contraction or reduction; contractions, views, data movement and opaque
nodes read boundaries only, and data movement and opaque nodes never sit inside another body.
A body holds at most `max_anchors` distinct contractions and reductions. `program_cost` rejects
a choice that breaks any of this.

Extractors share one protocol: `Extractor(model, objective, **options).extract(eg, roots,
forbid=...) -> Extraction`, each tagged `optimality` "tree-optimal", "dag-optimal" or
"heuristic", and each result has passed `program_cost`. They are registered in `EXTRACTORS`.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .costmodel import CostModel, Prices, nbytes, node_flops
from ..errors import EqsatFuseError
from ..ops import OPS
from ..saturation.serialized import ENode, SerializedEGraph

EPS = 1e-6           # price of one inline node, in the objective's unit: ties go to smaller programs
EPS_US = EPS         # the name earlier versions used
_CONST_LEAVES = {"Const", "Scalar", "Ints", "Absent"}
_ANCHOR_KINDS = ("anchor", "reduction")


class ExtractionError(EqsatFuseError):
    """An extractor produced an invalid choice (a bug), or no legal program exists."""


@dataclass
class KernelCost:
    """One kernel's predicted cost, broken down (latency in microseconds, energy in microjoules).

    `cost` is the value under the objective the extraction minimized (`us` or `energy_uj`).
    """

    eclass: int
    alias: bool
    launch_us: float
    read_bytes: float
    write_bytes: float
    flops: float
    us: float
    ops: list[str] = field(default_factory=list)
    energy_uj: float | None = None
    onchip: bool = False              # the working set fits the target's on-chip memory
    cost: float = 0.0


@dataclass
class Extraction:
    """The chosen program: a node per needed class, its cost and each kernel's share.

    `cost` is in the unit of `objective`; `latency_us` and `energy_uj` give both predictions
    (`energy_uj` is None when the target's cost file has no [energy] table). `details` holds what
    an extractor has to say about its run (the ILP's status, bound and gap).
    """

    choice: dict[int, int]
    roots: list[int]
    constant: frozenset[int]
    cost: float
    kernels: dict[int, KernelCost]
    extractor: str
    seconds: float
    objective: str = "latency"
    latency_us: float = 0.0
    energy_uj: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


# ---- facts every extractor needs ---------------------------------------------------------------

def constant_classes(eg: SerializedEGraph) -> dict[int, int]:
    """Classes computable at compile time, each with an all-constant node to fold it from.

    Bottom-up from the constant leaves (Kahn's order): a class becomes constant when one of its
    nodes has only constant children, and keeps the first such node, so the picks form a DAG.
    Inputs are never constant.
    """
    nodes = eg.nodes
    parents: dict[int, list[int]] = {}
    waiting: list[int] = [0] * len(nodes)
    ready: list[int] = []
    for index, node in enumerate(nodes):
        if node.op == "Input":
            continue
        children = node.children
        if node.op in _CONST_LEAVES or not children:
            ready.append(index)
            continue
        kids = children if len(children) == 1 else set(children)
        waiting[index] = len(kids)
        for ch in kids:
            if ch in parents:
                parents[ch].append(index)
            else:
                parents[ch] = [index]
    pick: dict[int, int] = {}
    while ready:
        following = []
        for index in ready:
            c = nodes[index].eclass
            if c in pick:
                continue
            pick[c] = index
            for parent in parents.get(c, ()):
                waiting[parent] -= 1
                if waiting[parent] == 0:
                    following.append(parent)
        ready = following
    return pick


def class_bytes(eg: SerializedEGraph, c: int, model: CostModel | None = None,
                activation: bool = True) -> float:
    """Bytes of class c's tensor, as `model` stores it (as its dtype says without a model)."""
    if model is None:
        return nbytes(eg.shapes.get(c), eg.dtypes.get(c))
    return model.tensor_bytes(eg.shapes.get(c), eg.dtypes.get(c), activation)


def roots_of(eg: SerializedEGraph, output_vars: dict[str, str]) -> list[int]:
    return [eg.lets[var] for var in output_vars.values()]


def is_anchor(op: str) -> bool:
    """A contraction or reduction: at most `max_anchors` of them share one kernel body."""
    return OPS[op].kind in _ANCHOR_KINDS


def _in(allowed: frozenset[str] | None, op: str) -> bool:
    return allowed is None or op in allowed


def inline_legal(model: CostModel, parent_op: str, child_op: str, child_has_anchor: bool) -> bool:
    """May a child whose chosen node is `child_op` (and whose inline body holds a contraction or
    reduction, or not) be computed inline inside `parent_op`'s kernel body?

    The one statement of per-edge legality; TList children (operand lists) are always legal and
    do not come here. `program_cost`, every extractor and the ILP follow it.
    """
    parent, child = OPS[parent_op].kind, OPS[child_op].kind
    if child not in ("elementwise", "view", "anchor", "reduction"):
        return False                       # movement, opaque, leaves and structure
    child_has_anchor = child_has_anchor or child in _ANCHOR_KINDS
    if parent == "elementwise":
        if child in _ANCHOR_KINDS:         # the first op of an anchor's epilogue
            return _in(model.epilogue, parent_op) and _in(model.epilogue_anchors, child_op)
        if child_has_anchor:               # the epilogue continues
            return _in(model.epilogue, parent_op) and _in(model.epilogue, child_op)
        return model.elementwise_fusion
    if parent == "reduction" and parent_op in model.prologue:
        return not child_has_anchor
    return False


def maybe_inline_legal(model: CostModel, parent_op: str, child_op: str) -> bool:
    """Whether `inline_legal` can hold for some body under the child (static pruning)."""
    return (inline_legal(model, parent_op, child_op, False)
            or inline_legal(model, parent_op, child_op, True))


def duplicate_nodes(eg: SerializedEGraph) -> set[int]:
    """Nodes that repeat another node of their class up to the order of their children, for
    elementwise ops (Add(a, b) next to Add(b, a)): same price, same legality. Extractors may skip
    them; any node of a class is a correct term for it."""
    seen: set[tuple] = set()
    duplicates: set[int] = set()
    for index, node in enumerate(eg.nodes):
        if OPS[node.op].kind != "elementwise" or len(node.children) < 2:
            continue
        key = (node.eclass, node.op, node.attrs, tuple(sorted(node.children)))
        if key in seen:
            duplicates.add(index)
        else:
            seen.add(key)
    return duplicates


class Pricing:
    """Prices of one e-graph's nodes and classes under one target and objective.

    Every extractor and `program_cost` take their numbers from here, so they agree exactly.
    """

    def __init__(self, eg: SerializedEGraph, model: CostModel, objective: str = "latency",
                 constant: Iterable[int] | dict[int, int] | None = None):
        self.eg, self.model, self.objective = eg, model, objective
        if constant is None:
            constant = constant_classes(eg)
        # class -> the node it is folded from (empty when only the set was given)
        self.constant_pick: dict[int, int] = constant if isinstance(constant, dict) else {}
        self.constant = frozenset(constant)
        self.prices: Prices = model.prices(objective)
        self.latency: Prices = model.prices("latency")
        self.energy: Prices | None = model.prices("energy") if model.has_energy() else None
        self._bytes: dict[int, float] = {}
        self._tensor_bytes: dict[tuple, float] = {}
        self._flops: dict[int, float] = {}
        self._work: dict[int, float] = {}

    def bytes(self, c: int) -> float:
        """Bytes of class c as stored on the target (constants are weights, the rest activations)."""
        value = self._bytes.get(c)
        if value is None:
            key = (self.eg.shapes.get(c), self.eg.dtypes.get(c), c not in self.constant)
            value = self._tensor_bytes.get(key)
            if value is None:
                value = self._tensor_bytes[key] = self.model.tensor_bytes(*key)
            self._bytes[c] = value
        return value

    def flops(self, index: int) -> float:
        value = self._flops.get(index)
        if value is None:
            node = self.eg.nodes[index]
            value = node_flops(self.model, node.op, node.attrs, self.eg.shapes.get(node.eclass),
                               [self.eg.shapes.get(ch) for ch in node.children])
            self._flops[index] = value
        return value

    def work(self, index: int, prices: Prices | None = None) -> float:
        """Price of computing node `index` inline in a kernel body (0 for leaves and structure)."""
        if prices is None or prices is self.prices:
            value = self._work.get(index)
            if value is None:
                value = self._work[index] = self._price_work(index, self.prices)
            return value
        return self._price_work(index, prices)

    def _price_work(self, index: int, prices: Prices) -> float:
        node = self.eg.nodes[index]
        if OPS[node.op].kind in ("leaf", "structure"):
            return 0.0
        groups = node.attrs[3] if node.op in ("Conv", "ConvTranspose") else 1
        return EPS + prices.work(self.flops(index), node.op, groups)

    def read(self, c: int) -> float:
        """Provisional price of reading class c alone (heuristics only)."""
        return self.prices.bytes_cost(self.bytes(c))

    def kernel(self, moved_bytes: float, work: float, prices: Prices | None = None) -> float:
        prices = prices or self.prices
        return prices.launch + prices.bytes_cost(moved_bytes) + work


# ---- the program cost and validity check -------------------------------------------------------

def program_cost(eg: SerializedEGraph, model: CostModel, choice: dict[int, int],
                 roots: list[int], constant: frozenset[int] | set[int] | dict[int, int],
                 objective: str = "latency", pricing: Pricing | None = None
                 ) -> tuple[float, dict[int, KernelCost]]:
    """Check `choice` and price it: (total under `objective`, cost of each kernel by its class).

    Raises ExtractionError when a needed class has no choice, a chosen node is not in its class,
    the chosen graph has a cycle, or a kernel body breaks the target's legality rules.
    """
    for c, n in choice.items():
        if not 0 <= n < len(eg.nodes) or eg.nodes[n].eclass != c:
            raise ExtractionError(f"class {eg.class_ids[c]}: chosen node {n} is not in the class")
    _check_acyclic(eg, choice, roots)
    constant = frozenset(constant)
    if pricing is None or pricing.objective != objective or pricing.constant != constant:
        pricing = Pricing(eg, model, objective, constant)

    def chosen(c: int) -> ENode:
        return eg.nodes[choice[c]]

    def is_boundary(c: int) -> bool:
        return c in constant or chosen(c).op in ("Mat", "Input")

    def walk_body(body_root: int, reads: set[int], inline: list[int]) -> int:
        """Visit a body's inline classes, check legality, return its count of distinct anchors."""
        has_anchor: dict[int, bool] = {}
        stack: list[tuple[int, bool]] = [(body_root, False)]
        while stack:
            c, expanded = stack.pop()
            if c in has_anchor:
                continue
            node = chosen(c)
            if not expanded:
                stack.append((c, True))
                stack.extend((ch, False) for ch in node.children
                             if not is_boundary(ch) and ch not in has_anchor)
                continue
            anchored = is_anchor(node.op)
            for ch in node.children:
                if is_boundary(ch):
                    reads.add(ch)
                    continue
                if eg.class_sort[ch] != "TList" and not inline_legal(
                        model, node.op, chosen(ch).op, has_anchor[ch]):
                    raise ExtractionError(
                        f"illegal kernel body on target {model.target}: {chosen(ch).op} "
                        f"(class {eg.class_ids[ch]}) inline under {node.op} "
                        f"(class {eg.class_ids[c]})")
                anchored = anchored or has_anchor[ch]
            has_anchor[c] = anchored
            inline.append(c)
        return sum(1 for c in has_anchor if is_anchor(chosen(c).op))

    def price(k: int) -> tuple[KernelCost, set[int]]:
        node = chosen(k)
        body = node.children[0] if node.op == "Mat" else k
        if node.op == "Mat" and is_boundary(body):       # a copy kernel
            reads, inline, ops = {body}, [], ["Copy"]
        else:
            reads, inline = set(), []
            anchors = walk_body(body, reads, inline)
            if anchors > model.max_anchors:
                raise ExtractionError(f"kernel of class {eg.class_ids[k]} holds {anchors} "
                                      f"contractions/reductions; target {model.target} allows "
                                      f"{model.max_anchors}")
            ops = [chosen(c).op for c in inline if eg.class_sort[c] == "T"]
        flops = sum(pricing.flops(choice[c]) for c in inline)
        work_us = sum(pricing.work(choice[c], pricing.latency) for c in inline)
        work_uj = (sum(pricing.work(choice[c], pricing.energy) for c in inline)
                   if pricing.energy else None)
        if node.op != "Mat" or not is_boundary(body):
            if OPS[chosen(body).op].kind == "view":      # an alias: nothing moves
                cost = work_us if objective == "latency" else work_uj
                return KernelCost(k, True, 0.0, 0.0, 0.0, 0.0, work_us, ops, work_uj, True,
                                  cost), reads
        read = sum(pricing.bytes(r) for r in reads)
        write = pricing.bytes(k)
        us = pricing.kernel(read + write, work_us, pricing.latency)
        uj = (pricing.kernel(read + write, work_uj, pricing.energy)
              if pricing.energy else None)
        cost = us if objective == "latency" else uj
        return KernelCost(k, False, model.launch_us, read, write, flops, us, ops, uj,
                          read + write <= pricing.prices.onchip_bytes, cost), reads

    kernels: dict[int, KernelCost] = {}
    pending = [r for r in roots if not (r in constant or chosen(r).op == "Input")]
    while pending:
        k = pending.pop()
        if k in kernels:
            continue
        kernels[k], reads = price(k)
        pending.extend(r for r in reads if r not in constant and chosen(r).op == "Mat")
    return sum(kc.cost for kc in kernels.values()), kernels


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


def choice_from(eg: SerializedEGraph, roots: list[int], pick) -> dict[int, int]:
    """Follow `pick(class) -> node` from the roots: the choice of every needed class."""
    choice: dict[int, int] = {}
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in choice:
            continue
        node = pick(c)
        if node is None:
            raise ExtractionError(f"no legal program computes class {eg.class_ids[c]}")
        choice[c] = node
        stack.extend(ch for ch in eg.nodes[node].children if ch not in choice)
    return choice


def finish(eg: SerializedEGraph, model: CostModel, pricing: Pricing, choice: dict[int, int],
           roots: list[int], name: str, started: float,
           details: dict[str, Any] | None = None) -> Extraction:
    """Price a choice with `program_cost` (the validity check) and wrap it as an Extraction.

    The choice is completed with the folded node of every constant class it reaches (lowering
    evaluates those terms, so their whole term is part of the program).
    """
    stack = [ch for c in choice for ch in eg.nodes[choice[c]].children if ch not in choice]
    while stack:
        c = stack.pop()
        if c in choice:
            continue
        if c not in pricing.constant_pick:
            raise ExtractionError(f"class {eg.class_ids[c]} is needed but has no chosen node")
        choice[c] = pricing.constant_pick[c]
        stack.extend(ch for ch in eg.nodes[choice[c]].children if ch not in choice)
    cost, kernels = program_cost(eg, model, choice, roots, pricing.constant, pricing.objective,
                                 pricing)
    energy = (sum(k.energy_uj for k in kernels.values()) if pricing.energy is not None else None)
    return Extraction(choice, list(roots), pricing.constant, cost, kernels, name,
                      time.perf_counter() - started, pricing.objective,
                      sum(k.us for k in kernels.values()), energy, dict(details or {}))


def _class_order(eg: SerializedEGraph) -> tuple[list[int], bool]:
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


# ---- greedy DAG-aware extraction -----------------------------------------------------------------

class _Option:
    """The best way found so far to compute one class, as its consumers see it.

    Kernel sets are bitsets over class positions (Python ints): union is one C-level `|`, and
    the cost of a union is the largest child's total plus the kernels the others add.
    """

    __slots__ = ("node", "boundary", "has_anchor", "anchors", "kbits", "ktotal", "under",
                 "open", "open_work", "open_bytes", "kernel", "total", "body", "kcount")

    def __init__(self, node, boundary, has_anchor, anchors, kbits, ktotal, under, open_,
                 open_work, open_bytes, kernel, total, body=-1, kcount=0):
        self.node = node
        self.boundary = boundary          # Mat, Input or constant: consumers read it from memory
        self.has_anchor = has_anchor      # the inline body holds a contraction or reduction
        self.anchors = anchors            # frozenset of anchor classes in the inline body
        self.kbits = kbits                # kernels the option needs (bit per class position)
        self.ktotal = ktotal              # their summed cost
        self.under = under                # the cyclic classes its program uses (bit per class)
        self.open = open_                 # inline class -> work; -1-class -> bytes read
        self.open_work = open_work
        self.open_bytes = open_bytes
        self.kernel = kernel              # for a Mat option: its own kernel's cost
        self.total = total
        self.body = body                  # for a Mat option: the node of its body root
        self.kcount = kcount              # how many kernels: the union's largest is its base


def _bits_total(bits: int, weights: np.ndarray) -> float:
    """Sum of weights[i] over the set bits i of `bits`."""
    if bits.bit_count() > 24:
        raw = np.frombuffer(bits.to_bytes((bits.bit_length() + 7) // 8, "little"), np.uint8)
        return float(weights[np.flatnonzero(np.unpackbits(raw, bitorder="little"))].sum())
    total = 0.0
    while bits:
        low = bits & -bits
        total += weights[low.bit_length() - 1]
        bits ^= low
    return float(total)


class GreedyDagExtractor:
    """Bottom-up, DAG-aware, heuristic: each class keeps the option whose own program (the set of
    kernels and open inline work it needs, each counted once) costs least; consumers re-evaluate
    when a child's option changes. One node per class; legality is respected as options combine.

    A kernel that is paid for anyway costs its consumers nothing (its own body is still chosen
    at its full price): the first pass treats the outputs' kernels so, and up to `rounds`
    refinements treat every kernel of the program found so (their marginal cost), which lets a
    class reuse a kernel the program computes anyway, and also the kernel that would
    materialize a value the program recomputes in several kernels, which lets its readers share
    it. A refinement is kept when its program cost is lower. Each refinement costs a pass, so it
    runs on e-graphs of up to `refine_nodes` e-nodes (larger ones get the first pass only).
    """

    name = "greedy-dag"
    optimality = "heuristic"

    def __init__(self, model: CostModel, objective: str = "latency", rounds: int = 1,
                 refine_nodes: int = 30000, **_options):
        self.model = model
        self.objective = objective
        self.rounds = rounds
        self.refine_nodes = refine_nodes

    def extract(self, eg: SerializedEGraph, roots: list[int],
                forbid: Iterable[int] = ()) -> Extraction:
        started = time.perf_counter()
        pricing = Pricing(eg, self.model, self.objective)
        forbid = frozenset(forbid)
        graph = _GreedyGraph(eg, pricing)
        picks = pricing.constant_pick
        result = None
        paid = frozenset(r for r in roots if r not in pricing.constant
                         and all(eg.nodes[n].op == "Mat" for n in eg.class_nodes[r]))
        rounds = self.rounds if len(eg.nodes) <= self.refine_nodes else 0
        for round_ in range(rounds + 1):
            best = self.options(eg, pricing, forbid, paid, graph)
            try:
                choice = _greedy_choice(eg, roots, best, picks)
                candidate = finish(eg, self.model, pricing, choice, roots, self.name, started,
                                   {"rounds": round_})
            except ExtractionError:
                if result is None:
                    raise
                break
            if result is not None and candidate.cost >= result.cost * (1 - 1e-12):
                break
            result = candidate
            paid = frozenset(result.kernels) | _materializers(eg, result, graph.parents)
        result.seconds = time.perf_counter() - started
        return result

    def options(self, eg: SerializedEGraph, pricing: Pricing, forbid: frozenset[int],
                paid: frozenset[int] = frozenset(),
                graph: "_GreedyGraph | None" = None) -> list[_Option | None]:
        """The best option of every class (None where no legal program computes it); the
        kernels of classes in `paid` cost nothing."""
        model, prices = self.model, pricing.prices
        constant = pricing.constant
        nodes = eg.nodes
        graph = graph or _GreedyGraph(eg, pricing)
        position, read_bytes, read_price = graph.position, graph.read_bytes, graph.read_price
        is_list, kinds, parents = graph.is_list, graph.kinds, graph.parents
        cycle_bit, self_loops = graph.cycle_bit, graph.self_loops
        kernel_weight = np.zeros(max(eg.num_classes, 1))     # by position: current kernel cost
        best: list[_Option | None] = [None] * eg.num_classes
        alias_best: list[_Option | None] = [None] * eg.num_classes
        folded = _Option(-1, True, False, frozenset(), 0, 0.0, 0, {}, 0.0, 0.0, 0.0, 0.0)
        for c in constant:
            best[c] = folded                      # its node: pricing.constant_pick
        legal_cache: dict[tuple[str, str, bool], bool] = {}
        launch, byte = prices.launch, prices.byte
        bytes_cost, max_anchors = prices.bytes_cost, model.max_anchors
        empty = frozenset()

        def effective(option: _Option, c: int) -> float:
            return option.total + (read_price[c] if option.boundary else 0.0)

        def union_kernels(children: list[_Option]) -> tuple[int, float, int]:
            if len(children) == 1:
                o = children[0]
                return o.kbits, o.ktotal, o.kcount
            big = max(children, key=lambda o: o.kcount)
            bits = big.kbits
            others = 0
            for o in children:
                if o is not big:
                    others |= o.kbits
            extra = others & ~bits
            if not extra:
                return bits, big.ktotal, big.kcount
            return (bits | extra, big.ktotal + _bits_total(extra, kernel_weight),
                    big.kcount + extra.bit_count())

        def evaluate(index: int) -> _Option | None:
            node = nodes[index]
            c, op = node.eclass, node.op
            if index in forbid or index in self_loops:
                return None
            bit = cycle_bit[c]
            if op == "Input":
                return _Option(index, True, False, empty, 0, 0.0, bit, {}, 0.0, 0.0, 0.0, 0.0)
            if op in _CONST_LEAVES:
                return None                       # only in constant classes, priced there
            children = []
            under = bit
            for ch in node.children:
                o = best[ch]
                if o is None or o.under & bit:
                    return None                   # not computable yet, or would close a cycle
                children.append(o)
                under |= o.under
            if op == "Mat":
                ch, o = node.children[0], children[0]
                if o.boundary:
                    kernel = launch + bytes_cost(read_bytes[ch] + read_bytes[c])
                elif kinds[o.node] == "view":
                    kernel = o.open_work
                else:
                    kernel = launch + bytes_cost(o.open_bytes + read_bytes[c]) + o.open_work
                view = alias_best[ch]
                if (view is not None and view is not o and not view.under & bit
                        and view.ktotal + view.open_work < o.ktotal + kernel):
                    # the child's best view makes this kernel an alias: cheaper as a whole
                    o, kernel, under = view, view.open_work, bit | view.under
                total = o.ktotal + kernel
                if c in paid:                     # consumers do not pay for it again
                    kernel = 0.0
                return _Option(index, True, False, empty, o.kbits | (1 << position[c]),
                               o.ktotal + kernel, under, {}, 0.0, 0.0, kernel, total, o.node,
                               o.kcount + 1)
            if children:
                kbits, ktotal, kcount = union_kernels(children)
            else:
                kbits, ktotal, kcount = 0, 0.0, 0
            anchored = kinds[index] in _ANCHOR_KINDS
            anchors = frozenset((c,)) if anchored else empty
            open_ = {c: pricing.work(index)}
            for ch, o in zip(node.children, children):
                if o.boundary:
                    open_[-1 - ch] = read_bytes[ch]
                    continue
                if not is_list[ch]:
                    key = (op, nodes[o.node].op, o.has_anchor)
                    legal = legal_cache.get(key)
                    if legal is None:
                        legal = legal_cache[key] = inline_legal(model, *key)
                    if not legal:
                        return None
                if o.anchors:
                    anchors = anchors | o.anchors
                anchored = anchored or o.has_anchor
                if len(o.open) > len(open_):        # copy the larger, add the smaller
                    merged = dict(o.open)
                    merged.update(open_)
                    open_ = merged
                else:
                    open_.update(o.open)
            if len(anchors) > max_anchors:
                return None
            work = moved = 0.0
            for key, value in open_.items():
                if key >= 0:
                    work += value
                else:
                    moved += value
            return _Option(index, False, anchored, anchors, kbits, ktotal, under, open_, work,
                           moved, 0.0, ktotal + work + bytes_cost(moved), -1, kcount)

        order = graph.order
        queue = deque(order)
        queued = [False] * len(nodes)
        for i in order:
            queued[i] = True
        budget = 50 * len(nodes) + 1000
        while queue and budget > 0:
            budget -= 1
            index = queue.popleft()
            queued[index] = False
            c = nodes[index].eclass
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
            if kinds[index] == "view":
                # the best view of the class, for a Mat above it to be an alias of
                view = alias_best[c]
                if (view is not None and view.node == index) or (option is not None and (
                        view is None or option.ktotal + option.open_work
                        < view.ktotal + view.open_work - 1e-12)):
                    alias_best[c] = option
                    changed = True
            if changed:
                kernel_weight[position[c]] = 0.0 if best[c] is None else best[c].kernel
                for parent in parents[c]:
                    if not queued[parent] and nodes[parent].eclass not in constant:
                        queued[parent] = True
                        queue.append(parent)
        return best


def _greedy_choice(eg: SerializedEGraph, roots: list[int], best: list[_Option | None],
                   picks: dict[int, int]) -> dict[int, int]:
    """Follow the best options from the roots. A Mat whose option chose a view of its child (an
    alias) gets it when that Mat is the child's only kind of consumer in the program."""
    override: dict[int, int] = {}
    for _ in range(4):
        def pick(c: int) -> int | None:
            if c in picks:
                return picks[c]
            if c in override:
                return override[c]
            return None if best[c] is None else best[c].node
        choice = choice_from(eg, roots, pick)
        wanted: dict[int, int] = {}
        inline_users: set[int] = set()
        for c, n in choice.items():
            node = eg.nodes[n]
            if node.op == "Mat":
                option = best[c]
                body = node.children[0]
                if option is not None and option.node == n and option.body >= 0 \
                        and option.body != choice.get(body):
                    wanted[body] = option.body
            else:
                inline_users.update(node.children)
        new = {c: n for c, n in wanted.items() if c not in inline_users}
        if all(override.get(c) == n for c, n in new.items()):
            return choice
        override.update(new)
    return choice


def _materializers(eg: SerializedEGraph, result: Extraction,
                   parents: list[list[int]]) -> set[int]:
    """The Mat classes of the values `result` computes inline in more than one kernel."""
    seen: dict[int, int] = {}
    for k in result.kernels:
        node = eg.nodes[result.choice[k]]
        body = node.children[0] if node.op == "Mat" else k
        for c in _inline_classes(eg, result.choice, result.constant, body):
            seen[c] = seen.get(c, 0) + 1
    return {eg.nodes[p].eclass for c, uses in seen.items() if uses > 1
            for p in parents[c] if eg.nodes[p].op == "Mat"}


class _GreedyGraph:
    """What every greedy pass over one e-graph shares: class positions (children first), bytes
    and read prices of classes, node kinds, parents, and the order nodes are first evaluated."""

    def __init__(self, eg: SerializedEGraph, pricing: Pricing):
        nodes = eg.nodes
        self.position, cycle = _class_order(eg)
        position = self.position
        # cycle checks need a bit only for classes on a cycle of the class graph
        self.cycle_bit = [0] * eg.num_classes
        if cycle:
            for i, c in enumerate(cyclic_classes(eg)):
                self.cycle_bit[c] = 1 << i
        self.read_bytes = [pricing.bytes(c) for c in range(eg.num_classes)]
        self.read_price = [pricing.prices.bytes_cost(b) for b in self.read_bytes]
        self.is_list = [s == "TList" for s in eg.class_sort]
        kind_of = {op: spec.kind for op, spec in OPS.items()}
        self.kinds = [kind_of[n.op] for n in nodes]
        self.self_loops: set[int] = set()
        parents: list[list[int]] = [[] for _ in range(eg.num_classes)]
        for index, node in enumerate(nodes):
            for ch in node.children:            # a repeated child: a repeated (harmless) entry
                parents[ch].append(index)
                if ch == node.eclass:
                    self.self_loops.add(index)
        self.parents = parents
        # children before parents: most nodes are evaluated once, when their children are ready
        constant = pricing.constant
        keyed = sorted((position[node.eclass], i) for i, node in enumerate(nodes)
                       if node.eclass not in constant)
        self.order = [i for _, i in keyed]


# ---- bottom-up tree-cost extraction -------------------------------------------------------------

_TREE_EPS = 1e-9     # every node adds this much in the tree DP: strictly increasing costs


@dataclass
class _TreeOption:
    cost: float                      # tree cost (reads priced as if the body read nothing else)
    node: int
    sub: float                       # tree cost of the kernels below (closed)
    work: float                      # inline work of the open body (tree-counted)
    moved: float                     # bytes the open body reads (tree-counted)
    children: tuple                  # (child class, child state) per child


class TreeExtractor:
    """Bottom-up dynamic programme over (class, body state): optimal for tree cost, where every
    use of a shared class pays for it again (the program cost of the unshared program).

    A state records what a consumer's legality depends on (the chosen op's kind and whether it
    may start or continue an epilogue, and how many anchors the inline body holds), so on a tree
    the optimum under the target's legality rules is found exactly when bytes are priced
    linearly (a target without on-chip memory). On a DAG, a class demanded in two states keeps
    one; if that breaks a consumer, the class is pinned to that state and the programme re-run.
    """

    name = "tree"
    optimality = "tree-optimal"

    def __init__(self, model: CostModel, objective: str = "latency", **_options):
        self.model = model
        self.objective = objective

    def extract(self, eg: SerializedEGraph, roots: list[int],
                forbid: Iterable[int] = ()) -> Extraction:
        started = time.perf_counter()
        pricing = Pricing(eg, self.model, self.objective)
        forbid = frozenset(forbid)
        pins: dict[int, tuple[int, Any]] = {}
        last_error: ExtractionError | None = None
        for _ in range(64):
            table = self._programme(eg, pricing, forbid, pins)
            choice, states, conflicts = self._reconstruct(eg, roots, table, pricing)
            try:
                return finish(eg, self.model, pricing, choice, roots, self.name, started,
                              {"pinned": len(pins)})
            except ExtractionError as exc:
                last_error = exc
                new = {c: (choice[c], states[c]) for c in conflicts if c not in pins}
                if not new:
                    break
                pins.update(new)
        raise ExtractionError(f"tree extraction found no legal program: {last_error}")

    def _programme(self, eg: SerializedEGraph, pricing: Pricing, forbid: frozenset[int],
                   pins: dict[int, tuple[int, Any]]) -> list[dict]:
        model, prices = self.model, pricing.prices
        constant = pricing.constant
        nodes = eg.nodes
        table: list[dict[Any, _TreeOption]] = [{} for _ in range(eg.num_classes)]
        for c in constant:
            table[c]["B"] = _TreeOption(0.0, pricing.constant_pick[c], 0.0, 0.0, 0.0, ())
        parents: list[list[int]] = [[] for _ in range(eg.num_classes)]
        for index, node in enumerate(nodes):
            for ch in set(node.children):
                parents[ch].append(index)
        kinds = [OPS[n.op].kind for n in nodes]
        read_bytes = [pricing.bytes(c) for c in range(eg.num_classes)]

        def kinds_of_op(op: str) -> str:
            return OPS[op].kind

        # An inline state is (chosen op, anchors its body holds, counted as in a tree): all that
        # a consumer's legality (`inline_legal`) and the max_anchors limit depend on.

        def evaluate(index: int) -> dict[Any, _TreeOption]:
            node = nodes[index]
            c, op = node.eclass, node.op
            if index in forbid or op in _CONST_LEAVES:
                return {}
            if c in pins and pins[c][0] != index:
                return {}
            if op == "Input":
                return {"B": _TreeOption(0.0, index, 0.0, 0.0, 0.0, ())}
            if op == "Mat":
                ch = node.children[0]
                out = None
                for state, o in table[ch].items():
                    if state == "B":
                        kernel = prices.launch + prices.bytes_cost(read_bytes[ch] + read_bytes[c])
                        sub = o.cost
                    elif kinds_of_op(state[0]) == "view":
                        kernel, sub = o.work, o.sub
                    else:
                        kernel = prices.launch + prices.bytes_cost(o.moved + read_bytes[c]) + o.work
                        sub = o.sub
                    cost = sub + kernel + _TREE_EPS
                    if out is None or cost < out.cost:
                        out = _TreeOption(cost, index, cost, 0.0, 0.0, ((ch, state),))
                return {} if out is None else {"B": out}
            # fold the children: partial results keyed by the anchors counted so far
            own = 1 if kinds[index] in _ANCHOR_KINDS else 0
            partial: dict[int, _TreeOption] = {
                own: _TreeOption(0.0, index, 0.0, pricing.work(index) + _TREE_EPS, 0.0, ())}
            for ch in node.children:
                step: dict[int, _TreeOption] = {}
                for state, o in table[ch].items():
                    if state == "B":
                        add = (o.cost, 0.0, read_bytes[ch], 0)
                    elif eg.class_sort[ch] == "TList" or inline_legal(model, op, state[0],
                                                                      state[1] > 0):
                        add = (o.sub, o.work, o.moved, state[1])
                    else:
                        continue
                    for count, p in partial.items():
                        total = count + add[3]
                        if total > model.max_anchors:
                            continue
                        sub, work, moved = p.sub + add[0], p.work + add[1], p.moved + add[2]
                        cost = sub + work + prices.bytes_cost(moved)
                        if total not in step or cost < step[total].cost:
                            step[total] = _TreeOption(cost, index, sub, work, moved,
                                                      p.children + ((ch, state),))
                partial = step
                if not partial:
                    return {}
            result = {}
            for count, p in partial.items():
                state = (op, count)
                if c in pins and pins[c][1] != state:
                    continue
                result[state] = p
            return result

        queue = deque(i for i, node in enumerate(nodes) if node.eclass not in constant)
        queued = [node.eclass not in constant for node in nodes]
        budget = 200 * len(nodes) + 1000
        while queue and budget > 0:
            budget -= 1
            index = queue.popleft()
            queued[index] = False
            c = nodes[index].eclass
            improved = False
            for state, option in evaluate(index).items():
                current = table[c].get(state)
                if current is None or option.cost < current.cost * (1 - 1e-12) - 1e-15:
                    table[c][state] = option
                    improved = True
            if improved:
                for parent in parents[c]:
                    if not queued[parent] and nodes[parent].eclass not in constant:
                        queued[parent] = True
                        queue.append(parent)
        return table

    @staticmethod
    def _reconstruct(eg: SerializedEGraph, roots: list[int], table: list[dict], pricing: Pricing
                     ) -> tuple[dict[int, int], dict[int, Any], set[int]]:
        """Top-down from the roots, the most expensive demand first; a class demanded in two
        states keeps the first (and is reported as a conflict)."""
        def as_root(c: int, state, option: _TreeOption) -> float:
            """A root computed inline is a kernel of its own (an alias if it is a view)."""
            if state == "B":
                return option.cost
            if OPS[state[0]].kind == "view":
                return option.sub + option.work
            return option.sub + pricing.kernel(option.moved + pricing.bytes(c), option.work)

        choice: dict[int, int] = {}
        states: dict[int, Any] = {}
        conflicts: set[int] = set()
        heap = []
        for r in roots:
            if not table[r]:
                raise ExtractionError(f"no legal program computes class {eg.class_ids[r]}")
            state, option = min(table[r].items(), key=lambda kv: as_root(r, *kv))
            heapq.heappush(heap, (-option.cost, r, state))
        while heap:
            _, c, state = heapq.heappop(heap)
            if c in choice:
                if states[c] != state:
                    conflicts.add(c)
                continue
            option = table[c].get(state)
            if option is None:
                raise ExtractionError(f"no legal program computes class {eg.class_ids[c]}")
            choice[c], states[c] = option.node, state
            for ch, ch_state in option.children:
                heapq.heappush(heap, (-table[ch][ch_state].cost, ch, ch_state))
        return choice, states, conflicts


# ---- the registry and the entry point ----------------------------------------------------------

def _ilp_extractor():
    from .ilp import IlpExtractor
    return IlpExtractor


class _Lazy(dict):
    """EXTRACTORS: name -> extractor class (the ILP module loads on first use)."""

    def __getitem__(self, name):
        value = super().__getitem__(name)
        return value() if value is _ilp_extractor else value


EXTRACTORS: dict[str, type] = _Lazy({"tree": TreeExtractor, "greedy-dag": GreedyDagExtractor,
                                     "ilp": _ilp_extractor})


def extract(eg: SerializedEGraph, roots: list[int], model: CostModel,
            extractor: str = "greedy-dag", *, objective: str = "latency",
            forbid: Iterable[int] = (), **options) -> Extraction:
    """Run the named extractor; the result has passed `program_cost`'s validity check.

    `objective` is what extraction minimizes ("latency" or "energy"); `forbid` lists e-nodes that
    must not be chosen; `options` go to the extractor (the ILP takes `seconds`).
    """
    if extractor not in EXTRACTORS:
        raise EqsatFuseError(f"unknown extractor {extractor!r}; choose one of "
                             f"{', '.join(EXTRACTORS)}")
    model.prices(objective)                       # an unknown objective fails here, named
    return EXTRACTORS[extractor](model, objective, **options).extract(eg, roots, forbid)


# ---- explanations: what each fusion is worth ---------------------------------------------------

@dataclass
class FusionValue:
    """One fused kernel, and the best program without it (split back at its Mat boundaries)."""

    eclass: int
    ops: list[str]
    with_cost: float
    without_cost: float | None        # None: no legal program without this fusion

    @property
    def saving(self) -> float | None:
        return None if self.without_cost is None else self.without_cost - self.with_cost


def fusion_values(eg: SerializedEGraph, model: CostModel, extraction: Extraction,
                  extractor: str | None = None, **options) -> list[FusionValue]:
    """For each fused kernel (a body of more than one operation), re-extract with that kernel's
    inline classes forced to be boundaries: every node reading one of them inline is forbidden,
    so the cheapest program must read it from a `Mat`. Uses the extraction's own extractor
    unless told otherwise.
    """
    name = extractor or extraction.extractor
    choice = extraction.choice
    consumers: dict[int, list[int]] = {}
    for index, node in enumerate(eg.nodes):
        if node.op != "Mat":
            for ch in set(node.children):
                consumers.setdefault(ch, []).append(index)
    values = []
    for k, kc in extraction.kernels.items():
        if kc.alias or len(kc.ops) < 2:
            continue
        node = eg.nodes[choice[k]]
        body = node.children[0] if node.op == "Mat" else k
        inline = _inline_classes(eg, choice, extraction.constant, body)
        forbid = {n for c in inline if c != body and eg.class_sort[c] == "T"
                  for n in consumers.get(c, ())}
        try:
            without = extract(eg, extraction.roots, model, name, objective=extraction.objective,
                              forbid=forbid, **options).cost
        except ExtractionError:
            without = None
        values.append(FusionValue(k, kc.ops, extraction.cost, without))
    return values


def _inline_classes(eg: SerializedEGraph, choice: dict[int, int], constant: frozenset[int],
                    body: int) -> set[int]:
    seen, stack = set(), [body]
    while stack:
        c = stack.pop()
        if c in seen or c in constant or eg.nodes[choice[c]].op in ("Mat", "Input"):
            continue
        seen.add(c)
        stack.extend(eg.nodes[choice[c]].children)
    return seen


@dataclass
class ExtractionContext:
    """What explaining an extraction needs after compilation: the e-graph, the answer, the target
    and the extractor's options (`Compiled.extraction`)."""

    egraph: SerializedEGraph
    extraction: Extraction
    model: CostModel
    options: dict[str, Any] = field(default_factory=dict)

    def fusion_values(self, extractor: str | None = None) -> list[FusionValue]:
        """Each fused kernel with the cost of the best program without it."""
        return fusion_values(self.egraph, self.model, self.extraction, extractor, **self.options)
