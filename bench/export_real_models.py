"""Export realistic-size models (real architectures at the sizes people deploy) for the
benchmarks, into a folder outside the repository (they are 40-440 MB each; never commit them).

Runs in the export venv (Python 3.11, CPU torch, transformers), like tests/models/export_models.py,
whose build/export/check code it reuses (random weights, seed 0, BatchNorm kept as nodes,
TorchScript exporter, static batch-1 shapes, checked against torch through onnxruntime):

    /work/exportenv/bin/python bench/export_real_models.py [--out /work/bench-models] [NAME ...]

then

    .venv/bin/python bench/models.py /work/bench-models/*.onnx

NAME is one of the specs below (default: all).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "export_models", HERE.parent / "tests" / "models" / "export_models.py")
em = importlib.util.module_from_spec(_spec)
sys.modules["export_models"] = em
_spec.loader.exec_module(em)

IMG224 = {"pixel_values": ((1, 3, 224, 224), "float32")}
TEXT128 = {"input_ids": ((1, 128), "int64"), "attention_mask": ((1, 128), "int64")}

SPECS = [
    em.Spec("resnet18_224",
            "ResNet-18 (basic blocks 2-2-2-2, widths 64-512) at 224x224.",
            "ResNetConfig", "ResNetForImageClassification",
            dict(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                 layer_type="basic", num_labels=1000),
            IMG224, 17, ["logits"]),
    em.Spec("resnet50_224",
            "ResNet-50 (bottleneck blocks 3-4-6-3, widths 256-2048) at 224x224.",
            "ResNetConfig", "ResNetForImageClassification",
            dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                 layer_type="bottleneck", num_labels=1000),
            IMG224, 17, ["logits"]),
    em.Spec("mobilenetv2_224",
            "MobileNetV2 1.0 at 224x224 (depthwise convs, ReLU6 as Clip).",
            "MobileNetV2Config", "MobileNetV2ForImageClassification",
            dict(depth_multiplier=1.0, image_size=224, tf_padding=False, num_labels=1000),
            IMG224, 17, ["logits"]),
    em.Spec("bert_base_128",
            "BERT-base encoder (12 layers, hidden 768, 12 heads), sequence 128, padding mask.",
            "BertConfig", "BertModel",
            dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512,
                 attn_implementation="eager"),
            TEXT128, 17, ["last_hidden_state", "pooler_output"]),
    em.Spec("vit_base_224",
            "ViT-Base/16 encoder (12 layers, hidden 768) at 224x224 (197 tokens).",
            "ViTConfig", "ViTModel",
            dict(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072, attn_implementation="eager"),
            IMG224, 17, ["last_hidden_state", "pooler_output"]),
    em.Spec("convnext_tiny_224",
            "ConvNeXt-T (depths 3-3-9-3, widths 96-768) at 224x224: 7x7 depthwise, LayerNorm, GELU.",
            "ConvNextConfig", "ConvNextForImageClassification",
            dict(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3], image_size=224,
                 num_labels=1000),
            IMG224, 17, ["logits"]),
    em.Spec("efficientnet_b0_224",
            "EfficientNet-B0 at 224x224: depthwise convs, squeeze-excite, SiLU, BN.",
            "EfficientNetConfig", "EfficientNetForImageClassification",
            dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
                 num_labels=1000,
                 dropout_rate=0.0, drop_connect_rate=0.0),
            IMG224, 17, ["logits"]),
    em.Spec("gpt2_small_128",
            "GPT-2 small (12 layers, hidden 768, 12 heads), sequence 128, causal + padding mask.",
            "GPT2Config", "GPT2Model",
            dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                 use_cache=False, attn_implementation="eager"),
            TEXT128, 17, ["last_hidden_state"]),
    em.Spec("llama_decoder_128",
            "A Llama-style decoder (8 layers, hidden 512, 8 heads, 2 KV heads (grouped-query),"
            " SwiGLU 1408, RMSNorm, rotary), sequence 128.",
            "LlamaConfig", "LlamaModel",
            dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                 use_cache=False, attn_implementation="eager"),
            TEXT128, 17, ["last_hidden_state"]),
]


def main(argv: list[str]) -> int:
    out = Path("/work/bench-models")
    if "--out" in argv:
        i = argv.index("--out")
        out = Path(argv[i + 1])
        del argv[i:i + 2]
    out.mkdir(parents=True, exist_ok=True)
    em.HERE = out                      # export() writes next to HERE
    import torch
    torch.use_deterministic_algorithms(True)
    wanted = set(argv)
    failed = []
    for spec in SPECS:
        if wanted and spec.name not in wanted:
            continue
        if spec.inputs is TEXT128:      # make_inputs draws ids below the spec's vocab size
            spec.config.setdefault("vocab_size", 30522)
        try:
            model = em.build(spec)
            args = em.make_inputs(spec)
            path = em.export(spec, model, args)
            res = em.check(spec, path, model, args)
        except Exception as e:  # report, keep going
            failed.append(spec.name)
            print(f"FAIL {spec.name}: {type(e).__name__}: {e}")
            continue
        print(f"ok   {spec.name:16s} {path.stat().st_size / 2**20:7.1f} MiB  "
              f"max|ort-torch| {res['max_abs_diff']:.2e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if "-h" in sys.argv or "--help" in sys.argv:     # runs in the torch venv: no _common
        print(__doc__.strip())
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
