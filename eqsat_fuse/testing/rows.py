"""Builder families of row kernels: Softmax, LayerNormalization, BatchNormalization and
ReduceMean/ReduceSum.

A mixin of `_Builder` (strategies.py): it uses the core's helpers (builder.py)."""

from __future__ import annotations

import math
from typing import Any

from .values import BOUND, _numel, _Val


class _RowFamilies:
    # -- row kernels
    def f_softmax(self) -> bool:
        if not self.allowed("Softmax"):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.choice([None] + list(range(-x.rank, x.rank)))
        ax = (-1 if axis is None else axis) % x.rank
        n = x.shape[ax]
        lo = math.exp(-(x.hi - x.lo)) / n if x.hi - x.lo < 700 else 0.0
        self.op("Softmax", [x], x.shape, lo, 1.0, x.flat, axis=axis)
        return True

    def f_layernorm(self) -> bool:
        if not self.allowed("LayerNormalization"):
            return False

        def axes_ok(v):
            return [a for a in range(v.rank)
                    if 2 <= _numel(v.shape[a:]) <= 512
                    and not any(i in v.flat for i in range(a, v.rank))]
        x = self.pick_any(lambda v: bool(axes_ok(v)), min_rank=1)
        x = self.tame(x, 5.0)
        axes = axes_ok(x)
        if not axes:
            return False
        a = self.choice(axes)
        axis_attr = self.choice([a, a - x.rank, None]) if a == x.rank - 1 else \
            self.choice([a, a - x.rank])
        nshape = x.shape[a:]
        scale = self.const(self.floats(nshape, 0.5, 1.5), "ln_g", node_ok=False)
        bias = self.const(self.floats(nshape, -0.5, 0.5), "ln_b", node_ok=False) \
            if self.flip(0.7) else None
        eps = self.choice([None, 1e-3, 1e-5])
        b = math.sqrt(_numel(nshape)) * scale.hi + (0.5 if bias is not None else 0.0)
        flat = frozenset(i for i in x.flat if i < a)
        self.op("LayerNormalization", [x, scale, bias], x.shape, -b, b, flat,
                axis=axis_attr, epsilon=eps)
        return True

    def f_batchnorm(self) -> bool:
        if not self.allowed("BatchNormalization"):
            return False
        x = self.pick_any(lambda v: v.shape[1] <= 64, min_rank=2)
        self.batchnorm(self.tame(x, BOUND / 2.5))
        return True

    def f_reduce(self) -> bool:
        ops = [o for o in ("ReduceMean", "ReduceSum") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick_any(min_rank=1)
        axes = [a for a in range(x.rank) if self.flip(0.4)] or [self.integer(0, x.rank - 1)]
        if _numel([x.shape[a] for a in axes]) > 256:
            axes = [min(axes, key=lambda a: x.shape[a])]
            if x.shape[axes[0]] > 256:
                return False
        keep = self.choice([None, 0, 1])
        form = self.choice(["axes", "all", "noop"]) if self.flip(0.2) else "axes"
        self.reduce(op, x, axes, keep, form=form)
        return True

    def reduce(self, op: str, x: _Val, axes: list[int], keepdims, form: str = "axes",
               register: bool = True, tame: bool = True) -> _Val:
        r = x.rank
        if form != "axes":
            axes = list(range(r))
        count = _numel([x.shape[a] for a in axes])
        if tame and op == "ReduceSum" and count * x.bound > 2 * BOUND:
            x = self.tame(x, 2 * BOUND / count)
        keep = 1 if keepdims is None else keepdims
        attrs: dict[str, Any] = {"keepdims": keepdims}
        ins: list = [x]
        if form == "axes":
            written = [a - r if self.flip(0.3) else a for a in axes]
            if self.flip(0.2):
                written = written[::-1]
            if op == "ReduceMean" and self.opset < 18:
                attrs["axes"] = written
            else:
                ins.append(self.ints(written, "axes"))
        elif form == "noop":
            attrs["noop_with_empty_axes"] = 1
            if op == "ReduceMean" and self.opset < 18:
                attrs["noop_with_empty_axes"] = None     # attribute form: no such attribute
            else:
                axes = []
        if not axes:   # noop_with_empty_axes=1 and no axes: Identity
            return self.op(op, ins, x.shape, x.lo, x.hi, x.flat, register=register, **attrs)
        if keep:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            flat = frozenset(i for i in x.flat if i not in axes)
        else:
            kept = [i for i in range(r) if i not in axes]
            shape = tuple(x.shape[i] for i in kept)
            flat = frozenset(j for j, i in enumerate(kept) if i in x.flat)
        lo, hi = (x.lo, x.hi) if op == "ReduceMean" else (x.lo * count, x.hi * count)
        return self.op(op, ins, shape, lo, hi, flat, register=register, **attrs)
