"""Hard limits: saturation in a child process with a memory cap and a wall-clock deadline.

The budgets of `saturate.Budgets` (iterations, e-nodes, seconds) are checked between iterations,
so one explosive iteration can still take all the memory of the machine: egglog then aborts the
whole process ("memory allocation of N bytes failed"), or the kernel kills it. With hard limits
the model is loaded into an e-graph and saturated in a child process instead:

- the child (`python -m eqsat_fuse.saturation.limits`, started with `subprocess`, so a user's
  script is never re-imported) caps its address space with RLIMIT_AS at its size after start-up plus
  `memory_mb`, and the parent kills it when `seconds` of wall time have passed;
- after loading the model and after every completed iteration the child sends a snapshot: the
  e-graph's JSON export (egglog's `serialize([]).to_json()`, what `serialized.parse_export`
  reads) with the iterations and rule matches so far; at the end it sends the final e-graph
  and the saturation report. The channel carries JSON only (nothing from the child is
  unpickled);
- if the last iteration overshot the e-node budget, the e-graph of the iteration before it is
  used (stop reason "node budget"): extraction runs in this process, and its memory grows
  with the e-graph;
- if the child hits a limit, compilation goes on from the last snapshot, i.e. the e-graph of
  the last completed iteration (the last one within the e-node budget, if a later one
  overshot it: extracting that could exhaust this process's memory instead), and the report's
  stop reason says "hard memory limit" or "hard time limit"; if the child hits a limit before
  the model is even loaded, `LimitError` says which limit and how to raise it.

Snapshots cost one JSON export per iteration (about as long as an iteration of a large
e-graph); they are taken only when hard limits are on. Extraction and lowering still run in the
calling process, on an e-graph no bigger than the last completed iteration's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import EqsatFuseError, LimitError, RuleFileError
from .saturate import (Budgets, IterationRecord, RuleInfo, SaturationReport, StopReason,
                       iteration_record)

_FRAME = struct.Struct(">Q")
_MEMORY_SIGNS = ("memory allocation of", "MemoryError", "Cannot allocate memory", "out of memory",
                 "capacity overflow")
# what else a child under a memory cap dies of when an allocation fails: pyo3 panics when
# Python could not allocate an object egglog hands back (seen in `serialize` of a snapshot);
# without a cap the same panic is a bug, reported as a crash
_CAPPED_MEMORY_SIGNS = ("PyObject pointer is null",)


@dataclass(frozen=True)
class HardLimits:
    """Limits on the saturation child process; None switches one off."""

    memory_mb: int | None = 4096      # memory the child may use beyond its start-up size
    seconds: float | None = 300.0     # wall time of the child, start-up included

    def __post_init__(self):
        if self.memory_mb is not None and not (isinstance(self.memory_mb, int)
                                               and self.memory_mb > 0):
            raise LimitError(f"hard memory limit must be a whole number of MB > 0, "
                             f"not {self.memory_mb!r}")
        if self.seconds is not None and not (isinstance(self.seconds, (int, float))
                                             and self.seconds > 0):
            raise LimitError(f"hard time limit must be a number of seconds > 0, "
                             f"not {self.seconds!r}")


def parse_hard_limits(text: str) -> HardLimits:
    """`--hard-limits` on the command line: "memory_mb=2048,seconds=60" (either may be left out;
    "default" keeps both defaults; "off" as a value switches that limit off)."""
    import argparse

    values: dict[str, Any] = {}
    if text.strip() not in ("", "default"):
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key, value = key.strip().replace("-", "_"), value.strip()
            if not sep or key not in ("memory_mb", "seconds"):
                raise argparse.ArgumentTypeError(
                    f"expected memory_mb=N,seconds=S (either may be left out), got {text!r}")
            try:
                values[key] = None if value == "off" else (
                    int(value) if key == "memory_mb" else float(value))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{key} must be a number, got {value!r}") from None
    try:
        return HardLimits(**values)
    except LimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class ExportedEGraph:
    """An e-graph received from the child as its JSON export.

    It answers `serialize(...).to_json()` like an egglog e-graph, which is all that
    `serialized.read_egraph` asks of one.
    """

    def __init__(self, export: bytes):
        self._text = export.decode()

    def serialize(self, *args, **kwargs) -> "ExportedEGraph":
        return self

    def to_json(self) -> str:
        return self._text


# ---- the parent ---------------------------------------------------------------------------------

def saturate_in_child(encoding, user_rules: list[str | Path] | None, budgets: Budgets,
                      limits: HardLimits, target_rules: Sequence[str] = (),
                      numerics: str = "exact") -> tuple[ExportedEGraph, SaturationReport]:
    """`saturate.saturate` in a child process under `limits`; same result, e-graph as an export."""
    request = pickle.dumps({
        "encoding": encoding, "rules": [str(p) for p in user_rules or []], "budgets": budgets,
        "target_rules": list(target_rules), "numerics": numerics, "memory_mb": limits.memory_mb, "seconds": limits.seconds})
    env = dict(os.environ, MALLOC_ARENA_MAX="2", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               RUST_BACKTRACE="0", PYTHONFAULTHANDLER="")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), *filter(None, [env.get("PYTHONPATH")])])
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "eqsat_fuse.saturation.limits"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    reader = _Reader(proc.stdout, budgets.nodes)
    errors: list[bytes] = []
    err_thread = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    reader.start()
    err_thread.start()
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(timeout=limits.seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.wait()
    except BaseException:          # KeyboardInterrupt: never leave the child running
        _kill(proc)
        proc.wait()
        raise
    reader.join()
    err_thread.join(timeout=5)
    stderr = b"".join(errors).decode(errors="replace")
    seconds = time.perf_counter() - started

    final = reader.final
    if final is not None and final[0]["kind"] == "done":
        report = _report_from(final[0]["report"])
        snapshot = reader.snapshot
        if (report.egraph_nodes > budgets.nodes and snapshot is not None
                and snapshot[0]["nodes"] <= budgets.nodes):
            # the last iteration overshot the e-node budget: extract the one before it
            return _from_snapshot(snapshot, StopReason.NODE_BUDGET, report.seconds,
                                  report.rule_files, report.rules)
        return ExportedEGraph(final[1]), report
    if final is not None and final[0]["kind"] == "error":
        raise _error_from(final[0])
    if final is not None and final[0]["kind"] == "crash":
        signs = _MEMORY_SIGNS + (_CAPPED_MEMORY_SIGNS if limits.memory_mb is not None else ())
        if any(sign in final[0]["traceback"] for sign in signs):
            which = "memory"
        else:
            raise RuntimeError("the saturation child process failed:\n" + final[0]["traceback"])
    elif timed_out:
        which = "time"
    elif final is not None and final[0]["kind"] == "memory":
        which = "memory"
    elif limits.memory_mb is not None and (
            any(sign in stderr for sign in _MEMORY_SIGNS)
            or proc.returncode in (-signal.SIGABRT, -signal.SIGKILL, -signal.SIGSEGV)):
        which = "memory"
    else:
        raise RuntimeError(f"the saturation child process ended with status {proc.returncode}"
                           f" and no result:\n{stderr[-2000:]}")
    return _fall_back(which, reader.snapshot, limits, budgets, seconds)


def _fall_back(which: str, snapshot, limits: HardLimits, budgets: Budgets, seconds: float):
    limit = (f"hard memory limit ({limits.memory_mb} MB)" if which == "memory"
             else f"hard time limit ({limits.seconds:g} s)")
    if snapshot is None:
        raise LimitError(
            f"saturation hit the {limit} before the model was loaded into the e-graph; raise it "
            f"(--hard-limits memory_mb=...,seconds=... on the command line)")
    return _from_snapshot(snapshot, StopReason.HARD_MEMORY_LIMIT if which == "memory"
                          else StopReason.HARD_TIME_LIMIT, seconds)


def _from_snapshot(snapshot, stop_reason: StopReason, seconds: float, rule_files=(),
                   rules=None):
    header, export = snapshot
    return ExportedEGraph(export), SaturationReport(
        stop_reason=stop_reason, iterations=header["iterations"], egraph_nodes=header["nodes"],
        seconds=seconds, matches_per_rule={r: c for r, c in sorted(header["matches"].items()) if c},
        rule_files=list(rule_files), rules=dict(rules or {}),
        per_iteration=[IterationRecord(**r) for r in header.get("records", [])])


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class _Reader(threading.Thread):
    """Reads the child's frames; keeps the final message and the snapshot to fall back to: the
    last one within the node budget (extracting a bigger e-graph could exhaust the memory of
    this process instead), else the last one."""

    def __init__(self, stream, node_budget: int):
        super().__init__(daemon=True)
        self.stream = stream
        self.node_budget = node_budget
        self.snapshot: tuple[dict, bytes] | None = None
        self.final: tuple[dict, bytes | None] | None = None

    def _frame(self) -> bytes | None:
        head = self.stream.read(_FRAME.size)
        if len(head) < _FRAME.size:
            return None
        (size,) = _FRAME.unpack(head)
        data = self.stream.read(size)
        return data if len(data) == size else None

    def run(self) -> None:
        while True:
            header = self._frame()
            if header is None:
                return
            message = json.loads(header)
            body = self._frame() if message.get("body") else None
            if message.get("body") and body is None:
                return                    # cut off mid-message: the child died
            if message["kind"] == "snapshot":
                if (self.snapshot is None or message["nodes"] <= self.node_budget
                        or self.snapshot[0]["nodes"] > self.node_budget):
                    self.snapshot = (message, body)
            else:
                self.final = (message, body)


def _report_from(data: dict) -> SaturationReport:
    data = dict(data)
    data["rules"] = {name: RuleInfo(**info) for name, info in data.get("rules", {}).items()}
    data["stop_reason"] = StopReason(data["stop_reason"])
    data["per_iteration"] = [IterationRecord(**r) for r in data.get("per_iteration", [])]
    known = {f.name for f in dataclasses.fields(SaturationReport)}
    return SaturationReport(**{k: v for k, v in data.items() if k in known})


def _error_from(message: dict) -> EqsatFuseError:
    from .. import errors

    cls = getattr(errors, message["class"], EqsatFuseError)
    if not (isinstance(cls, type) and issubclass(cls, EqsatFuseError)):
        cls = EqsatFuseError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message["message"])
    if cls is RuleFileError or issubclass(cls, RuleFileError):
        exc.file, exc.line, exc.column = message.get("file"), message.get("line"), message.get(
            "column")
    return exc


# ---- the child ----------------------------------------------------------------------------------

class _Channel:
    def __init__(self, fd: int):
        self.fd = fd

    def send(self, message: dict, body: bytes | None = None) -> None:
        message = dict(message, body=body is not None)
        self._write(json.dumps(message).encode())
        if body is not None:
            self._write(body)

    def _write(self, data: bytes) -> None:
        view = memoryview(_FRAME.pack(len(data)) + data)
        while view:
            view = view[os.write(self.fd, view):]


def _is_iteration(command) -> bool:
    kind = type(command).__name__
    return kind == "RunSchedule" or (kind == "UserDefined"
                                     and getattr(command, "name", None) == "run-schedule")


class _SnapshotEGraph:
    """An egglog e-graph that sends a snapshot after the model is loaded and after each iteration."""

    def __init__(self, inner, channel: _Channel):
        self._inner = inner
        self._channel = channel
        self._model_pending = False
        self.iterations = 0
        self.matches: dict[str, int] = {}
        self.records: list[dict] = []       # IterationRecord fields, one per iteration

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def parse_program(self, *args, **kwargs):
        commands = self._inner.parse_program(*args, **kwargs)
        if kwargs.get("filename") == "<model>":
            self._model_pending = True
        return commands

    def run_program(self, *commands):
        started = time.perf_counter()
        outputs = self._inner.run_program(*commands)
        if any(_is_iteration(c) for c in commands):
            self.iterations += 1
            this_iteration: dict[str, int] = {}
            for output in outputs:
                report = getattr(output, "report", None)
                for rule, count in getattr(report, "num_matches_per_rule", {}).items():
                    this_iteration[rule] = this_iteration.get(rule, 0) + count
            for rule, count in this_iteration.items():
                self.matches[rule] = self.matches.get(rule, 0) + count
            self._snapshot(this_iteration, time.perf_counter() - started)
        elif self._model_pending:
            self._model_pending = False
            self._snapshot()
        return outputs

    def _snapshot(self, iteration_matches: dict[str, int] | None = None,
                  seconds: float = 0.0) -> None:
        size = self._inner.run_program(*self._inner.parse_program("(print-size)"))
        nodes = sum(n for _, n in size[0].sizes)
        if iteration_matches is not None:
            self.records.append(dataclasses.asdict(
                iteration_record(self.iterations, iteration_matches, nodes, seconds)))
        export = self._inner.serialize([]).to_json().encode()
        self._channel.send({"kind": "snapshot", "iterations": self.iterations, "nodes": nodes,
                            "matches": self.matches, "records": list(self.records)}, export)


def _virtual_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child_main() -> int:
    try:
        import resource
    except ImportError:            # not a POSIX system: the deadline still works
        resource = None

    channel = _Channel(os.dup(1))
    os.dup2(2, 1)                      # anything else printed goes to stderr, not the channel
    sys.stdout = sys.stderr
    if resource is not None:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # no core dump on an abort
        except (ValueError, OSError):
            pass
    request = pickle.loads(sys.stdin.buffer.read())   # from the parent, which started us
    try:
        if request["memory_mb"] is not None and resource is None:
            raise LimitError("a hard memory limit needs resource.setrlimit, which this platform "
                             "lacks; pass memory_mb=off and keep the time limit")
        from . import saturate as saturate_module

        real = saturate_module.new_egraph
        saturate_module.new_egraph = lambda: _SnapshotEGraph(real(), channel)
        if request["memory_mb"] is not None:
            cap = _virtual_bytes() + request["memory_mb"] * (1 << 20)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        egraph, report = saturate_module.saturate(request["encoding"], request["rules"],
                                                  request["budgets"], request["target_rules"],
                                                  request["numerics"])
        inner = egraph._inner if isinstance(egraph, _SnapshotEGraph) else egraph
        export = inner.serialize([]).to_json().encode()
        channel.send({"kind": "done", "report": dataclasses.asdict(report)}, export)
    except EqsatFuseError as exc:
        channel.send({"kind": "error", "class": type(exc).__name__, "message": str(exc),
                      **{k: getattr(exc, k, None) for k in ("file", "line", "column")}})
    except MemoryError:
        channel.send({"kind": "memory"})
    except BaseException:          # egglog's PanicException derives from BaseException
        channel.send({"kind": "crash", "traceback": traceback.format_exc()[-4000:]})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
