"""Stage 5, decode: the extracted choice -> `ir.KernelPlan`.

Every chosen `Mat` class becomes a kernel that writes one buffer; its body is the inline term
under it, down to the boundaries it reads (other kernels' buffers, graph inputs, constants).
Classes whose terms use constants only become `ConstExpr`s, which lowering folds once.
"""

from __future__ import annotations

from ..frontend.encode import Encoding
from ..errors import EqsatFuseError
from ..extraction.cost import Extraction
from ..ir import BodyNode, ConstExpr, Graph, Kernel, KernelPlan, Operand, TensorInfo
from ..ops import OPS
from ..saturation.serialized import SerializedEGraph


def decode(eg: SerializedEGraph, extraction: Extraction, encoding: Encoding,
           graph: Graph) -> KernelPlan:
    """Turn the chosen e-nodes into kernels in execution order."""
    choice, constant = extraction.choice, extraction.constant

    def node_of(c: int):
        return eg.nodes[choice[c]]

    # Readable buffer names: the model's value name where a class holds one.
    value_of_class: dict[int, str] = {}
    for value, var in encoding.value_vars.items():
        c = eg.lets.get(var)
        if c is not None:
            value_of_class.setdefault(c, value)
    for output, var in encoding.output_vars.items():
        value_of_class[eg.lets[var]] = output

    taken = set(graph.values) | set(graph.initializers) | set(value_of_class.values())

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "'"
        taken.add(name)
        return name

    generated: dict[int, str] = {}

    def info(c: int) -> TensorInfo:
        return TensorInfo(tuple(eg.shapes[c]), eg.dtypes[c])

    def attrs_of(node) -> dict:
        attrs = dict(zip(OPS[node.op].attrs, node.attrs))
        if node.op in ("Input", "Const"):
            if attrs["name"] not in encoding.leaf_keys:
                raise EqsatFuseError(f"the chosen program reads ({node.op} {attrs['name']!r}), "
                                     f"which the model does not have: a rule created it")
            attrs["name"] = encoding.leaf_keys[attrs["name"]]
        return attrs

    def tensor_list(c: int) -> list[int]:
        items = []
        while node_of(c).op == "TCons":
            head, c = node_of(c).children
            items.append(head)
        return items

    def operands_of(node) -> list[int]:
        if node.op in ("Concat", "Opaque"):
            return tensor_list(node.children[0])
        return list(node.children)

    constants: dict[str, ConstExpr] = {}
    const_names: dict[int, str] = {}

    def constant_operand(c: int) -> Operand:
        node = node_of(c)
        if node.op == "Absent":
            return Operand("absent")
        if c not in const_names:
            name = attrs_of(node)["name"] if node.op == "Const" else fresh(f"c{c}")
            const_names[c] = name
            body: list[BodyNode] = []
            index_of: dict[int, int] = {}
            for k in _postorder(c, lambda k: operands_of(node_of(k))):
                n = node_of(k)
                if n.op == "Mat":           # a kernel boundary inside a folded constant: none
                    index_of[k] = index_of[n.children[0]]
                    continue
                args = [Operand("absent") if node_of(a).op == "Absent"
                        else Operand("node", index_of[a]) for a in operands_of(n)]
                index_of[k] = len(body)
                body.append(BodyNode(n.op, args, attrs_of(n)))
            constants[name] = ConstExpr(name, body, info(c) if c in eg.shapes else None)
        return Operand("const", const_names[c])

    def buffer_name(c: int) -> str:
        if c in value_of_class:
            return value_of_class[c]
        if c not in generated:
            generated[c] = fresh(f"t{c}")
        return generated[c]

    def boundary_operand(c: int) -> Operand:
        if c in constant:
            return constant_operand(c)
        node = node_of(c)
        if node.op == "Input":
            return Operand("buffer", attrs_of(node)["name"])
        return Operand("buffer", buffer_name(c))

    def is_boundary(c: int) -> bool:
        return c in constant or node_of(c).op in ("Mat", "Input")

    kernels: list[Kernel] = []
    built: set[int] = set()

    def build_kernel(k: int) -> None:
        node = node_of(k)
        body_root = node.children[0] if node.op == "Mat" else k
        if node.op == "Mat" and is_boundary(body_root):
            body = [BodyNode("Identity", [boundary_operand(body_root)], {})]
            kind = "compute"
        else:
            body = []
            index_of: dict[int, int] = {}
            children = lambda c: [a for a in operands_of(node_of(c)) if not is_boundary(a)]
            for c in _postorder(body_root, children):
                n = node_of(c)
                args = [boundary_operand(a) if is_boundary(a) else Operand("node", index_of[a])
                        for a in operands_of(n)]
                index_of[c] = len(body)
                body.append(BodyNode(n.op, args, attrs_of(n)))
            root_kind = OPS[node_of(body_root).op].kind
            kind = {"view": "alias", "opaque": "opaque"}.get(root_kind, "compute")
        inputs = list(dict.fromkeys(a.ref for b in body for a in b.args if a.kind == "buffer"))
        kernels.append(Kernel(name=f"k{len(kernels)}", output=buffer_name(k), inputs=inputs,
                              body=body, kind=kind, info=info(k), eclass=k))

    def reads_of(k: int) -> list[int]:
        """Classes of the kernels that kernel k reads."""
        node = node_of(k)
        start = node.children[0] if node.op == "Mat" else k
        out, seen, stack = [], set(), [start]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            if is_boundary(c):
                if c not in constant and node_of(c).op == "Mat":
                    out.append(c)
                continue
            stack.extend(operands_of(node_of(c)))
        return out

    kernel_roots = [c for c in extraction.roots
                    if not (c in constant or node_of(c).op == "Input")]
    for k in _postorder_many(kernel_roots, reads_of):
        if k not in built:
            built.add(k)
            build_kernel(k)

    outputs: dict[str, str] = {}
    for output, var in encoding.output_vars.items():
        c = eg.lets[var]
        operand = boundary_operand(c) if is_boundary(c) else Operand("buffer", buffer_name(c))
        outputs[output] = operand.ref
    return KernelPlan(
        kernels=kernels,
        buffers={k.output: k.info for k in kernels},
        inputs={name: graph.values[name] for name in graph.inputs},
        outputs=outputs, constants=constants,
        initializers=graph.initializers, opaque_nodes=dict(encoding.opaque_nodes))


def _postorder(root: int, children) -> list[int]:
    return _postorder_many([root], children)


def _postorder_many(roots: list[int], children) -> list[int]:
    """Every class reachable from `roots`, children before parents, without recursion."""
    order: list[int] = []
    done: set[int] = set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            c, expanded = stack.pop()
            if c in done:
                continue
            if expanded:
                done.add(c)
                order.append(c)
                continue
            stack.append((c, True))
            stack.extend((ch, False) for ch in reversed(children(c)) if ch not in done)
    return order
