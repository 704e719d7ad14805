"""Builder families of views and data movement: Transpose, Reshape, Flatten, Unsqueeze,
Squeeze, Concat, Slice, Split, Gather, Pad, Expand and shape subgraphs.

A mixin of `_Builder` (strategies.py): it uses the core's helpers (builder.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from .values import (INT64_MAX, INT64_MIN, MAX_NUMEL, _broadcast, _divisors, _numel,
                     _onnx_slice_len, _Val)


class _ViewFamilies:
    # -- views and data movement
    def f_transpose(self) -> bool:
        if not (self.allow_shapes and self.allowed("Transpose")):
            return False
        x = self.pick_any(min_rank=2)
        if self.flip(0.15):
            perm, written = list(range(x.rank))[::-1], None
        else:
            perm = list(self.draw(st.permutations(range(x.rank))))
            written = perm
        flat = frozenset(i for i, p in enumerate(perm) if p in x.flat)
        self.op("Transpose", [x], tuple(x.shape[p] for p in perm), x.lo, x.hi, flat,
                perm=written)
        return True

    def _view_flat(self, x: _Val, out_rank: int) -> frozenset:
        return frozenset(range(out_rank)) if x.flat else frozenset()

    def f_reshape(self) -> bool:
        if not (self.allow_shapes and self.allowed("Reshape")):
            return False
        x = self.pick_any()
        n = x.numel
        rank = self.choice([2, 1, 3, 4] + ([0] if n == 1 else []))
        dims, rest = [], n
        for _ in range(max(rank - 1, 0)):
            d = self.choice(_divisors(rest))
            dims.append(d)
            rest //= d
        if rank >= 1:
            dims.append(rest)
        if rank >= 1 and _numel(dims) != n:
            return False
        written = list(dims)
        if rank >= 1 and self.flip(0.4):
            written[self.integer(0, rank - 1)] = -1
        for i in range(min(rank, x.rank)):
            if written[i] == dims[i] == x.shape[i] and self.flip(0.3):
                written[i] = 0
        shape_v = self.ints(written, "shape")
        self.op("Reshape", [x, shape_v], tuple(dims), x.lo, x.hi, self._view_flat(x, rank))
        return True

    def f_flatten(self) -> bool:
        if not (self.allow_shapes and self.allowed("Flatten")):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.choice([None] + list(range(-x.rank, x.rank + 1)))
        a = 1 if axis is None else (axis + x.rank if axis < 0 else axis)
        out = (_numel(x.shape[:a]), _numel(x.shape[a:]))
        self.op("Flatten", [x], out, x.lo, x.hi, self._view_flat(x, 2), axis=axis)
        return True

    def f_unsqueeze(self) -> bool:
        if not (self.allow_shapes and self.allowed("Unsqueeze")):
            return False
        x = self.pick_any(max_rank=4)
        k = self.integer(1, 2)
        out_rank = x.rank + k
        pos = sorted(self.sample(range(out_rank), k))
        written = [p - out_rank if self.flip(0.3) else p for p in pos]
        shape, src, flat = [], 0, set()
        for i in range(out_rank):
            if i in pos:
                shape.append(1)
            else:
                if src in x.flat:
                    flat.add(i)
                shape.append(x.shape[src])
                src += 1
        self.op("Unsqueeze", [x, self.ints(written, "axes")], tuple(shape), x.lo, x.hi, flat)
        return True

    def f_squeeze(self) -> bool:
        if not (self.allow_shapes and self.allowed("Squeeze")):
            return False
        x = self.pick(lambda v: 1 in v.shape)
        if x is None:
            return False
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if self.flip(0.25):
            axes, ins = ones, [x]
        else:
            axes = [i for i in ones if self.flip()] or [self.choice(ones)]
            written = [a - x.rank if self.flip(0.3) else a for a in axes]
            ins = [x, self.ints(written, "axes")]
        kept = [i for i in range(x.rank) if i not in axes]
        flat = frozenset(j for j, i in enumerate(kept) if i in x.flat)
        self.op("Squeeze", ins, tuple(x.shape[i] for i in kept), x.lo, x.hi, flat)
        return True

    def f_concat(self) -> bool:
        if not (self.allow_shapes and self.allowed("Concat")):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.integer(0, x.rank - 1)
        parts = [x]
        for _ in range(self.integer(1, 2)):
            mode = self.choice(["const", "self", "existing", "input"])
            if mode == "self":
                parts.append(x)
                continue
            if mode == "existing":
                def ok(v):
                    return v.rank == x.rank and all(
                        v.shape[i] == x.shape[i] for i in range(x.rank) if i != axis)
                v = self.pick(ok)
                if v is not None:
                    parts.append(v)
                    continue
            shape = list(x.shape)
            shape[axis] = self.integer(1, 4)
            if mode == "input":
                parts.append(self.new_input(shape))
            else:
                parts.append(self.const(self.floats(shape, -2.0, 2.0)))
        shape = list(x.shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        if _numel(shape) > MAX_NUMEL:
            parts = parts[:1] + [x]
            shape[axis] = 2 * x.shape[axis]
            if _numel(shape) > MAX_NUMEL:
                return False
        written = axis - x.rank if self.flip(0.3) else axis
        flat = frozenset().union(*[p.flat for p in parts])
        self.op("Concat", parts, tuple(shape), min(p.lo for p in parts),
                max(p.hi for p in parts), flat, axis=written)
        return True

    def f_slice(self) -> bool:
        if not (self.allow_shapes and self.allowed("Slice")):
            return False
        x = self.pick_any(min_rank=1)
        axes = [a for a in range(x.rank) if self.flip(0.5)] or [self.integer(0, x.rank - 1)]
        if self.flip(0.3):
            axes = axes[::-1]
        starts, ends, steps, shape = [], [], [], list(x.shape)
        for a in axes:
            dim = x.shape[a]
            step = self.choice([1, 2, -1, -2, 3])
            start = self.choice([self.integer(-dim - 2, dim + 2), 0, -1,
                                 INT64_MAX if step < 0 else 0])
            end = self.choice([self.integer(-dim - 2, dim + 2), INT64_MAX, INT64_MIN, -1])
            if step > 0 and end == INT64_MIN:
                end = INT64_MAX
            if step < 0 and end == INT64_MAX:
                end = INT64_MIN
            length = _onnx_slice_len(dim, start, end, step)
            if length == 0:
                start, end = (0, INT64_MAX) if step > 0 else (-1, INT64_MIN)
                length = _onnx_slice_len(dim, start, end, step)
            starts.append(start), ends.append(end), steps.append(step)
            shape[a] = length
        ins = [x, self.ints(starts, "starts"), self.ints(ends, "ends")]
        default_axes = axes == list(range(len(axes)))
        if not default_axes or self.flip(0.5) or any(s != 1 for s in steps):
            ins.append(self.ints([a - x.rank if self.flip(0.3) else a for a in axes], "axes"))
            if any(s != 1 for s in steps) or self.flip(0.3):
                ins.append(self.ints(steps, "steps"))
        self.op("Slice", ins, tuple(shape), x.lo, x.hi, x.flat)
        return True

    def f_split(self) -> bool:
        if not (self.allow_shapes and self.allowed("Split")):
            return False
        x = self.pick(lambda v: any(d >= 2 for d in v.shape))
        if x is None:
            return False
        axis = self.choice([a for a in range(x.rank) if x.shape[a] >= 2])
        dim = x.shape[axis]
        k = self.integer(2, min(3, dim))
        forms = ["sizes"]
        if self.opset < 18 and dim % k == 0:
            forms.append("equal")
        if self.opset >= 18:
            chunk = -(-dim // k)
            if dim - chunk * (k - 1) >= 1:
                forms.append("num_outputs")
        form = self.choice(forms)
        if form == "sizes":
            cuts = sorted(self.sample(range(1, dim), k - 1))
            sizes = [b - a for a, b in zip([0] + cuts, cuts + [dim])]
        elif form == "equal":
            sizes = [dim // k] * k
        else:
            chunk = -(-dim // k)
            sizes = [chunk] * (k - 1) + [dim - chunk * (k - 1)]
        attrs: dict[str, Any] = {"axis": axis - x.rank if self.flip(0.3) else
                                 (None if axis == 0 and self.flip() else axis)}
        ins: list = [x]
        if form == "sizes":
            ins.append(self.ints(sizes, "split"))
        elif form == "num_outputs":
            attrs["num_outputs"] = k
        names = [self.fresh("v") for _ in sizes]
        self.node("Split", ins, names, **attrs)
        for name, size in zip(names, sizes):
            shape = list(x.shape)
            shape[axis] = size
            v = _Val(name, tuple(shape), "float32", x.lo, x.hi,
                     frozenset(a for a in x.flat if shape[a] > 1))
            self.produced.append(v)
            self.values.append(v)
        return True

    def f_gather(self) -> bool:
        if not (self.allow_shapes and self.allowed("Gather")):
            return False
        x = self.pick_any(min_rank=1)
        axis = self.integer(0, x.rank - 1)
        d = x.shape[axis]
        ishape = self.choice([(), (self.integer(1, 4),), (self.integer(1, 3), self.integer(1, 3))])
        out = x.shape[:axis] + tuple(ishape) + x.shape[axis + 1:]
        if _numel(out) > MAX_NUMEL:
            ishape = ()
            out = x.shape[:axis] + x.shape[axis + 1:]
        if self.flip(0.1):
            idx = self.new_input(ishape, -d, d - 1, dtype="int64")
            idx_flat = set(range(axis, axis + len(ishape)))
        else:
            values = self.rng().integers(-d, d, size=ishape).astype(np.int64)
            idx = self.const(values, "idx")
            idx_flat = set(range(axis, axis + len(ishape))) \
                if (len(np.unique(values)) <= 1 or axis in x.flat) else set()
        flat = set(idx_flat)
        for i in x.flat:
            if i < axis:
                flat.add(i)
            elif i > axis:
                flat.add(i - 1 + len(ishape))
        written = axis - x.rank if self.flip(0.3) else (None if axis == 0 and self.flip() else
                                                        axis)
        self.op("Gather", [x, idx], out, x.lo, x.hi, flat, axis=written)
        return True

    def f_pad(self) -> bool:
        if not (self.allow_shapes and self.allowed("Pad")):
            return False
        x = self.pick_any(min_rank=1)
        r = x.rank
        mode = self.choice(["constant", "reflect", "edge"])
        begins, ends = [], []
        for dim in x.shape:
            limit = 2 if mode != "reflect" else min(2, dim - 1)
            lo_allowed = -1 if (mode == "constant" and dim >= 3 and self.flip(0.1)) else 0
            begins.append(self.integer(lo_allowed, limit))
            ends.append(self.integer(0, limit))
        shape = tuple(d + b + e for d, b, e in zip(x.shape, begins, ends))
        if _numel(shape) > MAX_NUMEL or min(shape, default=1) < 1:
            return False
        lo, hi = x.lo, x.hi
        ins: list = [x]
        use_axes = self.opset >= 18 and self.flip(0.2)
        if use_axes:
            axes = [a for a in range(r) if begins[a] or ends[a]] or [0]
            ins.append(self.ints([begins[a] for a in axes] + [ends[a] for a in axes], "pads"))
        else:
            ins.append(self.ints(begins + ends, "pads"))
        if mode == "constant":
            value = self.choice([None, 0.0, 1.0, -1.5, 0.5])
            if value is not None:
                ins.append(self.const(np.array(value, dtype=np.float32), "pv"))
            v = 0.0 if value is None else value
            if any(begins) or any(ends):
                lo, hi = min(lo, v), max(hi, v)
        if use_axes:
            if len(ins) == 2:
                ins.append(None)
            ins.append(self.ints([a - r if self.flip(0.3) else a for a in axes], "axes"))
        self.op("Pad", ins, shape, lo, hi, x.flat,
                mode=None if mode == "constant" and self.flip() else mode)
        return True

    def f_expand(self) -> bool:
        if not (self.allow_shapes and self.allowed("Expand")):
            return False
        x = self.pick_any(max_rank=4)
        target = [self.integer(2, 3) if d == 1 and self.flip(0.7) else
                  (1 if self.flip(0.2) else d) for d in x.shape]
        if x.rank < 4 and self.flip(0.4):
            target = [self.integer(1, 3)] + target
        out = _broadcast(x.shape, target)
        if out is None or _numel(out) > MAX_NUMEL:
            return False
        off = len(out) - x.rank
        flat = {i for i in range(len(out)) if i < off or x.shape[i - off] == 1 or
                (i - off) in x.flat}
        self.op("Expand", [x, self.ints(target, "shape")], out, x.lo, x.hi, flat)
        return True

    def f_shape_subgraph(self) -> bool:
        """Reshape driven by a shape computed at run time: Shape -> Gather/Slice -> Unsqueeze ->
        Concat -> Reshape."""
        if not (self.allow_shapes and self.allowed("Shape", "Gather", "Unsqueeze", "Concat",
                                                   "Reshape")):
            return False
        y = self.pick_any(min_rank=1)
        r = y.rank
        # group consecutive dims of y into the target dims
        groups, cur = [], [0]
        for i in range(1, r):
            if self.flip(0.4):
                cur.append(i)
            else:
                groups.append(cur)
                cur = [i]
        groups.append(cur)
        shape_name = self.fresh("shape")
        start = end = None
        if self.opset >= 15 and self.flip(0.2):   # Shape(start=1): the index shift is tracked
            start = 1 if r >= 2 else None
        self.node("Shape", [y], [shape_name], start=start, end=end)
        offset = start or 0
        pieces, target, minus_one_used = [], [], False
        for grp in groups:
            size = _numel([y.shape[i] for i in grp])
            target.append(size)
            if len(grp) == 1 and grp[0] >= offset and self.flip(0.8):
                idx = grp[0] - offset
                if self.allowed("Slice") and self.flip(0.3):
                    piece = self.fresh("dim")
                    self.node("Slice", [shape_name, self.ints([idx], "st"),
                                        self.ints([idx + 1], "en")], [piece])
                else:
                    g = self.fresh("dim")
                    ind = self.const(np.array(idx if self.flip(0.7) else idx - (r - offset),
                                              dtype=np.int64), "i")
                    self.node("Gather", [shape_name, ind], [g], axis=0)
                    piece = self.fresh("dim")
                    self.node("Unsqueeze", [g, self.ints([0], "ax")], [piece])
                pieces.append(piece)
            elif not minus_one_used and self.flip(0.5):
                minus_one_used = True
                pieces.append(self.ints([-1], "m1").name)
            else:
                pieces.append(self.ints([size], "d").name)
        if self.flip(0.3) and len(target) < 5:   # an extra leading 1
            pieces.insert(0, self.ints([1], "one").name)
            target.insert(0, 1)
        new_shape = self.fresh("newshape")
        self.node("Concat", pieces, [new_shape], axis=0)
        # reshape y, or another value with as many elements
        other = self.pick(lambda v: v.numel == y.numel and v is not y) if self.flip(0.3) else None
        src = other or y
        self.op("Reshape", [src, new_shape], tuple(target), src.lo, src.hi,
                self._view_flat(src, len(target)))
        return True
