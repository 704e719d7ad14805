"""The whole compiler, top to bottom: import, encode, saturate, extract, decode, lower.

`compile` calls each stage once, in order, and keeps what it needs for `run`, `verify` and the
report. Every stage is its own module and can be called alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import onnx

from .backends import resolve_backend
from .compiled import Compiled, TensorSpec, load  # noqa: F401  (the compiler's results)
from .errors import EqsatFuseError
from .extraction.cost import roots_of
from .extraction.costmodel import load_cost_model
from .extraction.fusion_values import ExtractionContext
from .extraction.registry import extract
from .frontend.encode import encode
from .frontend.importer import import_model, with_input_shapes
from .lowering.decode import decode
from .lowering.generic import ShapeGeneric
from .lowering.lower import Program, lower
from .numerics import resolve as resolve_numerics
from .saturation.limits import HardLimits, saturate_in_child
from .saturation.passes import saturate_by_passes
from .saturation.saturate import Budgets, saturate
from .saturation.serialized import priced_at, read_for_extraction
from .signature import representative_bindings
from .threads import resolve as resolve_threads
from .tools.explain import shaping_rules
from .tools.report import KernelReport, Report


def _source_proto(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load(str(model))


def compile(model: str | Path | onnx.ModelProto, target: str = "cpu", backend: str | None = None,
            extractor: str = "greedy-dag", rules: list[str | Path] | None = None,
            input_shapes: dict[str, tuple[int, ...]] | None = None,
            budgets: Budgets | None = None,
            storage_dtype: str | None = None, cache_dir: str | Path | None = None,
            strategy: str = "eqsat",
            progress: Callable[[str], None] | None = None,
            hard_limits: HardLimits | None = None,
            objective: str = "latency", ilp_seconds: float = 30.0,
            threads: int | None = None, numerics: str | None = None,
            dims: dict[str, int | list[int]] | None = None) -> Compiled:
    """Compile an ONNX model (path or ModelProto) into a fused program for `target`.

    `rules` adds rule files to the shipped ones; `input_shapes` fixes dynamic input dims;
    `strategy` is "eqsat" (equality saturation, the default) or "passes" (the same rules as a
    fixed-order pass pipeline that commits after each pass; see `passes`). `progress`, if
    given, is called with each stage's name as it starts. `hard_limits` runs
    saturation in a child process with a memory cap and a deadline (see `limits`).
    `extractor` is "tree", "greedy-dag" or "ilp" (`ilp_seconds` is its time limit); `objective`
    ("latency" or "energy") is what extraction minimizes under the target's cost model.
    `backend` is "numba" (the default: each fused kernel compiled, the machine code cached on
    disk) or "numpy"; the environment variable EQSAT_FUSE_BACKEND sets another default.
    `threads` is the program's one thread setting (default: the cores this process may use):
    the Numba backend's parallel loops, with BLAS single-threaded inside them, or the NumPy
    backend's BLAS; each run sets it and puts the process's settings back (see `threads`).
    `numerics` is "exact" (the default: NaN, infinities and signed zeros as the model computes
    them) or "fast" (also the rules tagged `:numerics fast` and the kernels' fast-math flags,
    like -ffast-math; see `numerics` and docs/numerics.md).
    Open input dims (not fixed by `input_shapes`) compile once for every value (docs/shapes.md):
    `dims` {symbol: value} is what the cost model prices (default 1 for a leading dim, else
    128); a list of values ({"seq": [1, 128]}) compiles a program per shape bucket.
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

    _check_options(strategy, ilp_seconds)
    backend = resolve_backend(backend)
    numerics = resolve_numerics(numerics)
    if threads is not None:
        resolve_threads(threads)        # a bad count is refused before minutes of saturation
    cost_model = load_cost_model(target)
    stage("import")
    graph = import_model(model, input_shapes)
    signature = graph.signature
    buckets = _buckets(signature, dims, input_shapes)
    stage("encode")
    encoding = encode(graph)
    stage("saturate")
    if strategy == "passes":
        egraph, saturation, encoding = saturate_by_passes(
            encoding, graph, rules, budgets or Budgets(), cost_model.rule_files, cost_model,
            extractor, numerics)
    elif hard_limits is None:
        egraph, saturation = saturate(encoding, rules, budgets or Budgets(), cost_model.rule_files,
                                      numerics)
    else:
        egraph, saturation = saturate_in_child(encoding, rules, budgets or Budgets(), hard_limits,
                                               cost_model.rule_files, numerics)
    stage("extract")
    serialized, priced = read_for_extraction(egraph, encoding.dim_codes,
                                             signature and signature.representative)

    def extract_at(eg):
        return extract(eg, roots_of(eg, encoding.output_vars), cost_model, extractor,
                       objective=objective, seconds=ilp_seconds)

    extraction = extract_at(priced)
    shaped_by = shaping_rules(serialized, extraction.choice, extraction.constant, encoding,
                              saturation.rule_files)
    stage("decode")
    plan = decode(serialized, extraction, encoding, graph)
    stage("lower")
    if storage_dtype is None:
        storage_dtype = cost_model.storage_dtype
    program, generic = _lower(plan, signature, dict(
        backend=backend, opset=graph.opset, storage_dtype=storage_dtype, cache_dir=cache_dir,
        threads=threads, numerics=numerics))
    for binding in buckets[1:]:     # shape buckets: a program extracted for each
        _add_bucket(generic, binding, serialized, encoding, graph, extract_at)
    stage("done")

    report = _report(graph, cost_model, backend, extractor, objective, saturation, extraction,
                     program, timings, shaped_by)
    # for --explain: each fusion is re-extracted, so one ILP run gets at most 10 s there
    context = ExtractionContext(priced, extraction, cost_model,
                                {"seconds": min(ilp_seconds, 10.0)})
    source = with_input_shapes(_source_proto(model), input_shapes)  # the oracle takes them too
    if signature is not None:
        report.symbolic = _symbolic_report(signature, generic, extraction.latency_us)
    return Compiled(program, report, source,
                    source_path=None if isinstance(model, onnx.ModelProto) else Path(model),
                    extraction=context, opset=graph.opset, generic=generic)


def _lower(plan, signature, options: dict):
    """The program (at the representative binding for open dims) and, for open dims, the
    `ShapeGeneric` that lowers the same plan for each new shape a run feeds."""
    if signature is None:
        return lower(plan, **options), None
    generic = ShapeGeneric(plan, signature, options)
    program, _ = generic.program_for(signature.representative, defer_jit=False)
    return program, generic


def _buckets(signature, dims, input_shapes) -> list[dict[str, int]]:
    """The bindings extraction prices (the first the representative one, set on `signature`);
    none for static shapes, where `dims` is refused."""
    if signature is None:
        if dims:
            raise EqsatFuseError(f"dims {sorted(dims)} name no open dim: the model's inputs are "
                                 f"all static"
                                 f"{' once input_shapes is applied' if input_shapes else ''}")
        return []
    buckets = representative_bindings(signature, dims)
    signature.representative = buckets[0]
    return buckets


def _symbolic_report(signature, generic: ShapeGeneric, cost_us: float) -> dict:
    """`report.symbolic`: the signature, and each shape bucket's binding and predicted cost."""
    out = signature.describe()
    if generic.buckets:
        out["buckets"] = [{"binding": signature.representative, "cost": cost_us},
                          *({"binding": b, "cost": cost} for b, _, cost in generic.buckets)]
    return out


def _add_bucket(generic: ShapeGeneric, binding: dict, serialized, encoding, graph,
                extract_at) -> None:
    """One more shape bucket: extraction priced at `binding`, decoded, lowered (and its
    kernels compiled) at that binding, so that its first run waits for nothing."""
    extraction = extract_at(priced_at(serialized, binding))
    bucket = generic.add_bucket(binding, decode(serialized, extraction, encoding, graph),
                                extraction.latency_us)
    bucket.program_for(binding, defer_jit=False)


def _check_options(strategy: str, ilp_seconds: float) -> None:
    """Refuse an unknown strategy or a bad ILP time limit before any work."""
    if strategy not in ("eqsat", "passes"):
        raise EqsatFuseError(f"unknown strategy {strategy!r}; choose eqsat or passes")
    if isinstance(ilp_seconds, bool) or not isinstance(ilp_seconds, (int, float)) \
            or not ilp_seconds > 0:
        raise EqsatFuseError(f"the ILP time limit (--ilp-seconds) must be a number > 0, "
                             f"got {ilp_seconds!r}")


def _report(graph, cost_model, backend: str, extractor: str, objective: str, saturation,
            extraction, program: Program, timings: dict[str, float], shaped_by) -> Report:
    """What `compile` reports: the stages' results, kernel by kernel, and their timings."""
    kernel_reports = []
    plan = program.plan      # lowering may drop kernels whose buffer a reader recomputes
    for kernel in plan.kernels:
        cost = extraction.kernels[kernel.eclass]
        kernel_reports.append(KernelReport(
            name=kernel.name, kind=kernel.kind, ops=kernel.ops, output=kernel.output,
            shape=list(kernel.info.shape), dtype=kernel.info.dtype, predicted_us=cost.us,
            launch_us=cost.launch_us, read_bytes=cost.read_bytes, write_bytes=cost.write_bytes,
            flops=cost.flops, energy_uj=cost.energy_uj))
    return Report(
        model=graph.name, target=cost_model.target, backend=backend, extractor=extractor,
        nodes_in=graph.onnx_nodes, nodes_imported=len(graph.nodes),
        kernels_out=sum(1 for k in plan.kernels if k.kind != "alias"),
        views=sum(1 for k in plan.kernels if k.kind == "alias"),
        stop_reason=saturation.stop_reason, iterations=saturation.iterations,
        egraph_nodes=saturation.egraph_nodes, matches_per_rule=saturation.matches_per_rule,
        cost=extraction.latency_us, peak_bytes=program.memory.arena_bytes,
        lower_bound_bytes=program.memory.lower_bound_bytes,
        separate_bytes=program.memory.separate_bytes, timings=timings,
        source_opset=graph.source_opset, opaque_ops=graph.opaque_ops, kernels=kernel_reports,
        rules_in_program=shaped_by,
        backend_report=program.report.as_dict() if program.report else {},
        objective=objective, energy_uj=extraction.energy_uj,
        extraction=dict(extraction.details, seconds=extraction.seconds),
        nodes_added_by_conversion=graph.nodes_added_by_conversion,
        import_seconds=dict(graph.import_seconds),
        rulesets={name: info.ruleset for name, info in saturation.rules.items()},
        numerics=program.report.numerics,
        inexact_rules={name: count for name, count in saturation.matches_per_rule.items()
                       if name in saturation.rules and saturation.rules[name].numerics == "fast"},
        notes=list(saturation.notes),
        saturation_iterations=[record.as_dict() for record in saturation.per_iteration])
