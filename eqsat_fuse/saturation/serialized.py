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

from ..frontend.encode import constructor_sorts
from ..dims import broadcast_shapes, evaluate

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
    """Read the e-graph into `SerializedEGraph`: from its frozen tables (`freeze()`, fast) when
    it is a live egglog e-graph, else from its JSON export (an e-graph received as one)."""
    if hasattr(egraph, "freeze"):
        return read_frozen(egraph)
    return parse_export(json.loads(egraph.serialize([]).to_json()))


def read_frozen(egraph: bindings.EGraph) -> SerializedEGraph:
    """Read a live e-graph through `freeze()`: its function tables, with e-class values canonical.

    The same data as `parse_export` reads from the JSON export, about ten times faster on large
    e-graphs (the export and its parse dominate otherwise).
    """
    constructors = constructor_sorts()
    functions = egraph.freeze().functions
    class_index: dict[tuple[str, Any], int] = {}
    class_sort: list[str] = []
    class_ids: list[str] = []

    def term_class(value, sort: str) -> int:
        key = (sort, value)
        index = class_index.get(key)
        if index is None:
            index = class_index[key] = len(class_ids)
            class_sort.append(sort)
            class_ids.append(f"{sort}-{str(value).removeprefix('Value(').rstrip(')')}")
        return index

    readers = {"i64": egraph.value_to_i64, "f64": egraph.value_to_f64,
               "String": egraph.value_to_string, "bool": egraph.value_to_bool}

    def primitive(value, sort: str):
        if sort == "IVec":
            return tuple(egraph.value_to_i64(item) for item in egraph.value_to_vec(value))
        if sort in readers:
            return readers[sort](value)
        raise ValueError(f"cannot read a primitive of sort {sort}")

    nodes: list[ENode] = []
    for name, function in functions.items():
        if name not in constructors or function.output_sort not in TERM_SORTS:
            continue
        sorts = function.input_sorts
        terms = [i for i, sort in enumerate(sorts) if sort in TERM_SORTS]
        values = [i for i, sort in enumerate(sorts) if sort not in TERM_SORTS]
        for row in function.rows:
            inputs = row.inputs
            nodes.append(ENode(
                op=name, eclass=term_class(row.output, function.output_sort),
                children=tuple(term_class(inputs[i], sorts[i]) for i in terms),
                attrs=tuple(primitive(inputs[i], sorts[i]) for i in values)))
    class_nodes: list[list[int]] = [[] for _ in class_ids]
    for index, node in enumerate(nodes):
        class_nodes[node.eclass].append(index)

    lets: dict[str, int] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    dtypes: dict[int, str] = {}
    relations: dict[str, set[int]] = {}
    for name, function in functions.items():
        sorts = function.input_sorts
        if function.is_let_binding:
            if function.output_sort in TERM_SORTS and function.rows:
                key = (function.output_sort, function.rows[0].output)
                if key in class_index:
                    lets[name] = class_index[key]
            continue
        if len(sorts) != 1 or sorts[0] not in TERM_SORTS:
            continue
        for row in function.rows:
            c = class_index.get((sorts[0], row.inputs[0]))
            if c is None:
                continue
            if name == "shape":
                shapes[c] = primitive(row.output, function.output_sort)
            elif name == "dtype":
                dtypes[c] = primitive(row.output, function.output_sort)
            elif function.output_sort.startswith("@"):
                relations.setdefault(name, set()).add(c)
    return SerializedEGraph(nodes=nodes, class_nodes=class_nodes, class_sort=class_sort,
                            class_ids=class_ids, shapes=shapes, dtypes=dtypes, lets=lets,
                            relations=relations)


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


def with_dims(eg: SerializedEGraph, convert) -> SerializedEGraph:
    """A copy of `eg` whose shapes and IVec attributes went through `convert` (an int -> the
    dim its code stands for, `dims.DimCodes.dim`, or a dim -> its value under a binding)."""
    def attr(value):
        return tuple(convert(v) for v in value) if isinstance(value, tuple) else value

    nodes = [ENode(n.op, n.eclass, n.children, tuple(attr(a) for a in n.attrs))
             if any(isinstance(a, tuple) for a in n.attrs) else n for n in eg.nodes]
    return SerializedEGraph(nodes=nodes, class_nodes=eg.class_nodes, class_sort=eg.class_sort,
                            class_ids=eg.class_ids,
                            shapes={c: tuple(convert(d) for d in s) for c, s in eg.shapes.items()},
                            dtypes=eg.dtypes, lets=eg.lets, relations=eg.relations)


def read_for_extraction(egraph: bindings.EGraph, codes, binding: dict | None
                        ) -> tuple[SerializedEGraph, SerializedEGraph]:
    """The e-graph as extraction reads it, twice: with its shapes and view attributes as dims
    (`codes`: the encoding's `dims.DimCodes`), for decoding, and with each dim's value under
    `binding`, for the cost model. The same object for a static-shape model (codes None)."""
    serialized = read_egraph(egraph)
    if codes is None:
        fill_missing_facts(serialized)
        return serialized, serialized
    serialized = with_dims(serialized, codes.dim)      # e-graph codes -> dims
    fill_missing_facts(serialized)
    return serialized, priced_at(serialized, binding)


def priced_at(eg: SerializedEGraph, binding: dict) -> SerializedEGraph:
    """`eg` (shapes as dims) with each dim's value under `binding`: what the cost model reads."""
    return with_dims(eg, lambda d: evaluate(d, binding))


def fill_missing_facts(eg: SerializedEGraph) -> None:
    """Give a shape and dtype to classes that rules created without stating them.

    Only forms whose result follows from their children alone: Mat, elementwise ops
    (broadcasting), literals, Cast and the views that carry their output shape.
    """
    from ..ops import OPS

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
        slot = ops[op].dtype_slot if op in ops else 0
        dtype_from = node.children[slot] if len(node.children) > slot else None
        dtype = node.attrs[0] if op == "Cast" else eg.dtypes.get(dtype_from)
        if op == "BatchNormalization" or op == "Clip":
            shapes = shapes[:1]
        if all(s is not None for s in shapes) and shapes:
            try:
                return broadcast_shapes(*shapes), dtype
            except ValueError:
                return None, dtype
        return None, dtype
    if op in ("MatMul", "Gemm") and len(children) >= 2:
        return _contraction_shape(eg, node, children), eg.dtypes.get(children[0])
    if op == "Concat" and children:
        items = _list_items(eg, children[0])
        shapes = [eg.shapes.get(i) for i in items]
        if not items or any(s is None for s in shapes):
            return None, eg.dtypes.get(items[0]) if items else None
        axis = node.attrs[0] % len(shapes[0])
        shape = list(shapes[0])
        shape[axis] = sum(s[axis] for s in shapes)
        return tuple(shape), eg.dtypes.get(items[0])
    if op == "Split" and children and children[0] in eg.shapes:
        sizes, axis, index = node.attrs
        shape = list(eg.shapes[children[0]])
        shape[axis % len(shape)] = sizes[index]
        return tuple(shape), eg.dtypes.get(children[0])
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


def _contraction_shape(eg: SerializedEGraph, node: ENode, children: list[int]):
    a, b = eg.shapes.get(children[0]), eg.shapes.get(children[1])
    if a is None or b is None:
        return None
    if node.op == "Gemm":
        trans_a, trans_b = node.attrs[2], node.attrs[3]
        return (a[1] if trans_a else a[0], b[0] if trans_b else b[1])
    if len(a) < 2 or len(b) < 2:
        return None
    try:
        batch = broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    except ValueError:
        return None
    return tuple(batch) + (a[-2], b[-1])


def _list_items(eg: SerializedEGraph, c: int) -> list[int]:
    """The tensor classes of an operand list (the first TCons chain found)."""
    items, seen = [], set()
    while c not in seen:
        seen.add(c)
        cons = next((eg.nodes[n] for n in eg.class_nodes[c] if eg.nodes[n].op == "TCons"), None)
        if cons is None:
            break
        items.append(cons.children[0])
        c = cons.children[1]
    return items


def _is_absent(eg: SerializedEGraph, c: int) -> bool:
    return any(eg.nodes[n].op == "Absent" for n in eg.class_nodes[c])
