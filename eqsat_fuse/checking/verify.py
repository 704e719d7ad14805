"""Verify, after the stages: does the compiled program compute what the original model computes?

The oracle is onnxruntime (all graph optimizations off, so it runs the model as written) or,
with `against="reference"` or when onnxruntime is not installed, `onnx.reference`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..ir import TensorInfo

# (rtol, atol) by output dtype; integer and boolean outputs must match exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (1e-2, 1e-2),
}


@dataclass
class OutputCheck:
    name: str
    ok: bool
    max_abs_diff: float
    max_rel_diff: float          # over the elements with |expected| > atol
    rtol: float
    atol: float


@dataclass
class VerifyResult:
    against: str
    ok: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    storage_dtype: str = "float32"   # how the program stored its intermediates
    note: str = ""                   # why the tolerances are looser than the outputs' dtype's

    def summary(self) -> str:
        lines = [f"verify against {self.against}: {'OK' if self.ok else 'MISMATCH'}"]
        if self.note:
            lines.append(f"  {self.note}")
        for o in self.outputs:
            lines.append(f"  {o.name}: {'ok' if o.ok else 'MISMATCH'}  max |diff| "
                         f"{o.max_abs_diff:.3g}, max rel {o.max_rel_diff:.3g} where |want| > atol "
                         f"(rtol {o.rtol:g}, atol {o.atol:g})")
        return "\n".join(lines)


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
                   against: str = "ort") -> tuple[dict[str, np.ndarray], str]:
    """Run the original model on `feeds`; returns the outputs and which oracle ran."""
    if against == "ort":
        try:
            import onnxruntime as ort
        except ImportError:
            against = "reference"
        else:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 3
            session = ort.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            return dict(zip(names, session.run(names, feeds))), "onnxruntime"
    if against != "reference":
        raise ValueError(f"unknown oracle {against!r}; use 'ort' or 'reference'")
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, evaluator.run(names, feeds))), "onnx.reference"


def compare(actual: dict[str, Any], expected: dict[str, Any], against: str,
            storage_dtype: str = "float32") -> VerifyResult:
    """Compare outputs by name with the per-dtype tolerances.

    A program that stores its intermediates in float16 (`storage_dtype`) is held to float16
    tolerances on its float outputs.
    """
    checks, loosened = [], False
    for name, want in expected.items():
        want = np.asarray(want)
        got = np.asarray(actual[name])
        rtol, atol = TOLERANCES.get(want.dtype.name, (0.0, 0.0))
        if storage_dtype == "float16" and want.dtype.kind == "f":
            wide = (rtol, atol)
            rtol, atol = max(rtol, TOLERANCES["float16"][0]), max(atol, TOLERANCES["float16"][1])
            loosened |= (rtol, atol) != wide
        if got.shape != want.shape or got.dtype != want.dtype:
            checks.append(OutputCheck(name, False, float("inf"), float("inf"), rtol, atol))
            continue
        if want.dtype.kind in "fc":
            magnitude = np.abs(want.astype(np.float64))
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            same_nan = np.isnan(got) & np.isnan(want)
            diff = np.where(same_nan, 0.0, diff)
            rel = diff / np.maximum(magnitude, 1e-30)
            ok = bool(np.all(diff <= atol + rtol * magnitude))
            max_abs = float(np.max(diff, initial=0.0))
            # relative error where it means something: elements larger than atol
            max_rel = float(np.max(np.where(magnitude > atol, rel, 0.0), initial=0.0))
        else:
            ok = bool(np.array_equal(got, want))
            max_abs = 0.0 if ok else float("inf")
            max_rel = max_abs
        checks.append(OutputCheck(name, ok, max_abs, max_rel, rtol, atol))
    rtol16, atol16 = TOLERANCES["float16"]
    note = (f"intermediates are stored in float16, so float outputs are held to float16's "
            f"tolerances (rtol {rtol16:g}, atol {atol16:g}); --storage-dtype float32 "
            f"(storage_dtype=\"float32\") keeps float32" if loosened else "")
    return VerifyResult(against, all(c.ok for c in checks), checks, storage_dtype, note)
