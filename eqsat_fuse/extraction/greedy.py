"""The greedy DAG-aware extractor (`GreedyDagExtractor`, "greedy-dag"): bottom-up, each class
keeps the option whose own program costs least, every kernel counted once.

The default extractor, and the ILP's warm start.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable

import numpy as np

from ..ops import OPS
from ..saturation.serialized import SerializedEGraph
from .classgraph import class_order, cyclic_classes
from .cost import (ANCHOR_KINDS, CONST_LEAVES, Extraction, ExtractionError, Pricing, choice_from,
                   finish, inline_classes, inline_legal)
from .costmodel import CostModel


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
        self.open = open_                 # inline class -> work; -1-class -> bytes read;
                                          # n_classes + class -> its epilogue's pass
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
    refinements treat so every kernel of the program found that an output or several kernels
    read (their marginal cost), which lets a class reuse a kernel the program computes anyway,
    and also the kernel that would materialize the outermost value the program recomputes in
    several kernels, which lets its readers share it. A kernel with one reader is not paid for
    anyway: its reader may still compute it in its own body. A refinement is kept when its
    program cost is lower. Each refinement costs a pass, so it runs on e-graphs of up to
    `refine_nodes` e-nodes (larger ones get the first pass only).
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
            bodies = _kernel_bodies(eg, result)
            paid = (_shared_kernels(eg, result, roots, bodies)
                    | _materializers(eg, result, graph.parents, bodies))
        result.seconds = time.perf_counter() - started
        return result

    def options(self, eg: SerializedEGraph, pricing: Pricing, forbid: frozenset[int],
                paid: frozenset[int] = frozenset(),
                graph: "_GreedyGraph | None" = None) -> list[_Option | None]:
        """The best option of every class (None where no legal program computes it); the
        kernels of classes in `paid` cost nothing."""
        graph = graph or _GreedyGraph(eg, pricing)
        kernel_weight = np.zeros(max(eg.num_classes, 1))     # by position: current kernel cost
        best: list[_Option | None] = [None] * eg.num_classes
        alias_best: list[_Option | None] = [None] * eg.num_classes
        folded = _Option(-1, True, False, frozenset(), 0, 0.0, 0, {}, 0.0, 0.0, 0.0, 0.0)
        for c in pricing.constant:
            best[c] = folded                      # its node: pricing.constant_pick
        evaluate = _evaluator(self.model, eg, pricing, graph, forbid, paid, best, alias_best,
                              kernel_weight)
        _propagate(eg, pricing, graph, evaluate, best, alias_best, kernel_weight)
        return best


def _union_kernels(children: list[_Option], kernel_weight: np.ndarray) -> tuple[int, float, int]:
    """The kernels of several children together: their bitset, summed cost and count."""
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


def _mat_pricer(pricing: Pricing, graph: "_GreedyGraph", paid: frozenset[int],
                alias_best: list[_Option | None]):
    """The function that prices a `Mat` node over child class `ch` with option `o`: a kernel of
    its own, or an alias of the child's best view when that is cheaper as a whole."""
    prices = pricing.prices
    launch, bytes_cost = prices.launch, prices.bytes_cost
    position, read_bytes, kinds = graph.position, graph.read_bytes, graph.kinds
    empty = frozenset()

    def mat_option(index: int, c: int, ch: int, o: _Option, under: int, bit: int) -> _Option:
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

    return mat_option


def _evaluator(model: CostModel, eg: SerializedEGraph, pricing: Pricing, graph: "_GreedyGraph",
               forbid: frozenset[int], paid: frozenset[int], best: list[_Option | None],
               alias_best: list[_Option | None], kernel_weight: np.ndarray):
    """The function that prices node `index` from its children's current options (None where
    it cannot be computed yet, or not legally)."""
    nodes = eg.nodes
    read_bytes, is_list, kinds = graph.read_bytes, graph.is_list, graph.kinds
    cycle_bit, self_loops = graph.cycle_bit, graph.self_loops
    n_classes = len(eg.class_ids)      # open keys from here on: an epilogue's pass, by class
    legal_cache: dict[tuple[str, str, bool], bool] = {}
    bytes_cost, max_anchors = pricing.prices.bytes_cost, model.max_anchors
    empty = frozenset()
    mat_option = _mat_pricer(pricing, graph, paid, alias_best)

    def evaluate(index: int) -> _Option | None:
        node = nodes[index]
        c, op = node.eclass, node.op
        if index in forbid or index in self_loops:
            return None
        bit = cycle_bit[c]
        if op == "Input":
            return _Option(index, True, False, empty, 0, 0.0, bit, {}, 0.0, 0.0, 0.0, 0.0)
        if op in CONST_LEAVES:
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
            return mat_option(index, c, node.children[0], children[0], under, bit)
        if children:
            kbits, ktotal, kcount = _union_kernels(children, kernel_weight)
        else:
            kbits, ktotal, kcount = 0, 0.0, 0
        anchored = kinds[index] in ANCHOR_KINDS
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
            epilogue = pricing.epilogue(o.node)
            if epilogue:                      # a contraction read inline: its epilogue's pass
                open_[n_classes + ch] = epilogue
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

    return evaluate


def _propagate(eg: SerializedEGraph, pricing: Pricing, graph: "_GreedyGraph", evaluate,
               best: list[_Option | None], alias_best: list[_Option | None],
               kernel_weight: np.ndarray) -> None:
    """Evaluate nodes until no class's best option changes (or the budget runs out): children
    before parents first, then the consumers of every class whose option changed."""
    nodes, constant = eg.nodes, pricing.constant
    position, read_price = graph.position, graph.read_price
    kinds, parents = graph.kinds, graph.parents

    def effective(option: _Option, c: int) -> float:
        return option.total + (read_price[c] if option.boundary else 0.0)

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


def _kernel_bodies(eg: SerializedEGraph, result: Extraction) -> dict[int, tuple[int, set[int]]]:
    """Each kernel of `result`: the root of its body and the classes the body computes inline."""
    bodies = {}
    for k in result.kernels:
        node = eg.nodes[result.choice[k]]
        body = node.children[0] if node.op == "Mat" else k
        bodies[k] = body, inline_classes(eg, result.choice, result.constant, body)
    return bodies


def _shared_kernels(eg: SerializedEGraph, result: Extraction, roots: list[int],
                    bodies: dict[int, tuple[int, set[int]]]) -> frozenset[int]:
    """The kernels of `result` that an output or more than one other kernel reads: paid for
    anyway. A kernel with one reader is not: counting it as paid would keep that reader from
    ever computing it in its own body (a contraction under the residual Add that reads it)."""
    readers = {k: int(k in roots) for k in result.kernels}
    for k, (body, inline) in bodies.items():
        if inline:
            reads = {ch for c in inline for ch in eg.nodes[result.choice[c]].children} - inline
        else:                                # a copy or an alias of a boundary
            reads = {body}
        for ch in reads:
            if ch in readers and ch != k:
                readers[ch] += 1
    return frozenset(k for k, n in readers.items() if n > 1 or k in roots)


def _materializers(eg: SerializedEGraph, result: Extraction, parents: list[list[int]],
                   bodies: dict[int, tuple[int, set[int]]]) -> set[int]:
    """The Mat classes of the values `result` computes inline in more than one kernel, the
    outermost of them: a value that is only ever recomputed inside another recomputed value is
    left out, since materializing the outer one ends its recomputation too, and its kernel may
    then compute the inner one (a contraction under a residual Add) in its own body."""
    seen: dict[int, int] = {}
    for _, inline in bodies.values():
        for c in inline:
            seen[c] = seen.get(c, 0) + 1
    shared = {c for c, uses in seen.items() if uses > 1}
    outer: set[int] = set()
    for _, inline in bodies.values():
        here = shared & inline
        inner: set[int] = set()
        for d in here:
            inner |= inline_classes(eg, result.choice, result.constant, d) - {d}
        outer |= here - inner
    return {eg.nodes[p].eclass for c in outer for p in parents[c] if eg.nodes[p].op == "Mat"}


class _GreedyGraph:
    """What every greedy pass over one e-graph shares: class positions (children first), bytes
    and read prices of classes, node kinds, parents, and the order nodes are first evaluated."""

    def __init__(self, eg: SerializedEGraph, pricing: Pricing):
        nodes = eg.nodes
        self.position, cycle = class_order(eg)
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
