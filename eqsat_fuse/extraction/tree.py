"""The tree extractor (`TreeExtractor`, "tree"): a bottom-up dynamic programme, optimal for the
tree cost (every use of a shared class pays for it again)."""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from ..ops import OPS
from ..saturation.serialized import SerializedEGraph
from .cost import (ANCHOR_KINDS, CONST_LEAVES, Extraction, ExtractionError, Pricing, finish,
                   inline_legal)
from .costmodel import CostModel


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
            if index in forbid or op in CONST_LEAVES:
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
            own = 1 if kinds[index] in ANCHOR_KINDS else 0
            partial: dict[int, _TreeOption] = {
                own: _TreeOption(0.0, index, 0.0, pricing.work(index) + _TREE_EPS, 0.0, ())}
            for ch in node.children:
                step: dict[int, _TreeOption] = {}
                for state, o in table[ch].items():
                    if state == "B":
                        add = (o.cost, 0.0, read_bytes[ch], 0)
                    elif eg.class_sort[ch] == "TList" or inline_legal(model, op, state[0],
                                                                      state[1] > 0):
                        # a contraction read inline pays its epilogue's pass
                        add = (o.sub, o.work + pricing.epilogue(o.node), o.moved, state[1])
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

        _relax(nodes, constant, parents, table, evaluate)
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


def _relax(nodes: list, constant: frozenset[int], parents: list[list[int]],
           table: list[dict[Any, _TreeOption]], evaluate) -> None:
    """Evaluate nodes until no (class, state) gets cheaper (or the budget runs out), the
    consumers of a class again whenever one of its states improved."""
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
