"""Fused attention at growing sequence lengths: an encoder layer and a decoder layer, each as
eqsat-fuse compiles it (the cost model chooses FusedAttention or not), as the unfused program
(the same compile under a copy of the cost file in which FusedAttention never pays), and as
onnxruntime ENABLE_ALL runs it. Medians of round-robin blocks (`_common.measure`: each runtime
alone in its block, after a pause), ratios in the same run; peak activation memory.

    .venv/bin/python bench/attention.py [--threads N] [MODEL.onnx ...]

`--threads N` (default 1) pins every runtime to N threads; `--threads 0` leaves each at its
own default (eqsat-fuse: the cores this process may use; onnxruntime: its own choice). Models
(default): /work/bench-models/attn_{encoder,decoder}_{128,512,1024,4096}.onnx, written by
`bench/export_real_models.py attention` (one BERT-base encoder layer with a padding mask; one
Llama-style decoder layer, causal, 8 query heads sharing 2 key/value heads).

Columns: `fused` and `unfused` ms, `ort` ms (ENABLE_ALL), `unf/fused` and `ort/fused` (above 1:
fused attention is faster), `kernels` the FusedAttention kernels of each program
(fused/unfused), `peak` the planned peak of each program's arena (activations and workspace;
weights aside) and `unf/fused` of the peaks, `ort peak` what onnxruntime's session and first
run add to a fresh process's peak resident memory (its weights included: compare it with the
file's size), and whether the outputs of both programs match onnxruntime.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import block_size, exit_on_help, measure, ort_session, pop_option  # noqa: E402

exit_on_help(sys.argv)
THREADS = int(pop_option(sys.argv, "--threads", "1"))
if THREADS:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = str(THREADS)

import numpy as np  # noqa: E402

import eqsat_fuse as ef  # noqa: E402
from eqsat_fuse.checking.verify import random_feeds  # noqa: E402
from eqsat_fuse.tools.calibrate import attention_priced  # noqa: E402

MODELS = "/work/bench-models/attn_*.onnx"


def ort_peak_bytes(path: str, threads: int) -> float:
    """What creating an onnxruntime session and its first run add to the peak resident memory
    of a fresh process: its weights (about the file's size) and its activations."""
    import subprocess
    # the peak of the process's own memory, VmHWM (ru_maxrss would start at the parent's peak:
    # Linux carries it across fork and exec)
    code = (
        "import sys; sys.path.insert(0, sys.argv[3]);"
        "from _common import ort_session;"
        "from eqsat_fuse.checking.verify import random_feeds;"
        "from eqsat_fuse.signature import model_inputs;"
        "from eqsat_fuse.frontend.importer import import_model;"
        "hwm = lambda: int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]);"
        "feeds = random_feeds(model_inputs(import_model(sys.argv[1])), 0);"
        "before = hwm();"
        "s = ort_session(sys.argv[1], int(sys.argv[2]), True);"
        "s.run(None, feeds);"
        "print(hwm() - before)")
    out = subprocess.run([sys.executable, "-c", code, path, str(threads),
                          str(Path(__file__).parent)], capture_output=True, text=True,
                         check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1]) * 1024


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}M"


def main(paths: list[str]) -> int:
    paths = paths or sorted(glob.glob(MODELS), key=lambda p: (
        Path(p).stem.rsplit("_", 1)[0], int(Path(p).stem.rsplit("_", 1)[1])))
    if not paths:
        print(f"no models: run bench/export_real_models.py attention first ({MODELS})")
        return 1
    threads = THREADS or None
    setting = f"{THREADS} thread(s)" if THREADS else "defaults"
    print(f"fused attention, {setting}; medians of round-robin blocks, ms", flush=True)
    print(f"{'model':20s} {'fused':>8s} {'unfused':>8s} {'ort':>8s} {'unf/fused':>9s} "
          f"{'ort/fused':>9s} {'kernels':>7s} {'peak fused':>10s} {'unfused':>8s} "
          f"{'unf/fused':>9s} {'ort peak':>8s} {'match':>5s}", flush=True)
    # the unfused program: FusedAttention priced at a thousandth of its rate
    plain_target = attention_priced(0.0757, 0.0, "cpu-unfused-attention")
    for path in paths:
        name = Path(path).stem
        fused = ef.compile(path, threads=threads)
        unfused = ef.compile(path, threads=threads, target=plain_target)
        feeds = random_feeds(fused.example_inputs, 0)
        ort = ort_session(path, THREADS or 0, True)
        want = ort.run(None, feeds)
        names = [o.name for o in ort.get_outputs()]
        match = all(np.allclose(c.run(feeds)[n], w, rtol=1e-3, atol=1e-4)
                    for c in (fused, unfused) for n, w in zip(names, want))
        runs = {"fused": lambda: fused.run(feeds), "unfused": lambda: unfused.run(feeds),
                "ort": lambda: ort.run(None, feeds)}
        long = "4096" in name
        t = measure(runs, repeat=5 if long else 15, min_time=1.0, max_time=60.0,
                    block=block_size(THREADS or os.cpu_count() or 1))
        del ort
        counts = "/".join(str(sum("FusedAttention" in k.ops for k in c.report.kernels))
                          for c in (fused, unfused))
        peak_f, peak_u = fused.report.peak_bytes, unfused.report.peak_bytes
        print(f"{name:20s} {t['fused'] * 1e3:8.2f} {t['unfused'] * 1e3:8.2f} "
              f"{t['ort'] * 1e3:8.2f} {t['unfused'] / t['fused']:9.2f} "
              f"{t['ort'] / t['fused']:9.2f} {counts:>7s} {mib(peak_f):>10s} "
              f"{mib(peak_u):>8s} {peak_u / peak_f:9.2f} "
              f"{mib(ort_peak_bytes(path, THREADS)):>8s} {'yes' if match else 'NO':>5s}",
              flush=True)
        del fused, unfused
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
