"""One compile, many shapes: a BERT encoder with symbolic [batch, seq] (issue 16).

The model comes from tests/models/export_dynamic.py:

    /work/exportenv/bin/python tests/models/export_dynamic.py bert_dyn --size real \\
        --out /work/bench-models
    .venv/bin/python bench/shapes.py /work/bench-models/bert_dyn_real.onnx [--threads 1 2]
                                     [--repeats 10] [--backend numba]

For each thread count, eqsat-fuse compiles the model once (no input_shapes) and runs it at 8
shapes from (1, 8) to (8, 512). Per shape: the first run (its lowering for the new shape
included), how many of its kernels ran as NumPy while a worker compiled them and how many
were compiled in this process (none should be), the steady median of --repeats runs once
those kernels are compiled, and
onnxruntime ENABLE_ALL's steady median at the same thread count, timed alone after eqsat-fuse
(one session for every shape, as onnxruntime serves variable shapes), and the largest
difference of the outputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _common import ort_session

SHAPES = [(1, 8), (1, 32), (1, 128), (2, 64), (1, 384), (4, 128), (1, 512), (8, 512)]


def _feeds(batch: int, seq: int, rng) -> dict:
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq * 3 // 4:] = 0
    return {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
            "attention_mask": mask}


def _median_ms(run, feeds, repeats: int) -> float:
    run(feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--backend", default="numba")
    args = parser.parse_args(argv)

    import eqsat_fuse as ef

    for threads in args.threads:
        start = time.perf_counter()
        compiled = ef.compile(args.model, backend=args.backend, threads=threads)
        compile_s = time.perf_counter() - start
        rng = np.random.default_rng(0)
        cases = [_feeds(b, s, rng) for b, s in SHAPES]
        ours, outputs = [], []
        generic = compiled.generic
        for (b, s), feeds in zip(SHAPES, cases):
            jit_before = _jit_count(compiled)
            start = time.perf_counter()
            out = compiled.run(feeds)
            first = (time.perf_counter() - start) * 1e3
            program, _ = generic.programs[generic.key(generic.bind(feeds))]
            deferred = program.report.jit_deferred
            generic.wait()          # the kernels it ran as NumPy are compiled now
            steady = _median_ms(compiled.run, feeds, args.repeats)
            ours.append((first, deferred, _jit_count(compiled) - jit_before, steady))
            outputs.append(out)
        session = ort_session(args.model, threads, optimize=True)
        names = [o.name for o in session.get_outputs()]
        time.sleep(0.5)
        theirs, diffs = [], []
        for feeds, out in zip(cases, outputs):
            want = session.run(None, feeds)
            diffs.append(max(float(np.max(np.abs(out[n] - w))) for n, w in zip(names, want)))
            theirs.append(_median_ms(lambda f: session.run(None, f), feeds, args.repeats))
        print(f"{args.model.name}, {threads} thread{'s' if threads > 1 else ''}, "
              f"{args.backend}: compiled once in {compile_s:.1f} s")
        print("| batch x seq | first run ms | kernels run as NumPy while compiling | kernels "
              "compiled in this process | steady ms | onnxruntime ms | ratio | max diff |")
        print("|---|---|---|---|---|---|---|---|")
        for (b, s), (first, deferred, jit, steady), ort_ms, diff in zip(SHAPES, ours, theirs,
                                                                        diffs):
            print(f"| {b} x {s} | {first:.1f} | {deferred} | {jit} | {steady:.2f} | "
                  f"{ort_ms:.2f} | {steady / ort_ms:.2f} | {diff:.1e} |")
    return 0


def _jit_count(compiled) -> int:
    """Kernels JIT-compiled so far by the programs of every shape this one has lowered."""
    generic = compiled.generic
    programs = [p for p, _ in generic.programs.values()] if generic else [compiled.program]
    return sum(p.report.jit_compiled for p in programs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
