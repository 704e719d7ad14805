"""Quantize the project's own float test models with onnxruntime's quantization tool.

Runs in the project venv (onnxruntime is a test dependency; no torch needed):

    python tests/models/quantize_models.py            # every model below
    python tests/models/quantize_models.py resnet_tiny_op17_qdq   # just one

Two forms, as users get them from `onnxruntime.quantization`:

- `<model>_qdq.onnx`: static quantization in QDQ format (QuantizeLinear / DequantizeLinear
  around the float ops), int8 weights per channel, uint8 activations, calibrated (MinMax) on
  eight inputs drawn from a fixed seed;
- `<model>_qop.onnx`: the same static quantization in QOperator format (QLinearConv and
  onnxruntime's com.microsoft QLinearAdd, QLinearGlobalAveragePool, QGemm);
- `<model>_dynq.onnx`: dynamic quantization (DynamicQuantizeLinear, MatMulInteger /
  ConvInteger), int8 weights per channel.

Each output is checked: onnxruntime runs it, the outputs are finite, and (for the classifiers)
its top-1 class on the first calibration input is the float model's. Reruns write the same
bytes.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process

HERE = Path(__file__).resolve().parent
SEED = 0
# output name -> (float model, form)
MODELS = {
    "resnet_tiny_op17_qdq": ("resnet_tiny_op17", "qdq"),
    "mobilenetv2_tiny_op17_qdq": ("mobilenetv2_tiny_op17", "qdq"),
    "bert_tiny_op17_qdq": ("bert_tiny_op17", "qdq"),
    "resnet_tiny_op17_qop": ("resnet_tiny_op17", "qop"),
    "mobilenetv2_tiny_op17_qop": ("mobilenetv2_tiny_op17", "qop"),
    "resnet_tiny_op17_dynq": ("resnet_tiny_op17", "dynq"),
    "bert_tiny_op17_dynq": ("bert_tiny_op17", "dynq"),
}


def sample_inputs(path: Path, n: int, seed: int = SEED) -> list[dict[str, np.ndarray]]:
    """n feeds for the model at `path`: images N(0, 1), token ids in [0, 50), masks of ones."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        feed = {}
        for i in session.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            if "int" in i.type:
                feed[i.name] = (np.ones(shape, np.int64) if "mask" in i.name
                                else rng.integers(0, 50, shape).astype(np.int64))
            else:
                feed[i.name] = rng.standard_normal(shape).astype(np.float32)
        feeds.append(feed)
    return feeds


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


def quantize_file(src: Path, out: Path, form: str) -> Path:
    """Quantize the float model `src` to `out` in `form` ("qdq" or "dynq"), then check it."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        if form in ("qdq", "qop"):
            quantize_static(str(pre), str(out), _Reader(sample_inputs(src, 8)),
                            quant_format=QuantFormat.QDQ if form == "qdq" else
                            QuantFormat.QOperator, per_channel=True,
                            weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
        elif form == "dynq":
            quantize_dynamic(str(pre), str(out), weight_type=QuantType.QInt8, per_channel=True)
        else:
            raise ValueError(f"unknown quantization form {form!r}")
    _check(src, out)
    return out


def quantize(name: str) -> Path:
    source, form = MODELS[name]
    return quantize_file(HERE / f"{source}.onnx", HERE / f"{name}.onnx", form)


def _check(src: Path, out: Path) -> None:
    feeds = sample_inputs(src, 1)[0]
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        if not np.all(np.isfinite(g)):
            raise SystemExit(f"{out.name}: onnxruntime gives non-finite outputs")
    if want[0].ndim == 2 and want[0].shape[-1] <= 1000 and "logits" in \
            [o.name for o in onnx.load(str(out), load_external_data=False).graph.output]:
        if int(np.argmax(want[0])) != int(np.argmax(got[0])):
            raise SystemExit(f"{out.name}: top-1 class differs from the float model's")


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown model(s) {unknown}; choose from {list(MODELS)}", file=sys.stderr)
        return 2
    for name in names:
        out = quantize(name)
        model = onnx.load(str(out))
        ops: dict[str, int] = {}
        for node in model.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        digest = hashlib.sha256(out.read_bytes()).hexdigest()[:12]
        print(f"{out.name}: {len(model.graph.node)} nodes, {out.stat().st_size} bytes, "
              f"sha256 {digest}; {', '.join(f'{k} {v}' for k, v in sorted(ops.items()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
