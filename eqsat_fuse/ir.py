"""The plain data that flows between stages.

`Graph` is what `import` produces and `encode` consumes: a topologically sorted list of nodes over
named values, each value with a static shape and dtype, and the initializers by name.
`KernelPlan` is what `decode` produces and `lower` consumes: the kernels (fused groups) that the
extracted program runs, each with its inputs, output and body, plus the constant expressions that
lowering folds once at compile time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The default-domain opset that every imported model is upgraded to (`frontend.importer`), and
# so the one the IR's ops and the opaque nodes `onnx.reference` runs follow.
CANONICAL_OPSET = 21


@functools.cache
def itemsize(dtype: str) -> int:
    """The bytes of one element of the dtype named `dtype` (looked up once per name)."""
    return np.dtype(dtype).itemsize


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype (a NumPy dtype name such as "float32") of one value. A dim is an int,
    or, in a model with open input dims, a `dims.Dim` expression of its symbols (then `size`
    and `nbytes` are not numbers: evaluate the shape at a binding first)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)


@dataclass
class Node:
    """One operator of the imported graph, attributes already normalized for the term language.

    `inputs` holds value names, with None for an omitted optional input. An `Opaque` node keeps
    the original ONNX node in `onnx_node` so the backend can run it through `onnx.reference`.
    """

    op: str
    inputs: list[str | None]
    outputs: list[str]
    attrs: dict[str, Any]
    name: str
    onnx_node: Any = None


@dataclass
class Graph:
    """An imported ONNX model: nodes in topological order over values with shapes (static, or
    symbolic where the inputs leave dims open: `signature`)."""

    name: str
    nodes: list[Node]
    values: dict[str, TensorInfo]
    initializers: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]
    opset: int                      # the canonical opset the nodes follow
    source_opset: int               # the opset the file declared
    opaque_ops: list[str] = field(default_factory=list)   # ONNX op types kept as opaque kernels
    onnx_nodes: int = 0             # nodes in the file (before opset conversion, dead-code removal)
    nodes_added_by_conversion: int = 0   # nodes the opset upgrade added (or removed, if < 0)
    # seconds per import step: read, check, convert, infer (shape inference), fold, normalize
    import_seconds: dict[str, float] = field(default_factory=dict)
    # open input dims: the symbolic signature (shapes hold `dims.Dim`s; see `signature`)
    signature: Any = None


# ---- kernels -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """What a kernel body reads: a buffer (`"buffer"`), a folded constant (`"const"`), a node of the
    same body (`"node"`, by index), or an omitted optional input (`"absent"`)."""

    kind: str
    ref: str | int | None = None


@dataclass
class BodyNode:
    """One operation inside a kernel body."""

    op: str
    args: list[Operand]
    attrs: dict[str, Any]


@dataclass
class Kernel:
    """A fused group: one launch that reads `inputs` and writes the buffer `output`.

    `body` is in topological order; its last node computes the output. `kind` is "compute",
    "alias" (a view such as Reshape: no data moves) or "opaque" (one ONNX node run by
    `onnx.reference`).
    """

    name: str
    output: str
    inputs: list[str]
    body: list[BodyNode]
    kind: str
    info: TensorInfo
    eclass: int = -1          # the e-class it computes (to look up its predicted cost)

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.body]


@dataclass
class ConstExpr:
    """A constant computed once at compile time: `body` evaluated over initializers and literals."""

    name: str
    body: list[BodyNode]
    info: TensorInfo | None


@dataclass
class KernelPlan:
    """The extracted program: kernels in execution order, the buffers they use, and constants.

    `outputs` maps each graph output name to the buffer, graph input or constant holding it.
    """

    kernels: list[Kernel]
    buffers: dict[str, TensorInfo]
    inputs: dict[str, TensorInfo]
    outputs: dict[str, str]
    constants: dict[str, ConstExpr]
    initializers: dict[str, np.ndarray]
    opaque_nodes: dict[int, Node] = field(default_factory=dict)   # by node index, for Opaque
