"""A mixed-integer linear programme built column by column and row by row, solved by HiGHS
(`scipy.optimize.milp`): what the ILP extractor (`ilp`) states its model in."""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Any, Iterable

import numpy as np


class Milp:
    """Columns and sparse rows of a MILP, built incrementally, and its solution by HiGHS."""

    def __init__(self):
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[list[int], list[float], float, float]] = []

    def var(self, cost: float = 0.0, lower: float = 0.0, upper: float = 1.0,
            integer: bool = False) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(1 if integer else 0)
        return len(self.cost) - 1

    def row(self, terms: Iterable[tuple[int, float]], lower: float = -math.inf,
            upper: float = math.inf) -> None:
        merged: dict[int, float] = defaultdict(float)
        for j, a in terms:
            merged[j] += a
        cols = [j for j, a in merged.items() if a != 0.0]
        self.rows.append((cols, [merged[j] for j in cols], lower, upper))

    def solve(self, seconds: float, cutoff: float | None, gap: float,
              fixed: dict[int, float] | None = None):
        # SciPy's solver loads here, on the first solve: importing eqsat_fuse does not pay for
        # it (about 0.1 s) when the ILP is not used
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        lower, upper = np.array(self.lower), np.array(self.upper)
        for j, v in (fixed or {}).items():
            lower[j] = upper[j] = v
        indptr, indices, data, lo, hi = [0], [], [], [], []
        for cols, vals, l, u in self.rows:
            indices.extend(cols)
            data.extend(vals)
            indptr.append(len(indices))
            lo.append(l)
            hi.append(u)
        n = len(self.cost)
        constraints = []
        if self.rows:
            matrix = csr_array((np.array(data, float), np.array(indices, np.int64),
                                np.array(indptr, np.int64)), shape=(len(self.rows), n))
            constraints = [LinearConstraint(matrix, np.array(lo), np.array(hi))]
        options: dict[str, Any] = {"time_limit": max(seconds, 0.01), "mip_rel_gap": gap,
                                   "presolve": True}
        if cutoff is not None:
            options["objective_bound"] = cutoff      # passed to HiGHS as is
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "unrecognized option" for the bound
            return milp(np.array(self.cost), integrality=np.array(self.integer),
                        bounds=Bounds(lower, upper), constraints=constraints, options=options)
