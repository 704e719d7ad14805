"""Fused elementwise chains of growing length: GB/s of the eqsat-fuse Numba kernel against a
memory copy of the same bytes (the bandwidth limit) and against onnxruntime, same run.

    .venv/bin/python bench/chains.py [--threads N] [--elements N] [--kind mixed|arithmetic|both]

Bytes per run = input read once + output written once (what a fused kernel must move).
The copy is np.copyto at one thread; with --threads N it is the faster of np.copyto and an
N-thread streaming copy (one thread cannot reach the machine's bandwidth). With N > 1 each
contender runs three times in a row per round and its first run is not counted (see
_common.measure: other runtimes' threads spin for a while after their runs).
Two kinds of chain: "mixed" (swish/GELU-like: Sigmoid, Tanh and Erf among the ops, which
makes long chains compute-bound on one core) and "arithmetic" (Mul, Add, Sub, Relu,
LeakyRelu, Neg: memory-bound at any length). Default: both.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

THREADS = set_threads(sys.argv)

import numpy as np  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from _common import (CHAIN_OPS, elementwise_model, measure, ort_session,  # noqa: E402
                     parallel_copy, block_size)


def main(argv: list[str]) -> None:
    n = 1 << 24
    if "--elements" in argv:
        n = int(argv[argv.index("--elements") + 1])
    kind = argv[argv.index("--kind") + 1] if "--kind" in argv else "both"
    kinds = list(CHAIN_OPS) if kind == "both" else [kind]
    if any(k not in CHAIN_OPS for k in kinds):
        sys.exit(f"chains.py: --kind is one of {', '.join(CHAIN_OPS)}, both")
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32).reshape(n // 64, 64)
    dst = np.empty_like(x)
    nbytes = 2 * x.nbytes
    pcopy = parallel_copy(THREADS) if THREADS > 1 else None
    copy_what = (f"the faster of np.copyto and a {THREADS}-thread streaming copy"
                 if THREADS > 1 else "np.copyto")
    print(f"threads: {THREADS}; {n} float32 elements ({x.nbytes / 2**20:.0f} MiB in, "
          f"{x.nbytes / 2**20:.0f} MiB out); medians; copy = {copy_what}")
    head = (f"{'ops':>3s} {'chain':44s} {'copy GB/s':>9s} {'fused GB/s':>10s} {'% copy':>7s} "
            f"{'ORT GB/s':>8s} {'x ORT':>6s} {'kernels':>7s}")
    print(head)
    print("-" * len(head))
    for kind, length in [(k, length) for k in kinds for length in (1, 2, 3, 4, 6, 8, 10)]:
        if length == 1 and kind != kinds[0]:
            print()
        model = elementwise_model(n, length, kind=kind)
        ops = "+".join(node.op_type for node in model.graph.node)
        program = ef.compile(model, backend="numba")
        feeds = {"x": x}
        assert program.verify(feeds).ok
        session = ort_session(model, THREADS, True)
        # both write into preallocated destinations: the copy into `dst`, the program into
        # output buffers it reuses across runs (run(feeds, out=...)); measured round-robin
        outs = program.program.empty_outputs()
        peers = {"copy": lambda: np.copyto(dst, x)}
        if THREADS > 1:
            peers["pcopy"] = lambda: pcopy(dst, x)
        t = measure({**peers, "fused": lambda: program.run(feeds, out=outs),
                     "ort": lambda: session.run(None, feeds)}, repeat=15,
                    block=block_size(THREADS))
        copy = min(t[k] for k in peers)
        fused, ort = t["fused"], t["ort"]
        gb = lambda s: nbytes / s / 1e9  # noqa: E731
        print(f"{length:3d} {ops[:44]:44s} {gb(copy):9.1f} {gb(fused):10.1f} "
              f"{100 * copy / fused:6.0f}% {gb(ort):8.1f} {ort / fused:6.2f} "
              f"{program.report.kernels_out:7d}")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
