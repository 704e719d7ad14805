"""Export transformers with open dims (symbolic batch, sequence and past length) to ONNX.

Runs in the export venv, like export_models.py (random weights, seed 0, TorchScript exporter):

    /work/exportenv/bin/python tests/models/export_dynamic.py [--out DIR] [--size tiny|real]
                                                              [NAME ...]

- `bert_dyn`: a BERT encoder (`BertModel`) with inputs `input_ids` / `attention_mask` of shape
  [batch, seq];
- `gpt2_kv`: one decode step of a GPT-2 (`GPT2LMHeadModel`) with a KV cache: `input_ids`
  [batch, seq], `attention_mask` [batch, total] (total = past + seq), `past_key_<i>` /
  `past_value_<i>` [batch, heads, past, head_dim]; it returns `logits` and the
  `present_key_<i>` / `present_value_<i>` [batch, heads, total, head_dim] that the next step
  reads as its past;
- `gpt2_kv_dynamo`: the same decode step through the dynamo exporter (`dynamic_shapes`; needs
  onnxscript in the export venv), whose shape plumbing differs.

`--size tiny` (the default) writes the test models into tests/models; `--size real` writes
deployment-size ones (BERT-base, GPT-2 small) for the benchmarks (bench/decode.py,
bench/shapes.py) into --out. Each export is checked against torch through onnxruntime at three
shapes (past 0 included).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import transformers
from transformers import DynamicCache

HERE = Path(__file__).resolve().parent
SEED = 0

CONFIGS = {
    "tiny": {
        "bert_dyn": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64,
                         max_position_embeddings=128),
        "gpt2_kv": dict(vocab_size=128, n_positions=256, n_embd=32, n_layer=2, n_head=4),
    },
    "real": {
        "bert_dyn": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                         num_attention_heads=12, intermediate_size=3072,
                         max_position_embeddings=512),
        "gpt2_kv": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    },
}
for _sizes in CONFIGS.values():          # the dynamo export is the same decode step
    _sizes["gpt2_kv_dynamo"] = _sizes["gpt2_kv"]


class BertOutputs(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state, out.pooler_output


class DecodeStep(torch.nn.Module):
    """GPT-2 with its KV cache as plain tensors: (ids, mask, *past) -> (logits, *present)."""

    def __init__(self, model, layers: int):
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids, attention_mask, *past):
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True)
        present = []
        for layer in out.past_key_values.layers[:self.layers]:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def _export(module, args, path: Path, inputs, outputs, dynamic, opset=17) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic, opset_version=opset, dynamo=False,
                          do_constant_folding=True)


def export_bert(config: dict, path: Path) -> list[dict]:
    torch.manual_seed(SEED)
    cfg = transformers.BertConfig(**config)
    cfg._attn_implementation = "eager"
    module = BertOutputs(transformers.BertModel(cfg).eval()).eval()
    gen = torch.Generator().manual_seed(SEED + 2)

    def feeds(batch, seq):
        ids = torch.randint(0, config["vocab_size"], (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq // 2:] = 0
        return ids, mask

    names = ["input_ids", "attention_mask"]
    dynamic = {n: {0: "batch", 1: "seq"} for n in names}
    dynamic.update({"last_hidden_state": {0: "batch", 1: "seq"}, "pooler_output": {0: "batch"}})
    _export(module, feeds(2, 16), path, names, ["last_hidden_state", "pooler_output"], dynamic)
    return [dict(zip(names, feeds(b, s))) for b, s in ((1, 8), (2, 16), (3, 5))], module


def _decode_step(config: dict):
    """GPT-2's decode step with random weights (seed 0), its past inputs' names, and a maker
    of its feeds (batch, seq, past) -> (ids, mask, *past), seeded."""
    torch.manual_seed(SEED)
    cfg = transformers.GPT2Config(**config)
    cfg._attn_implementation = "eager"
    layers, heads = config["n_layer"], config["n_head"]
    head_dim = config["n_embd"] // heads
    module = DecodeStep(transformers.GPT2LMHeadModel(cfg).eval(), layers).eval()
    gen = torch.Generator().manual_seed(SEED + 2)
    past_names = [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]

    def feeds(batch, seq, past):
        ids = torch.randint(0, config["vocab_size"], (batch, seq), generator=gen)
        mask = torch.ones(batch, past + seq, dtype=torch.int64)
        kv = [torch.randn(batch, heads, past, head_dim, generator=gen) for _ in past_names]
        return (ids, mask, *kv)

    return module, past_names, feeds


def _decode_cases(inputs: list[str], feeds) -> list[dict]:
    return [dict(zip(inputs, feeds(b, s, p))) for b, s, p in ((1, 1, 5), (2, 4, 0), (1, 7, 9))]


def export_gpt2(config: dict, path: Path):
    module, past_names, feeds = _decode_step(config)
    present_names = [n.replace("past_", "present_") for n in past_names]
    inputs = ["input_ids", "attention_mask", *past_names]
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
               "logits": {0: "batch", 1: "seq"}}
    dynamic.update({n: {0: "batch", 2: "past"} for n in past_names})
    dynamic.update({n: {0: "batch", 2: "total"} for n in present_names})
    _export(module, feeds(1, 2, 3), path, inputs, ["logits", *present_names], dynamic)
    return _decode_cases(inputs, feeds), module


def export_gpt2_dynamo(config: dict, path: Path):
    """The decode step of `export_gpt2`, exported by the dynamo exporter (torch.export with
    `dynamic_shapes`; needs onnxscript): other shape plumbing (sym_size) than TorchScript's."""
    module, past_names, feeds = _decode_step(config)
    inputs = ["input_ids", "attention_mask", *past_names]
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
    past, total = torch.export.Dim("past", max=128), torch.export.Dim("total", max=192)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, tuple({0: batch, 2: past}
                                                              for _ in past_names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, feeds(1, 2, 3), str(path), input_names=inputs,
                          dynamic_shapes=shapes, dynamo=True)
    return _decode_cases(inputs, feeds), module


def check(path: Path, cases: list[dict], module) -> float:
    """Largest |onnxruntime - torch| over the cases (each a different shape)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for case in cases:
        with torch.no_grad():
            want = module(*case.values())
        got = session.run(None, {k: v.numpy() for k, v in case.items()})
        for w, g in zip(want, got):
            if w.numel():
                worst = max(worst, float(np.max(np.abs(w.numpy() - g))))
    return worst


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*",
                        help="bert_dyn, gpt2_kv, gpt2_kv_dynamo (default: all)")
    parser.add_argument("--size", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder to write into (default: tests/models for tiny)")
    args = parser.parse_args(argv)
    out = args.out or (HERE if args.size == "tiny" else None)
    if out is None:
        parser.error("--size real needs --out (the files are hundreds of MB: keep them out of "
                     "the repository)")
    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    exporters = {"bert_dyn": export_bert, "gpt2_kv": export_gpt2,
                 "gpt2_kv_dynamo": export_gpt2_dynamo}
    names = args.names or list(exporters)
    for name in names:
        if name not in exporters:
            parser.error(f"unknown model {name!r} (choose from {', '.join(exporters)})")
        suffix = "tiny" if args.size == "tiny" else "real"
        path = out / f"{name}_{suffix}.onnx"
        cases, module = exporters[name](CONFIGS[args.size][name], path)
        diff = check(path, cases, module)
        print(f"ok   {path.name:24s} {path.stat().st_size / 1024:9.1f} KiB  "
              f"max|ort-torch| over 3 shapes {diff:.2e}")
        if diff > 1e-3:
            print(f"FAIL {name}: onnxruntime and torch differ by {diff}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
