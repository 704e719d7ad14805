"""ILP extraction: the exact optimum of the program cost, solved by HiGHS (`scipy.optimize.milp`).

The model states `cost.program_cost` as linear constraints, so that for every choice it
allows, its objective equals `program_cost` of that choice (and it allows exactly the choices
`program_cost` accepts):

- ``x[n]`` (binary): e-node n is chosen. One node per needed class, a chosen node's children
  are needed, a class is needed only if a chosen node uses it (or it is a root), and the chosen
  graph is acyclic (an order variable per class, only inside strongly connected components).
- A kernel K is a class with a `Mat` node (or a root). ``m[n,K]`` (continuous, forced to 0/1):
  node n is computed inline in K's body. Only (node, kernel) pairs reachable from K's body root
  through inline-legal edges get a variable. ``mc[c,K]``: class c is used by K's body;
  ``r[c,K]``: K reads boundary class c. Each is bounded below by its causes, and costs are
  non-negative, so at the optimum every one equals its definition.
- The objective: per kernel, launch + bytes_cost(read + write) + the work of every inline node
  of K (a node inline in two kernels is paid twice: recomputation), alias kernels (a view at the
  body root) cost their view only. On a target with on-chip memory, a binary ``fits[K]`` picks
  the on-chip byte price when the kernel's bytes fit.
- Legality (`cost.inline_legal`) is global, because the choice is: an edge whose legality
  does not depend on the body below is a pair constraint; one that does uses ``H[c]`` (the inline
  body of c holds an anchor), and a kernel holds at most `max_anchors` anchors (a sum over m).

Two families of valid inequalities make the relaxation tight enough for HiGHS: the nodes of
one class that all need a class share one row (at most one of them is chosen), following what
every alternative of a child needs a few levels down (Relu(Mat c) and Relu(c) both need c); and
a chosen inline node is computed in at least one kernel.

The (node, kernel) pairs grow with how deep bodies may reach; on a large e-graph the model keeps
the deepest `horizon` (in inline operations below a kernel's root) whose pairs fit `pair_budget`,
never shallower than the greedy answer's deepest body. The optimum is then the optimum among
programs whose bodies are at most that deep (reported as `horizon`; unlimited when all fit).

HiGHS gets the greedy answer's cost as an objective bound (milp takes no start point): if it
finds nothing better, the greedy answer is kept. A time limit stops it early; the report then
gives the gap between the answer and the best lower bound HiGHS proved.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from typing import Any, Iterable

import numpy as np

from ..graphs import reachable
from ..ops import OPS
from ..saturation.serialized import SerializedEGraph
from .classgraph import strongly_connected
from .cost import (Extraction, ExtractionError, Pricing, choice_from, duplicate_nodes, finish,
                   inline_legal, is_anchor, maybe_inline_legal)
from .costmodel import CostModel
from .greedy import GreedyDagExtractor
from .milp import Milp

_BOUNDARY_OPS = ("Mat", "Input")


class IlpExtractor:
    """Exact DAG extraction under the program cost (`cost.program_cost`), on HiGHS."""

    name = "ilp"
    optimality = "dag-optimal"

    def __init__(self, model: CostModel, objective: str = "latency", seconds: float = 30.0,
                 gap: float = 1e-7, warm_start: bool = True, horizon: float | None = None,
                 pair_budget: int = 20000, **_options):
        self.model = model
        self.objective = objective
        self.seconds = seconds
        self.gap = gap
        self.warm_start = warm_start
        self.horizon = horizon            # None: as deep as `pair_budget` allows
        self.pair_budget = pair_budget

    # ---- the protocol ----
    def extract(self, eg: SerializedEGraph, roots: list[int],
                forbid: Iterable[int] = ()) -> Extraction:
        started = time.perf_counter()
        pricing = Pricing(eg, self.model, self.objective)
        forbid = frozenset(forbid)
        greedy = None
        if self.warm_start:
            try:
                greedy = GreedyDagExtractor(self.model, self.objective).extract(eg, roots, forbid)
            except ExtractionError:
                greedy = None
        built = time.perf_counter()
        least = 0 if greedy is None else _body_depth(eg, greedy)
        problem = _Problem(eg, roots, pricing, forbid, self.horizon, self.pair_budget, least)
        build_seconds = time.perf_counter() - built
        details: dict[str, Any] = {"variables": len(problem.milp.cost),
                                   "constraints": len(problem.milp.rows),
                                   "build_seconds": build_seconds,
                                   "horizon": getattr(problem, "horizon", math.inf)}
        if greedy is not None:
            details["greedy_cost"] = greedy.cost
        if problem.infeasible:
            res = None
        else:
            cutoff = None if greedy is None else greedy.cost * (1 + 1e-9) + 1e-9
            remaining = self.seconds - (time.perf_counter() - started)
            solving = time.perf_counter()
            res = problem.milp.solve(remaining, cutoff, self.gap)
            details["solver_seconds"] = time.perf_counter() - solving
            details["status"] = _STATUS.get(res.status, str(res.status))
            details["message"] = res.message
            details["nodes"] = res.get("mip_node_count")
        bound = None if res is None else res.get("mip_dual_bound")
        result = None
        if res is not None and res.x is not None:
            choice = problem.decode(res.x)
            result = finish(eg, self.model, pricing, choice, roots, self.name, started, details)
            result.details["objective"] = float(res.fun)
        if result is None or (greedy is not None and greedy.cost < result.cost):
            if greedy is None:
                raise ExtractionError(f"no legal program computes the outputs under target "
                                      f"{self.model.target}"
                                      + ("" if res is None else f" ({res.message})"))
            result = greedy
            # the ILP's objective (if it found a program) is not this program's cost
            result.details = dict(details, kept="greedy-dag", objective=None)
            result.extractor = self.name
        proved_optimal = res is not None and res.status in (0, 2)
        if proved_optimal:
            # status 2 with a cutoff: nothing beats the greedy answer
            gap = 0.0 if res.status == 2 or res.get("mip_gap") is None else res.mip_gap
        elif bound is not None and math.isfinite(bound) and result.cost > 0:
            gap = max(0.0, (result.cost - bound) / result.cost)
        else:
            gap = None
        result.details["gap"] = gap
        result.details["bound"] = bound
        result.seconds = time.perf_counter() - started
        return result

    # ---- for tests: the ILP objective of one given choice ----
    def objective_of(self, eg: SerializedEGraph, roots: list[int],
                     choice: dict[int, int]) -> float | None:
        """Solve with x fixed to `choice` (restricted to what the roots need): the objective, or
        None when the ILP finds the choice infeasible."""
        pricing = Pricing(eg, self.model, self.objective)
        problem = _Problem(eg, roots, pricing, frozenset())
        if problem.infeasible:
            return None
        def chosen(c: int) -> bool:
            return c not in pricing.constant and c in choice

        needed = reachable([r for r in roots if chosen(r)],
                           lambda c: [ch for ch in eg.nodes[choice[c]].children if chosen(ch)])
        fixed = {j: 0.0 for j in problem.x.values()}
        for c in needed:
            j = problem.x.get(choice[c])
            if j is None:
                return None                       # a node the model ruled out
            fixed[j] = 1.0
        res = problem.milp.solve(60.0, None, 1e-9, fixed)
        return None if res.x is None else float(res.fun)


def _body_depth(eg: SerializedEGraph, extraction: Extraction) -> int:
    """How deep the deepest kernel body of a program reaches (inline operations below its root,
    as `_Problem._reach` counts them)."""
    choice, constant = extraction.choice, extraction.constant
    deepest = 0
    for k in extraction.kernels:
        node = eg.nodes[choice[k]]
        start = node.children[0] if node.op == "Mat" else k
        depth = {start: 0}
        queue = deque([start])
        while queue:
            c = queue.popleft()
            n = eg.nodes[choice[c]]
            if c in constant or n.op in ("Mat", "Input"):
                continue
            deepest = max(deepest, depth[c])
            for ch in n.children:
                if ch not in depth:
                    depth[ch] = depth[c] + (0 if eg.class_sort[ch] == "TList" else 1)
                    queue.append(ch)
    return deepest


def _pick_horizon(reaches: dict[int, list[tuple[int, int]]], budget: int, least: int) -> float:
    """The deepest horizon whose (node, kernel) pairs fit `budget` (never below `least`)."""
    depths = sorted(d for members in reaches.values() for _, d in members)
    if len(depths) <= budget:
        return math.inf
    return max(least, depths[budget] - 1)


_STATUS = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded", 4: "other"}


class _Problem:
    """The MILP of one extraction (see the module docstring)."""

    def __init__(self, eg: SerializedEGraph, roots: list[int], pricing: Pricing,
                 forbid: frozenset[int], horizon: float | None = math.inf,
                 pair_budget: int = 60000, least_horizon: int = 0):
        """`horizon`: how deep (in inline operations below the body root) a kernel body may
        reach; None picks the deepest that keeps the (node, kernel) pairs within `pair_budget`,
        but never less than `least_horizon` (the depth of a program that must stay feasible)."""
        self.eg, self.pricing = eg, pricing
        self.model = pricing.model
        self.constant = constant = pricing.constant
        self.milp = Milp()
        self.infeasible = False
        self._h_later: list[tuple[int, int, int]] = []   # (parent, child node, child class)
        nodes = eg.nodes
        self.roots = roots = list(dict.fromkeys(roots))

        # ---- which nodes can be part of a program at all ----
        relevant = reachable([r for r in roots if r not in constant],
                             lambda c: [ch for n in eg.class_nodes[c] for ch in nodes[n].children
                                        if ch not in constant])
        available = self._available(relevant, forbid | duplicate_nodes(eg))
        self.avail = avail = {c: [n for n in eg.class_nodes[c] if n in available]
                              for c in relevant}
        if any(not avail[r] for r in roots if r not in constant):
            self.infeasible = True
            return
        bnd = {c: [n for n in avail[c] if nodes[n].op in _BOUNDARY_OPS] for c in relevant}
        inl = {c: [n for n in avail[c] if nodes[n].op not in _BOUNDARY_OPS] for c in relevant}
        root_set = set(roots)
        self._structure(relevant, root_set, avail)
        self._placement_legality(relevant, inl)
        self._kernels(relevant, root_set, avail, bnd, inl, horizon, pair_budget, least_horizon)

    # ---- parts of the model ----
    def _structure(self, relevant: set[int], root_set: set[int],
                   avail: dict[int, list[int]]) -> None:
        """Choice variables and the structure of a program: one node per needed class, a chosen
        node's children needed, a class needed only if a chosen node uses it, no cycle."""
        lp, nodes, constant = self.milp, self.eg.nodes, self.constant
        self.x = x = {n: lp.var(integer=True) for c in relevant for n in avail[c]}
        users: dict[int, list[int]] = defaultdict(list)
        for c in relevant:
            # The children of a chosen node are needed, and so are the classes a child forces (a
            # child class with one node forces that node's children: Relu(Mat c) needs c as
            # surely as Relu(c) does). At most one node of c is chosen, so the nodes of c that
            # need a class share one row: a much tighter relaxation than a row per node.
            needs: dict[int, list[int]] = defaultdict(list)
            for n in avail[c]:
                for ch in set(nodes[n].children):
                    if ch not in constant:
                        users[ch].append(n)
                for d in self._forced(n, avail):
                    needs[d].append(n)
            for d, ns in needs.items():
                lp.row([(x[n], 1.0) for n in ns] + [(x[k], -1.0) for k in avail[d]], upper=0.0)
        for c in relevant:
            terms = [(x[n], 1.0) for n in avail[c]]
            if c in root_set:
                lp.row(terms, 1.0, 1.0)
            else:
                lp.row(terms, upper=1.0)
                lp.row(terms + [(x[p], -1.0) for p in users.get(c, ())], upper=0.0)
        self._acyclic(relevant, avail)

    def _placement_legality(self, relevant: set[int], inl: dict[int, list[int]]) -> None:
        """Legality that holds wherever a node sits: pair rows for edges that are never legal
        or legal only above an anchor, and `H` rows for those legal only above none."""
        eg, lp, x, model, constant = self.eg, self.milp, self.x, self.model, self.constant
        nodes = eg.nodes
        needs_h: set[int] = set()
        for c in relevant:
            for p in inl[c]:
                parent = nodes[p]
                for ch in set(parent.children):
                    if ch in constant or eg.class_sort[ch] == "TList":
                        continue
                    illegal, conditional = [], []
                    for n in inl[ch]:
                        if not maybe_inline_legal(model, parent.op, nodes[n].op):
                            illegal.append(n)
                        elif (inline_legal(model, parent.op, nodes[n].op, False)
                              != inline_legal(model, parent.op, nodes[n].op, True)):
                            conditional.append(n)
                    if illegal:
                        lp.row([(x[p], 1.0)] + [(x[n], 1.0) for n in illegal], upper=1.0)
                    for n in conditional:
                        if inline_legal(model, parent.op, nodes[n].op, True):
                            # legal only above an anchor: n must hold an inline child (every
                            # legal inline child of n then holds an anchor; see inline_legal)
                            kids = [k for g in set(nodes[n].children) if g not in constant
                                    for k in inl[g]]
                            lp.row([(x[p], 1.0), (x[n], 1.0)] + [(x[k], -1.0) for k in kids],
                                   upper=1.0)
                        else:
                            needs_h.add(ch)
                            self._h_later.append((p, n, ch))
        self._has_anchor(needs_h, relevant, inl)

    def _kernels(self, relevant: set[int], root_set: set[int], avail, bnd, inl,
                 horizon: float | None, pair_budget: int, least_horizon: int) -> None:
        """A kernel per class with a `Mat` node (and per root), each over the nodes that may be
        inline in its body down to `horizon` (None: the deepest that fits `pair_budget`)."""
        lp, x, nodes, roots = self.milp, self.x, self.eg.nodes, self.roots
        prices = self.pricing.prices
        self.m: dict[tuple[int, int], int] = {}
        kernels = [c for c in relevant if bnd[c] and any(nodes[n].op == "Mat" for n in bnd[c])]
        kernels += [r for r in roots if r in relevant and r not in kernels]
        self.homes: dict[int, list[int]] = defaultdict(list)    # node -> its m/alias variables
        reaches = {k: self._reach(k, k in root_set, avail, inl,
                                  math.inf if horizon is None else horizon) for k in kernels}
        if horizon is None:
            horizon = _pick_horizon(reaches, pair_budget, least_horizon)
        self.horizon = horizon
        self.pairs = 0
        for k in kernels:
            members = [(n, d) for n, d in reaches[k] if d <= horizon]
            self.pairs += len(members)
            self._kernel(k, k in root_set, avail, bnd, inl, prices, members)
        # A chosen inline node is computed in at least one kernel (a root that is a view is its
        # own alias). Not needed for exactness; it keeps the relaxation from spreading a node's
        # work thinly over many kernels.
        for c in relevant:
            if c in root_set and any(OPS[nodes[n].op].kind == "view" for n in inl[c]):
                continue
            for n in inl[c]:
                lp.row([(x[n], 1.0)] + [(j, -1.0) for j in self.homes.get(n, ())], upper=0.0)

    def _forced(self, n: int, avail: dict[int, list[int]], depth: int = 4) -> set[int]:
        """Classes every program choosing node n needs, `depth` levels down: its children, and
        what every node of such a child needs (Relu(Mat c) needs c as surely as Relu(c) does;
        Add(Mat c, y) and Add(c, y) both need c)."""
        out: set[int] = set()
        for ch in self.eg.nodes[n].children:
            if ch not in self.constant:
                out.add(ch)
                out |= self._needed_by(ch, avail, depth - 1)
        return out

    def _needed_by(self, c: int, avail: dict[int, list[int]], depth: int) -> frozenset[int]:
        """Classes every available node of class c needs, `depth` levels down (memoized)."""
        cache = self.__dict__.setdefault("_needed_cache", {})
        key = (c, depth)
        if key not in cache:
            result: set[int] | None = None
            if depth > 0:
                for n in avail.get(c, ()):
                    needs = self._forced(n, avail, depth)
                    result = needs if result is None else result & needs
                    if not result:
                        break
            cache[key] = frozenset(result or ())
        return cache[key]

    def _available(self, relevant: set[int], forbid: frozenset[int]) -> set[int]:
        """Nodes that can be chosen: not forbidden, no child of their own class, no child that
        nothing can compute (to a fixed point)."""
        eg, constant = self.eg, self.constant
        candidates = {n for c in relevant for n in eg.class_nodes[c]
                      if n not in forbid and eg.nodes[n].eclass not in eg.nodes[n].children
                      and eg.nodes[n].op not in ("Const", "Scalar", "Ints", "Absent")}
        live_class = set(constant)
        live: set[int] = set()
        waiting: dict[int, list[int]] = defaultdict(list)
        missing: dict[int, int] = {}
        ready = []
        for n in candidates:
            kids = {ch for ch in eg.nodes[n].children if ch not in constant}
            missing[n] = len(kids)
            for ch in kids:
                waiting[ch].append(n)
            if not kids:
                ready.append(n)
        while ready:
            n = ready.pop()
            live.add(n)
            c = eg.nodes[n].eclass
            if c in live_class:
                continue
            live_class.add(c)
            for user in waiting.get(c, ()):
                missing[user] -= 1
                if missing[user] == 0:
                    ready.append(user)
        return live

    def _acyclic(self, relevant: set[int], avail: dict[int, list[int]]) -> None:
        """Order variables inside each strongly connected component of the class graph."""
        eg, lp, x = self.eg, self.milp, self.x
        edges = {c: sorted({ch for n in avail[c] for ch in eg.nodes[n].children
                            if ch in relevant}) for c in relevant}
        for component in strongly_connected(edges):
            if len(component) < 2:
                continue
            size = float(len(component))
            order = {c: lp.var(0.0, 0.0, size - 1) for c in component}
            for c in component:
                for n in avail[c]:
                    for ch in set(eg.nodes[n].children):
                        if ch in order:
                            # chosen n: order[c] >= order[ch] + 1
                            lp.row([(order[c], 1.0), (order[ch], -1.0), (x[n], -size)],
                                   lower=1.0 - size)

    def _has_anchor(self, needed: set[int], relevant: set[int],
                    inl: dict[int, list[int]]) -> None:
        """H[c] >= 1 when c's chosen node is inline and its inline body holds an anchor."""
        eg, lp, x, constant = self.eg, self.milp, self.x, self.constant
        h: dict[int, int] = {}
        stack = list(needed)
        while stack:
            c = stack.pop()
            if c in h:
                continue
            h[c] = lp.var()
            for n in inl[c]:
                if not is_anchor(eg.nodes[n].op):
                    stack.extend(ch for ch in eg.nodes[n].children
                                 if ch not in constant and ch not in h)
        for c, hc in h.items():
            for n in inl[c]:
                if is_anchor(eg.nodes[n].op):
                    lp.row([(hc, 1.0), (x[n], -1.0)], lower=0.0)
                    continue
                for ch in set(eg.nodes[n].children):
                    if ch in h:
                        lp.row([(hc, 1.0), (x[n], -1.0), (h[ch], -1.0)], lower=-1.0)
        for p, n, ch in self._h_later:
            # legal only while the child's body holds no anchor
            lp.row([(x[p], 1.0), (x[n], 1.0), (h[ch], 1.0)], upper=2.0)

    def _reach(self, k: int, is_root: bool, avail, inl, horizon: float) -> list[tuple[int, int]]:
        """The nodes that may be inline in kernel k's body, with the least depth each is reached
        at (breadth first, through inline-legal edges; operand lists add no depth)."""
        eg, nodes, model, constant = self.eg, self.eg.nodes, self.model, self.constant
        depth_of: dict[int, int] = {}
        frontier: deque[int] = deque()
        starts = [nodes[M].children[0] for M in avail.get(k, ()) if nodes[M].op == "Mat"]
        starts = [b for b in starts if b not in constant]
        for n in [n for b in starts for n in inl[b]] + (list(inl[k]) if is_root else []):
            if OPS[nodes[n].op].kind != "view" and n not in depth_of:
                depth_of[n] = 0
                frontier.append(n)
        while frontier:
            p = frontier.popleft()
            depth, parent = depth_of[p], nodes[p]
            for ch in set(parent.children):
                if ch in constant:
                    continue
                is_list = eg.class_sort[ch] == "TList"
                below = depth if is_list else depth + 1
                if below > horizon:
                    continue
                for n in inl[ch]:
                    if n in depth_of or not (is_list or
                                             maybe_inline_legal(model, parent.op, nodes[n].op)):
                        continue
                    depth_of[n] = below
                    frontier.append(n)
        return list(depth_of.items())

    def _kernel(self, k: int, is_root: bool, avail, bnd, inl, prices,
                reach: list[tuple[int, int]]) -> None:
        """Membership, reads, launch, bytes and anchors of the kernel of class k.

        Membership is stated as a cover: a class K's body uses (mc) is computed inline by one of
        its nodes (m <= x) or read as a boundary (r <= its boundary nodes' x). At integer points
        that is exact; in the LP relaxation it makes fractional choices pay their share.
        """
        eg, lp, x, pricing, constant = self.eg, self.milp, self.x, self.pricing, self.constant
        nodes, model = eg.nodes, self.model
        m = self.m
        mc: dict[int, int] = {}
        members: dict[int, list[int]] = defaultdict(list)   # class -> its m variables in K
        member_nodes: dict[int, list[int]] = defaultdict(list)   # ... and their nodes
        reads: dict[int, int] = {}
        launched: list[tuple[int, float]] = []       # terms of "K runs as a kernel" (0/1)
        inside: list[tuple[int, int]] = []           # (node, its m variable)

        # K runs as a kernel (an alias has no members): one of its Mat nodes, or as a root an
        # inline node of its own, is chosen
        active = [(x[M], -1.0) for M in avail.get(k, ()) if nodes[M].op == "Mat"]
        if is_root:
            active += [(x[n], -1.0) for n in inl[k] if OPS[nodes[n].op].kind != "view"]

        def read_var(c: int) -> int:
            if c not in reads:
                reads[c] = lp.var()
                if c not in constant:
                    lp.row([(reads[c], 1.0)] + [(x[q], -1.0) for q in bnd[c]], upper=0.0)
            return reads[c]

        # the classes a body of K starts from; a contraction below them carries an epilogue
        body_roots = {nodes[M].children[0] for M in avail.get(k, ()) if nodes[M].op == "Mat"}
        if is_root:
            body_roots.add(k)

        def member(n: int) -> tuple[int, bool]:
            key = (n, k)
            if key in m:
                return m[key], False
            below = nodes[n].eclass not in body_roots
            m[key] = j = lp.var(pricing.work(n) + (pricing.epilogue(n) if below else 0.0))
            self.homes[n].append(j)
            lp.row([(j, 1.0), (x[n], -1.0)], upper=0.0)
            members[nodes[n].eclass].append(j)
            member_nodes[nodes[n].eclass].append(n)
            inside.append((n, j))
            return j, True

        for n, _ in reach:
            member(n)
        for M in avail.get(k, ()):
            if nodes[M].op != "Mat":
                continue
            b = nodes[M].children[0]
            launched.append((x[M], 1.0))
            if b in constant:
                lp.row([(read_var(b), 1.0), (x[M], -1.0)], lower=0.0)
                continue
            cover = [(read_var(b), 1.0)] if bnd[b] else []
            for n in inl[b]:
                if OPS[nodes[n].op].kind == "view":    # an alias: the view alone, no launch
                    alias = lp.var(pricing.work(n))
                    self.homes[n].append(alias)
                    lp.row([(alias, 1.0), (x[M], -1.0)], upper=0.0)
                    lp.row([(alias, 1.0), (x[n], -1.0)], upper=0.0)
                    launched.append((alias, -1.0))
                    cover.append((alias, 1.0))
                    continue
                cover.append((m[(n, k)], 1.0))
            lp.row(cover + [(x[M], -1.0)], lower=0.0)
        if is_root:
            for n in inl[k]:
                if OPS[nodes[n].op].kind == "view":    # a root that is a view: an alias
                    lp.cost[x[n]] += pricing.work(n)
                    continue
                launched.append((x[n], 1.0))
                lp.row([(m[(n, k)], 1.0), (x[n], -1.0)], lower=0.0)
        # a class is used by K's body if one of its in-K users is; the users of one class share
        # a row (at most one of them is chosen)
        for parent_class, js in members.items():
            by_child: dict[int, list[int]] = defaultdict(list)
            for n, j in zip(member_nodes[parent_class], js):
                for ch in set(nodes[n].children):
                    by_child[ch].append(j)
            for ch, users_in_k in by_child.items():
                if ch in constant:
                    target = read_var(ch)
                else:
                    if ch not in mc:
                        mc[ch] = lp.var()
                    target = mc[ch]
                lp.row([(target, 1.0)] + [(j, -1.0) for j in users_in_k], lower=0.0)
        for c, j in mc.items():
            cover = [(i, 1.0) for i in members.get(c, ())]
            if bnd[c]:
                cover.append((read_var(c), 1.0))
            lp.row(cover + [(j, -1.0)], lower=0.0)

        self._kernel_prices(k, reads, launched, inside, active, prices)

    def _kernel_prices(self, k: int, reads: dict[int, int], launched: list[tuple[int, float]],
                       inside: list[tuple[int, int]], active: list[tuple[int, float]],
                       prices) -> None:
        """The objective terms of the kernel of class k (launch, bytes moved at the on-chip or
        main-memory rate) and its limit on anchors."""
        lp, pricing, nodes, model = self.milp, self.pricing, self.eg.nodes, self.model
        write = pricing.bytes(k)
        moved = [(reads[c], pricing.bytes(c)) for c in reads] + [(j, write * a)
                                                                  for j, a in launched]
        for j, a in launched:
            lp.cost[j] += prices.launch * a
        most = sum(pricing.bytes(c) for c in reads) + write
        onchip = prices.onchip_bytes
        if most <= onchip or prices.onchip_byte == prices.byte:
            rate = prices.onchip_byte if most <= onchip else prices.byte
            for j, a in moved:
                lp.cost[j] += rate * a
        else:
            for j, a in moved:
                lp.cost[j] += prices.onchip_byte * a
            fits = lp.var(integer=True)
            excess = lp.var(prices.byte - prices.onchip_byte, 0.0, most)
            # fits only if the bytes fit; otherwise every byte pays the main-memory price
            lp.row(moved + [(fits, most - onchip)], upper=most)
            lp.row([(excess, 1.0), (fits, most)] + [(j, -a) for j, a in moved], lower=0.0)

        anchors = [j for n, j in inside if is_anchor(nodes[n].op)]
        if len(anchors) > model.max_anchors:
            lp.row([(j, 1.0) for j in anchors] + [(j, a * model.max_anchors) for j, a in active],
                   upper=0.0)

    # ---- reading the answer ----
    def decode(self, values: np.ndarray) -> dict[int, int]:
        chosen: dict[int, int] = {}
        for n, j in self.x.items():
            if values[j] > 0.5:
                chosen[self.eg.nodes[n].eclass] = n
        picks = self.pricing.constant_pick
        return choice_from(self.eg, self.roots,
                           lambda c: picks[c] if c in self.constant else chosen.get(c))
