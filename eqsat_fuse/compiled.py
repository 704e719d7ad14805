"""A compiled program as users hold it: `Compiled` (run, verify, inputs, outputs, save, ...),
its `TensorSpec`s, and `load`, which reads a saved artifact back into one.

Kept apart from the compiler (`pipeline`): a process that only loads and runs an artifact
imports this, lowering and the backend, not saturation, extraction or the rule checker
(importing `eqsat_fuse` itself imports neither, see its `__getattr__`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import EqsatFuseError, FeedError, RunError
from .ir import CANONICAL_OPSET, KernelPlan, TensorInfo
from .lowering.generic import ShapeGeneric
from .lowering.lower import Program
from .signature import binding_text
from .tools.report import Report

if TYPE_CHECKING:
    import onnx

    from .checking.verify import VerifyResult
    from .extraction.fusion_values import ExtractionContext

@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a compiled program: its name, the shape it was compiled for (ints,
    and `dims.Dim`s for the dims a shape-generic program leaves open) and its NumPy dtype name
    ("float32", "int64", ...)."""

    name: str
    shape: tuple
    dtype: str


class Compiled:
    """A compiled model: `run(feeds)`, `report`, `verify()`, `inputs`, `outputs`, `save(path)`.

    One that `load` read from a saved artifact holds the program and its report but not the
    ONNX model it was compiled from: `verify`, `to_onnx` and `report_html` need that model."""

    def __init__(self, program: Program, report: Report, source: onnx.ModelProto | None,
                 source_path: Path | None = None, extraction: ExtractionContext | None = None,
                 opset: int = CANONICAL_OPSET, generic: ShapeGeneric | None = None):
        self.program = program              # the program at the representative shape
        self.generic = generic              # open dims: the symbolic plan, a program per shape
        self.report = report
        self._source = source
        self.source_path = source_path      # the file it was compiled from: never overwritten
        self.extraction = extraction        # what --explain re-extracts from
        self.opset = opset                  # the opset its opaque nodes run at (onnx.reference)

    @property
    def plan(self) -> KernelPlan:
        return self.program.plan

    @property
    def inputs(self) -> dict[str, TensorSpec]:
        """Input name -> `TensorSpec` (name, shape, dtype) that `run` expects, in the model's
        order; a shape-generic program's open dims are `dims.Dim`s (`seq`, `past + 1`)."""
        if self.generic is not None:
            plan = self.generic.plan
            return {name: TensorSpec(name, tuple(plan.inputs[name].shape),
                                     str(plan.inputs[name].dtype))
                    for name in self.generic.signature.inputs}
        return {name: TensorSpec(name, tuple(info.shape), str(info.dtype))
                for name, info in self.plan.inputs.items()}

    @property
    def outputs(self) -> dict[str, TensorSpec]:
        """Output name -> `TensorSpec` (name, shape, dtype) of what `run` returns, in the
        model's order (symbolic dims as in `inputs`)."""
        if self.generic is not None:
            plan = self.generic.plan
            infos = {**plan.buffers, **plan.inputs}
            out = {}
            for name, (shape, dtype) in self.program._output_info.items():
                info = infos.get(plan.outputs[name])
                out[name] = TensorSpec(name, tuple(info.shape) if info else tuple(shape),
                                       np.dtype(dtype).name)
            return out
        return {name: TensorSpec(name, tuple(int(d) for d in shape), np.dtype(dtype).name)
                for name, (shape, dtype) in self.program._output_info.items()}

    def run(self, feeds: dict[str, Any], out: dict[str, np.ndarray] | None = None
            ) -> dict[str, np.ndarray]:
        """Run the compiled program: {input name: array} -> {output name: array}.

        Outputs are new arrays by default. `out` ({output name: array}, e.g. from
        `program.empty_outputs()`) makes the run write those outputs into the given arrays and
        return them, so repeated runs allocate nothing (see `Program.run`)."""
        if self.generic is not None:
            return self.generic.run(feeds, out=out)
        return self.program.run(feeds, out=out)

    @property
    def example_inputs(self) -> dict[str, TensorInfo]:
        """Each input `run` takes, at the shape the program was compiled for (a shape-generic
        program's representative one), as `ir.TensorInfo`: what random feeds are drawn from."""
        inputs = self.plan.inputs
        if self.generic is not None:
            return {n: inputs[n] for n in self.generic.signature.inputs}
        return dict(inputs)

    def program_at(self, feeds: dict[str, Any]) -> tuple[Program, dict[str, Any]]:
        """The lowered program that runs `feeds`, and the feeds it takes (a shape-generic
        program's, for the feeds' shape, with its derived inputs added): for timing or
        profiling one shape's program as `run` would run it."""
        if self.generic is None:
            return self.program, feeds
        return self.generic.program_at(feeds)

    def verify(self, feeds: dict[str, Any] | None = None, against: str = "ort",
               seed: int = 0, rtol: float | None = None, atol: float | None = None,
               tolerances: dict[str, tuple[float, float]] | None = None) -> VerifyResult:
        """Compare with the original model run by onnxruntime (or onnx.reference).

        `rtol` / `atol` replace the per-dtype tolerances of every float output; `tolerances`
        {output name: (rtol, atol)} sets them per output (integer outputs too). The indices of
        ArgMax, ArgMin and TopK are compared tie-aware (see `checking.verify`)."""
        from .checking.verify import random_feeds, verify_program

        self._need_source("verify")
        drawn = feeds is None
        feeds = random_feeds(self.example_inputs, seed) if drawn else feeds
        try:
            return verify_program(self._source, self.plan, self.run, feeds, against,
                                  self.program.storage_dtype, rtol=rtol, atol=atol,
                                  tolerances=tolerances)
        except (FeedError, RunError) as why:
            if not drawn or self.generic is None:
                raise
            binding = binding_text(self.generic.signature.representative)
            raise type(why)(
                f"{why}; the inputs were drawn at the representative binding {binding}, which "
                f"this model's shape facts allow but its values may not (a decode step's past "
                f"and total lengths, say): give verify inputs of a shape the model runs at, or "
                f"compile with dims={{...}} (--dim NAME=VALUE) binding the symbols to sizes it "
                f"takes") from None

    def to_onnx(self, path: str | Path | None = None, force: bool = False,
                opset: int | None = None, inline: bool = False) -> onnx.ModelProto:
        """The optimized program as an ONNX model (fused kernels as local functions of domain
        `eqsat_fuse`, folded constants as initializers; see `export`), written to `path` when
        given: atomically, an existing file replaced only with `force`, never the model this
        was compiled from. `inline=True` writes plain ONNX instead: each fused kernel's call
        replaced by its function's body (`onnx.inliner`), no local functions left."""
        from .tools.export import export_model, inline_functions, save_model

        self._need_source("to_onnx")
        model = export_model(self.program, self._source, opset=opset, generic=self.generic)
        if inline:
            model = inline_functions(model)
        if path is not None:
            save_model(model, path, force=force,
                       protect=[self.source_path] if self.source_path else [])
        return model

    def report_html(self, path: str | Path, force: bool = False) -> Path:
        """Write the visual report (both graphs, kernel costs, memory plan, saturation) to one
        self-contained HTML file; an existing file is replaced only with `force`."""
        from .tools.html_report import write

        self._need_source("report_html")
        return write(self, path, force=force,
                     protect=[self.source_path] if self.source_path else [])


    def save(self, path: str | Path, force: bool = False) -> Path:
        """Save the compiled program as an artifact folder that `load` runs without saturation,
        extraction or (on a machine like this one) JIT: the kernel plan, folded constants,
        memory plan, report and, for the Numba backend, the kernels' machine code (see
        docs/artifacts.md). Written atomically; an existing artifact is replaced only with
        `force`, and never the model this was compiled from."""
        from .artifacts import write_artifact

        return write_artifact(self, path, force=force)

    def _need_source(self, what: str) -> None:
        if self._source is None:
            raise EqsatFuseError(f"{what} needs the ONNX model: this program was loaded from a "
                                 f"saved artifact, which holds the compiled program only")


def load(path: str | Path, threads: int | None = None, recompile: bool = True,
         saved_kernels: bool = True) -> Compiled:
    """Load an artifact written by `Compiled.save`: no saturation, no extraction, and on a
    machine of the same CPU with the same eqsat-fuse, Numba and Python no JIT.

    `threads` overrides the saved thread setting (kernels generated for another count are
    compiled again). An artifact made elsewhere (another CPU or version) has its kernels
    compiled again from the stored plan with an `ArtifactWarning`, or, with
    `recompile=False`, is refused with an `ArtifactError`; so is one that was tampered with
    or truncated. `saved_kernels=False` compiles the kernels from the stored plan and reads
    none of the artifact's Numba cache files, which hold machine code: for an artifact from
    someone you do not trust (docs/artifacts.md)."""
    from .artifacts.reading import start_reading
    reading = start_reading(path)          # first: the imports below happen while it reads
    from .artifacts.store import read_artifact

    loaded = read_artifact(path, threads=threads, recompile=recompile,
                           saved_kernels=saved_kernels, reading=reading)
    return Compiled(loaded.program, loaded.report, None, opset=loaded.opset,
                    generic=loaded.generic)
