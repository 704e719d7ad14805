"""Autoregressive decoding with a KV cache: one compile, then a token at a time (issue 16).

The model is one GPT-2 decode step whose past length is a symbol, exported by
tests/models/export_dynamic.py:

    /work/exportenv/bin/python tests/models/export_dynamic.py gpt2_kv --size real \\
        --out /work/bench-models
    .venv/bin/python bench/decode.py /work/bench-models/gpt2_kv_real.onnx [--tokens 64]
                                     [--prompt 8] [--threads 1 2] [--backend numba]

For each thread count: eqsat-fuse compiles the step once (no input_shapes), then decodes
--tokens tokens after a --prompt-token prompt, feeding present_* back as past_*; every step is a
new shape (the past grows by one). Then onnxruntime (ORT_ENABLE_ALL, the same thread count)
decodes the same tokens, timed alone after eqsat-fuse's loop. Printed per thread count:
time to the first token (compile + prompt step), the per-token median of the first loop (each
shape seen for the first time: its lowering included) and of a second loop over the same
shapes, onnxruntime's per-token median, and the largest logit difference from onnxruntime.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _common import ort_session


def _layers(inputs) -> list[str]:
    return [n for n in inputs if n.startswith("past_")]


def _feeds(ids, total, past: dict) -> dict:
    return {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], total), np.int64),
            **past}


def decode(run, names: list[str], past_names: list[str], prompt: np.ndarray, tokens: int,
           shape: tuple) -> tuple[list[float], list[np.ndarray], list[np.ndarray]]:
    """Run the loop: seconds per step, the logits of each step, the tokens fed."""
    batch, heads, _, head_dim = shape
    past = {n: np.zeros((batch, heads, 0, head_dim), np.float32) for n in past_names}
    ids, total = prompt, prompt.shape[1]
    seconds, logits, fed = [], [], []
    for _ in range(tokens + 1):
        feeds = _feeds(ids, total, past)
        start = time.perf_counter()
        out = run(feeds)
        seconds.append(time.perf_counter() - start)
        logits.append(out["logits"][:, -1])
        fed.append(ids)
        past = {n: out[n.replace("past_", "present_")] for n in past_names}
        ids = np.argmax(out["logits"][:, -1:], axis=-1).astype(np.int64)
        total += 1
    return seconds, logits, fed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--backend", default="numba")
    args = parser.parse_args(argv)

    import eqsat_fuse as ef

    rng = np.random.default_rng(0)
    rows = []
    for threads in args.threads:
        start = time.perf_counter()
        compiled = ef.compile(args.model, backend=args.backend, threads=threads)
        compile_s = time.perf_counter() - start
        past_names = _layers(compiled.inputs)
        spec = compiled.inputs[past_names[0]].shape
        heads, head_dim = int(spec[1]), int(spec[3])
        prompt = rng.integers(0, 1000, (1, args.prompt)).astype(np.int64)
        first, logits, _ = decode(compiled.run, [], past_names, prompt, args.tokens,
                                  (1, heads, 0, head_dim))
        again, _, _ = decode(compiled.run, [], past_names, prompt, args.tokens,
                             (1, heads, 0, head_dim))
        session = ort_session(args.model, threads, optimize=True)
        names = [o.name for o in session.get_outputs()]

        def run_ort(feeds):
            return dict(zip(names, session.run(None, feeds)))

        time.sleep(0.5)
        decode(run_ort, names, past_names, prompt, 4, (1, heads, 0, head_dim))   # warm up
        ort_s, ort_logits, _ = decode(run_ort, names, past_names, prompt, args.tokens,
                                      (1, heads, 0, head_dim))
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(logits, ort_logits))
        rows.append((threads, compile_s + first[0], statistics.median(first[1:]) * 1e3,
                     statistics.median(again[1:]) * 1e3, statistics.median(ort_s[1:]) * 1e3,
                     max(first[1:]) * 1e3, diff))
    print(f"{args.model.name}: prompt {args.prompt} tokens, then {args.tokens} tokens one at a "
          f"time ({args.backend} backend)")
    print("| threads | first token s (compile+prompt) | per token ms, 1st loop | max step ms, "
          "1st loop | per token ms, 2nd loop | onnxruntime ms | ratio (2nd loop / ort) | "
          "max logit diff |")
    print("|---|---|---|---|---|---|---|---|")
    for t, ttft, first_ms, again_ms, ort_ms, worst, diff in rows:
        print(f"| {t} | {ttft:.1f} | {first_ms:.2f} | {worst:.1f} | {again_ms:.2f} | "
              f"{ort_ms:.2f} | {again_ms / ort_ms:.2f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
