"""Latency with the machine idle and with one core kept busy by another process.

    .venv/bin/python bench/contention.py [--quick] [--seconds S] [--pin CPU] [MODEL ...]

For each model: eqsat-fuse (Numba backend) and onnxruntime (ENABLE_ALL) at their default thread
count and at 1 and 2 threads, first with the machine as it is ("idle"), then with a busy-loop
process beside them ("busy": one core's worth of load, unpinned, or on core CPU with `--pin`).
Prints a markdown table of medians (ms) and the two ratios the issue asks about: eqsat-fuse at
its default against onnxruntime at its default, and against itself at one thread.

Why it is built this way:
- each model runs in a child process of its own (memory of one model at a time, thread pools
  fresh, a crash costs one row); the child compiles first (`ef.compile(..., threads=N)`; the
  kernel cache in ~/.cache makes a second compile fast), then times;
- each variant is timed alone in blocks: a 50 ms pause (the previous runtime's spinning workers
  go to sleep), one uncounted run (its own workers wake), then `BLOCK` counted runs; the blocks
  of all variants alternate round after round until the phase's time is spent, so drifting load
  falls on all of them alike; medians over all counted runs;
- the busy process is `while True: pass` with a deadline of its own (it ends even if this script
  is killed with SIGKILL), killed when the phase ends, on Ctrl-C and on any error;
- "idle" is whatever the machine is doing: the table gives the load other processes put on this
  process's cores during each phase (from /proc/stat, this process's own CPU time taken out), so
  a noisy idle phase shows as such. eqsat-fuse at its default uses fewer threads while other
  processes keep cores busy (`eqsat_fuse.threads`); the table gives the threads its default
  used at the end of each phase.

`MODEL` is an .onnx file; default: the realistic exports in /work/bench-models if present
(bench/README.md), else tests/models/*.onnx. `--quick`: 2 s per phase and the two smallest
default models (a smoke test; the figures are noisier). `--seconds S`: per phase (default 8).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common import exit_on_help

ROOT = Path(__file__).resolve().parent.parent
REAL = Path("/work/bench-models")
REAL_DEFAULT = ["mobilenetv2_224", "efficientnet_b0_224", "resnet18_224",
                "bert_block_dynamo_128", "gpt2_block_dynamo_128", "llama_decoder_128"]
BLOCK = 4
PAUSE = 0.05
SETTLE = 3 * 0.25          # after the load changes: three of eqsat-fuse's load windows
VARIANTS = [("ef", None), ("ef", 1), ("ef", 2), ("ort", None), ("ort", 1), ("ort", 2)]


def busy_process(seconds: float, pin: int | None) -> subprocess.Popen:
    """A process that keeps one core busy for at most `seconds` (its own deadline)."""
    code = ("import os, time\n"
            f"{'' if pin is None else f'os.sched_setaffinity(0, {{{pin}}})'}\n"
            f"end = time.monotonic() + {seconds}\n"
            "while time.monotonic() < end: pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


# ---- one model, in a child process ------------------------------------------------------------

def _feeds(compiled):
    import numpy as np
    rng = np.random.default_rng(0)
    feeds = {}
    for name, spec in compiled.inputs.items():
        dtype = np.dtype(spec.dtype)
        feeds[name] = (rng.standard_normal(spec.shape).astype(dtype) if dtype.kind == "f"
                       else np.ones(spec.shape, dtype))     # token ids and masks: ones
    return feeds


def _runners(model: str):
    """{(runtime, threads): run()} for every variant, compiled and warmed up."""
    import eqsat_fuse as ef
    from _common import ort_session
    runners, feeds = {}, None
    for runtime, threads in VARIANTS:
        if runtime == "ef":
            compiled = ef.compile(model, backend="numba", threads=threads)
            feeds = feeds or _feeds(compiled)
            runners[runtime, threads] = lambda c=compiled: c.run(feeds)
        else:
            session = ort_session(model, threads or 0, optimize=True)    # 0: its default
            runners[runtime, threads] = lambda s=session: s.run(None, feeds)
        runners[runtime, threads]()
    return runners


def _time_phase(runners: dict, seconds: float) -> dict:
    """Median ms of each runner, blocks alternating until `seconds` are spent (3 rounds at
    least; a block stops early once it has run for a third of the phase)."""
    import numpy as np
    times = {key: [] for key in runners}
    start, rounds = time.monotonic(), 0
    while rounds < 3 or time.monotonic() - start < seconds:
        for key, run in runners.items():
            time.sleep(PAUSE)
            run()
            block_start = time.monotonic()
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - t0)
                if time.monotonic() - block_start > seconds / 3:
                    break
        rounds += 1
    return {key: 1e3 * float(np.median(v)) for key, v in times.items()}


def _foreign_load(load, since: tuple[float, float, float]) -> float | None:
    """Other processes' load on our cores since `since` (wall, busy, own CPU), in cores."""
    busy = load.busy_seconds()
    if busy is None:
        return None
    wall, busy0, own0 = since
    return max(0.0, (busy - busy0) - (time.process_time() - own0)) / (time.monotonic() - wall)


def _phase(runners, seconds, busy_seconds, pin):
    from eqsat_fuse import threads as T
    proc = busy_process(busy_seconds, pin) if busy_seconds else None
    try:
        time.sleep(SETTLE)
        mark = (time.monotonic(), T.LOAD.busy_seconds() or 0.0, time.process_time())
        medians = _time_phase(runners, seconds)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("the busy process reached its deadline before the phase ended")
        return {"ms": {f"{r}:{t}": v for (r, t), v in medians.items()},
                "foreign_load": _foreign_load(T.LOAD, mark),
                "default_threads_used": T.LOAD.usable(T.resolve(None))}
    finally:
        stop(proc)


def one_model(model: str, seconds: float, pin: int | None) -> dict:
    from eqsat_fuse.threads import resolve
    started = time.monotonic()
    runners = _runners(model)
    compile_s = time.monotonic() - started
    idle = _phase(runners, seconds, 0, pin)
    time.sleep(SETTLE)
    busy = _phase(runners, seconds, max(300.0, 20 * seconds), pin)
    return {"model": Path(model).stem, "compile_s": compile_s, "default_threads": resolve(None),
            "idle": idle, "busy": busy}


# ---- the table ---------------------------------------------------------------------------------

def _fmt(v):
    return "-" if v is None else f"{v:.2f}"


def table(rows: list[dict]) -> str:
    head = ("| model | load | other load (cores) | ef default (threads used) | ef 1 | ef 2 "
            "| ort default | ort 1 | ort 2 | ef default / ort default | ef default / ef 1 |")
    lines = [head, "|" + "---|" * 11]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | failed: {row['error']} |" + " |" * 9)
            continue
        for load in ("idle", "busy"):
            p = row[load]
            ms = p["ms"]
            ef0, ef1, ort0 = ms["ef:None"], ms["ef:1"], ms["ort:None"]
            lines.append(
                f"| {row['model']} | {load} | {_fmt(p['foreign_load'])} | {ef0:.2f} "
                f"({p['default_threads_used']} of {row['default_threads']}) | {ef1:.2f} "
                f"| {ms['ef:2']:.2f} | {ort0:.2f} | {ms['ort:1']:.2f} | {ms['ort:2']:.2f} "
                f"| {ef0 / ort0:.2f} | {ef0 / ef1:.2f} |")
    return "\n".join(lines)


def _models(argv: list[str], quick: bool) -> list[str]:
    if argv:
        return argv
    if REAL.is_dir():
        names = REAL_DEFAULT[:2] if quick else REAL_DEFAULT
        return [str(REAL / f"{n}.onnx") for n in names if (REAL / f"{n}.onnx").exists()]
    found = sorted(str(p) for p in (ROOT / "tests" / "models").glob("*.onnx"))
    return found[:2] if quick else found


def _option(argv: list[str], flag: str, kind):
    if flag not in argv:
        return None
    i = argv.index(flag)
    try:
        value = kind(argv[i + 1])
    except (IndexError, ValueError):
        sys.exit(f"contention.py: {flag} needs a value ({kind.__name__})")
    del argv[i:i + 2]
    return value


def main(argv: list[str]) -> int:
    exit_on_help(argv)
    if argv[:1] == ["--one"]:                       # the child: one model, JSON on stdout
        model, seconds, pin = argv[1], float(argv[2]), None if argv[3] == "-" else int(argv[3])
        print(json.dumps(one_model(model, seconds, pin)))
        return 0
    quick = "--quick" in argv
    argv = [a for a in argv if a != "--quick"]
    seconds = _option(argv, "--seconds", float) or (2.0 if quick else 8.0)
    pin = _option(argv, "--pin", int)
    models = _models(argv, quick)
    print(f"# contention: {len(models)} models, {seconds:g} s per phase, busy process "
          f"{'on core %d' % pin if pin is not None else 'unpinned'}, {os.cpu_count()} cores",
          file=sys.stderr, flush=True)
    rows = []
    for model in models:
        print(f"[contention] {Path(model).stem}...", file=sys.stderr, flush=True)
        child = subprocess.Popen([sys.executable, __file__, "--one", model, str(seconds),
                                  "-" if pin is None else str(pin)],
                                 stdout=subprocess.PIPE, text=True, start_new_session=False)
        try:
            out, _ = child.communicate()
        except BaseException:
            child.send_signal(signal.SIGINT)         # its finally kills its busy process
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
        lines = out.strip().splitlines()
        rows.append(json.loads(lines[-1]) if child.returncode == 0 and lines else
                    {"model": Path(model).stem, "error": f"exit status {child.returncode}"})
    print(table(rows))
    print("\nms per run, medians; 'other load' is what other processes (the busy loop "
          "included) used of this process's cores during the phase; eqsat-fuse is the Numba "
          "backend, onnxruntime ORT_ENABLE_ALL; default = each runtime's own thread count.")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # so `finally` kills the busy loop
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
