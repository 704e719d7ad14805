"""The symbolic signature of a shape-generic program: which input dims are symbols, how a run's
feeds bind them, and the values the program reads that depend on the symbols alone.

`frontend.symbolic` finds these at import; the compiled program (`lowering.generic.ShapeGeneric`)
keeps a `Signature` and, for each run, binds the symbols from the feeds' shapes (`bind`:
a feed that disagrees with another on a shared symbol is refused, naming both), and computes the
derived inputs for that binding (`derive`: shape values such as a Reshape target fed as data, a
causal mask, the positions of a Range), once per concrete shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dims import bare_symbol, evaluate, evaluate_all, is_symbolic, shape_str
from .errors import EqsatFuseError


class BindError(EqsatFuseError):
    """A run's feeds do not fit the symbolic signature."""


@dataclass
class Signature:
    inputs: dict[str, tuple]                    # each real input's shape: ints and Dims
    derived: list[str] = field(default_factory=list)   # inputs the program computes per shape
    shape_values: dict[str, np.ndarray] = field(default_factory=dict)  # object arrays of dims
    recipe: list[Any] = field(default_factory=list)    # onnx NodeProtos over symbols alone
    constants: dict[str, np.ndarray] = field(default_factory=dict)     # what the recipe reads
    constraints: list[tuple] = field(default_factory=list)   # (dim, allowed values, why)
    opset_imports: list[Any] = field(default_factory=list)
    symbols: dict[str, str] = field(default_factory=dict)    # symbol -> where it comes from
    representative: dict[str, int] = field(default_factory=dict)   # what extraction priced
    runners: dict = field(default_factory=dict, repr=False)   # the recipe's node runners

    def bind(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """The symbols' values given each input's concrete shape, or `BindError`."""
        binding: dict[str, int] = {}
        seen: dict[str, str] = {}
        for name, shape in self.inputs.items():
            fed = shapes[name]
            if len(fed) != len(shape):
                raise BindError(f"input {name!r} has rank {len(shape)} {shape_str(shape)}, "
                                f"fed an array of shape {list(fed)}")
            for axis, d in enumerate(shape):
                s = bare_symbol(d)
                if s is None:
                    continue
                if s in binding and binding[s] != int(fed[axis]):
                    raise BindError(f"inputs {seen[s]} and {name!r} (dim {axis}) share the "
                                    f"symbol {s!r}, but are fed {binding[s]} and {fed[axis]}")
                binding.setdefault(s, int(fed[axis]))
                seen.setdefault(s, f"{name!r} (dim {axis})")
        missing = set(self.symbols) - set(binding)
        if missing:
            raise BindError(f"no input dim gives the value of {sorted(missing)}")
        for name, shape in self.inputs.items():
            for axis, d in enumerate(shape):
                want = evaluate(d, binding)
                if want != int(shapes[name][axis]):
                    what = f"{d} = {want}" if is_symbolic(d) else str(want)
                    raise BindError(f"input {name!r} dim {axis} must be {what}, but is fed "
                                    f"{shapes[name][axis]}")
        self.check(binding, "for these inputs")
        return binding

    def check(self, binding: dict[str, int], where: str) -> None:
        """`BindError` unless `binding` keeps every fact the model's shapes rely on."""
        for d, allowed, why in self.constraints:
            value = evaluate(d, binding)
            options = {evaluate(a, binding) for a in allowed}
            if value not in options:
                raise BindError(f"the dim {d} is {value} {where}, but must be "
                                f"{' or '.join(map(str, sorted(options)))} ({why})")

    def derive(self, binding: dict[str, int]) -> dict[str, np.ndarray]:
        """The derived inputs' values for one binding."""
        values: dict[str, np.ndarray] = {}

        def value(name: str) -> np.ndarray | None:
            if name == "":
                return None
            if name in values:
                return values[name]
            if name in self.shape_values:
                array = self.shape_values[name]
                values[name] = np.array([evaluate(d, binding) for d in array.reshape(-1)],
                                        dtype=np.int64).reshape(array.shape)
                return values[name]
            return self.constants[name]

        if self.recipe:
            from .backends.reference import NodeRunner
            for index, node in enumerate(self.recipe):
                inputs = [value(i) for i in node.input]
                key = (index, tuple(None if v is None else v.dtype.str for v in inputs))
                runner = self.runners.get(key)
                if runner is None:      # built once: any shape of those dtypes runs through it
                    runner = self.runners[key] = NodeRunner(
                        node, [None if v is None else (n, v.dtype, None)
                               for n, v in zip(node.input, inputs)], self.opset_imports)
                outputs = runner.run(inputs)
                values.update((o, np.asarray(v)) for o, v in zip(node.output, outputs) if o)
        return {name: value(name) for name in self.derived}

    def describe(self) -> dict:
        """The signature as the report shows it."""
        return {"inputs": {n: [str(d) for d in s] for n, s in self.inputs.items()},
                "symbols": dict(self.symbols), "representative": dict(self.representative)}


MAX_BUCKETS = 8


def binding_text(binding: dict[str, int]) -> str:
    """A binding as messages and the report show it: `batch=1, seq=128`."""
    return ", ".join(f"{k}={v}" for k, v in binding.items())


def representative_bindings(signature: Signature, given: dict | None) -> list[dict[str, int]]:
    """The bindings extraction prices, one per shape bucket: `given` maps a symbol to a value,
    or to a list of values (buckets: one program for each, the product of every list), and for
    every other symbol 1 where it is first seen as an input's leading (batch) dim, 128
    elsewhere (or the largest size the model allows it, where it allows only some). The first
    binding is the representative one."""
    given = dict(given or {})
    unknown = set(given) - set(signature.symbols)
    if unknown:
        raise BindError(f"dims {sorted(unknown)} are not symbols of the model (its symbols: "
                        f"{sorted(signature.symbols)})")
    choices: dict[str, list[int]] = {}
    for s, where in signature.symbols.items():
        values = given.get(s, 1 if where.endswith(" dim 0") else 128)
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer))
                             or v < 1 for v in values):
            raise BindError(f"dims[{s!r}] = {given.get(s)!r}: give a whole number >= 1, or a "
                            f"list of them (shape buckets)")
        choices[s] = sorted({int(v) for v in values})
    count = int(np.prod([len(v) for v in choices.values()], dtype=np.int64))
    if count > MAX_BUCKETS:
        raise BindError(f"dims give {count} shape buckets; at most {MAX_BUCKETS} are compiled")
    # a default the model cannot run at (a symbol broadcast against 5 must be 1 or 5) gives
    # way to the largest size it can take
    for d, allowed, _ in signature.constraints:
        s = bare_symbol(d)
        if s is not None and s not in given and all(not is_symbolic(a) for a in allowed) \
                and choices[s][0] not in allowed:
            choices[s] = [max(int(a) for a in allowed)]
    bindings = [{}]
    for s, values in choices.items():
        bindings = [{**b, s: v} for b in bindings for v in values]
    for b in bindings:
        signature.check(b, f"at {binding_text(b)} (the binding extraction would price: give "
                           f"dims the model can run at)")
    return bindings


def bucket_of(buckets: list[dict[str, int]], binding: dict[str, int]) -> int:
    """The bucket that serves `binding`: for each symbol the buckets differ in, the smallest
    bucket value at least the symbol's value (the largest when none is)."""
    varying = [s for s in buckets[0] if len({b[s] for b in buckets}) > 1]
    want = {}
    for s in varying:
        values = sorted({b[s] for b in buckets})
        want[s] = next((v for v in values if v >= binding[s]), values[-1])
    return next(i for i, b in enumerate(buckets) if all(b[s] == want[s] for s in varying))


def model_inputs(graph) -> dict:
    """An imported graph's inputs as `ir.TensorInfo`s of concrete shapes: as declared, or,
    where dims are open, at the representative binding `compile` would price by default."""
    from .ir import TensorInfo
    signature = graph.signature
    if signature is None:
        return {name: graph.values[name] for name in graph.inputs}
    binding = representative_bindings(signature, None)[0]
    return {name: TensorInfo(tuple(evaluate_all(tuple(graph.values[name].shape), binding)),
                             graph.values[name].dtype) for name in signature.inputs}
