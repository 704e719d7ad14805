"""Random e-graphs shaped like the ones eqsat-fuse extracts from, for cross-checking extractors.

`random_egraph` draws a small ONNX-like DAG of operators (convolutions and MatMuls with constant
weights, elementwise ops, reductions, views, a Concat over an operand list) and builds the
e-graph that encoding plus fusion would: every operator's output has a `Mat` class around its
inline class, and the inline class holds the unfused node (reading `Mat` classes) plus
alternatives reading producers inline. On top: shared producers (several consumers), constant
expressions (folded weights), and a few cycles (nodes whose choice would make the program
cyclic: `Mat` of a view of itself, an inline alternative that reads a descendant).
`tree=True` draws e-graphs in which every program is a tree (each producer has one consumer,
each constant one reader, no cycles): there the program cost is the tree cost.

`all_choices` enumerates every choice of the classes a program needs, for brute force.
"""

from __future__ import annotations

import itertools
import random

from eqsat_fuse.ops import OPS
from eqsat_fuse.saturation.serialized import ENode, SerializedEGraph

_ATTRS = {
    "Conv": ((0, 0, 0, 0), (1, 1), (1, 1), 1),
    "MatMul": (),
    "Relu": (), "Sigmoid": (), "Add": (), "Mul": (), "BatchNormalization": (1e-5,),
    "Softmax": (-1,), "ReduceMean": ((-1,), 1),
    "Reshape": ((1, -1),), "Transpose": ((1, 0, 2, 3),),
    "Concat": (1,),
}


class _Builder:
    def __init__(self):
        self.nodes: list[ENode] = []
        self.class_nodes: list[list[int]] = []
        self.class_sort: list[str] = []
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.dtypes: dict[int, str] = {}

    def new_class(self, shape=None, sort="T") -> int:
        c = len(self.class_nodes)
        self.class_nodes.append([])
        self.class_sort.append(sort)
        if shape is not None:
            self.shapes[c] = tuple(shape)
            self.dtypes[c] = "float32"
        return c

    def add(self, op: str, c: int, children=(), attrs=None) -> int:
        node = ENode(op, c, tuple(children), _ATTRS.get(op, ()) if attrs is None else attrs)
        if node in (self.nodes[i] for i in self.class_nodes[c]):
            return -1
        self.nodes.append(node)
        self.class_nodes[c].append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def build(self) -> SerializedEGraph:
        return SerializedEGraph(nodes=self.nodes, class_nodes=self.class_nodes,
                                class_sort=self.class_sort,
                                class_ids=[f"c{i}" for i in range(len(self.class_nodes))],
                                shapes=self.shapes, dtypes=self.dtypes)


def random_egraph(rnd: random.Random, ops: int = 6, tree: bool = False,
                  cycles: bool = True) -> tuple[SerializedEGraph, list[int]]:
    """(e-graph, root classes)."""
    b = _Builder()
    sizes = [(1, 4, 4, 4), (1, 8, 16, 16), (1, 16, 32, 32), (1, 64, 64, 64)]

    def leaf(op: str, shape) -> int:
        c = b.new_class(shape)
        b.add(op, c, (), (f"{op.lower()}{c}",))
        return c

    def weight(shape) -> int:
        """A constant: a Const, or (sometimes) a folded expression over constants."""
        w = leaf("Const", shape)
        if rnd.random() < 0.3:
            k = leaf("Const", shape)
            folded = b.new_class(shape)
            b.add("Mul", folded, (w, k))
            return folded
        return w

    # values: (inline class or None, boundary class, kind of the producer)
    values = [(None, leaf("Input", rnd.choice(sizes)), "leaf")]
    if rnd.random() < 0.5:
        values.append((None, leaf("Input", rnd.choice(sizes)), "leaf"))
    uses = [0] * len(values)
    for _ in range(ops):
        op = rnd.choice(["Conv", "Conv", "MatMul", "Relu", "Relu", "Sigmoid", "Add", "Add", "Mul",
                         "Mul", "BatchNormalization", "Softmax", "ReduceMean", "Reshape",
                         "Transpose", "Concat"])
        arity = 2 if op in ("Add", "Mul", "Concat") else 1
        free = [i for i, u in enumerate(uses) if not (tree and u)]
        if len(free) < arity:
            op, arity = "Relu", 1
            if not free:
                break
        picked = rnd.sample(free, arity)
        for i in picked:
            uses[i] += 1
        shape = rnd.choice(sizes)
        inline = b.new_class(shape)
        mat = b.new_class(shape)
        b.add("Mat", mat, (inline,))
        args = [values[i] for i in picked]
        kind = OPS[op].kind

        def operand_choices(arg):
            """Ways the op may read an argument: its boundary, or its inline class."""
            producer_inline, boundary, producer_kind = arg
            ways = [boundary]
            fusable = producer_kind in ("elementwise", "anchor", "reduction")
            if producer_inline is not None and fusable and kind in ("elementwise", "reduction"):
                ways.append(producer_inline)
            elif producer_inline is not None and rnd.random() < 0.15:
                ways.append(producer_inline)          # a form the target may refuse
            return ways

        if op == "Conv":
            extra = [weight((shape[1], 4, 1, 1))]
        elif op == "MatMul":
            extra = [weight((shape[-1], shape[-1]))]
        elif op == "BatchNormalization":
            extra = [weight((shape[1],)) for _ in range(4)]
        else:
            extra = []
        if op == "Concat":
            tail = b.new_class(sort="TList")
            b.add("TNil", tail)
            for arg in reversed(args):
                cell = b.new_class(sort="TList")
                b.add("TCons", cell, (arg[1], tail))
                tail = cell
            b.add("Concat", inline, (tail,))
        else:
            combos = list(itertools.product(*[operand_choices(a) for a in args]))
            rnd.shuffle(combos)
            for combo in combos[:max(1, len(combos) - rnd.randrange(2))]:
                b.add(op, inline, tuple(combo) + tuple(extra))
            base = tuple(a[1] for a in args) + tuple(extra)
            b.add(op, inline, base)
        if op == "BatchNormalization" and args[0][2] == "anchor" and rnd.random() < 0.5:
            # a BN folded into the convolution before it: Conv(x, w*k) in the BN's class
            b.add("Conv", inline, (args[0][1], weight((shape[1], 4, 1, 1))))
        values.append((inline, mat, kind))
        uses.append(0)
        if cycles and not tree and rnd.random() < 0.3:
            # Mat(Reshape(this Mat)) = this Mat: choosing it would be a cycle
            view = b.new_class(shape)
            b.add("Reshape", view, (mat,))
            b.add("Mat", mat, (view,))
        if cycles and not tree and rnd.random() < 0.2 and len(values) > 3:
            # an earlier producer gets an alternative that reads this later value
            earlier = rnd.choice([v for v in values[:-1] if v[0] is not None] or [values[-1]])
            if earlier[0] is not None:
                b.add("Relu", earlier[0], (mat,))
    roots = []
    unused = [i for i, u in enumerate(uses) if u == 0 and values[i][0] is not None]
    for i in unused[-2:] or [len(values) - 1]:
        inline, mat, _ = values[i]
        roots.append(inline if rnd.random() < 0.15 else mat)
    return b.build(), roots


def all_choices(eg: SerializedEGraph, roots: list[int], fixed: dict[int, int],
                limit: int = 20000):
    """Every choice of one node per needed class (classes in `fixed` keep their node), as
    dicts; stops after `limit` (returns whether it was complete as the generator's value)."""
    count = 0

    def extend(choice: dict[int, int], pending: list[int]):
        nonlocal count
        while pending and pending[-1] in choice:
            pending = pending[:-1]
        if not pending:
            count += 1
            yield dict(choice)
            return
        c = pending[-1]
        options = [fixed[c]] if c in fixed else eg.class_nodes[c]
        for n in options:
            if count >= limit:
                return
            choice[c] = n
            kids = [ch for ch in eg.nodes[n].children if ch not in choice]
            yield from extend(choice, pending[:-1] + kids)
            del choice[c]

    yield from extend({}, list(reversed(roots)))
