"""What each fusion is worth: for every fused kernel of an extraction, the cost of the best
program without it (`fusion_values`, `ExtractionContext.fusion_values`; `--explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..saturation.serialized import SerializedEGraph
from .cost import Extraction, ExtractionError, inline_classes
from .costmodel import CostModel
from .registry import extract


@dataclass
class FusionValue:
    """One fused kernel, and the best program without it (split back at its Mat boundaries)."""

    eclass: int
    ops: list[str]
    with_cost: float
    without_cost: float | None        # None: no legal program without this fusion

    @property
    def saving(self) -> float | None:
        return None if self.without_cost is None else self.without_cost - self.with_cost


def fusion_values(eg: SerializedEGraph, model: CostModel, extraction: Extraction,
                  extractor: str | None = None, **options) -> list[FusionValue]:
    """For each fused kernel (a body of more than one operation), re-extract with that kernel's
    inline classes forced to be boundaries: every node reading one of them inline is forbidden,
    so the cheapest program must read it from a `Mat`; for a FusedAttention kernel, with that
    node forbidden (the cost model's choice between it and the unfused form, per shape). Uses
    the extraction's own extractor unless told otherwise.
    """
    name = extractor or extraction.extractor
    choice = extraction.choice
    consumers: dict[int, list[int]] = {}
    for index, node in enumerate(eg.nodes):
        if node.op != "Mat":
            for ch in set(node.children):
                consumers.setdefault(ch, []).append(index)
    values = []
    for k, kc in extraction.kernels.items():
        if kc.alias or (len(kc.ops) < 2 and kc.ops != ["FusedAttention"]):
            continue
        node = eg.nodes[choice[k]]
        body = node.children[0] if node.op == "Mat" else k
        if len(kc.ops) < 2:
            # one operation that stands for several (FusedAttention): without it, the best
            # program computes its class another way (the exported kernels)
            forbid = {choice[body]}
        else:
            inline = inline_classes(eg, choice, extraction.constant, body)
            forbid = {n for c in inline if c != body and eg.class_sort[c] == "T"
                      for n in consumers.get(c, ())}
        try:
            without = extract(eg, extraction.roots, model, name, objective=extraction.objective,
                              forbid=forbid, **options).cost
        except ExtractionError:
            without = None
        values.append(FusionValue(k, kc.ops, extraction.cost, without))
    return values


@dataclass
class ExtractionContext:
    """What explaining an extraction needs after compilation: the e-graph, the answer, the target
    and the extractor's options (`Compiled.extraction`)."""

    egraph: SerializedEGraph
    extraction: Extraction
    model: CostModel
    options: dict[str, Any] = field(default_factory=dict)

    def fusion_values(self, extractor: str | None = None) -> list[FusionValue]:
        """Each fused kernel with the cost of the best program without it."""
        return fusion_values(self.egraph, self.model, self.extraction, extractor, **self.options)
