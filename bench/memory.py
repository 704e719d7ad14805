"""Peak arena bytes per model against the liveness lower bound and against allocating every
tensor separately, for both backends and both storage dtypes.

    .venv/bin/python bench/memory.py [MODEL ...]
"""

from __future__ import annotations

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BUILTIN, exit_on_help, load_model  # noqa: E402

import eqsat_fuse as ef  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(names: list[str]) -> None:
    if not names:
        names = sorted(glob.glob(os.path.join(ROOT, "tests/models/*.onnx"))) + list(BUILTIN)
    head = (f"{'model':28s} {'backend':7s} {'storage':7s} {'peak KiB':>10s} {'bound KiB':>10s} "
            f"{'separate KiB':>12s} {'peak/bound':>10s} {'separate/peak':>13s} {'in-place':>8s}")
    print(head)
    print("-" * len(head))
    worst = 0.0
    for name in names:
        model = load_model(name)
        label = os.path.basename(name).removesuffix(".onnx")
        for backend in ("numpy", "numba"):
            for storage in ("float32", "float16"):
                c = ef.compile(model, backend=backend, storage_dtype=storage)
                r = c.report
                # a program with no intermediate (one fused kernel) has nothing to place
                empty = r.lower_bound_bytes == 0 and r.peak_bytes == 0
                ratio = r.peak_bytes / max(r.lower_bound_bytes, 1)
                worst = max(worst, ratio)
                print(f"{label:28s} {backend:7s} {storage:7s} {r.peak_bytes / 1024:10.1f} "
                      f"{r.lower_bound_bytes / 1024:10.1f} {r.separate_bytes / 1024:12.1f} "
                      f"{'-' if empty else f'{ratio:.3f}':>10s} "
                      f"{'-' if empty else f'{r.separate_bytes / r.peak_bytes:.2f}':>13s} "
                      f"{len(c.program.memory.inplace):8d}")
                sys.stdout.flush()
    print(f"\nworst peak / lower bound: {worst:.3f} (target <= 1.10)")


if __name__ == "__main__":
    exit_on_help(sys.argv)
    main(sys.argv[1:])
