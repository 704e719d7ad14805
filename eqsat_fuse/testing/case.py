"""The drawn case: `GraphCase` (a generated model with its feeds) and `model_text`, the
printable form of a model that failure messages show."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


@dataclass
class GraphCase:
    """One generated model, its feeds, and which ops it uses."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    description: str

    def text(self, max_values: int = 64) -> str:
        """The model as `onnx.printer` text (big initializers elided) and the feeds' shapes."""
        feeds = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.feeds.items())
        return f"{self.description}\nfeeds: {feeds}\n{model_text(self.model, max_values)}"

    def save(self, directory: str | Path) -> Path:
        """Write `model.onnx` and `feeds.npz` into `directory` (created), to replay elsewhere."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        onnx.save(self.model, str(path / "model.onnx"))
        np.savez(path / "feeds.npz", **self.feeds)
        return path

    def __repr__(self) -> str:
        return f"GraphCase<{self.text()}>"

    def _repr_pretty_(self, printer, cycle) -> None:   # what Hypothesis prints for a failure
        printer.text(repr(self))


def model_text(model: onnx.ModelProto, max_values: int = 64) -> str:
    """`onnx.printer.to_text(model)`, with the data of initializers above `max_values` elements
    left out (listed below the text with their shape and range)."""
    if all(int(np.prod(t.dims, dtype=np.int64)) <= max_values for t in model.graph.initializer):
        return onnx.printer.to_text(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    notes = []
    for t in copy.graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) > max_values:
            a = numpy_helper.to_array(t)
            notes.append(f"#   {t.name}: {a.dtype}{list(a.shape)} "
                         f"in [{a.min():.4g}, {a.max():.4g}]")
            empty = TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))
            t.CopyFrom(empty)
    return (onnx.printer.to_text(copy)
            + f"\n# data left out of initializers above {max_values} elements:\n"
            + "\n".join(notes))

