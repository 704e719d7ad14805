"""Latency per model: onnxruntime (all optimizations / none) against eqsat-fuse (Numba fused,
Numba with no rule run, NumPy fused). Medians, ratios to ORT_ENABLE_ALL in the same run,
geometric means per family.

    .venv/bin/python bench/models.py [--threads N] [--fast-math] [--no-baselines [--numpy]]
                                     [MODEL ...]

`--fast-math` also times the Numba program compiled with numerics="fast" (docs/numerics.md)
beside the default exact one: the `fast` column and `exact/fast`, the cost of exact mode.
`--no-baselines` leaves out the no-rules Numba program and the NumPy one (their columns show
"-"): on deployment-size models their cold compiles take most of the run; `--numpy` keeps the
NumPy one (it compiles in seconds: the comparison behind the default backend, docs/backends.md).

MODEL is an .onnx file or a builtin of bench/_common.py (encoder-base, cnn-resnet56,
elementwise-4M). Default: every test model and the builtins.
"""

from __future__ import annotations

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

THREADS = set_threads(sys.argv)
FAST = "--fast-math" in sys.argv
if FAST:
    sys.argv.remove("--fast-math")
BASELINES = "--no-baselines" not in sys.argv
if not BASELINES:
    sys.argv.remove("--no-baselines")
NUMPY = BASELINES or "--numpy" in sys.argv
if "--numpy" in sys.argv:
    sys.argv.remove("--numpy")

import numpy as np  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from _common import (BUILTIN, block_size, family_of, geomean, load_model, measure,  # noqa: E402
                     median_seconds, ort_session)
from eqsat_fuse.checking.verify import random_feeds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(names: list[str]) -> None:
    if not names:
        names = sorted(glob.glob(os.path.join(ROOT, "tests/models/*.onnx"))) + list(BUILTIN)
    print(f"threads: {THREADS} (OMP/OpenBLAS/Numba/ORT intra-op); medians; "
          "ratio = time / ORT_ENABLE_ALL (lower is better)")
    head = (f"{'model':28s} {'family':11s} {'ORT all':>9s} {'ORT none':>9s} {'numba':>9s} "
            f"{'numba-nofuse':>12s} {'numpy':>9s} | {'x ORT':>6s} {'nofuse/fused':>12s} "
            f"{'numpy x ORT':>11s}" + (f" {'fast':>9s} {'exact/fast':>10s}" if FAST else ""))
    print(head)
    print("-" * len(head))
    ratios: dict[str, list[float]] = {}
    fusion: dict[str, list[float]] = {}
    exactness: dict[str, list[float]] = {}
    for name in names:
        model = load_model(name)
        label = os.path.basename(name).removesuffix(".onnx")
        family = family_of(label)
        fused = ef.compile(model, backend="numba")
        unfused = numpy_fused = None
        if BASELINES:
            unfused = ef.compile(model, backend="numba", budgets=ef.Budgets(iterations=0))
        if NUMPY:
            numpy_fused = ef.compile(model, backend="numpy")
        fast = ef.compile(model, backend="numba", numerics="fast") if FAST else None
        feeds = random_feeds(fused.example_inputs, 0)
        check = fused.verify(feeds)
        if not check.ok:
            # float32 rounding amplified by a model's scale (ResNet-50's random BN statistics
            # give logits of 1e5, where a few elements cancel to ~100): accept a difference
            # within 1e-5 of the largest output, say so, and time it; anything else aborts
            session = ort_session(model, THREADS, False)
            got = fused.run(feeds)
            want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
            scale = max(float(np.max(np.abs(w))) for w in want.values())
            worst = max(float(np.max(np.abs(got[k] - w))) for k, w in want.items())
            print(f"{label}: per-element check failed ({check.summary().splitlines()[-1].strip()}"
                  f"); max |diff| / max |output| = {worst / scale:.1e}")
            assert worst <= 1e-5 * scale, f"{label}: numba output mismatch"
        ort_all = ort_session(model, THREADS, True)
        ort_none = ort_session(model, THREADS, False)
        # round-robin: each round runs every variant once, so machine load hits all alike
        variants = {
            "ort_all": lambda: ort_all.run(None, feeds),
            "ort_none": lambda: ort_none.run(None, feeds),
            "numba": lambda: fused.run(feeds),
        }
        if unfused is not None:
            variants["nofuse"] = lambda: unfused.run(feeds)
        if fast is not None:
            variants["fast"] = lambda: fast.run(feeds)
        t = measure(variants, block=block_size(THREADS))
        if numpy_fused is not None:
            t["numpy"] = median_seconds(lambda: numpy_fused.run(feeds), repeat=5, min_time=0.1)
        r = t["numba"] / t["ort_all"]
        ratios.setdefault(family, []).append(r)
        ms = {k: f"{v * 1e3:.3f}m" for k, v in t.items()}
        nofuse_ratio = numpy_ratio = "-"
        if unfused is not None:
            fusion.setdefault(family, []).append(t["nofuse"] / t["numba"])
            nofuse_ratio = f"{t['nofuse'] / t['numba']:.2f}"
        if numpy_fused is not None:
            numpy_ratio = f"{t['numpy'] / t['ort_all']:.2f}"
        print(f"{label:28s} {family:11s} {ms['ort_all']:>9s} {ms['ort_none']:>9s} "
              f"{ms['numba']:>9s} {ms.get('nofuse', '-'):>12s} {ms.get('numpy', '-'):>9s} | "
              f"{r:6.2f} {nofuse_ratio:>12s} {numpy_ratio:>11s}"
              + (f" {ms['fast']:>9s} {t['numba'] / t['fast']:10.2f}" if FAST else ""))
        if FAST:
            exactness.setdefault(family, []).append(t["numba"] / t["fast"])
        sys.stdout.flush()
    print()
    print("geometric means per family (numba fused / ORT_ENABLE_ALL; numba no-rules / fused):")
    for family in sorted(ratios):
        speedup = f"{geomean(fusion[family]):5.2f}" if family in fusion else "    -"
        print(f"  {family:12s} x ORT {geomean(ratios[family]):5.2f}   fusion speed-up "
              f"{speedup}   ({len(ratios[family])} models)"
              + (f"   exact/fast {geomean(exactness[family]):5.2f}" if FAST else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
