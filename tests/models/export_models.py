"""Export small, randomly initialised real-architecture models to ONNX.

Runs in a separate Python 3.11 venv with a CPU torch (NOT the project venv):

    python3 -m venv /work/exportenv
    /work/exportenv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \
        transformers==5.24.0 onnx==1.23.2 onnxruntime==1.32.0
    /work/exportenv/bin/python tests/models/export_models.py            # all models
    /work/exportenv/bin/python tests/models/export_models.py bert_tiny_op17   # just one
    /work/exportenv/bin/python tests/models/export_models.py --stats   # README tables from manifest.json

Every model is built from a tiny config with random weights (torch.manual_seed(0)
before construction), BatchNorm running stats/affine params are randomised so that
BN folding is non-trivial, and the model is exported with the TorchScript exporter
(dynamo=False, static batch-1 shapes). BN is kept as BatchNormalization nodes
(training=PRESERVE on an eval-mode model skips the exporter's own Conv+BN fusion).

After export each file is checked: onnx.checker, shape inference with data_prop
(values left without a static shape are reported, not fatal), and onnxruntime vs torch outputs
(rtol 1e-4, atol 1e-5). manifest.json describes every file.
"""

from __future__ import annotations

import collections
import hashlib
import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers

HERE = Path(__file__).resolve().parent
SEED = 0
RTOL, ATOL = 1e-4, 1e-5


# --------------------------------------------------------------------------- specs


@dataclass
class Spec:
    name: str
    description: str
    config_cls: str  # transformers config class name (or "" for plain torch)
    model_cls: str  # transformers model class name
    config: dict  # kwargs for config_cls
    inputs: dict  # input name -> (shape, dtype)
    opset: int
    output_names: list = field(default_factory=list)


IMG = {"pixel_values": ((1, 3, 64, 64), "float32")}
TEXT16 = {"input_ids": ((1, 16), "int64"), "attention_mask": ((1, 16), "int64")}

RESNET_CFG = dict(
    embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1],
    layer_type="basic", num_labels=10,
)
MOBILENETV2_CFG = dict(
    depth_multiplier=0.25, finegrained_output=False, image_size=64, num_labels=10,
)
BERT_CFG = dict(
    vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=128, max_position_embeddings=64, attn_implementation="eager",
)

SPECS = [
    Spec("resnet_tiny_op17",
         "ResNet (basic blocks, 1 per stage): Conv+BN+ReLU, residual Add, MaxPool, global pool, Gemm head.",
         "ResNetConfig", "ResNetForImageClassification", RESNET_CFG, IMG, 17, ["logits"]),
    Spec("resnet_tiny_op9",
         "Same ResNet at opset 9.",
         "ResNetConfig", "ResNetForImageClassification", RESNET_CFG, IMG, 9, ["logits"]),
    Spec("mobilenetv2_tiny_op17",
         "MobileNetV2 (symmetric padding): inverted residuals, depthwise Conv+BN+ReLU6 (Clip), residual Add.",
         "MobileNetV2Config", "MobileNetV2ForImageClassification",
         dict(MOBILENETV2_CFG, tf_padding=False), IMG, 17, ["logits"]),
    Spec("mobilenetv2_tfpad_op13",
         "MobileNetV2 with tf_padding=True: TF 'same' padding exported as explicit Pad nodes before convs.",
         "MobileNetV2Config", "MobileNetV2ForImageClassification",
         dict(MOBILENETV2_CFG, tf_padding=True), IMG, 13, ["logits"]),
    Spec("efficientnet_tiny_op17",
         "EfficientNet-style: depthwise convs, squeeze-excite (GlobalAvgPool, Sigmoid, Mul), SiLU, BN.",
         "EfficientNetConfig", "EfficientNetForImageClassification",
         dict(width_coefficient=0.25, depth_coefficient=0.25, image_size=64, hidden_dim=320,  # hidden_dim must equal round_filters(1280)
              num_labels=10, dropout_rate=0.0, drop_connect_rate=0.0),
         IMG, 17, ["logits"]),
    Spec("convnext_tiny_op17",
         "ConvNeXt: 7x7 depthwise conv, channels-last LayerNorm, pointwise Linear+GELU, layer-scale, residual.",
         "ConvNextConfig", "ConvNextForImageClassification",
         dict(hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], image_size=64, num_labels=10),
         IMG, 17, ["logits"]),
    Spec("vit_tiny_op17",
         "ViT encoder: patch-embedding Conv, CLS token, 2 pre-LN transformer layers (eager attention).",
         "ViTConfig", "ViTModel",
         dict(image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=2, intermediate_size=128, attn_implementation="eager"),
         IMG, 17, ["last_hidden_state", "pooler_output"]),
    Spec("bert_tiny_op17",
         "BERT encoder (2 layers, 2 heads), padding attention mask, exact GELU (Erf), LayerNormalization.",
         "BertConfig", "BertModel", BERT_CFG, TEXT16, 17, ["last_hidden_state", "pooler_output"]),
    Spec("bert_tiny_op9",
         "Same BERT at opset 9 (LayerNorm decomposed into ReduceMean/Sub/Pow/Sqrt/Div).",
         "BertConfig", "BertModel", BERT_CFG, TEXT16, 9, ["last_hidden_state", "pooler_output"]),
    # GPT-2 gets an attention_mask input as well: without one, transformers' mask code
    # probes position_ids for packed sequences with torch.diff, which has no ONNX export.
    Spec("gpt2_tiny_op17",
         "GPT-2 decoder (2 layers, 2 heads): causal + padding mask, Conv1D (Gemm/MatMul) projections, tanh-GELU.",
         "GPT2Config", "GPT2Model",
         dict(vocab_size=100, n_embd=64, n_layer=2, n_head=2, n_positions=64,
              use_cache=False, attn_implementation="eager"),
         TEXT16, 17, ["last_hidden_state"]),
]


# --------------------------------------------------------------------------- build


class OutputsAsTuple(torch.nn.Module):
    """Call a transformers model with keyword inputs and return chosen outputs as a tuple."""

    def __init__(self, model, input_names, output_names):
        super().__init__()
        self.model = model
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    def forward(self, *args):
        out = self.model(**dict(zip(self.input_names, args)), return_dict=True)
        return tuple(out[k] for k in self.output_names)


def randomise_batchnorm(model: torch.nn.Module, gen: torch.Generator) -> int:
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(c, generator=gen) * 1.5 + 0.25)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=gen) * 1.0 + 0.5)
                    m.bias.copy_(torch.randn(c, generator=gen) * 0.2)
            n += 1
    return n


def build(spec: Spec) -> torch.nn.Module:
    torch.manual_seed(SEED)
    cfg_kwargs = dict(spec.config)
    attn = cfg_kwargs.pop("attn_implementation", None)
    config = getattr(transformers, spec.config_cls)(**cfg_kwargs)
    if attn is not None:
        config._attn_implementation = attn
    model = getattr(transformers, spec.model_cls)(config)
    randomise_batchnorm(model, torch.Generator().manual_seed(SEED + 1))
    model.eval()
    return OutputsAsTuple(model, spec.inputs, spec.output_names).eval()


def make_inputs(spec: Spec) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(SEED + 2)
    out = []
    for name, (shape, dtype) in spec.inputs.items():
        if name == "pixel_values":
            out.append(torch.randn(shape, generator=gen))
        elif name == "input_ids":
            out.append(torch.randint(0, spec.config["vocab_size"], shape, generator=gen))
        elif name == "attention_mask":
            m = torch.ones(shape, dtype=torch.int64)
            m[..., -4:] = 0  # last 4 positions are padding
            out.append(m)
        else:
            raise ValueError(name)
    return tuple(out)


# --------------------------------------------------------------------------- export + check


def export(spec: Spec, model: torch.nn.Module, args) -> Path:
    path = HERE / f"{spec.name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, args, str(path),
            dynamo=False,  # TorchScript exporter: supports old opsets (9)
            opset_version=spec.opset,
            input_names=list(spec.inputs),
            output_names=spec.output_names,
            training=torch.onnx.TrainingMode.PRESERVE,  # model is eval(); keeps BatchNormalization nodes
            do_constant_folding=True,
        )
    return path


def nonstatic_values(model: onnx.ModelProto) -> list[str]:
    """Names of node outputs / graph IO whose inferred shape is not fully static."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    g = inferred.graph
    typed = {v.name: v for v in list(g.input) + list(g.output) + list(g.value_info)}
    bad = []
    names = [v.name for v in g.input] + [o for n in g.node for o in n.output if o]
    for name in names:
        v = typed.get(name)
        ok = (
            v is not None
            and v.type.HasField("tensor_type")
            and v.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
        )
        if not ok:
            bad.append(name)
    return bad


def check(spec: Spec, path: Path, model: torch.nn.Module, args) -> dict:
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    bad = nonstatic_values(proto)

    with torch.no_grad():
        want = [t.numpy() for t in model(*args)]
    max_abs = 0.0
    # the graph as written (no ORT rewrites) and with all of ORT's graph optimisations
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        got = sess.run(None, {k: a.numpy() for k, a in zip(spec.inputs, args)})
        for name, g, w in zip(spec.output_names, got, want):
            # float error grows with the values a random network carries to its output
            # (ResNet-50's logits reach 3e4): the absolute tolerance scales with the largest
            atol = ATOL * max(1.0, float(np.max(np.abs(w))))
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=atol, err_msg=f"{spec.name}:{name} ({level})")
            assert np.all(np.isfinite(g)) and np.std(g) > 0, f"{spec.name}:{name} degenerate output"
            max_abs = max(max_abs, float(np.max(np.abs(g - w))))
    return {"nonstatic": bad, "max_abs_diff": max_abs}


def describe(spec: Spec, path: Path) -> dict:
    proto = onnx.load(str(path))
    g = proto.graph
    hist = collections.Counter(n.op_type for n in g.node)

    def io(vs):
        return [
            {
                "name": v.name,
                "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param
                          for d in v.type.tensor_type.shape.dim],
                "dtype": onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
            }
            for v in vs
        ]

    return {
        "file": path.name,
        "description": spec.description,
        "library": "transformers",
        "class": f"transformers.{spec.model_cls}",
        "config_class": f"transformers.{spec.config_cls}",
        "config": spec.config,
        "opset": spec.opset,
        "inputs": io(g.input),
        "outputs": io(g.output),
        "node_count": len(g.node),
        "initializer_count": len(g.initializer),
        "op_histogram": dict(sorted(hist.items())),
        "size_bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def print_stats() -> None:
    """Markdown tables (for README.md) from manifest.json."""
    models = json.loads((HERE / "manifest.json").read_text())["models"]
    print("| file | opset | nodes | size (bytes) | all shapes static | op histogram |")
    print("| --- | --- | --- | --- | --- | --- |")
    union = collections.Counter()
    for m in models:
        union.update(m["op_histogram"])
        hist = ", ".join(f"{k} {v}" for k, v in m["op_histogram"].items())
        static = "yes" if m["all_shapes_static_after_onnx_inference"] else f"no ({m['nonstatic_value_count']})"
        print(f"| {m['file']} | {m['opset']} | {m['node_count']} | {m['size_bytes']} | {static} | {hist} |")
    print()
    print("Union over all models:", ", ".join(f"{k} {v}" for k, v in sorted(union.items())))
    print("Total bytes:", sum(m["size_bytes"] for m in models))


def main(argv: list[str]) -> int:
    if argv == ["--stats"]:
        print_stats()
        return 0
    torch.use_deterministic_algorithms(True)
    wanted = set(argv)
    unknown = wanted - {s.name for s in SPECS}
    if unknown:
        print("unknown model(s):", ", ".join(sorted(unknown)))
        return 2
    manifest_path = HERE / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    entries = {m["file"]: m for m in manifest.get("models", [])}

    failed = []
    for spec in SPECS:
        if wanted and spec.name not in wanted:
            continue
        try:
            model = build(spec)
            args = make_inputs(spec)
            path = export(spec, model, args)
            res = check(spec, path, model, args)
        except Exception as e:  # report, keep going
            failed.append(spec.name)
            print(f"FAIL {spec.name}: {type(e).__name__}: {e}")
            continue
        entry = describe(spec, path)
        # Not a failure: e.g. TF-padding exports Pad widths through Transpose/Reshape
        # chains that onnx data propagation cannot evaluate (a compiler can fold them).
        entry["all_shapes_static_after_onnx_inference"] = not res["nonstatic"]
        entry["nonstatic_value_count"] = len(res["nonstatic"])
        entries[entry["file"]] = entry
        static = "all static" if not res["nonstatic"] else f"{len(res['nonstatic'])} NON-STATIC e.g. {res['nonstatic'][:3]}"
        print(f"ok   {spec.name:24s} opset {spec.opset:2d} nodes {entry['node_count']:4d} "
              f"{entry['size_bytes'] / 1024:7.1f} KiB  shapes: {static}  max|ort-torch| {res['max_abs_diff']:.2e}")

    order = [f"{s.name}.onnx" for s in SPECS]
    manifest = {
        "generator": "tests/models/export_models.py",
        "exporter": "torch.onnx.export(dynamo=False, training=PRESERVE, do_constant_folding=True)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__},
        "seed": SEED,
        "models": sorted(entries.values(), key=lambda m: order.index(m["file"]) if m["file"] in order else 99),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    if failed:
        print("failed:", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
