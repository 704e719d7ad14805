"""The extractors by name (`EXTRACTORS`) and the entry point that runs one (`extract`).

Extractors share one protocol: `Extractor(model, objective, **options).extract(eg, roots,
forbid=...) -> Extraction`, each tagged `optimality` "tree-optimal", "dag-optimal" or
"heuristic", and each result has passed `program_cost` (see `cost`).
"""

from __future__ import annotations

from typing import Iterable

from ..errors import EqsatFuseError
from ..saturation.serialized import SerializedEGraph
from .cost import Extraction
from .costmodel import CostModel
from .greedy import GreedyDagExtractor
from .ilp import IlpExtractor
from .tree import TreeExtractor

EXTRACTORS: dict[str, type] = {"tree": TreeExtractor, "greedy-dag": GreedyDagExtractor,
                               "ilp": IlpExtractor}


def extract(eg: SerializedEGraph, roots: list[int], model: CostModel,
            extractor: str = "greedy-dag", *, objective: str = "latency",
            forbid: Iterable[int] = (), **options) -> Extraction:
    """Run the named extractor; the result has passed `program_cost`'s validity check.

    `objective` is what extraction minimizes ("latency" or "energy"); `forbid` lists e-nodes that
    must not be chosen; `options` go to the extractor (the ILP takes `seconds`).
    """
    if extractor not in EXTRACTORS:
        raise EqsatFuseError(f"unknown extractor {extractor!r}; choose one of "
                             f"{', '.join(EXTRACTORS)}")
    model.prices(objective)                       # an unknown objective fails here, named
    return EXTRACTORS[extractor](model, objective, **options).extract(eg, roots, forbid)
