"""What a program costs and which programs are legal: the one statement every extractor and
every report follows.

The program cost (docs/cost-models.md says what it charges) is computed in one place,
`program_cost`:

    cost = sum over distinct kernels K of  launch + bytes_cost(read(K) + write(K))
                                           + sum over distinct inline classes n of K: work(n)
                                           + sum over those below K's root: epilogue(n)

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

`Pricing` holds the per-node and per-class prices every extractor reads, `choice_from` and
`finish` turn an extractor's picks into a checked `Extraction`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import EqsatFuseError
from ..graphs import postorder, reachable
from ..ops import OPS
from ..saturation.serialized import ENode, SerializedEGraph
from .costmodel import CostModel, Prices, is_depthwise, nbytes, node_flops

EPS = 1e-6    # price of one inline node, in the objective's unit: ties go to smaller programs
CONST_LEAVES = {"Const", "Scalar", "Ints", "Absent"}
ANCHOR_KINDS = ("anchor", "reduction")
CONTRACTIONS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "ConvInteger", "MatMulInteger")


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
        if node.op in CONST_LEAVES or not children:
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
    return OPS[op].kind in ANCHOR_KINDS


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
    child_has_anchor = child_has_anchor or child in ANCHOR_KINDS
    if parent == "elementwise":
        if child in ANCHOR_KINDS:          # the first op of an anchor's epilogue
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
        """Bytes of class c as stored on the target (constants are weights, the rest
        activations)."""
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
        groups = node.attrs[3] if node.op in ("Conv", "ConvTranspose", "ConvInteger") else 1
        depthwise = None
        if len(node.children) > 1 and \
                is_depthwise(node.op, groups, self.eg.shapes.get(node.children[1])):
            depthwise = self.bytes(node.children[0])
        return EPS + prices.work(self.flops(index), node.op, groups, depthwise)

    def epilogue(self, index: int, prices: Prices | None = None) -> float:
        """Extra price of node `index` when it sits inline in a kernel body below the root: a
        contraction there carries an epilogue, which makes one pass over its output (the
        epilogue's later ops ride in the same pass). 0 for any other node."""
        prices = prices or self.prices
        if not prices.epilogue_byte or self.eg.nodes[index].op not in CONTRACTIONS:
            return 0.0
        return prices.epilogue_pass(self.bytes(self.eg.nodes[index].eclass))

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

    def inline_children(c: int) -> list[int]:
        # last child first: the order this walk has always listed a body's classes (and so its
        # kernel's ops) in; `postorder` visits children in the order given
        return [ch for ch in reversed(chosen(c).children) if not is_boundary(ch)]

    def walk_body(body_root: int, reads: set[int], inline: list[int]) -> int:
        """Visit a body's inline classes, check legality, return its count of distinct anchors."""
        has_anchor: dict[int, bool] = {}
        for c in postorder([body_root], inline_children):
            node = chosen(c)
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
        below = [c for c in inline if c != body]
        work_us = (sum(pricing.work(choice[c], pricing.latency) for c in inline)
                   + sum(pricing.epilogue(choice[c], pricing.latency) for c in below))
        work_uj = (sum(pricing.work(choice[c], pricing.energy) for c in inline)
                   + sum(pricing.epilogue(choice[c], pricing.energy) for c in below)
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


def inline_classes(eg: SerializedEGraph, choice: dict[int, int], constant: frozenset[int],
                   body: int) -> set[int]:
    """The classes a kernel body computes inline, from its root `body` down to boundaries."""
    def inline(c: int) -> bool:
        return c not in constant and eg.nodes[choice[c]].op not in ("Mat", "Input")

    return reachable([body] if inline(body) else [],
                     lambda c: [ch for ch in eg.nodes[choice[c]].children if inline(ch)])
