"""Where runtimes' quantized tensors part, and why: every QuantizeLinear output of a QDQ model,
from onnxruntime ORT_DISABLE_ALL and from eqsat-fuse, against the exact QDQ semantics.

    .venv/bin/python bench/qdq_trace.py MODEL_qdq.onnx [FLOAT_MODEL.onnx] [--inputs N]

The exact semantics: the same graph evaluated by `onnx.reference` in float64 (each product of
two float32 values is exact there, a sum of a few thousand of them off by far less than a
quantization step), so its QuantizeLinear outputs are the rounding of the exact real value.
Every QuantizeLinear output is made a graph output (so each runtime writes it), both runtimes
run the same seeded inputs (FLOAT_MODEL's `sample_inputs` shapes, or the model's own), and for
each runtime the script prints, in graph order, the first quantized tensors that differ from
the exact ones: how many elements, by how many steps, and how far the exact value x / scale was
from a rounding tie (k + 1/2) there. A first difference whose elements all lie near a tie
(within 1e-3 of a step; a float32 sum of K products moves x / scale by up to about
K 2^-24 sum|ab| / scale, 1e-6 to 1e-4 of a step in real layers) is a summation-order effect,
not a bug: upstream tensors are equal, so only that layer's float arithmetic can have rounded
differently. Later tensors then differ because their inputs do (their distances mean nothing).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import exit_on_help, pop_option  # noqa: E402

exit_on_help(sys.argv)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.version_converter  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from eqsat_fuse.checking.quantized import traced as expose  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "models"))
from quantize_models import sample_inputs  # noqa: E402


NEAR_TIE = 1e-3   # in steps: above a float32 sum's rounding, far below a wrong kernel's error


def traced(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], dict[str, tuple]]:
    """The model with every QuantizeLinear output a graph output (`checking.quantized.traced`);
    those names in graph order, and each one's (x, scale) input names."""
    names, args = [], {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            names.append(node.output[0])
            args[node.output[0]] = (node.input[0], node.input[1])
    return expose(model, names), names, args


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph computing in float64: float32 initializers, inputs, outputs, Casts and
    Constants made float64 (integer tensors as they are), at opset 21 (onnx.reference has
    DequantizeLinear from opset 19)."""
    m = onnx.version_converter.convert_version(model, 21)
    g = m.graph
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))
    for vi in [*g.input, *g.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    del g.value_info[:]
    for node in g.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t)
                                                     .astype(np.float64), a.t.name))
    return m


def first_differences(name_order: list[str], got: dict, exact: dict, pre: dict, scales: dict,
                      limit: int = 3) -> list[str]:
    lines = []
    for name in name_order:
        a, b = np.asarray(got[name]).astype(np.int64), np.asarray(exact[name]).astype(np.int64)
        bad = a != b
        if not bad.any():
            continue
        ratio = np.broadcast_to(pre[name] / scales[name], a.shape)[bad]
        distance = np.abs(np.abs(ratio - np.floor(ratio)) - 0.5)
        tie = distance <= NEAR_TIE
        lines.append(f"    {name}: {int(bad.sum())} of {a.size} elements differ, by "
                     f"{int(np.abs(a - b)[bad].max())} step(s) at most; near a tie "
                     f"(|x/scale - (k+1/2)| <= {NEAR_TIE:g}): {int(tie.sum())} of "
                     f"{int(bad.sum())}; distances {float(distance.min()):.3g} to "
                     f"{float(distance.max()):.3g}")
        if len(lines) >= limit:
            break
    return lines or ["    every quantized tensor equals the exact one"]


def main(argv: list[str]) -> int:
    count = int(pop_option(argv, "--inputs", "2"))
    if not argv:
        print(__doc__.strip())
        return 2
    path = Path(argv[0])
    shapes_from = Path(argv[1]) if len(argv) > 1 else path
    model, order, args = traced(onnx.load(str(path)))
    exact_model = as_float64(model)
    # the pre-rounding value x of each QuantizeLinear, exactly: its input as an output too
    for name in order:
        x = args[name][0]
        if x not in {o.name for o in exact_model.graph.output}:
            exact_model.graph.output.append(helper.make_empty_tensor_value_info(x))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    scales = {name: inits[args[name][1]].astype(np.float64) for name in order}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    compiled = ef.compile(model, backend="numba")
    reference = ReferenceEvaluator(exact_model)
    final = model.graph.output[0].name
    print(f"{path.name}: {len(order)} QuantizeLinear outputs traced, {count} input(s)")
    for k, feed in enumerate(sample_inputs(shapes_from, count, seed=5)):
        feed64 = {n: v.astype(np.float64) if v.dtype == np.float32 else v
                  for n, v in feed.items()}
        out_names = [o.name for o in exact_model.graph.output]
        exact = dict(zip(out_names, reference.run(None, feed64)))
        pre = {name: np.asarray(exact[args[name][0]], np.float64) for name in order}
        runs = {"onnxruntime ORT_DISABLE_ALL":
                dict(zip([o.name for o in session.get_outputs()], session.run(None, feed))),
                "eqsat-fuse (numba)": compiled.run(feed)}
        for label, got in runs.items():
            diff = float(np.max(np.abs(np.asarray(got[final], np.float64) - exact[final])))
            print(f"  input {k}, {label}: output {final!r} differs from exact by {diff:.4g}")
            for line in first_differences(order, got, exact, pre, scales):
                print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
