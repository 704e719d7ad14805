"""Verify, after the stages: does the compiled program compute what the original model computes?

The oracle is onnxruntime (all graph optimizations off, so it runs the model as written) or,
with `against="reference"` or when onnxruntime is not installed, `onnx.reference`.

Each output is held to a tolerance (rtol, atol): an element passes when
|got - want| <= atol + rtol * |want|. The defaults depend on the output's dtype (`TOLERANCES`;
integers and booleans exactly); the caller may give `rtol` / `atol` for every float output and
`tolerances` per output name. NaN must meet NaN and an infinity the same infinity; a NaN or
infinity on one side only is a mismatch, counted apart from the elements outside tolerance.

The indices that ArgMax, ArgMin and TopK return are compared tie-aware. The compiled program
computes the op's input with other rounding than the oracle, so where two positions hold values
that are equal within tolerance the pick may fall the other way, and either answer is right.
An index that differs from the oracle's is a *tie* when the values it and the oracle's index
point at are equal within the tolerance: in the op's input as the oracle computes it (read from
the oracle as an extra output) or, when that cannot be read, in TopK's values outputs. Ties are
counted and said, never hidden; any other difference is a mismatch. Every output's line says
why it passed or failed, and where the worst element is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import onnx

from ..errors import EqsatFuseError, RunError
from ..ir import KernelPlan, TensorInfo

# (rtol, atol) by output dtype; integer and boolean outputs must match exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (1e-2, 1e-2),
}
INDEX_OPS = {"ArgMax": 0, "ArgMin": 0, "TopK": 1}   # op -> which of its outputs holds indices


@dataclass
class OutputCheck:
    """One output's verdict. `max_abs_diff` of an index output is the largest difference
    between the values the program's and the oracle's indices point at (inf where it cannot
    be read); `reason` says in words why the output passed or failed."""

    name: str
    ok: bool
    max_abs_diff: float
    max_rel_diff: float          # over the elements with |expected| > atol
    rtol: float
    atol: float
    mismatched: int = 0          # elements outside tolerance (indices: not ties)
    nan_mismatched: int = 0      # NaN or infinity on one side only, or infinities of two signs
    ties: int = 0                # indices that differ between values equal within tolerance
    size: int = 0                # elements compared
    reason: str = ""


@dataclass
class VerifyResult:
    against: str
    ok: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    storage_dtype: str = "float32"   # how the program stored its intermediates
    note: str = ""                   # why the tolerances are looser than the outputs' dtype's

    def summary(self) -> str:
        failed = sum(not o.ok for o in self.outputs)
        ties = sum(o.ties for o in self.outputs)
        head = f"verify against {self.against}: {'OK' if self.ok else 'MISMATCH'}"
        if failed:
            head += f" ({failed} of {len(self.outputs)} outputs)"
        elif ties:
            head += f" ({ties} tied ind{'ex' if ties == 1 else 'ices'} accepted)"
        lines = [head]
        if self.note:
            lines.append(f"  {self.note}")
        for o in self.outputs:
            lines.append(f"  {o.name}: {'ok' if o.ok else 'MISMATCH'}  {o.reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class IndexOutput:
    """An integer output that holds positions along `axis` of the tensor `input`."""

    op: str                  # ArgMax, ArgMin or TopK
    node: str                # the node's name ("" when the model gives none)
    input: str               # the value it indexes, by its name in the model
    axis: int                # as the node says it (may be negative)
    keepdims: bool           # ArgMax/ArgMin: the reduced axis kept (TopK: always)
    values: str | None       # TopK: its values output, when that is a graph output


def random_feeds(inputs: dict[str, TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs drawn from a fixed seed: floats ~ N(0, 1), integers in [0, 2), booleans."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, info in inputs.items():
        dtype = np.dtype(info.dtype)
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(info.shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, 2, size=info.shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, size=info.shape).astype(bool)
        else:
            raise ValueError(f"cannot make random values for input {name!r} of dtype {dtype}")
    return feeds


def oracle_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                   against: str = "ort", also: Iterable[str] = ()
                   ) -> tuple[dict[str, np.ndarray], str]:
    """Run the original model on `feeds`; returns the outputs and which oracle ran.

    `also` names values inside the model (a node's output, an input, an initializer) to
    return beside the outputs: the inputs of the index ops, to tell ties from mismatches."""
    names = [o.name for o in model.graph.output]
    extra = [n for n in also if n not in names]
    given = {n: np.asarray(feeds[n]) for n in extra if n in feeds}
    given |= {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer
              if i.name in extra and i.name not in given}
    computed = [n for n in extra if n not in given]
    if computed:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in computed)
    values, oracle = _run_oracle(model, feeds, names + computed, against)
    return values | given, oracle


def _run_oracle(model: onnx.ModelProto, feeds, names: list[str], against: str):
    if against == "ort":
        try:
            import onnxruntime as ort
        except ImportError:
            against = "reference"
        else:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 4     # its errors are raised, not logged
            session = ort.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
            state = ort.capi.onnxruntime_pybind11_state
            try:
                return dict(zip(names, session.run(names, feeds))), "onnxruntime"
            except (state.InvalidArgument, state.Fail, state.RuntimeException) as why:
                message = str(why).splitlines()[0] if str(why) else type(why).__name__
                raise RunError(f"onnxruntime cannot run the original model on these inputs: "
                               f"{message}") from None
    if against != "reference":
        raise ValueError(f"unknown oracle {against!r}; use 'ort' or 'reference'")
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)
    return dict(zip(names, evaluator.run(names, feeds))), "onnx.reference"


def index_outputs(plan: KernelPlan, source: onnx.ModelProto) -> dict[str, IndexOutput]:
    """The graph outputs of `plan` that ArgMax, ArgMin or TopK indices fill, by output name.

    The plan keeps these ops as opaque kernels that remember their ONNX node, so the node's
    input and axis are read from there. The input is named only if the source model has a
    value of that name (the oracle must be able to return it)."""
    known = {o for n in source.graph.node for o in n.output}
    known |= {i.name for i in source.graph.input} | {i.name for i in source.graph.initializer}
    by_buffer = {buffer: name for name, buffer in plan.outputs.items()}
    found = {}
    for kernel in plan.kernels:
        if kernel.kind != "opaque" or kernel.output not in by_buffer:
            continue
        attrs = kernel.body[-1].attrs
        opaque = plan.opaque_nodes.get(attrs.get("node"))
        node = opaque.onnx_node if opaque is not None else None
        if node is None or INDEX_OPS.get(node.op_type) != attrs.get("index"):
            continue
        given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        values = by_buffer.get(node.output[0]) if node.op_type == "TopK" else None
        found[by_buffer[kernel.output]] = IndexOutput(
            node.op_type, node.name, node.input[0] if node.input[0] in known else "",
            int(given.get("axis", -1 if node.op_type == "TopK" else 0)),
            bool(given.get("keepdims", 1)), values)
    return found


def verify_program(source: onnx.ModelProto, plan: KernelPlan,
                   run: Callable[[dict], dict[str, np.ndarray]], feeds: dict[str, Any],
                   against: str = "ort", storage_dtype: str = "float32", **tolerance
                   ) -> VerifyResult:
    """Run the oracle and the program on `feeds` and compare them (`compare`'s tolerance
    keywords: rtol, atol, tolerances), reading the index ops' inputs for their ties."""
    indices = index_outputs(plan, source)
    probes = sorted({i.input for i in indices.values() if i.input})
    expected, oracle = oracle_outputs(source, feeds, against, also=probes)
    outputs = {o.name for o in source.graph.output}
    op_inputs = {n: expected[n] for n in probes if n in expected}
    expected = {n: v for n, v in expected.items() if n in outputs}
    return compare(run(feeds), expected, oracle, storage_dtype, indices=indices,
                   op_inputs=op_inputs, **tolerance)


def resolve_tolerances(dtypes: dict[str, str], storage_dtype: str = "float32",
                       rtol: float | None = None, atol: float | None = None,
                       tolerances: dict[str, tuple[float, float]] | None = None
                       ) -> tuple[dict[str, tuple[float, float]], bool]:
    """Each output's (rtol, atol) and whether float16 storage loosened any of them.

    The dtype's default, loosened to float16's for float outputs of a program that stores its
    intermediates in float16; then `rtol` / `atol` for every float output; then `tolerances`
    {output name: (rtol, atol)} for the outputs they name (integer ones too)."""
    tolerances = dict(tolerances or {})
    unknown = sorted(set(tolerances) - set(dtypes))
    if unknown:
        raise EqsatFuseError(f"a tolerance is given for {unknown[0]!r}, which is not an output; "
                             f"the outputs are {', '.join(dtypes)}")
    for what, value in [("rtol", rtol), ("atol", atol)] + [
            (f"rtol of {n!r}", t[0]) for n, t in tolerances.items()] + [
            (f"atol of {n!r}", t[1]) for n, t in tolerances.items()]:
        if value is not None and not (isinstance(value, (int, float)) and value >= 0):
            raise EqsatFuseError(f"{what} must be a number >= 0, got {value!r}")

    def of(dtype: str, loosen: bool) -> tuple[float, float]:
        r, a = TOLERANCES.get(dtype, (0.0, 0.0))
        if np.dtype(dtype).kind not in "fc":
            return r, a
        if loosen:
            r, a = max(r, TOLERANCES["float16"][0]), max(a, TOLERANCES["float16"][1])
        return (r if rtol is None else float(rtol)), (a if atol is None else float(atol))

    chosen, loosened = {}, False
    for name, dtype in dtypes.items():
        if name in tolerances:
            chosen[name] = tuple(float(t) for t in tolerances[name])
            continue
        chosen[name] = of(dtype, storage_dtype == "float16")
        loosened |= chosen[name] != of(dtype, False)
    return chosen, loosened


def compare(actual: dict[str, Any], expected: dict[str, Any], against: str,
            storage_dtype: str = "float32", rtol: float | None = None,
            atol: float | None = None, tolerances: dict[str, tuple[float, float]] | None = None,
            indices: dict[str, IndexOutput] | None = None,
            op_inputs: dict[str, np.ndarray] | None = None) -> VerifyResult:
    """Compare outputs by name under each output's tolerance (`resolve_tolerances`).

    `indices` (from `index_outputs`) marks the outputs to compare tie-aware, `op_inputs` holds
    the oracle's values of the tensors they index. A program that stores its intermediates in
    float16 (`storage_dtype`) is held to float16 tolerances on its float outputs."""
    expected = {name: np.asarray(want) for name, want in expected.items()}
    indices, op_inputs = indices or {}, op_inputs or {}
    chosen, loosened = resolve_tolerances({n: w.dtype.name for n, w in expected.items()},
                                          storage_dtype, rtol, atol, tolerances)
    checks = []
    for name, want in expected.items():
        r, a = chosen[name]
        if name not in actual:
            checks.append(_failed(name, r, a, "not among the compiled program's outputs"))
            continue
        got = np.asarray(actual[name])
        if got.shape != want.shape:
            checks.append(_failed(name, r, a, f"shape {got.shape}, the oracle's {want.shape}"))
        elif got.dtype != want.dtype:
            checks.append(_failed(name, r, a, f"dtype {got.dtype}, the oracle's {want.dtype}"))
        elif name in indices:
            index = indices[name]
            pointed = op_inputs.get(index.input)
            if name not in (tolerances or {}):
                r, a = _value_tolerance(index, pointed, expected, storage_dtype, rtol, atol)
            checks.append(_check_indices(name, got, want, index, pointed, actual, expected, r, a))
        else:
            checks.append(_check_values(name, got, want, r, a))
    rtol16, atol16 = TOLERANCES["float16"]
    note = (f"intermediates are stored in float16, so float outputs are held to float16's "
            f"tolerances (rtol {rtol16:g}, atol {atol16:g}); --storage-dtype float32 "
            f"(storage_dtype=\"float32\") keeps float32" if loosened else "")
    return VerifyResult(against, all(c.ok for c in checks), checks, storage_dtype, note)


def _failed(name: str, rtol: float, atol: float, reason: str) -> OutputCheck:
    return OutputCheck(name, False, float("inf"), float("inf"), rtol, atol, reason=reason)


def _at(index: tuple) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ("," if len(index) == 1 else "") + ")"


def _check_values(name: str, got: np.ndarray, want: np.ndarray, rtol: float,
                  atol: float) -> OutputCheck:
    """A float or integer output, element by element; NaN and infinities must agree."""
    wide = np.complex128 if "c" in (got.dtype.kind, want.dtype.kind) else np.float64
    g, w = got.astype(wide), want.astype(wide)
    finite = np.isfinite(g) & np.isfinite(w)
    special = ~finite & ~((np.isnan(g) & np.isnan(w)) | (g == w))
    with np.errstate(invalid="ignore", over="ignore"):     # inf - inf: not compared here
        diff = np.where(finite, np.abs(g - w), 0.0)
    magnitude = np.where(finite, np.abs(w), 0.0)
    outside = diff > atol + rtol * magnitude
    max_abs = float(np.max(diff, initial=0.0))
    # relative error where it means something: elements larger than atol
    rel = diff / np.maximum(magnitude, 1e-30)
    max_rel = float(np.max(np.where(magnitude > atol, rel, 0.0), initial=0.0))
    bad, nans = int(np.count_nonzero(outside)), int(np.count_nonzero(special))
    exact = rtol == 0 and atol == 0
    rule = f"within atol + rtol x |want| (rtol {rtol:g}, atol {atol:g})"
    parts = []
    if bad:
        worst = np.unravel_index(int(np.argmax(np.where(outside, diff, -1.0))), diff.shape)
        parts.append((f"{bad} of {diff.size} elements differ (compared exactly)" if exact else
                      f"{bad} of {diff.size} elements not {rule}")
                     + f"; the worst at {_at(worst)}: got {g[worst]:.8g}, want {w[worst]:.8g} "
                       f"(|diff| {diff[worst]:.3g})")
    if nans:
        first = tuple(np.argwhere(special)[0])
        parts.append(f"{nans} NaN/inf on one side only (or of the other sign); the first at "
                     f"{_at(first)}: got {g[first]:.8g}, want {w[first]:.8g}")
    if not parts:
        parts.append(f"all {diff.size} elements equal (compared exactly)" if exact else
                     f"every element {rule}")
        shared = int(np.count_nonzero(~finite))
        if shared:
            parts.append(f"{shared} NaN/inf, alike on both sides")
    if want.dtype.kind in "fc" or not exact:
        parts.append(f"max |diff| {max_abs:.3g}, max rel {max_rel:.3g} where |want| > atol")
    return OutputCheck(name, not (bad or nans), max_abs, max_rel, rtol, atol, bad, nans, 0,
                       int(diff.size), "; ".join(parts))


def _value_tolerance(index: IndexOutput, pointed, expected, storage_dtype, rtol, atol):
    """What "equal values" means for a tie: the tolerance of a float output of the dtype of
    the values compared (the op's input, or TopK's values output)."""
    dtype = (pointed.dtype.name if pointed is not None else
             expected[index.values].dtype.name if index.values in expected else "float32")
    return resolve_tolerances({"values": dtype}, storage_dtype, rtol, atol)[0]["values"]


def _check_indices(name: str, got: np.ndarray, want: np.ndarray, index: IndexOutput,
                   pointed: np.ndarray | None, actual: dict, expected: dict, rtol: float,
                   atol: float) -> OutputCheck:
    """Indices: equal, or a tie (the values pointed at equal within tolerance)."""
    op = f"{index.op} {index.node!r}" if index.node else index.op
    differ = got != want
    size, count = int(got.size), int(np.count_nonzero(differ))
    if not count:
        return OutputCheck(name, True, 0.0, 0.0, rtol, atol, size=size,
                           reason=f"all {size} indices equal the oracle's ({op})")
    if pointed is not None:
        axis = index.axis % pointed.ndim
        reduced = index.op != "TopK" and not index.keepdims
        g = np.expand_dims(got, axis) if reduced else got
        w = np.expand_dims(want, axis) if reduced else want
        inside = (g >= 0) & (g < pointed.shape[axis])
        at_g = np.take_along_axis(pointed, np.where(inside, g, 0), axis).astype(np.float64)
        at_w = np.take_along_axis(pointed, w, axis).astype(np.float64)
        if reduced:
            inside, at_g, at_w = (np.squeeze(v, axis) for v in (inside, at_g, at_w))
        where = f"the values they point at in the input of {op}"
    elif index.values in actual and index.values in expected:
        axis = index.axis % got.ndim
        inside = np.ones(got.shape, bool)
        at_g = np.asarray(actual[index.values], np.float64)
        at_w = np.asarray(expected[index.values], np.float64)
        where = f"the values output {index.values!r} of {op}"
    else:
        return OutputCheck(name, False, float("inf"), float("inf"), rtol, atol, count, 0, 0,
                           size, f"{count} of {size} indices differ from the oracle's ({op}; "
                           f"the values they index could not be read, so compared exactly)")
    gap = np.where(np.isnan(at_g) & np.isnan(at_w), 0.0, np.abs(at_g - at_w))
    tie = differ & inside & (gap <= atol + rtol * np.abs(at_w))
    repeated = np.zeros(got.shape, bool)
    if index.op == "TopK":                  # a TopK row that repeats an index has no tie
        repeated = differ & np.any(np.diff(np.sort(got, axis=axis), axis=axis) == 0,
                                   axis=axis, keepdims=True)
        tie &= ~repeated
    bad = differ & ~tie
    ties, wrong = int(np.count_nonzero(tie)), int(np.count_nonzero(bad))
    rule = f"equal within rtol {rtol:g}, atol {atol:g}"
    max_gap = float(np.max(np.where(differ, np.nan_to_num(gap, nan=np.inf), 0.0)))
    if not wrong:
        return OutputCheck(name, True, max_gap, 0.0, rtol, atol, 0, 0, ties, size,
                           f"{ties} of {size} indices differ from the oracle's, each a swap "
                           f"between tied values ({where} are {rule}; largest gap "
                           f"{max_gap:.3g})" + ("; the rest are equal" if ties < size else ""))
    first = tuple(np.argwhere(bad)[0])
    why = (" out of range" if not inside[first] else
           ", which its row holds twice" if repeated[first] else
           f" -> {at_g[first]:.8g}, want index {want[first]} -> {at_w[first]:.8g} "
           f"(not {rule})")
    reason = (f"{wrong} of {size} indices differ from the oracle's and are no tie ({where}); "
              f"the first at {_at(first)}: got index {got[first]}{why}")
    if ties:
        reason += ("; 1 more differs but is a tie" if ties == 1 else
                   f"; {ties} more differ but are ties")
    return OutputCheck(name, False, max_gap, float("inf"), rtol, atol, wrong, 0, ties, size,
                       reason)
