"""Symbolic dims in an exported model: each dim expression a program's attributes hold (a
Reshape target `[batch*seq, 768]`, a Slice end `past + seq`) computed in the graph from the
inputs' shapes, so that the exported model runs at every shape the compiled one does.

A symbol is read where an input has it as a dim (`Shape(input, start=axis, end=axis + 1)`); a
polynomial is Mul and Add of those, a floor division Div (dims are never negative), a
remainder Mod, min and max Min and Max; each distinct dim is computed once. The derived inputs
of the signature (`signature.Signature`: shape values the program reads as data, and the recipe
of ONNX nodes over symbols alone, such as a causal mask) are written as they are, in front of
the kernels.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from ..dims import Dim, bare_symbol, is_symbolic
from ..errors import ExportError


class DimWriter:
    def __init__(self, exporter, signature):
        self.exporter = exporter
        self.signature = signature
        self.values: dict[Dim, str] = {}
        self.factors: dict = {}                          # a symbol, or (op, a, b) -> its value
        self.where: dict[str, tuple[str, int]] = {}      # symbol -> (input, axis)
        for name, shape in signature.inputs.items():
            for axis, d in enumerate(shape):
                s = bare_symbol(d)
                if s is not None:
                    self.where.setdefault(s, (name, axis))

    @property
    def scope(self):
        return self.exporter.graph

    def value(self, d) -> str:
        """A one-element int64 tensor holding `d`."""
        scope = self.scope
        if not is_symbolic(d):
            return scope.ints([d], "dim")
        if d in self.values:
            return self.values[d]
        total = None
        for mono, coeff in d.terms:
            term = None
            for factor, power in mono:
                part = self._factor(factor)
                for _ in range(power):
                    term = part if term is None else self._op("Mul", term, part)
            if term is None:
                term = scope.ints([coeff], "dim")
            elif coeff != 1:
                term = self._op("Mul", term, scope.ints([coeff], "dim"))
            total = term if total is None else self._op("Add", total, term)
        self.values[d] = total
        return total

    def _factor(self, factor) -> str:
        if factor not in self.factors:      # each symbol read, each opaque factor made once
            self.factors[factor] = self._new_factor(factor)
        return self.factors[factor]

    def _new_factor(self, factor) -> str:
        if isinstance(factor, str):
            if factor not in self.where:
                raise ExportError(f"the symbol {factor!r} is no input's dim: the exported model "
                                  f"could not compute it")
            name, axis = self.where[factor]
            out = self.scope.fresh(f"{factor}:dim")
            self.scope.node("Shape", [name], [out], name=out, start=axis, end=axis + 1)
            return out
        op, a, b = factor
        onnx_op = {"//": "Div", "%": "Mod", "min": "Min", "max": "Max"}[op]
        return self._op(onnx_op, self.value(a), self.value(b))

    def _op(self, op: str, a: str, b: str) -> str:
        out = self.scope.fresh(f"dim:{op}")
        self.scope.node(op, [a, b], [out], name=out)
        return out

    def vector(self, values, hint: str) -> str:
        """A 1-D int64 tensor of `values` (ints and dims)."""
        parts = [self.value(v) for v in values]
        if not parts:
            return self.scope.ints([], hint)
        if len(parts) == 1:
            return parts[0]
        out = self.scope.fresh(hint)
        self.scope.node("Concat", parts, [out], name=out, axis=0)
        return out

    def write_derived(self) -> None:
        """The derived inputs, computed in the graph: shape values from the dims, then the
        recipe's nodes as the model had them."""
        scope, sig = self.scope, self.signature
        needed = set(sig.derived) | {i for n in sig.recipe for i in n.input}
        for name, array in sig.shape_values.items():
            if name not in needed:
                continue
            flat = self.vector(list(array.reshape(-1)), f"{name}:flat")
            shape = scope.ints(list(array.shape), f"{name}:shape")
            scope.node("Reshape", [flat, shape], [name], name=scope.fresh(f"{name}:dims"))
        for name, value in sig.constants.items():
            if name not in self.exporter.initializers:
                self.exporter.initializers[name] = numpy_helper.from_array(np.asarray(value),
                                                                           name)
        for node in sig.recipe:
            copy = scope.node(node.op_type, list(node.input), list(node.output),
                              name=scope.fresh(node.name or node.op_type), domain=node.domain)
            copy.attribute.extend(node.attribute)
