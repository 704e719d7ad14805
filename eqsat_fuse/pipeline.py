"""The whole compiler, top to bottom: import, encode, saturate, extract, decode, lower.

`compile` calls each stage once, in order, and keeps what it needs for `run`, `verify` and the
report. Every stage is its own module and can be called alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from .costmodel import load_cost_model
from .decode import decode
from .encode import encode
from .explain import shaping_rules
from .extract import extract, roots_of
from .importer import import_model
from .ir import KernelPlan
from .lower import Program, lower
from .report import KernelReport, Report
from .saturate import Budgets, saturate
from .serialized import fill_missing_facts, read_egraph
from .verify import VerifyResult, compare, oracle_outputs, random_feeds


class Compiled:
    """A compiled model: `run(feeds)`, `report`, `verify()`."""

    def __init__(self, program: Program, report: Report, source: onnx.ModelProto):
        self.program = program
        self.report = report
        self._source = source

    @property
    def plan(self) -> KernelPlan:
        return self.program.plan

    @property
    def inputs(self):
        """Input name -> TensorInfo (static shape and dtype) the program was compiled for."""
        return dict(self.plan.inputs)

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        """Run the compiled program: {input name: array} -> {output name: array}."""
        return self.program.run(feeds)

    def verify(self, feeds: dict[str, Any] | None = None, against: str = "ort",
               seed: int = 0) -> VerifyResult:
        """Compare with the original model run by onnxruntime (or onnx.reference)."""
        feeds = random_feeds(self.plan.inputs, seed) if feeds is None else feeds
        expected, oracle = oracle_outputs(self._source, feeds, against)
        return compare(self.run(feeds), expected, oracle,
                       storage_dtype=getattr(self.program, "storage_dtype", "float32"))


def _source_proto(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load(str(model))


def compile(model: str | Path | onnx.ModelProto, target: str = "cpu", backend: str = "numpy",
            extractor: str = "greedy-dag", rules: list[str | Path] | None = None,
            input_shapes: dict[str, tuple[int, ...]] | None = None,
            budgets: Budgets | None = None,
            storage_dtype: str | None = None, cache_dir: str | Path | None = None,
            progress: Callable[[str], None] | None = None) -> Compiled:
    """Compile an ONNX model (path or ModelProto) into a fused program for `target`.

    `rules` adds rule files to the shipped ones; `input_shapes` fixes dynamic input dims;
    `progress`, if given, is called with each stage's name as it starts. `storage_dtype`
    overrides the target's activation storage ("float16" halves bytes moved); `cache_dir` is
    where the Numba backend keeps compiled kernels.
    """
    timings: dict[str, float] = {}
    current: list = [None, time.perf_counter()]

    def stage(name: str) -> None:
        now = time.perf_counter()
        if current[0] is not None:
            timings[current[0]] = now - current[1]
        current[:] = [name, now]
        if progress is not None and name != "done":
            progress(name)

    cost_model = load_cost_model(target)
    stage("import")
    graph = import_model(model, input_shapes)
    stage("encode")
    encoding = encode(graph)
    stage("saturate")
    egraph, saturation = saturate(encoding, rules, budgets or Budgets(), cost_model.target)
    stage("extract")
    serialized = read_egraph(egraph)
    fill_missing_facts(serialized)
    extraction = extract(serialized, roots_of(serialized, encoding.output_vars), cost_model,
                         extractor)
    shaped_by = shaping_rules(serialized, extraction.choice, extraction.constant, encoding,
                              saturation.rule_files)
    stage("decode")
    plan = decode(serialized, extraction, encoding, graph)
    stage("lower")
    if storage_dtype is None:
        storage_dtype = getattr(cost_model, "storage_dtype", "float32")
    program = lower(plan, backend, graph.opset, storage_dtype=storage_dtype, cache_dir=cache_dir)
    plan = program.plan          # lowering may drop kernels whose buffer a reader recomputes
    stage("done")

    kernel_reports = []
    for kernel in plan.kernels:
        cost = extraction.kernels[kernel.eclass]
        kernel_reports.append(KernelReport(
            name=kernel.name, kind=kernel.kind, ops=kernel.ops, output=kernel.output,
            shape=list(kernel.info.shape), dtype=kernel.info.dtype, predicted_us=cost.us,
            launch_us=cost.launch_us, read_bytes=cost.read_bytes, write_bytes=cost.write_bytes,
            flops=cost.flops))
    report = Report(
        model=graph.name, target=cost_model.target, backend=backend, extractor=extractor,
        nodes_in=graph.onnx_nodes, nodes_imported=len(graph.nodes),
        kernels_out=sum(1 for k in plan.kernels if k.kind != "alias"),
        views=sum(1 for k in plan.kernels if k.kind == "alias"),
        stop_reason=saturation.stop_reason, iterations=saturation.iterations,
        egraph_nodes=saturation.egraph_nodes, matches_per_rule=saturation.matches_per_rule,
        cost=extraction.cost, peak_bytes=program.memory.arena_bytes,
        lower_bound_bytes=program.memory.lower_bound_bytes,
        separate_bytes=program.memory.separate_bytes, timings=timings,
        source_opset=graph.source_opset, opaque_ops=graph.opaque_ops, kernels=kernel_reports,
        rules_in_program=shaped_by,
        backend_report=program.report.as_dict() if program.report else {})
    return Compiled(program, report, _source_proto(model))

