"""The e-graph as plain Python data, read from egglog's JSON export (the egraph-serialize format).

Only tensor terms (sorts T and TList) become `ENode`s. Primitive values (i64, f64, String, IVec)
become the attributes of the nodes that use them, in constructor order. The `shape` and `dtype`
facts and any relations become per-class tables. Classes are numbered 0..n-1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings

from .encode import constructor_sorts

TERM_SORTS = ("T", "TList")


@dataclass(frozen=True)
class ENode:
    """One e-node of a tensor term: its op, its class, tensor children (classes) and attributes."""

    op: str
    eclass: int
    children: tuple[int, ...]
    attrs: tuple[Any, ...]


@dataclass
class SerializedEGraph:
    nodes: list[ENode]
    class_nodes: list[list[int]]                 # class -> its node indices
    class_sort: list[str]                        # class -> "T" | "TList"
    class_ids: list[str]                         # class -> egglog's id (for messages)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[int, str] = field(default_factory=dict)
    lets: dict[str, int] = field(default_factory=dict)          # let variable -> class
    relations: dict[str, set[int]] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_nodes)


def _primitive(op: str, sort: str, children: list[str], raw: dict) -> Any:
    if sort == "i64":
        return int(op)
    if sort == "f64":
        if op == "NaN":
            return math.nan
        return float(op)
    if sort == "String":
        return json.loads(op)
    if sort == "bool":
        return op == "true"
    if op == "vec-of":
        return tuple(_primitive(raw[c]["op"], "i64", [], raw) for c in children)
    raise ValueError(f"cannot read a primitive of sort {sort}: {op}")


def read_egraph(egraph: bindings.EGraph) -> SerializedEGraph:
    """Export the e-graph and read it into `SerializedEGraph`."""
    return parse_export(json.loads(egraph.serialize([]).to_json()))


def parse_export(data: dict) -> SerializedEGraph:
    """Read egglog's JSON export (already parsed) into `SerializedEGraph`."""
    constructors = constructor_sorts()
    raw_nodes: dict[str, dict] = data["nodes"]
    class_data: dict[str, dict] = data["class_data"]
    sort_of = {cid: info["type"] for cid, info in class_data.items()}

    class_index: dict[str, int] = {}
    class_sort: list[str] = []
    class_ids: list[str] = []
    for cid, sort in sort_of.items():
        if sort in TERM_SORTS:
            class_index[cid] = len(class_ids)
            class_ids.append(cid)
            class_sort.append(sort)
    # a class bound by several lets (after unions) lists them all: "$a, $b"
    lets = {name.strip(): class_index[cid] for cid, info in class_data.items()
            if "let" in info and cid in class_index for name in info["let"].split(",")}

    # primitive values per class (a class of a primitive sort holds one primitive node)
    values: dict[str, Any] = {}
    for nid, node in raw_nodes.items():
        if nid.startswith("primitive-"):
            values[node["eclass"]] = _primitive(node["op"], sort_of[node["eclass"]],
                                                node["children"], raw_nodes)

    nodes: list[ENode] = []
    class_nodes: list[list[int]] = [[] for _ in class_ids]
    shapes: dict[int, tuple[int, ...]] = {}
    dtypes: dict[int, str] = {}
    relations: dict[str, set[int]] = {}
    for nid, node in raw_nodes.items():
        if nid.startswith("primitive-"):
            continue
        op, eclass = node["op"], node["eclass"]
        child_classes = [raw_nodes[c]["eclass"] for c in node["children"]]
        if eclass in class_index and op in constructors:
            index = len(nodes)
            nodes.append(ENode(
                op=op, eclass=class_index[eclass],
                children=tuple(class_index[c] for c in child_classes if c in class_index),
                attrs=tuple(values[c] for c in child_classes if c not in class_index)))
            class_nodes[class_index[eclass]].append(index)
        elif op == "shape" and child_classes[0] in class_index:
            shapes[class_index[child_classes[0]]] = tuple(values[eclass])
        elif op == "dtype" and child_classes[0] in class_index:
            dtypes[class_index[child_classes[0]]] = values[eclass]
        elif sort_of.get(eclass, "").startswith("@") and all(c in class_index
                                                              for c in child_classes):
            if len(child_classes) == 1:
                relations.setdefault(op, set()).add(class_index[child_classes[0]])
    return SerializedEGraph(nodes=nodes, class_nodes=class_nodes, class_sort=class_sort,
                            class_ids=class_ids, shapes=shapes, dtypes=dtypes, lets=lets,
                            relations=relations)


def fill_missing_facts(eg: SerializedEGraph) -> None:
    """Give a shape and dtype to classes that rules created without stating them.

    Only forms whose result follows from their children alone: Mat, elementwise ops
    (broadcasting), literals, Cast and the views that carry their output shape.
    """
    from .ops import OPS

    changed = True
    while changed:
        changed = False
        for node in eg.nodes:
            c = node.eclass
            if eg.class_sort[c] != "T" or (c in eg.shapes and c in eg.dtypes):
                continue
            shape, dtype = _node_facts(eg, node, OPS)
            if shape is not None and c not in eg.shapes:
                eg.shapes[c] = shape
                changed = True
            if dtype is not None and c not in eg.dtypes:
                eg.dtypes[c] = dtype
                changed = True


def _node_facts(eg: SerializedEGraph, node: ENode, ops) -> tuple:
    op = node.op
    children = [ch for ch in node.children if ch in eg.shapes or not _is_absent(eg, ch)]
    if op == "Scalar":
        return (), node.attrs[1]
    if op == "Ints":
        return (len(node.attrs[0]),), "int64"
    if op == "Mat" or (op in ops and ops[op].kind == "elementwise"):
        shapes = [eg.shapes.get(ch) for ch in children]
        if op == "Where":
            dtype_from = children[1] if len(children) > 1 else None
        else:
            dtype_from = children[0] if children else None
        dtype = node.attrs[0] if op == "Cast" else eg.dtypes.get(dtype_from)
        if op == "BatchNormalization" or op == "Clip":
            shapes = shapes[:1]
        if all(s is not None for s in shapes) and shapes:
            try:
                import numpy as np
                return tuple(np.broadcast_shapes(*shapes)), dtype
            except ValueError:
                return None, dtype
        return None, dtype
    if op in ("Reshape", "Expand") and children:
        return tuple(node.attrs[0]), eg.dtypes.get(children[0])
    if op == "Transpose" and children and children[0] in eg.shapes:
        src = eg.shapes[children[0]]
        return tuple(src[p] for p in node.attrs[0]), eg.dtypes.get(children[0])
    if op == "Unsqueeze" and children and children[0] in eg.shapes:
        shape = list(eg.shapes[children[0]])
        for axis in sorted(node.attrs[0]):
            shape.insert(axis, 1)
        return tuple(shape), eg.dtypes.get(children[0])
    return None, None


def _is_absent(eg: SerializedEGraph, c: int) -> bool:
    return any(eg.nodes[n].op == "Absent" for n in eg.class_nodes[c])
