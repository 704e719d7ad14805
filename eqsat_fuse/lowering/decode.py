"""Stage 4, lowering, first step: the extracted choice -> `ir.KernelPlan`.

Every chosen `Mat` class becomes a kernel that writes one buffer; its body is the inline term
under it, down to the boundaries it reads (other kernels' buffers, graph inputs, constants).
Classes whose terms use constants only become `ConstExpr`s, which lowering folds once.
"""

from __future__ import annotations

from ..errors import EqsatFuseError
from ..extraction.cost import Extraction
from ..frontend.encode import Encoding
from ..graphs import postorder
from ..ir import BodyNode, ConstExpr, Graph, Kernel, KernelPlan, Operand, TensorInfo
from ..ops import OPS
from ..saturation.serialized import SerializedEGraph


def decode(eg: SerializedEGraph, extraction: Extraction, encoding: Encoding,
           graph: Graph) -> KernelPlan:
    """Turn the chosen e-nodes into kernels in execution order."""
    decoder = _Decoder(eg, extraction, encoding, graph)
    kernel_roots = [c for c in extraction.roots
                    if not (c in decoder.constant or decoder.node_of(c).op == "Input")]
    built: set[int] = set()
    for k in postorder(kernel_roots, decoder.reads_of):
        if k not in built:
            built.add(k)
            decoder.build_kernel(k)
    kernels = decoder.kernels
    outputs = decoder.outputs()     # may name constants the kernels do not read
    return KernelPlan(
        kernels=kernels,
        buffers={k.output: k.info for k in kernels},
        inputs={name: graph.values[name] for name in graph.inputs},
        outputs=outputs, constants=decoder.constants,
        initializers=graph.initializers, opaque_nodes=dict(encoding.opaque_nodes))


class _Decoder:
    """The names, operands and kernels of one decoding (what `decode` builds as it goes)."""

    def __init__(self, eg: SerializedEGraph, extraction: Extraction, encoding: Encoding,
                 graph: Graph):
        self.eg = eg
        self.encoding = encoding
        self.choice, self.constant = extraction.choice, extraction.constant
        # Readable buffer names: the model's value name where a class holds one.
        self.value_of_class: dict[int, str] = {}
        for value, var in encoding.value_vars.items():
            c = eg.lets.get(var)
            if c is not None:
                self.value_of_class.setdefault(c, value)
        for output, var in encoding.output_vars.items():
            self.value_of_class[eg.lets[var]] = output
        self.taken = set(graph.values) | set(graph.initializers) | set(
            self.value_of_class.values())
        self.generated: dict[int, str] = {}
        self.constants: dict[str, ConstExpr] = {}
        self.const_names: dict[int, str] = {}
        self.kernels: list[Kernel] = []

    # ---- classes, names and attributes ----

    def node_of(self, c: int):
        return self.eg.nodes[self.choice[c]]

    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            name += "'"
        self.taken.add(name)
        return name

    def info(self, c: int) -> TensorInfo:
        return TensorInfo(tuple(self.eg.shapes[c]), self.eg.dtypes[c])

    def attrs_of(self, node) -> dict:
        attrs = dict(zip(OPS[node.op].attrs, node.attrs))
        if node.op in ("Input", "Const"):
            if attrs["name"] not in self.encoding.leaf_keys:
                raise EqsatFuseError(f"the chosen program reads ({node.op} {attrs['name']!r}), "
                                     f"which the model does not have: a rule created it")
            attrs["name"] = self.encoding.leaf_keys[attrs["name"]]
        return attrs

    def tensor_list(self, c: int) -> list[int]:
        items = []
        while self.node_of(c).op == "TCons":
            head, c = self.node_of(c).children
            items.append(head)
        return items

    def operands_of(self, node) -> list[int]:
        if node.op in ("Concat", "Opaque"):
            return self.tensor_list(node.children[0])
        return list(node.children)

    def buffer_name(self, c: int) -> str:
        if c in self.value_of_class:
            return self.value_of_class[c]
        if c not in self.generated:
            self.generated[c] = self.fresh(f"t{c}")
        return self.generated[c]

    # ---- operands ----

    def constant_operand(self, c: int) -> Operand:
        node = self.node_of(c)
        if node.op == "Absent":
            return Operand("absent")
        if c not in self.const_names:
            name = self.attrs_of(node)["name"] if node.op == "Const" else self.fresh(f"c{c}")
            self.const_names[c] = name
            body: list[BodyNode] = []
            index_of: dict[int, int] = {}
            for k in postorder([c], lambda k: self.operands_of(self.node_of(k))):
                n = self.node_of(k)
                if n.op == "Mat":           # a kernel boundary inside a folded constant: none
                    index_of[k] = index_of[n.children[0]]
                    continue
                args = [Operand("absent") if self.node_of(a).op == "Absent"
                        else Operand("node", index_of[a]) for a in self.operands_of(n)]
                index_of[k] = len(body)
                body.append(BodyNode(n.op, args, self.attrs_of(n)))
            self.constants[name] = ConstExpr(name, body,
                                             self.info(c) if c in self.eg.shapes else None)
        return Operand("const", self.const_names[c])

    def boundary_operand(self, c: int) -> Operand:
        if c in self.constant:
            return self.constant_operand(c)
        node = self.node_of(c)
        if node.op == "Input":
            return Operand("buffer", self.attrs_of(node)["name"])
        return Operand("buffer", self.buffer_name(c))

    def is_boundary(self, c: int) -> bool:
        return c in self.constant or self.node_of(c).op in ("Mat", "Input")

    # ---- kernels ----

    def build_kernel(self, k: int) -> None:
        node = self.node_of(k)
        body_root = node.children[0] if node.op == "Mat" else k
        if node.op == "Mat" and self.is_boundary(body_root):
            body = [BodyNode("Identity", [self.boundary_operand(body_root)], {})]
            kind = "compute"
        else:
            body = []
            index_of: dict[int, int] = {}
            children = lambda c: [a for a in self.operands_of(self.node_of(c))
                                  if not self.is_boundary(a)]
            for c in postorder([body_root], children):
                n = self.node_of(c)
                args = [self.boundary_operand(a) if self.is_boundary(a)
                        else Operand("node", index_of[a]) for a in self.operands_of(n)]
                index_of[c] = len(body)
                body.append(BodyNode(n.op, args, self.attrs_of(n)))
            root_kind = OPS[self.node_of(body_root).op].kind
            kind = {"view": "alias", "opaque": "opaque"}.get(root_kind, "compute")
        inputs = list(dict.fromkeys(a.ref for b in body for a in b.args if a.kind == "buffer"))
        self.kernels.append(Kernel(name=f"k{len(self.kernels)}", output=self.buffer_name(k),
                                   inputs=inputs, body=body, kind=kind, info=self.info(k),
                                   eclass=k))

    def reads_of(self, k: int) -> list[int]:
        """Classes of the kernels that kernel k reads."""
        node = self.node_of(k)
        start = node.children[0] if node.op == "Mat" else k
        out, seen, stack = [], set(), [start]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            if self.is_boundary(c):
                if c not in self.constant and self.node_of(c).op == "Mat":
                    out.append(c)
                continue
            stack.extend(self.operands_of(self.node_of(c)))
        return out

    def outputs(self) -> dict[str, str]:
        """Graph output name -> the buffer, input or constant that holds it."""
        outputs: dict[str, str] = {}
        for output, var in self.encoding.output_vars.items():
            c = self.eg.lets[var]
            operand = self.boundary_operand(c) if self.is_boundary(c) \
                else Operand("buffer", self.buffer_name(c))
            outputs[output] = operand.ref
        return outputs
