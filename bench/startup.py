"""Startup per model, each figure taken in a fresh process: cold compile (empty kernel cache),
warm compile (the cache that cold compile filled), `eqsat_fuse.load` of the artifact the warm
compile saved, and onnxruntime's session creation; medians of --repeat processes.

    .venv/bin/python bench/startup.py [--models MODEL ...] [--repeat N] [--threads N]
                                      [--backend numba|numpy] [--empty-numba-cache]

Without --models it runs every `.onnx` file of /work/bench-models (the realistic exports of
`export_real_models.py`), else the test models. Each process times its own call (compile,
load, session) after its imports; `import` is the interpreter start and the imports before it
(eqsat_fuse with NumPy, Numba and onnx; onnxruntime), which every fresh process pays.

`load` is split into reading and checking the artifact's files against their SHA-256 (the
weights, mostly: `read`) and the rest (`rest`: lowering the stored plan, which generates the
kernel sources and loads their machine code from the artifact's Numba cache files); the
`jit` column counts kernels the load compiled (0 on the machine that saved it). Cold compile
uses an empty eqsat-fuse kernel folder; with --empty-numba-cache it also points
NUMBA_CACHE_DIR at an empty folder, so the hand-written runtime is compiled too, as on a new
machine. `--threads` (default 1) pins every runtime, as the other benchmarks do.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_threads  # noqa: E402

MODELS = "/work/bench-models"
TEST_MODELS = Path(__file__).resolve().parent.parent / "tests" / "models"


# ---- the child processes: one call each, timed after the imports --------------------------------

def child(kind: str, model: str, backend: str, cache: str, artifact: str) -> dict:
    """Run one startup step in this (fresh) process and return its figures."""
    started = time.perf_counter()
    if kind == "ort":
        import onnxruntime as ort
        imported = time.perf_counter()
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return {"import": imported - started, "seconds": time.perf_counter() - imported}
    import eqsat_fuse as ef
    imported = time.perf_counter()
    if kind == "load":
        program = ef.load(artifact)
        seconds = time.perf_counter() - imported
        b = program.report.backend_report
        timings = program.report.timings
        return {"import": imported - started, "seconds": seconds, "read": timings["load-read"],
                "rest": seconds - timings["load-read"], "jit": b.get("jit_compiled", 0)}
    program = ef.compile(model, backend=backend, cache_dir=cache, threads=int(
        os.environ["NUMBA_NUM_THREADS"]))
    seconds = time.perf_counter() - imported
    b = program.report.backend_report
    figures = {"import": imported - started, "seconds": seconds, "jit": b.get("jit_compiled", 0),
               "sources": b.get("sources", 0), "nodes": program.report.nodes_in}
    if artifact:
        program.save(artifact, force=True)
    return figures


def _spawn(kind: str, model: str, backend: str, cache: str, artifact: str = "",
           env: dict | None = None) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", kind, model, backend,
               cache, artifact]
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(f"{kind} of {model} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# ---- the parent: per model, the four steps --repeat times ---------------------------------------

def measure(model: str, backend: str, repeat: int, empty_numba_cache: bool) -> dict:
    """Medians of each step over `repeat` rounds (each round: cold, warm + save, load, ORT)."""
    rows: dict[str, list[dict]] = {"cold": [], "warm": [], "load": [], "ort": []}
    with tempfile.TemporaryDirectory(prefix="startup-") as scratch:
        artifact = os.path.join(scratch, "model.eqsat")
        for round_ in range(repeat):
            cache = os.path.join(scratch, f"kernels-{round_}")
            env = dict(os.environ)
            if empty_numba_cache:
                env["NUMBA_CACHE_DIR"] = os.path.join(scratch, f"numba-{round_}")
            rows["cold"].append(_spawn("compile", model, backend, cache, env=env))
            rows["warm"].append(_spawn("compile", model, backend, cache, artifact, env=env))
            rows["load"].append(_spawn("load", model, backend, cache, artifact, env=env))
            rows["ort"].append(_spawn("ort", model, backend, cache))
        size = sum(f.stat().st_size for f in Path(artifact).rglob("*") if f.is_file())
    median = {step: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
              for step, runs in rows.items()}
    median["artifact_mb"] = size / 1e6
    return median


def table(results: dict[str, dict], threads: int, backend: str, repeat: int) -> str:
    head = (f"{'model':26s} {'nodes':>5s} {'srcs':>4s} {'cold s':>7s} {'warm s':>7s} "
            f"{'load s':>7s} {'read s':>7s} {'rest s':>7s} {'jit':>3s} {'MB':>6s} "
            f"{'ort s':>6s} {'import s':>9s}")
    lines = [f"startup, {backend} backend, {threads} thread(s), medians of {repeat} fresh "
             f"processes per step (import: eqsat-fuse / onnxruntime)", head, "-" * len(head)]
    for model, m in results.items():
        lines.append(
            f"{Path(model).stem[:26]:26s} {m['cold']['nodes']:5.0f} {m['cold']['sources']:4.0f} "
            f"{m['cold']['seconds']:7.2f} {m['warm']['seconds']:7.2f} "
            f"{m['load']['seconds']:7.2f} {m['load']['read']:7.2f} {m['load']['rest']:7.2f} "
            f"{m['load']['jit']:3.0f} {m['artifact_mb']:6.1f} {m['ort']['seconds']:6.2f} "
            f"{m['load']['import']:4.1f}/{m['ort']['import']:<4.1f}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        print(json.dumps(child(*argv[1:6])))
        return
    threads = set_threads(argv)
    options = {"--repeat": "3", "--backend": "numba"}
    for flag in options:
        if flag in argv:
            i = argv.index(flag)
            options[flag] = argv[i + 1]
            del argv[i:i + 2]
    empty = "--empty-numba-cache" in argv
    if empty:
        argv.remove("--empty-numba-cache")
    models = argv[argv.index("--models") + 1:] if "--models" in argv else (
        sorted(glob.glob(os.path.join(MODELS, "*.onnx")))
        or sorted(str(p) for p in TEST_MODELS.glob("*.onnx")))
    results = {}
    for model in models:
        print(f"[startup] {model}...", file=sys.stderr, flush=True)
        results[model] = measure(model, options["--backend"], int(options["--repeat"]), empty)
    print(table(results, threads, options["--backend"], int(options["--repeat"])))


if __name__ == "__main__":
    main(sys.argv[1:])
