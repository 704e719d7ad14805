"""Stage 1, encode: `ir.Graph` -> an egglog program over the term language of `rules/lang.egg`.

One `(let ...)` per node (never one nested expression: egglog builds those in quadratic time).
Every node is wrapped in `(Mat ...)`, the unfused program; tensor data stays outside the e-graph
(`(Const "name")`, `(Input "name")`); shapes and dtypes enter as facts. Names taken from the model
never reach the program text unless they are plain identifiers: other names are replaced by a
key (`#3`), so a model cannot inject egglog text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from ..dims import DimCodes
from ..graphs import postorder
from ..ir import Graph, Node, TensorInfo
from ..ops import OPS
from ..resources import data_dir

_SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,80}")


@dataclass
class Encoding:
    """The model as egglog program text, and how to map the e-graph back to the model."""

    program: str
    leaf_keys: dict[str, str]                # egglog string key -> input or initializer name
    value_vars: dict[str, str]               # value name -> egglog variable of its term
    output_vars: dict[str, str]              # graph output -> egglog variable
    opaque_nodes: dict[int, Node] = field(default_factory=dict)
    lets: int = 0
    # the model's own terms: inner variable -> (op, variables of its tensor arguments); lets the
    # explanation tell a node the encoder wrote from one a rule added
    originals: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # symbolic dims as the e-graph's integers (`dims.DimCodes`); None for static shapes
    dim_codes: DimCodes | None = None


@cache
def constructor_sorts() -> dict[str, tuple[tuple[str, ...], str]]:
    """The constructors declared in rules/lang.egg: name -> (argument sorts, result sort)."""
    path = data_dir("rules") / "lang.egg"
    from egglog import bindings     # here: egglog's import (0.2 s) only where rules are read
    commands = bindings.EGraph().parse_program(path.read_text(), filename=str(path))
    return {c.name: (tuple(c.schema.input), c.schema.output)
            for c in commands if type(c).__name__ == "Constructor"}


def render_value(value, sort: str, codes: DimCodes | None = None) -> str:
    """An attribute value as egglog literal text of the given sort (symbolic dims as `codes`)."""
    if sort == "i64":
        return str(codes.code(value) if codes is not None else int(value))
    if sort == "f64":
        return render_float(float(value))
    if sort == "String":
        text = str(value)
        if not re.fullmatch(r"[A-Za-z0-9_.:/#+-]*", text):
            raise ValueError(f"refusing to put {text!r} into egglog text")
        return f'"{text}"'
    if sort == "IVec":
        items = [str(codes.code(v) if codes is not None else int(v)) for v in value]
        return f"(vec-of {' '.join(items)})" if items else "(vec-empty)"
    raise ValueError(f"no literal form for sort {sort}")


def render_float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def _facts(var: str, info: TensorInfo, codes: DimCodes | None = None) -> list[str]:
    """The shape and dtype facts of one value."""
    return [f"(set (shape {var}) {render_value(info.shape, 'IVec', codes)})",
            f'(set (dtype {var}) "{info.dtype}")']


def _splat_value(value) -> float | None:
    """The value of a one-element numeric constant (a scalar such as an epsilon or a 0.5),
    else None. Larger constants get no value fact, even when all their elements are equal:
    an all-zero bias is data, and identities such as x + 0 = x on it would only close loops."""
    if value.size != 1 or value.dtype.kind not in "fiu":
        return None
    return float(value.reshape(-1)[0])


def _value_facts(var: str, value) -> list[str]:
    """The facts about a model constant's values that rules may read: `scalar-value` of a
    one-element constant (`_splat_value`), and the relations the exact-mode rules of canon.egg
    rely on (declared in lang.egg), each true of every element:

    - `exact-reciprocal`: +-2^k whose reciprocal 2^-k is representable in the dtype, so that
      x / c and x * (1/c) round the same real number;
    - `fraction`: finite, 1e-6 <= |v| <= 1 (float32 and float64 only: a product of two of them
      is a normal number there, and neither x * a nor x * (a * b) can overflow);
    - `plus-zero`: +0.0, not -0.0;
    - `quant-scale`: finite, 2^-30 <= |v| <= 2^30 (float32 and float64): a quantization scale
      whose products with the integers of 16-bit types stay normal numbers, so that
      (q - z) * s / s rounds back to q - z, and whose dequantized 8-bit values multiply and
      sum in a float32 contraction without overflow (rules/quant.egg's integer rules).
    """
    lines = []
    splat = _splat_value(value)
    if splat is not None:
        lines.append(f"(set (scalar-value {var}) {render_float(splat)})")
    if value.dtype.kind != "f" or value.size == 0:
        return lines
    if _every(value, _exact_reciprocals):
        lines.append(f"(exact-reciprocal {var})")
    if value.dtype in (np.float32, np.float64) and _every(value, _fractions):
        lines.append(f"(fraction {var})")
    if _every(value, _plus_zeros):
        lines.append(f"(plus-zero {var})")
    if value.dtype in (np.float32, np.float64) and _every(value, _quant_scales):
        lines.append(f"(quant-scale {var})")
    return lines


def _every(value: np.ndarray, test) -> bool:
    """Whether `test` (elementwise) holds for every element of `value`: tried on the first 64
    elements first, so that a weight matrix, where it fails at once, costs no full-size pass."""
    with np.errstate(all="ignore"):
        return bool(np.all(test(value.reshape(-1)[:64]))) and bool(np.all(test(value)))


def _exact_reciprocals(v: np.ndarray) -> np.ndarray:
    reciprocal = np.reciprocal(v)
    return (np.abs(np.frexp(v)[0]) == 0.5) & np.isfinite(reciprocal) & (reciprocal * v == 1)


def _quant_scales(v: np.ndarray) -> np.ndarray:
    magnitude = np.abs(v)
    return (magnitude >= 2.0 ** -30) & (magnitude <= 2.0 ** 30)


def _fractions(v: np.ndarray) -> np.ndarray:
    magnitude = np.abs(v)
    return (magnitude >= 1e-6) & (magnitude <= 1)


def _plus_zeros(v: np.ndarray) -> np.ndarray:
    return (v == 0) & ~np.signbit(v)


def encode(graph: Graph) -> Encoding:
    """Write the graph as egglog lets: leaves, then one Mat-wrapped term per node output."""
    sorts = constructor_sorts()
    lines: list[str] = []
    value_vars: dict[str, str] = {}
    leaf_keys: dict[str, str] = {}
    opaque_nodes: dict[int, Node] = {}
    originals: dict[str, tuple[str, tuple[str, ...]]] = {}
    counter = 0
    codes = DimCodes() if graph.signature is not None else None

    def new_var(prefix: str) -> str:
        nonlocal counter
        counter += 1
        return f"${prefix}{counter}"

    def leaf(name: str, constructor: str) -> None:
        key = name if _SAFE_NAME.fullmatch(name) else f"#{len(leaf_keys)}"
        leaf_keys[key] = name
        var = new_var("l")
        lines.append(f'(let {var} ({constructor} "{key}"))')
        lines.extend(_facts(var, graph.values[name], codes))
        if constructor == "Input":
            lines.append(f"(dynamic {var})")
        value = graph.initializers.get(name) if constructor == "Const" else None
        if value is not None:
            lines.extend(_value_facts(var, value))
        value_vars[name] = var

    used = {i for n in graph.nodes for i in n.inputs if i} | set(graph.outputs)
    for name in graph.inputs:
        leaf(name, "Input")
    for name in graph.initializers:
        if name in used:
            leaf(name, "Const")

    def arg(value: str | None) -> str:
        return "(Absent)" if value is None else value_vars[value]

    def tensor_list(values: list[str | None]) -> str:
        text = "(TNil)"
        for value in reversed(values):
            text = f"(TCons {arg(value)} {text})"
        return text

    dynamic = set(graph.inputs)
    for index, node in enumerate(graph.nodes):
        spec = OPS[node.op]
        arg_sorts, _ = sorts[node.op]
        attr_sorts = arg_sorts[len(arg_sorts) - len(spec.attrs):]
        if node.op in ("Concat", "Opaque"):
            tensors = [tensor_list(node.inputs)]
        else:
            tensors = [arg(v) for v in node.inputs]
        if node.op == "Opaque":
            opaque_nodes[index] = node
        for out_index, output in enumerate(node.outputs):
            attrs = dict(node.attrs)
            if node.op == "Opaque":
                attrs.update(node=index, index=out_index)
            elif node.op == "Split":
                attrs["index"] = out_index
            rendered = [render_value(attrs[a], s, codes) for a, s in zip(spec.attrs, attr_sorts)]
            term = f"({node.op} {' '.join(tensors + rendered)})"
            inner, outer = new_var("i"), new_var("v")
            lines.append(f"(let {inner} {term})")
            originals[inner] = (node.op, tuple(value_vars[v] if v else "" for v in node.inputs))
            lines.append(f"(let {outer} (Mat {inner}))")
            info = graph.values[output]
            lines.extend(_facts(inner, info, codes))
            lines.extend(_facts(outer, info, codes))
            # import folded the nodes over constants only, but for the DequantizeLinear of
            # integer weights it keeps (frontend.folding): what is left depends on an input
            if node.op == "Opaque" or any(v in dynamic for v in node.inputs if v):
                lines.append(f"(dynamic {inner})")
                dynamic.add(output)
            value_vars[output] = outer

    return Encoding(program="\n".join(lines) + "\n", leaf_keys=leaf_keys, value_vars=value_vars,
                    output_vars={o: value_vars[o] for o in graph.outputs},
                    opaque_nodes=opaque_nodes, lets=counter, originals=originals,
                    dim_codes=codes)


def encode_choice(eg, choice: dict[int, int], encoding: Encoding, graph: Graph) -> Encoding:
    """Write an extracted program (one chosen node per class of `eg`) back as egglog lets.

    The result is the program alone, with no alternatives: what a compiler that rewrites in
    place holds after a pass. Leaves keep the keys of `encoding`; facts are carried over.
    """
    sorts = constructor_sorts()
    codes = encoding.dim_codes
    roots = {output: eg.lets[var] for output, var in encoding.output_vars.items()}
    # children last to first (the order the lets have always been written in)
    order = postorder(roots.values(), lambda c: reversed(eg.nodes[choice[c]].children))
    visited = set(order)
    dynamic = eg.relations.get("dynamic", set())
    lines: list[str] = []
    originals: dict[str, tuple[str, tuple[str, ...]]] = {}
    for c in order:
        node = eg.nodes[choice[c]]
        var = f"$c{c}"
        arg_sorts = sorts[node.op][0]
        children, attrs = iter(node.children), iter(node.attrs)
        args = [f"$c{next(children)}" if s in ("T", "TList") else render_value(next(attrs), s, codes)
                for s in arg_sorts]
        lines.append(f"(let {var} ({' '.join([node.op, *args])}))")
        originals[var] = (node.op, tuple(a for a, s in zip(args, arg_sorts) if s == "T"))
        if c in eg.shapes and c in eg.dtypes:
            lines.extend(_facts(var, TensorInfo(tuple(eg.shapes[c]), eg.dtypes[c]), codes))
        if c in dynamic:
            lines.append(f"(dynamic {var})")
        if node.op == "Const":
            value = graph.initializers.get(encoding.leaf_keys[node.attrs[0]])
            if value is not None:
                lines.extend(_value_facts(var, value))
    value_vars = {value: f"$c{eg.lets[var]}" for value, var in encoding.value_vars.items()
                  if var in eg.lets and eg.lets[var] in visited}
    return Encoding(program="\n".join(lines) + "\n", leaf_keys=encoding.leaf_keys,
                    value_vars=value_vars,
                    output_vars={output: f"$c{c}" for output, c in roots.items()},
                    opaque_nodes=encoding.opaque_nodes, lets=len(order), originals=originals,
                    dim_codes=codes)
