"""What a compilation did, for people (`summary()`) and for scripts (`as_dict()`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..signature import binding_text


@dataclass
class KernelReport:
    """One kernel of the compiled program and its predicted cost."""

    name: str
    kind: str                 # compute | alias | opaque
    ops: list[str]
    output: str
    shape: list[int]
    dtype: str
    predicted_us: float
    launch_us: float
    read_bytes: float
    write_bytes: float
    flops: float
    energy_uj: float | None = None      # predicted microjoules (None: the target gives no energy)


@dataclass
class Report:
    """The figures of one compilation. `as_dict()` keys are relied on by scripts and the harness."""

    model: str
    target: str
    backend: str
    extractor: str
    nodes_in: int                 # ONNX nodes in the file, as written (before opset conversion)
    nodes_imported: int           # nodes left after import-time shape folding and dead-code removal
    kernels_out: int              # kernels that run (compute and opaque; views are not kernels)
    views: int                    # alias kernels: Reshape/Transpose/... that move no data
    stop_reason: str              # a saturate.StopReason (a str)
    iterations: int
    egraph_nodes: int
    matches_per_rule: dict[str, int]
    cost: float                   # predicted microseconds under the target
    peak_bytes: int               # arena size of the memory plan
    lower_bound_bytes: int        # most bytes live at once (liveness lower bound)
    separate_bytes: int           # every buffer allocated separately
    timings: dict[str, float]     # seconds per stage
    source_opset: int
    opaque_ops: list[str] = field(default_factory=list)
    kernels: list[KernelReport] = field(default_factory=list)
    rules_in_program: dict[str, int] = field(default_factory=dict)   # see explain.shaping_rules
    backend_report: dict[str, Any] = field(default_factory=dict)   # lowering.program.BackendReport
    objective: str = "latency"            # what extraction minimized: latency or energy
    energy_uj: float | None = None        # predicted microjoules (None: no [energy] in the target)
    extraction: dict[str, Any] = field(default_factory=dict)   # extractor details (ILP gap...)
    nodes_added_by_conversion: int = 0    # nodes the upgrade from source_opset added
    rulesets: dict[str, str] = field(default_factory=dict)   # rule name -> its ruleset
    notes: list[str] = field(default_factory=list)  # e.g. user rules the strategy cannot fire
    import_seconds: dict[str, float] = field(default_factory=dict)   # import's steps
    # (ir.Graph.import_seconds: read, conversion, checker, shape inference, folding, ...)
    saturation_iterations: list[dict[str, Any]] = field(default_factory=list)   # one
    # saturate.IterationRecord (as a dict) per iteration: rules matched, matches, e-nodes, seconds
    numerics: str = "exact"               # the numerics mode (eqsat_fuse.numerics)
    inexact_rules: dict[str, int] = field(default_factory=dict)   # rules tagged `:numerics fast`
    # symbolic dims: each input's shape, the symbols, and the binding extraction priced
    # (signature.Signature.describe); empty for a program compiled for static shapes
    symbolic: dict[str, Any] = field(default_factory=dict)
    # that fired (fast mode only), with their match counts: the e-graph extraction chose from
    # held their rewrites (rules_in_program cannot tell a rule whose right side is a variable)

    def analysis_facts(self) -> set[str]:
        """Rules of the `analysis` ruleset: they derive facts (shapes, dtypes, fusability), and
        rewrite no program."""
        return {rule for rule, ruleset in self.rulesets.items() if ruleset == "analysis"}

    def conversion_note(self) -> str:
        """What the opset upgrade did to the node count, to follow `nodes_in`: " (+242 added by
        upgrading opset 9)", or "" when it changed nothing."""
        added = self.nodes_added_by_conversion
        if not added:
            return ""
        verb = "added" if added > 0 else "removed"
        return f" ({added:+d} {verb} by upgrading opset {self.source_opset})"

    def _steps(self, stage: str) -> str:
        """The split of the import stage, " (read 0.40s, infer 0.10s, ...)", else ""."""
        if stage != "import" or not self.import_seconds:
            return ""
        return " (" + ", ".join(f"{k} {v:.2f}s" for k, v in self.import_seconds.items()) + ")"

    def as_dict(self) -> dict[str, Any]:
        return dict(asdict(self), fusions=self.fusions)

    @property
    def fusions(self) -> dict[str, int]:
        """What was fused, as onnxruntime's fusion statistics count it: pattern -> count, from
        the kernels. The operators that rules recognize in their decomposed forms ("Gelu",
        "LayerNormalization", "FusedAttention") as the program runs them (recognized, or
        written so in the model), then each fused kernel's shape, its ops in order
        ("Conv+Relu", "MatMul+Add+Gelu")."""
        counts: dict[str, int] = {}
        for op in RECOGNIZED:
            n = sum(k.ops.count(op) for k in self.kernels if k.kind == "compute")
            if n:
                counts[op] = n
        for kernel in self.fused:
            key = "+".join(kernel.ops)
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def fused(self) -> list[KernelReport]:
        """Kernels that compute more than one operation."""
        return [k for k in self.kernels if k.kind == "compute" and len(k.ops) > 1]

    def summary(self) -> str:
        lines = [
            f"model         {self.model}",
            f"target        {self.target} (backend {self.backend}, extractor {self.extractor})",
            f"nodes         {self.nodes_in} in the file{self.conversion_note()} -> "
            f"{self.kernels_out} kernels "
            f"(+ {self.views} views that move no data)",
            f"saturation    {self.stop_reason} after {self.iterations} iterations, "
            f"{self.egraph_nodes} e-nodes",
            f"cost          {self.cost:.1f} us predicted"
            + (f", {self.energy_uj:.1f} uJ" if self.energy_uj is not None else "")
            + (f" (minimizing {self.objective})" if self.objective != "latency" else "")
            + _extraction_note(self.extraction),
            f"memory        peak {self.peak_bytes / 1024:.1f} KiB (lower bound "
            f"{self.lower_bound_bytes / 1024:.1f} KiB, separate {self.separate_bytes / 1024:.1f} KiB)",
            "time          " + ", ".join(f"{k} {v:.2f}s" + self._steps(k)
                                         for k, v in self.timings.items()),
        ]
        if self.symbolic:
            inputs = ", ".join(f"{n} [{', '.join(s)}]" for n, s in self.symbolic["inputs"].items())
            priced = binding_text(self.symbolic["representative"])
            lines.append(f"shapes        symbolic: {inputs}; one program for every value, "
                         f"priced (and the figures above given) at {priced} (--dim sets it)")
        b = self.backend_report
        if b.get("backend") == "numba":
            lines.append(f"numba         {b['compiled_kernels']}/{b['kernels']} kernels compiled "
                         f"({b['sources']} sources; JIT {b['jit_seconds']:.2f}s: "
                         f"{b['jit_compiled']} compiled"
                         + (f" with {b['jit_workers']} worker process(es)"
                            if b.get("jit_workers") else "")
                         + f", {b['jit_loaded']} from cache), "
                         f"{len(b['fallback_kernels'])} fell back to NumPy, "
                         f"{b['copy_kernels']} copies, {b['threads']} thread(s)")
        if b.get("storage_dtype", "float32") != "float32":
            lines.append(f"storage       intermediates in {b['storage_dtype']}, computed in "
                         f"float32 (--storage-dtype sets it; the default is the target's storage_dtype)")
        if self.numerics == "fast":
            lines.append("numerics      fast (--fast-math): inexact rules fired: "
                         + (", ".join(f"{name} x{count}" for name, count
                                      in sorted(self.inexact_rules.items())) or "none")
                         + "; NaN, infinities and signed zeros may differ from the model")
        if self.opaque_ops:
            lines.append(f"opaque        {', '.join(self.opaque_ops)} (run by onnx.reference)")
        lines += [f"note          {note}" for note in self.notes]
        fusions = self.fusions
        recognized = {k: v for k, v in fusions.items() if k in RECOGNIZED}
        if recognized:
            lines.append("fused ops     " + ", ".join(f"{count} {name}" for name, count
                                                      in recognized.items()))
        groups = {k: v for k, v in fusions.items() if k not in RECOGNIZED}
        if groups:
            lines.append("fused kernels:")
            for key, count in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"  {count:4d} x {key}")
        return "\n".join(lines)


# The operators `Report.fusions` counts on their own (summary: "fused ops"): Gelu,
# LayerNormalization and FusedAttention, which the fuse rules recognize in their decomposed
# forms.
RECOGNIZED = ("Gelu", "LayerNormalization", "FusedAttention")


def _extraction_note(details: dict[str, Any]) -> str:
    """The ILP's word on its answer: proved optimal, or the gap left at the time limit."""
    if "gap" not in details:
        return ""
    gap = details["gap"]
    horizon = details.get("horizon")
    scope = (f" among bodies <= {int(horizon)} ops deep" if isinstance(horizon, (int, float))
             and horizon != float("inf") else "")
    if gap is None:
        return "; ILP: no bound"
    if gap <= 1e-6:
        return f"; ILP: optimal{scope}"
    return f"; ILP: within {100 * gap:.2f}% of optimal{scope} (time limit)"

