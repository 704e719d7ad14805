"""Export realistic-size models (real architectures at the sizes people deploy) for the
benchmarks, into a folder outside the repository (they are 40-440 MB each; never commit them).

Runs in the export venv (Python 3.11, CPU torch, transformers), like tests/models/export_models.py,
whose build/export/check code it reuses (random weights, seed 0, BatchNorm kept as nodes,
TorchScript exporter, static batch-1 shapes, checked against torch through onnxruntime):

    /work/exportenv/bin/python bench/export_real_models.py [--out /work/bench-models] [NAME ...]

then

    .venv/bin/python bench/models.py /work/bench-models/*.onnx

NAME is one of the specs below, or of VARIANTS (DenseNet-121, dynamo-exported BERT and GPT-2
blocks; the dynamo exporter needs onnxscript in the export venv), or `attention` for the
encoder and decoder layers of bench/attention.py at every length of ATTENTION_SEQS (default:
all).
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
    # the ~2,000-node transformer of issue 20's cold-compile target: the same decoder, 16 layers
    em.Spec("llama16_decoder_128",
            "The Llama-style decoder above with 16 layers (about 1,900 ONNX nodes), sequence 128.",
            "LlamaConfig", "LlamaModel",
            dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=16,
                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                 use_cache=False, attn_implementation="eager"),
            TEXT128, 17, ["last_hidden_state"]),
]

# one encoder layer and one decoder layer at growing sequence lengths, for bench/attention.py
# (issue 14: fused attention; a small vocabulary, the layers are what is measured)
ATTENTION_SEQS = (128, 512, 1024, 4096)
for _seq in ATTENTION_SEQS:
    _text = {"input_ids": ((1, _seq), "int64"), "attention_mask": ((1, _seq), "int64")}
    SPECS += [
        em.Spec(f"attn_encoder_{_seq}",
                f"One BERT-base encoder layer (hidden 768, 12 heads), sequence {_seq}, padding "
                "mask.",
                "BertConfig", "BertModel",
                dict(vocab_size=1000, hidden_size=768, num_hidden_layers=1,
                     num_attention_heads=12, intermediate_size=3072,
                     max_position_embeddings=_seq, attn_implementation="eager"),
                _text, 17, ["last_hidden_state"]),
        em.Spec(f"attn_decoder_{_seq}",
                f"One Llama-style decoder layer (hidden 512, 8 heads, 2 KV heads, causal, "
                f"rotary, SwiGLU 1408), sequence {_seq}.",
                "LlamaConfig", "LlamaModel",
                dict(vocab_size=1000, hidden_size=512, intermediate_size=1408,
                     num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2,
                     max_position_embeddings=_seq, use_cache=False,
                     attn_implementation="eager"),
                _text, 17, ["last_hidden_state"])]


# ---------------------------------------------------------------- exporter variants (issue 14)
# Models whose exports spell fusions differently from the specs above: DenseNet-121 (Conv ->
# BatchNormalization -> Relu after a Concat), and BERT/GPT-2 blocks through the dynamo exporter
# (`x * (0.5 * (1 + erf(x / sqrt 2)))`, GELU's tanh form). torchvision is not in the export
# venv, so DenseNet-121 is written out here, as torchvision builds it.

def densenet121(num_classes: int = 1000):
    """torchvision's DenseNet-121 (growth 32, blocks 6-12-24-16, bn_size 4), random weights."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, cin, growth=32, bn_size=4):
            super().__init__()
            self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1,
                                                                     bias=False)
            self.norm2 = nn.BatchNorm2d(bn_size * growth)
            self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

        def forward(self, feats):
            x = self.conv1(torch.relu(self.norm1(torch.cat(feats, 1))))
            return self.conv2(torch.relu(self.norm2(x)))

    class Block(nn.Module):
        def __init__(self, n, cin):
            super().__init__()
            self.layers = nn.ModuleList(Layer(cin + i * 32) for i in range(n))

        def forward(self, x):
            feats = [x]
            for layer in self.layers:
                feats.append(layer(feats))
            return torch.cat(feats, 1)

    mods, c = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
               nn.MaxPool2d(3, 2, 1)], 64
    for i, n in enumerate((6, 12, 24, 16)):
        mods.append(Block(n, c))
        c += n * 32
        if i != 3:
            mods += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                     nn.AvgPool2d(2, 2)]
            c //= 2
    mods += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
             nn.Linear(c, num_classes)]
    return nn.Sequential(*mods)


def export_variants(out: Path, wanted: set[str]) -> list[str]:
    """densenet121_224 (TorchScript exporter), bert_block_dynamo_128 and gpt2_block_dynamo_128
    (two layers each, the dynamo exporter); each checked against torch through onnxruntime."""
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers
    failed = []

    def save(name, model, args, input_names, dynamo):
        path = out / f"{name}.onnx"
        if dynamo:
            torch.onnx.export(model, args, str(path), dynamo=True, opset_version=18,
                              input_names=input_names, external_data=False)
        else:
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17,
                              input_names=input_names, do_constant_folding=True,
                              training=torch.onnx.TrainingMode.PRESERVE)
        with torch.no_grad():
            want = model(*args)
        want = want[0] if isinstance(want, tuple) else want
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {k: a.numpy() for k, a in zip(input_names, args)})[0]
        diff = float(np.max(np.abs(got - want.numpy())))
        assert diff < 1e-3, f"{name}: max|ort-torch| {diff}"
        print(f"ok   {name:24s} {path.stat().st_size / 2**20:7.1f} MiB  max|ort-torch| {diff:.2e}",
              flush=True)

    if not wanted or "densenet121_224" in wanted:
        torch.manual_seed(em.SEED)
        model = densenet121()
        em.randomise_batchnorm(model, torch.Generator().manual_seed(em.SEED + 1))
        x = torch.randn((1, 3, 224, 224), generator=torch.Generator().manual_seed(em.SEED + 2))
        try:
            save("densenet121_224", model.eval(), (x,), ["pixel_values"], dynamo=False)
        except Exception as e:  # report, keep going
            failed.append("densenet121_224")
            print(f"FAIL densenet121_224: {type(e).__name__}: {e}")

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, return_dict=True).last_hidden_state

    blocks = {"bert_block_dynamo_128": ("BertConfig", "BertModel", dict(
                  num_hidden_layers=2, hidden_size=768, num_attention_heads=12,
                  intermediate_size=3072)),
              "gpt2_block_dynamo_128": ("GPT2Config", "GPT2Model", dict(
                  n_layer=2, n_embd=768, n_head=12, use_cache=False))}
    for name, (config_cls, model_cls, cfg) in blocks.items():
        if wanted and name not in wanted:
            continue
        torch.manual_seed(em.SEED)
        config = getattr(transformers, config_cls)(vocab_size=1000, **cfg)
        config._attn_implementation = "eager"
        model = Hidden(getattr(transformers, model_cls)(config)).eval()
        ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(em.SEED))
        try:
            save(name, model, (ids,), ["input_ids"], dynamo=True)
        except Exception as e:  # report, keep going
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    return failed


VARIANTS = ("densenet121_224", "bert_block_dynamo_128", "gpt2_block_dynamo_128")


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
    if "attention" in wanted:
        wanted = (wanted - {"attention"}) | {f"attn_{kind}_{seq}" for seq in ATTENTION_SEQS
                                             for kind in ("encoder", "decoder")}
    failed = []
    if not wanted or wanted & set(VARIANTS):
        failed += export_variants(out, wanted & set(VARIANTS))
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
