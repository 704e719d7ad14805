"""Export, a tool after the stages: a compiled program -> an ONNX model that onnxruntime runs.

`export_model(program)` writes the lowered `KernelPlan` back as ONNX, in the canonical opset
(`importer.CANONICAL_OPSET`; the model's own opset when it is newer):

- the graph inputs and outputs keep the original model's names and dtypes, with the static
  shapes the program was compiled for; every intermediate buffer gets a `value_info`;
- every constant a kernel reads is an initializer holding the array lowering folded (so a
  Conv+BatchNormalization pair folded by the rules leaves a Conv with new weights, and no
  BatchNormalization);
- each kernel is one node, in execution order:
  * a fused kernel (more than one op in its body) is a call of an ONNX local function of domain
    `eqsat_fuse`. Kernels with the same body (same ops, attributes, wiring and input dtypes)
    share one function, named after its ops (`MatMul_Add_Gelu`, `Conv_Add_Relu_2`, ...); the
    function's inputs are the buffers and constants the kernel reads (named after the slot that
    reads them: `Conv_x`, `Conv_w`, `Add_b`...), its output is `out`, its body standard ONNX ops;
  * a single-op kernel or a view (Reshape, Transpose...) is the plain ONNX node;
  * an opaque kernel is the original ONNX node, reading and writing the buffers of the plan.

Each term-language op maps back to one ONNX op of the canonical opset with its attributes; what
the importer turned from an input into an attribute becomes an input again: Reshape's and
Expand's static shape, Squeeze/Unsqueeze axes, Slice starts/ends/axes/steps, Pad pads and
constant_value, ReduceMean/ReduceSum axes and Split's sizes are int64 initializers in the graph
(shared between nodes that use the same values) and `Constant` nodes inside a function. Split
selects one output of an ONNX Split node (kernels reading other outputs of the same split share
the node); Cast's NumPy dtype becomes the TensorProto enum; Gelu is the opset-20 op (written out
with Erf or Tanh below opset 20).

`inline_functions` (in `frontend.reading`, which reads every model through it, so eqsat-fuse
compiles its own exports) makes the model plain ONNX, each call replaced by the function's
body: `Compiled.to_onnx(inline=True)`, `eqsat-fuse optimize -o OUT.onnx --inline`.

`save_model` writes the file through `files.write_atomically`; tensors go to a data file beside
the model only when they would not fit in one protobuf (2 GiB).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..dims import bare_symbol, has_dims, is_symbolic
from ..errors import EqsatFuseError, ExportError  # noqa: F401  (ExportError: also from here)
from ..files import write_atomically
from ..frontend.importer import CANONICAL_OPSET
from ..frontend.protos import all_tensors
from ..frontend.reading import EXPORT_DOMAIN, inline_functions  # noqa: F401  (export's own)
from ..ir import BodyNode, Kernel, Operand, TensorInfo
from ..lowering.lower import contiguous
from ..ops import OPS, result_dtype
from .export_dims import DimWriter

MIN_OPSET = 18              # ReduceMean takes its axes as an input from opset 18 on
# Tensors bigger than this in total go to an external data file (protobuf caps a message at
# 2 GiB; the margin leaves room for the graph itself).
EXTERNAL_DATA_BYTES = (2 << 30) - (64 << 20)
EXTERNAL_MIN_TENSOR = 1024  # smaller tensors stay inside the model file


# ---- the stage ----------------------------------------------------------------------------------

def export_model(program, source: onnx.ModelProto | None = None,
                 opset: int | None = None, generic=None) -> onnx.ModelProto:
    """The lowered program (`lower.Program`) as an ONNX model; `source` is the original model
    (for its graph name, and its opset when newer than the canonical one). With `generic` (a
    `lowering.generic.ShapeGeneric`), its symbolic plan is written instead, the dims computed in
    the graph (`export_dims`), so that the model runs at every shape; `source` is needed then,
    for the inputs' and outputs' declarations."""
    opset = default_opset(source) if opset is None else int(opset)
    if opset < MIN_OPSET:
        raise ExportError(f"cannot export to opset {opset}: eqsat-fuse writes opset "
                          f"{MIN_OPSET} or newer")
    if opset < CANONICAL_OPSET:
        for op_type in _opaque_op_types(program.plan):
            if _since(op_type, opset) != _since(op_type, CANONICAL_OPSET):
                raise ExportError(f"cannot export to opset {opset}: the model's {op_type} node "
                                  f"follows opset {CANONICAL_OPSET}, where {op_type} differs")
    return _Exporter(program, opset, source, generic).model()


def _opaque_op_types(plan) -> set[str]:
    used = {b.attrs["node"] for k in plan.kernels for b in k.body if b.op == "Opaque"}
    return {plan.opaque_nodes[i].onnx_node.op_type for i in used if i in plan.opaque_nodes}


def _since(op_type: str, opset: int) -> int | None:
    """The version of `op_type`'s definition in force at `opset` (None: not defined yet)."""
    try:
        return onnx.defs.get_schema(op_type, opset).since_version
    except onnx.defs.SchemaError:
        return None


def default_opset(source: onnx.ModelProto | None) -> int:
    """The canonical opset, or the source model's when it is newer (the importer keeps such a
    model's uncovered nodes in their own opset; covered ops have one form from opset 21 on)."""
    if source is not None:
        versions = [o.version for o in source.opset_import if o.domain in ("", "ai.onnx")]
        if versions and versions[0] > CANONICAL_OPSET:
            return int(versions[0])
    return CANONICAL_OPSET


def save_model(model: onnx.ModelProto, path: str | Path, *, force: bool = False,
               protect: Iterable[str | Path] = (), force_hint: str = "force=True") -> None:
    """Write `model` to `path` atomically (an existing file only with `force`, never a file in
    `protect`). Tensors go to `<path>.data` only when the model would not fit in 2 GiB."""
    path = Path(path)
    protect = [Path(p) for p in protect]
    tensors = [t for t in all_tensors(model)
               if t.HasField("raw_data") and len(t.raw_data) >= EXTERNAL_MIN_TENSOR]
    if sum(len(t.raw_data) for t in tensors) > EXTERNAL_DATA_BYTES:
        for other in protect:          # check the model's name before writing its data file
            if other.exists() and path.exists() and path.resolve() == other.resolve():
                raise EqsatFuseError(f"{path}: refusing to overwrite the input model")
        if path.exists() and not force:
            raise EqsatFuseError(f"{path}: already exists; pass {force_hint} to replace it")
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
        location = f"{path.name}.data"
        _externalize(model, path.with_name(location), location, force, protect, force_hint)
    write_atomically(path, lambda handle: handle.write(model.SerializeToString()), force=force,
                     protect=protect, force_hint=force_hint)


def _externalize(model: onnx.ModelProto, data_path: Path, location: str, force: bool,
                 protect: list[Path], force_hint: str) -> None:
    """Move the model's large tensors into one data file (4 KiB-aligned, as onnx writes it)."""
    tensors = [t for t in all_tensors(model)
               if t.HasField("raw_data") and len(t.raw_data) >= EXTERNAL_MIN_TENSOR]
    placed: list[tuple[onnx.TensorProto, int, int]] = []

    def write(handle) -> None:
        offset = 0
        for tensor in tensors:
            gap = (-offset) % 4096
            handle.write(b"\0" * gap)
            offset += gap
            handle.write(tensor.raw_data)
            placed.append((tensor, offset, len(tensor.raw_data)))
            offset += len(tensor.raw_data)

    write_atomically(data_path, write, force=force, protect=protect, force_hint=force_hint)
    for tensor, offset, length in placed:
        onnx.external_data_helper.set_external_data(tensor, location, offset, length)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")


# ---- building the model -------------------------------------------------------------------------

def _elem_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _value_info(name: str, info: TensorInfo) -> onnx.ValueInfoProto:
    """A value's declaration; a symbolic dim is its symbol's name (a `dim_param`), an
    expression of symbols an unknown dim."""
    dims = [(bare_symbol(d) if is_symbolic(d) else d) for d in info.shape]
    return helper.make_tensor_value_info(name, _elem_type(info.dtype), dims)


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _ints(values) -> list[int]:
    if has_dims(list(values)):
        raise ExportError(f"the symbolic dims {[str(v) for v in values]} have no ONNX attribute "
                          f"form")
    return [int(v) for v in values]


def _symbolic(kernel: Kernel) -> bool:
    return any(has_dims(list(n.attrs.values())) for n in kernel.body)


class _Scope:
    """Where nodes go (the graph, or one function body) and how literals are written there."""

    def __init__(self, exporter: "_Exporter", function: bool, taken: set[str]):
        self.exporter = exporter
        self.function = function
        self.nodes: list[onnx.NodeProto] = []
        self.taken = taken
        self.literals: dict[tuple, str] = {}
        self.multi: dict[tuple, list[str]] = {}          # multi-output nodes already written
        self.preferred: dict[tuple, dict[int, str]] = {}  # their outputs' names, where known

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str | None = None,
             domain: str = "", **attrs) -> onnx.NodeProto:
        while inputs and inputs[-1] == "":        # omitted trailing optional inputs
            inputs = inputs[:-1]
        while outputs and outputs[-1] == "":
            outputs = outputs[:-1]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        made = helper.make_node(op, inputs, outputs, name=name or None, domain=domain or None,
                                **attrs)
        self.nodes.append(made)
        return made

    def literal(self, value: np.ndarray, hint: str) -> str:
        """A constant tensor: an initializer in the graph, a Constant node in a function."""
        value = contiguous(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key in self.literals:
            return self.literals[key]
        name = self.fresh(hint)
        if self.function:
            self.node("Constant", [], [name], value=numpy_helper.from_array(value, name))
        else:
            self.exporter.initializers[name] = numpy_helper.from_array(value, name)
        self.literals[key] = name
        return name

    def ints(self, values, hint: str) -> str:
        if self.exporter.dims is not None and has_dims(list(values)):
            if self.function:
                raise ExportError("a symbolic dim inside a fused kernel's function")
            return self.exporter.dims.vector(list(values), hint)
        return self.literal(np.asarray(_ints(values), dtype=np.int64).reshape(-1), hint)

    def scalar(self, value: float, dtype: str | None, hint: str) -> str:
        return self.literal(np.asarray(value, dtype=np.dtype(dtype or "float32")), hint)


class _Exporter:
    def __init__(self, program, opset: int, source: onnx.ModelProto | None, generic=None):
        self.program = program
        self.plan = program.plan if generic is None else generic.plan
        self.constants: dict[str, np.ndarray] = program.constants
        self.opset = opset
        self.source = source
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.value_info: dict[str, TensorInfo] = {}
        self.functions: dict[tuple, onnx.FunctionProto] = {}
        self.function_users: dict[str, list[str]] = {}
        self.constant_nodes: set[str] = set()     # constants written as Constant nodes
        plan = self.plan
        taken = set(plan.inputs) | set(plan.buffers) | set(plan.outputs) | set(self.constants)
        taken |= {a.ref for k in plan.kernels for b in k.body for a in b.args
                  if a.kind in ("buffer", "const")}
        self.dims = None
        if generic is not None:
            if source is None:
                raise ExportError("exporting a shape-generic program needs its source model")
            sig = generic.signature
            taken |= set(sig.shape_values) | {o for n in sig.recipe for o in n.output}
            taken |= set(sig.constants)
            self.dims = DimWriter(self, sig)
        self.graph = _Scope(self, function=False, taken=taken)

    # -- values of the plan --

    def info_of(self, ref: str) -> TensorInfo:
        if ref in self.plan.buffers:
            return self.plan.buffers[ref]
        if ref in self.plan.inputs:
            return self.plan.inputs[ref]
        if ref in self.constants:
            value = self.constant(ref)
            return TensorInfo(tuple(value.shape), value.dtype.name)
        raise ExportError(f"the program reads {ref!r}, which is neither an input, a buffer nor "
                          f"a constant")

    def constant(self, ref: str) -> np.ndarray:
        """A folded constant (contiguous, in the shape the plan gives it)."""
        return self.constants[ref]

    def graph_name(self, operand: Operand) -> str:
        """The graph value holding a kernel operand (a constant becomes an initializer)."""
        if operand.kind == "const":
            if operand.ref in self.constant_nodes:
                return operand.ref
            if operand.ref not in self.constants:
                raise ExportError(f"constant {operand.ref!r} was not folded")
            if operand.ref not in self.initializers:
                self.initializers[operand.ref] = numpy_helper.from_array(
                    self.constant(operand.ref), operand.ref)
            return operand.ref
        if operand.kind == "buffer":
            return operand.ref
        raise ExportError(f"a kernel operand of kind {operand.kind!r} has no graph value")

    # -- the model --

    def model(self) -> onnx.ModelProto:
        plan = self.plan
        self._prescan_multi_outputs()
        for name, ref in plan.outputs.items():
            if ref == name and ref in self.constants and ref not in plan.buffers \
                    and ref not in plan.inputs:
                self._constant_node(name, ref)     # kernels may read it too: written first
        if self.dims is not None:
            self.dims.write_derived()
        for kernel in plan.kernels:
            if not kernel.body:
                raise ExportError(f"kernel {kernel.name} has an empty body")
            # a fused kernel whose attributes hold symbolic dims is written inline: its dims
            # are graph values, which a function body cannot read
            if len(kernel.body) > 1 and not (self.dims is not None and _symbolic(kernel)):
                self._call(kernel)
            else:
                self._emit_body(self.graph, kernel.body, self.graph_name, self._operand_dtype,
                                kernel.output, kernel.info.dtype, kernel.name)
            self.value_info[kernel.output] = kernel.info

        outputs = []
        for name, ref in plan.outputs.items():
            info = self.info_of(ref)
            is_constant = ref in self.constants and ref not in plan.buffers \
                and ref not in plan.inputs
            if is_constant and ref not in self.initializers and ref not in self.constant_nodes:
                self._constant_node(name, ref)
            elif ref != name:
                kind = "const" if is_constant else "buffer"
                source = self.graph_name(Operand(kind, ref))
                self.graph.node("Identity", [source], [name], name=self.graph.fresh(f"{name}:id"))
            outputs.append(_value_info(name, info))
        inputs = [_value_info(name, info) for name, info in plan.inputs.items()]
        hidden = set(plan.inputs) | set(plan.outputs)
        if self.dims is not None:      # the model's own declarations, dim_params and all
            declared = {vi.name: vi for vi in [*self.source.graph.input,
                                               *self.source.graph.output]}
            inputs = [declared[name] for name in self.dims.signature.inputs]
            outputs = [declared.get(o.name, o) for o in outputs]
        value_info = [_value_info(name, info) for name, info in self.value_info.items()
                      if name not in hidden and not has_dims(list(info.shape))]

        fused = sum(1 for k in plan.kernels if len(k.body) > 1)
        graph = helper.make_graph(
            self.graph.nodes, self._graph_name(), inputs, outputs,
            initializer=list(self.initializers.values()), value_info=value_info,
            doc_string=f"optimized by eqsat-fuse: {len(plan.kernels)} kernels, {fused} of them "
                       f"fused (local functions of domain '{EXPORT_DOMAIN}')")
        opsets = [helper.make_opsetid("", self.opset)]
        if self.functions:
            opsets.append(helper.make_opsetid(EXPORT_DOMAIN, 1))
        ir_version = max(8, helper.find_min_ir_version_for(opsets[:1], ignore_unknown=True))
        from .. import __version__

        functions = list(self.functions.values())
        for function in functions:
            function.doc_string = (f"fused kernel {function.doc_string} (kernels "
                                   f"{', '.join(self.function_users[function.name])})")
        return helper.make_model(graph, opset_imports=opsets, functions=functions,
                                 ir_version=ir_version, producer_name="eqsat-fuse",
                                 producer_version=__version__)

    def _constant_node(self, name: str, ref: str) -> None:
        """An output computed from constants alone: a Constant node (a graph output may not be
        an initializer)."""
        self.graph.node("Constant", [], [name], name=self.graph.fresh(f"{name}:const"),
                        value=numpy_helper.from_array(self.constant(ref), name))
        if ref == name:
            self.constant_nodes.add(ref)

    def _graph_name(self) -> str:
        if self.source is not None and self.source.graph.name:
            return f"{self.source.graph.name} (eqsat-fuse)"
        return "eqsat-fuse"

    def _operand_dtype(self, operand: Operand) -> str | None:
        if operand.kind in ("buffer", "const"):
            return self.info_of(operand.ref).dtype
        return None

    def _prescan_multi_outputs(self) -> None:
        """Single-op Split and Opaque kernels that read the same node's different outputs share
        one ONNX node: name each of its outputs after the kernel that uses it."""
        for kernel in self.plan.kernels:
            if len(kernel.body) != 1 or kernel.body[0].op not in ("Split", "Opaque"):
                continue
            node = kernel.body[0]
            args = tuple("" if a.kind == "absent" else a.ref for a in node.args)
            key = _multi_key(node, args)
            self.graph.preferred.setdefault(key, {}).setdefault(node.attrs["index"],
                                                                kernel.output)

    # -- fused kernels as local functions --

    def _call(self, kernel: Kernel) -> None:
        formals: dict[tuple[str, str], str] = {}
        used: set[str] = {"out"}
        for node in kernel.body:
            for position, a in enumerate(node.args):
                if a.kind not in ("buffer", "const") or (a.kind, a.ref) in formals:
                    continue
                slots = OPS[node.op].inputs if node.op in OPS else ()
                slot = slots[position] if len(slots) > 1 and position < len(slots) \
                    else (slots[0] if len(slots) == 1 and node.op not in ("Concat", "Opaque")
                          else str(position))
                base = name = f"{node.op}_{slot}"
                n = 1
                while name in used:
                    n += 1
                    name = f"{base}_{n}"
                used.add(name)
                formals[(a.kind, a.ref)] = name
        actual = [self.graph_name(Operand(kind, ref)) for kind, ref in formals]
        dtypes = tuple(self.info_of(ref).dtype for _, ref in formals)
        signature = (tuple((n.op, tuple((a.kind, formals[(a.kind, a.ref)])
                                        if a.kind in ("buffer", "const") else (a.kind, a.ref)
                                        for a in n.args),
                            tuple(sorted((k, _freeze(v)) for k, v in n.attrs.items())))
                           for n in kernel.body), dtypes, kernel.info.dtype)
        function = self.functions.get(signature)
        if function is None:
            function = self._function(kernel, formals, dtypes)
            self.functions[signature] = function
            self.function_users[function.name] = []
        self.function_users[function.name].append(kernel.name)
        self.graph.node(function.name, actual, [kernel.output], name=kernel.name,
                        domain=EXPORT_DOMAIN)

    def _function(self, kernel: Kernel, formals: dict[tuple[str, str], str],
                  dtypes: tuple) -> onnx.FunctionProto:
        ops = kernel.ops
        base = "_".join(ops) if len(ops) <= 5 else \
            f"{'_'.join(ops[:3])}_{len(ops) - 4}more_{ops[-1]}"
        names = {f.name for f in self.functions.values()}
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}_{n}"
        scope = _Scope(self, function=True, taken=set(formals.values()) | {"out"})
        dtype_of = dict(zip(formals.values(), dtypes))
        self._emit_body(scope, kernel.body, lambda a: formals[(a.kind, a.ref)],
                        lambda a: dtype_of[formals[(a.kind, a.ref)]]
                        if a.kind in ("buffer", "const") else None,
                        "out", kernel.info.dtype, "")
        return helper.make_function(EXPORT_DOMAIN, name, list(formals.values()), ["out"],
                                    scope.nodes, [helper.make_opsetid("", self.opset)],
                                    doc_string="+".join(ops))

    # -- bodies and ops --

    def _emit_body(self, scope: _Scope, body: list[BodyNode], operand_name: Callable,
                   operand_dtype: Callable, out: str, out_dtype: str, label: str) -> None:
        names: list[str] = []
        dtypes: list[str | None] = []
        for i, node in enumerate(body):
            last = i == len(body) - 1
            args, arg_dtypes = [], []
            for a in node.args:
                if a.kind == "node":
                    args.append(names[a.ref])
                    arg_dtypes.append(dtypes[a.ref])
                elif a.kind == "absent":
                    args.append("")
                    arg_dtypes.append(None)
                else:
                    args.append(operand_name(a))
                    arg_dtypes.append(operand_dtype(a))
            dtype = out_dtype if last else _result_dtype(node, arg_dtypes)
            want = out if last else scope.fresh(f"{node.op}_{i}" if scope.function
                                                else f"{out}:{node.op}_{i}")
            node_name = label if scope is self.graph else f"{node.op}_{i}"
            got = self._emit_op(scope, node, args, arg_dtypes, want, dtype, node_name)
            if last and got != out:
                scope.node("Identity", [got], [out], name=scope.fresh(f"{node_name}:id")
                           if scope is self.graph else None)
            names.append(got)
            dtypes.append(dtype)

    def _emit_op(self, scope: _Scope, node: BodyNode, args: list[str], arg_dtypes: list,
                 out: str, dtype: str | None, label: str) -> str:
        """Write one term-language op as ONNX; returns the value holding its result."""
        op, a = node.op, node.attrs
        emit = lambda onnx_op, inputs, **attrs: scope.node(onnx_op, inputs, [out], name=label,
                                                           **attrs)
        if op == "Gelu":
            if self.opset >= 20:
                emit(op, args, approximate=str(a["approximate"]))
            else:
                self._gelu(scope, args[0], dtype, str(a["approximate"]), out, label)
        elif op in OPS and OPS[op].onnx_plain:
            # the ONNX op of the same name (operator table), its attributes typed as their
            # ONNX defaults are
            emit(op, args, **{key: type(default)(a[key]) for key, default in OPS[op].defaults})
        elif op == "Cast":
            to = _elem_type(a["to"])
            # the importer keeps a float8 Cast in the term language only when it does not
            # saturate (a saturating one stays Opaque): say so, ONNX's default saturates
            emit(op, args, to=to, saturate=0 if to in _FLOAT8 and self.opset >= 19 else None)
        elif op in ("QuantizeLinear", "DequantizeLinear"):
            self._quantization(scope, op, args, arg_dtypes, out, label)
        elif op == "BatchNormalization":
            emit(op, args, epsilon=float(a["epsilon"]))
        elif op in ("Conv", "ConvInteger"):
            if op == "ConvInteger":
                args = _scalar_zero_points(self.constant, scope, node, args)
            emit(op, args, pads=_ints(a["pads"]), strides=_ints(a["strides"]),
                 dilations=_ints(a["dilations"]), group=int(a["group"]))
        elif op == "ConvTranspose":
            pads = _ints(a["pads"])
            attrs = dict(strides=_ints(a["strides"]), dilations=_ints(a["dilations"]),
                         group=int(a["group"]), output_padding=_ints(a["output_padding"]))
            if min(pads, default=0) >= 0:
                emit(op, args, pads=pads, **attrs)
            else:
                self._conv_transpose_grown(scope, args, pads, attrs, out, label)
        elif op == "Gemm":
            emit(op, args, alpha=float(a["alpha"]), beta=float(a["beta"]),
                 transA=int(a["trans_a"]), transB=int(a["trans_b"]))
        elif op == "Softmax":
            emit(op, args, axis=int(a["axis"]))
        elif op == "LayerNormalization":
            emit(op, args, axis=int(a["axis"]), epsilon=float(a["epsilon"]))
        elif op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
            axes = scope.ints(a["axes"], f"{_hint(out, scope)}axes")
            emit(op, [args[0], axes], keepdims=int(a["keepdims"]))
        elif op in ("MaxPool", "AveragePool"):
            dilations = _ints(a["dilations"])
            if self.opset < 19 and op == "AveragePool":
                if any(d != 1 for d in dilations):
                    raise ExportError(f"AveragePool with dilations needs opset 19 or newer")
                dilations = None
            extra = {"count_include_pad": int(a["count_include_pad"])} \
                if op == "AveragePool" else {}
            emit(op, args, kernel_shape=_ints(a["kernel_shape"]), pads=_ints(a["pads"]),
                 strides=_ints(a["strides"]), dilations=dilations, ceil_mode=int(a["ceil_mode"]),
                 **extra)
        elif op == "LRN":
            emit(op, args, size=int(a["size"]), alpha=float(a["alpha"]), beta=float(a["beta"]),
                 bias=float(a["bias"]))
        elif op == "FusedAttention":
            _attention(scope, node, args, out, label)
        else:
            return self._emit_data_op(scope, node, args, out, dtype, label)
        return out

    def _emit_data_op(self, scope: _Scope, node: BodyNode, args: list[str], out: str,
                      dtype: str | None, label: str) -> str:
        """`_emit_op` for the ops that move data, the constants, Split and Opaque."""
        op, a = node.op, node.attrs
        emit = lambda onnx_op, inputs, **attrs: scope.node(onnx_op, inputs, [out], name=label,
                                                           **attrs)
        if op == "Concat":
            emit(op, args, axis=int(a["axis"]))
        elif op == "Gather":
            emit(op, args, axis=int(a["axis"]))
        elif op == "Pad":
            mode = str(a["mode"])
            inputs = [args[0], scope.ints(a["pads"], f"{_hint(out, scope)}pads")]
            value = float(a["value"])
            if mode == "constant" and value != 0.0:
                if dtype is None:
                    raise ExportError(f"{label}: Pad of a value whose dtype is unknown")
                inputs.append(scope.scalar(value, dtype, f"{_hint(out, scope)}value"))
            emit(op, inputs, mode=mode)
        elif op == "Transpose":
            emit(op, args, perm=_ints(a["perm"]))
        elif op in ("Reshape", "Expand"):
            shape = list(a["shape"])
            inputs = [args[0], scope.ints(shape, f"{_hint(out, scope)}shape")]
            if op == "Reshape" and any(not is_symbolic(d) and d == 0 for d in shape):
                emit(op, inputs, allowzero=1)       # a 0 in the shape is a real 0-sized dim
            else:
                emit(op, inputs)
        elif op == "Flatten":
            emit(op, args, axis=int(a["axis"]))
        elif op in ("Squeeze", "Unsqueeze"):
            emit(op, [args[0], scope.ints(a["axes"], f"{_hint(out, scope)}axes")])
        elif op == "Slice":
            h = _hint(out, scope)
            emit(op, [args[0], scope.ints(a["starts"], f"{h}starts"),
                      scope.ints(a["ends"], f"{h}ends"), scope.ints(a["axes"], f"{h}axes"),
                      scope.ints(a["steps"], f"{h}steps")])
        elif op == "Split":
            return self._split(scope, node, args, out, dtype, label)
        elif op == "Opaque":
            return self._opaque(scope, node, args, out, label)
        elif op == "Scalar":
            value = np.asarray(a["value"], dtype=np.dtype(a["dtype"]))
            emit("Constant", [], value=numpy_helper.from_array(value, out))
        elif op == "Ints":
            value = np.asarray(_ints(a["values"]), dtype=np.int64)
            emit("Constant", [], value=numpy_helper.from_array(value, out))
        else:
            raise ExportError(f"{label}: the term-language op {op!r} has no ONNX export")
        return out

    def _multi_output(self, scope: _Scope, key: tuple, count: int, index: int, out: str,
                      defaults: list[str | None], make: Callable[[list[str]], None]) -> str:
        """The value of output `index` of a multi-output node, written once per scope."""
        if key in scope.multi:
            return scope.multi[key][index]
        preferred = scope.preferred.get(key, {})
        names = []
        for j in range(count):
            if j == index:
                names.append(out)
            elif j in preferred:
                names.append(preferred[j])
            elif defaults[j] == "":
                names.append("")
            else:
                names.append(scope.fresh(f"{out}:out{j}" if not scope.function else f"unused_{j}"))
        scope.multi[key] = names
        make(names)
        return out

    def _split(self, scope: _Scope, node: BodyNode, args: list[str], out: str,
               dtype: str | None, label: str) -> str:
        sizes, axis = _ints(node.attrs["split"]), int(node.attrs["axis"])
        index = int(node.attrs["index"])

        def make(names: list[str]) -> None:
            split = scope.ints(sizes, f"{_hint(out, scope)}split")
            scope.node("Split", [args[0], split], names, name=label, axis=axis)
            if scope is self.graph:        # the outputs no kernel uses get a value_info too
                info = self.info_of(args[0])
                for j, name in enumerate(names):
                    if name not in self.plan.buffers:
                        shape = list(info.shape)
                        shape[axis] = sizes[j]
                        self.value_info[name] = TensorInfo(tuple(shape), info.dtype)

        return self._multi_output(scope, _multi_key(node, tuple(args)), len(sizes), index, out,
                                  [None] * len(sizes), make)

    def _opaque(self, scope: _Scope, node: BodyNode, args: list[str], out: str,
                label: str) -> str:
        index = node.attrs["node"]
        ir_node = self.plan.opaque_nodes.get(index)
        if ir_node is None or ir_node.onnx_node is None:
            raise ExportError(f"{label}: opaque node {index} is missing from the plan")
        original = ir_node.onnx_node
        if len(args) != len(original.input):
            raise ExportError(f"{label}: opaque node {original.name or original.op_type!r} "
                              f"reads {len(args)} values, its ONNX node {len(original.input)}")

        def make(names: list[str]) -> None:
            copy = onnx.NodeProto()
            copy.CopyFrom(original)
            del copy.input[:], copy.output[:]
            copy.input.extend(args)
            while names and names[-1] == "":
                names = names[:-1]
            copy.output.extend(names)
            copy.name = original.name or label
            scope.nodes.append(copy)

        return self._multi_output(scope, _multi_key(node, tuple(args)), len(original.output),
                                  int(node.attrs["index"]), out,
                                  ["" if not o else None for o in original.output], make)

    def _conv_transpose_grown(self, scope: _Scope, args: list[str], pads: list[int],
                              attrs: dict, out: str, label: str) -> None:
        """ConvTranspose with negative pads (an `output_shape` larger than the natural output):
        ONNX forbids them, so the transposed convolution runs with those pads at 0 and no bias,
        its output is padded with zeros where the pads were negative, and the bias is added
        (the grown positions receive no input contribution, only the bias)."""
        h = _hint(out, scope)
        rank = len(pads) // 2
        bias = args[2] if len(args) > 2 and args[2] else None
        core = scope.fresh(f"{h}core" if not scope.function else "ConvTranspose_core")
        scope.node("ConvTranspose", args[:2], [core], name=f"{label}:core" if label else None,
                   pads=[max(p, 0) for p in pads], **attrs)
        grow = [0, 0] + [max(-p, 0) for p in pads[:rank]] + [0, 0] + \
            [max(-p, 0) for p in pads[rank:]]
        grown = out if bias is None else scope.fresh(f"{h}grown" if not scope.function
                                                     else "ConvTranspose_grown")
        scope.node("Pad", [core, scope.ints(grow, f"{h}pads")], [grown],
                   name=f"{label}:pad" if label else None, mode="constant")
        if bias is not None:
            column = scope.fresh(f"{h}bias" if not scope.function else "ConvTranspose_bias")
            scope.node("Unsqueeze", [bias, scope.ints(range(1, rank + 1), f"{h}bias_axes")],
                       [column], name=f"{label}:bias" if label else None)
            scope.node("Add", [grown, column], [out], name=f"{label}:add" if label else None)

    def _gelu(self, scope: _Scope, x: str, dtype: str | None, approximate: str, out: str,
              label: str) -> None:
        """Gelu below opset 20: 0.5·x·(1 + erf(x/√2)), or its tanh approximation."""
        dtype = dtype or "float32"
        h = _hint(out, scope)
        value = lambda v, tag: scope.scalar(v, dtype, f"{h}{tag}")
        tmp = lambda tag: scope.fresh(f"{h}{tag}")
        node = lambda op, inputs, output: (scope.node(op, inputs, [output],
                                                      name=f"{label}:{op}_{output}"
                                                      if not scope.function else None), output)[1]
        if approximate == "tanh":
            cube = node("Mul", [node("Mul", [x, x], tmp("x2")), x], tmp("x3"))
            inner = node("Add", [x, node("Mul", [cube, value(0.044715, "c")], tmp("cx3"))],
                         tmp("inner"))
            scaled = node("Mul", [inner, value(math.sqrt(2 / math.pi), "k")], tmp("scaled"))
            t = node("Tanh", [scaled], tmp("t"))
        else:
            t = node("Erf", [node("Div", [x, value(math.sqrt(2.0), "sqrt2")], tmp("xs"))],
                     tmp("t"))
        one_plus = node("Add", [t, value(1.0, "one")], tmp("onep"))
        half_x = node("Mul", [x, value(0.5, "half")], tmp("halfx"))
        node("Mul", [half_x, one_plus], out)

    def _quantization(self, scope: _Scope, op: str, args: list[str], arg_dtypes: list,
                      out: str, label: str) -> None:
        """QuantizeLinear and DequantizeLinear as the arithmetic they are: the term language's
        scale and zero point broadcast against x (a per-axis one as `[C, 1, 1]`), which ONNX's
        own ops do not allow, so the export spells them out with the same rounding, saturation
        and NaN result (backends/numpy/quantize.py)."""
        x, scale, zero = args
        h = _hint(out, scope)
        tmp = lambda tag: scope.fresh(f"{h}{tag}")
        node = lambda onnx_op, inputs, output, **attrs: (scope.node(
            onnx_op, inputs, [output], name=f"{label}:{onnx_op}_{output}"
            if not scope.function else None, **attrs), output)[1]
        if op == "DequantizeLinear":
            wide = lambda v, tag: node("Cast", [v], tmp(tag), to=onnx.TensorProto.INT64)
            diff = node("Sub", [wide(x, "xi"), wide(zero, "zi")], tmp("diff"))
            as_float = node("Cast", [diff], tmp("diff_f"), to=_elem_type(arg_dtypes[1]))
            node("Mul", [as_float, scale], out)
            return
        work = arg_dtypes[0] or "float32"
        info = np.iinfo(np.dtype(arg_dtypes[2]))
        lo, hi = (scope.scalar(v, work, f"{h}{tag}") for v, tag in ((info.min, "lo"),
                                                                     (info.max, "hi")))
        rounded = node("Round", [node("Div", [x, scale], tmp("q"))], tmp("rounded"))
        zero_f = node("Cast", [zero], tmp("zero_f"), to=_elem_type(work))
        v = node("Add", [rounded, zero_f], tmp("shifted"))
        inside = node("GreaterOrEqual", [v, lo], tmp("inside"))
        clipped = node("Where", [inside, node("Min", [v, hi], tmp("capped")), lo], tmp("sat"))
        node("Cast", [clipped], out, to=_elem_type(arg_dtypes[2]))


# the term-language ops the export writes as several ONNX ops, and those ops in order
def _scalar_zero_points(constant: Callable, scope: _Scope, node: BodyNode,
                        args: list[str]) -> list[str]:
    """onnxruntime's ConvInteger takes one zero point per tensor: a constant one whose elements
    are all equal (the per-channel zeros of a quantizer's weights) is written as that one
    value (`constant`: a folded constant by name)."""
    args = list(args)
    for slot in (2, 3):
        if slot < len(node.args) and node.args[slot].kind == "const":
            value = np.asarray(constant(node.args[slot].ref))
            if value.size > 1 and np.all(value == value.reshape(-1)[0]):
                args[slot] = scope.literal(value.reshape(-1)[0].reshape(()), "zero_point")
    return args


SPELLED_OUT = {
    "DequantizeLinear": ["Cast", "Cast", "Sub", "Cast", "Mul"],
    "QuantizeLinear": ["Div", "Round", "Cast", "Add", "GreaterOrEqual", "Min", "Where", "Cast"],
}

_FLOAT8 = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
           onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ}

def _attention(scope: _Scope, node: BodyNode, args: list[str], out: str, label: str) -> None:
    """FusedAttention as the ops it stands for: MatMul, the scale (Mul or Div), the mask (Add),
    Softmax over the last axis, MatMul (what `attention-*` in rules/fuse.egg read)."""
    q, kt, v, mask, scale = args
    h = _hint(out, scope)
    how = str(node.attrs["how"])

    def step(op, inputs, tag, **attrs):
        value = scope.fresh(f"{h}{tag}")
        scope.node(op, inputs, [value], name=f"{label}:{tag}" if not scope.function else None,
                   **attrs)
        return value
    scores = step("MatMul", [q, kt], "scores")
    if how in ("mul", "div"):
        scores = step("Mul" if how == "mul" else "Div", [scores, scale], "scaled")
    if node.args[3].kind != "absent":
        scores = step("Add", [scores, mask], "masked")
    probs = step("Softmax", [scores], "probs", axis=-1)
    scope.node("MatMul", [probs, v], [out], name=f"{label}:out" if not scope.function else None)


def _hint(out: str, scope: _Scope) -> str:
    """The prefix of a literal's name: inside a function plain, in the graph its user's name."""
    return "" if scope.function else f"{out}:"


def _multi_key(node: BodyNode, args: tuple) -> tuple:
    if node.op == "Split":
        return ("Split", args, _freeze(node.attrs["split"]), int(node.attrs["axis"]))
    return ("Opaque", int(node.attrs["node"]), args)


def _result_dtype(node: BodyNode, arg_dtypes: list[str | None]) -> str | None:
    """The dtype of a body node's value (the kernel's own dtype is known for its last node)."""
    if node.op == "Scalar":
        return str(node.attrs["dtype"])
    if node.op == "Ints":
        return "int64"
    if node.op == "Opaque":
        return None
    dtype = result_dtype(node.op, node.attrs,
                         lambda i: arg_dtypes[i] if i < len(arg_dtypes) else None)
    return dtype or next((d for d in arg_dtypes if d is not None), None)
