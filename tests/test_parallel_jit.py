"""Cold compile on every core (`backends.numba.parallel_jit`): worker processes compile some of
a program's kernel modules while this process compiles the others, and whatever a worker fails
to compile this process compiles itself."""

from __future__ import annotations

import subprocess
import sys

from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import parallel_jit

from conftest import make_model


def _branches(first: str, second: str):
    """Six outputs, each its own kernel of a distinct source: output k applies (first, then
    second) k + 1 times to input k, a chain no other test builds."""
    nodes, inputs, outputs = [], [], []
    for k in range(6):
        x = f"x{k}"
        inputs.append((x, [3, 40]))
        for i in range(k + 1):
            for op in (first, second):
                y = f"b{k}_{op}{i}"
                nodes.append(helper.make_node(op, [x], [y]))
                x = y
        nodes.append(helper.make_node("Identity", [x], [f"y{k}"]))
        outputs.append((f"y{k}", [3, 40]))
    return make_model(nodes, inputs, outputs)


def _compile(model, cache):
    program = ef.compile(model, backend="numba", cache_dir=cache, threads=2)
    result = program.verify(seed=2)
    assert result.ok, result.summary()
    return program.report.backend_report


def test_workers_compile_part_of_a_cold_program(tmp_path):
    report = _compile(_branches("Sigmoid", "Tanh"), tmp_path / "kernels")
    assert report["sources"] == 6
    assert report["jit_workers"] == 1
    assert report["jit_compiled"] == 6 and report["jit_loaded"] == 0
    # every module's machine code is in the cache: a second process would load, not compile
    indexes = list((tmp_path / "kernels").rglob("*.nbi"))
    assert len(indexes) == 6


def test_a_failing_worker_leaves_its_modules_to_this_process(tmp_path, monkeypatch):
    def dying_worker():     # takes one module and exits without an answer
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                bufsize=1)

    monkeypatch.setattr(parallel_jit, "_start_worker", dying_worker)
    report = _compile(_branches("Tanh", "Sigmoid"), tmp_path / "kernels")
    assert report["sources"] == 6
    assert report["jit_compiled"] == 6
