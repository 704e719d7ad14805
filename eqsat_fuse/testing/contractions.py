"""Builder families of contractions: Conv blocks (with BatchNormalization, activation and
residual epilogue), pooling, MatMul and Gemm.

A mixin of `_Builder` (strategies.py): it uses the core's helpers (builder.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .values import (_ACTIVATIONS, INPUT_RANGE, MAX_NUMEL, _broadcast, _divisors, _numel,
                     _sigmoid, _Val)


class _ContractionFamilies:
    # -- contractions
    def f_conv(self, bn: bool | None = None, act: str | bool | None = None,
               residual: bool | None = None, spatial: int | None = None) -> bool:
        if not (self.allow_conv and self.allowed("Conv")):
            return False
        sp = spatial if spatial is not None else self.choice([2, 1])

        def ok(v):
            if v.rank != sp + 2 or v.shape[1] > 16:
                return False
            return v.shape[0] * _numel(v.shape[2:]) <= 144 and max(v.shape[2:]) <= 24

        def make():
            n = self.integer(1, 2)
            c = self.integer(1, 8)
            if sp == 2:
                dims = [self.integer(1, 10), self.integer(1, 10)]
            else:
                dims = [self.integer(1, 24)]
            while n * _numel(dims) > 144:
                i = int(np.argmax(dims))
                dims[i] = max(1, dims[i] // 2)
            return self.new_input((n, c, *dims))
        x = self.pick(ok, make, p_new=0.15)
        before = set(map(id, self.values))
        y = self.conv(x)
        y = self.epilogue(y, bn=bn, act=act, residual=residual, before=before)
        return True

    def conv(self, x: _Val) -> _Val:
        n, c = x.shape[:2]
        in_sp = list(x.shape[2:])
        sp = len(in_sp)
        groups = [1] + ([c] if c > 1 else []) + [d for d in _divisors(c) if 1 < d < c]
        g = self.choice(groups)
        auto_pad = self.choice(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER",
                                "VALID"])
        kernel, strides, dils, pb, pe, out_sp = [], [], [], [], [], []
        for size in in_sp:
            s = self.choice([1, 2])
            # onnxruntime refuses dilations with auto_pad SAME_*
            d = self.choice([1, 2]) if not auto_pad.startswith("SAME") else 1
            if auto_pad == "NOTSET":
                lo_pad, hi_pad = self.integer(0, 2), self.integer(0, 2)
            else:
                lo_pad = hi_pad = 0
            ks = [k for k in (1, 3, 2, 5) if (c // g <= 4 or k < 5)]
            if auto_pad in ("NOTSET", "VALID"):
                room = size + lo_pad + hi_pad
                ks = [k for k in ks if (k - 1) * d + 1 <= room] or [1]
            k = self.choice(ks)
            eff = (k - 1) * d + 1
            if auto_pad == "NOTSET":
                lo_pad, hi_pad = min(lo_pad, eff - 1), min(hi_pad, eff - 1)
                if size + lo_pad + hi_pad < eff:
                    d = 1
                    eff = k
                o = (size + lo_pad + hi_pad - eff) // s + 1
            elif auto_pad == "VALID":
                if size < eff:
                    d, k, eff = 1, 1, 1
                o = (size - eff) // s + 1
            else:
                o = -(-size // s)
            kernel.append(k), strides.append(s), dils.append(d), out_sp.append(o)
            pb.append(lo_pad), pe.append(hi_pad)
        per_channel = n * _numel(out_sp)
        cout_max = max(1, MAX_NUMEL // per_channel)
        if g > cout_max:
            g = 1
        if g == c and c > 1:
            mults = [m for m in (1, 2) if g * m <= cout_max] or [1]
        else:
            mults = [m for m in range(1, 17) if g * m <= min(16, cout_max)] or [1]
        cout = g * self.choice(mults)
        fan_in = (c // g) * _numel(kernel)
        rng = self.rng()
        w = rng.standard_normal((cout, c // g, *kernel)) / math.sqrt(fan_in)
        has_bias = self.flip(0.6)
        b = rng.normal(0, 0.3, cout) if has_bias else np.zeros(cout)
        xb = x.bound
        m = np.abs(w).reshape(cout, -1).sum(1) * xb + np.abs(b)
        if m.max() > 16:
            w *= (16 - np.abs(b).max()) / (np.abs(w).reshape(cout, -1).sum(1).max() * xb)
            m = np.abs(w).reshape(cout, -1).sum(1) * xb + np.abs(b)
        wv = self.const(w.astype(np.float32), "w", node_ok=False)
        bv = self.const(b.astype(np.float32), "b", node_ok=False) if has_bias else None
        attrs: dict[str, Any] = {}
        if self.flip(0.3):
            attrs["kernel_shape"] = kernel
        if auto_pad == "NOTSET":
            if any(pb) or any(pe) or self.flip(0.3):
                attrs["pads"] = pb + pe
        else:
            attrs["auto_pad"] = auto_pad
        if any(s != 1 for s in strides) or self.flip(0.2):
            attrs["strides"] = strides
        if any(d != 1 for d in dils) or self.flip(0.2):
            attrs["dilations"] = dils
        if g != 1 or self.flip(0.2):
            attrs["group"] = g
        flat = frozenset(a for a in x.flat if a != 1)
        bound = float(m.max())
        return self.op("Conv", [x, wv, bv], (n, cout, *out_sp), -bound, bound, flat, **attrs)

    def batchnorm(self, x: _Val) -> _Val:
        c = x.shape[1]
        rng = self.rng()
        scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
        if self.flip(0.2):
            scale *= np.where(rng.random(c) < 0.5, -1, 1).astype(np.float32)
        beta = rng.normal(0, 0.3, c).astype(np.float32)
        mean = rng.normal(0, 0.3, c).astype(np.float32)
        var = rng.uniform(0.5, 2.0, c).astype(np.float32)
        eps = self.choice([None, 1e-3, 1e-5])
        k = scale / np.sqrt(var + (1e-5 if eps is None else eps))
        ends = np.stack([(x.lo - mean) * k + beta, (x.hi - mean) * k + beta])
        names = [self.const(a, p, node_ok=False) for a, p in
                 ((scale, "bn_s"), (beta, "bn_b"), (mean, "bn_m"), (var, "bn_v"))]
        return self.op("BatchNormalization", [x, *names], x.shape, float(ends.min()),
                       float(ends.max()), x.flat, epsilon=eps,
                       momentum=self.choice([None, 0.9]))

    def activation(self, y: _Val, act: str | None = None) -> _Val:
        acts = [a for a in _ACTIVATIONS
                if (a == "Swish" and self.allowed("Sigmoid", "Mul")) or self.allowed(a)]
        if act is None:
            if not acts:
                return y
            act = self.choice(acts)
        if act == "Swish":
            s = self.op("Sigmoid", [y], y.shape, _sigmoid(y.lo), _sigmoid(y.hi), y.flat)
            return self.op("Mul", [y, s], y.shape, -0.2785 if y.lo < 0 else 0.0, max(y.hi, 0.0),
                           y.flat)
        return self.unary(act, y)

    def epilogue(self, y: _Val, bn=None, act=None, residual=None,
                 before: set[int] | None = None) -> _Val:
        """Optional BatchNormalization, activation, residual Add (and activation after it).
        The residual is a value of y's shape from `before` the block (ids), or a new input."""
        if (bn is None and self.allowed("BatchNormalization") and y.rank >= 2 and self.flip(0.5)) \
                or bn:
            y = self.batchnorm(y)
        if act is None:
            if self.flip(0.6):
                y = self.activation(y)
        elif act:
            y = self.activation(y, None if act is True else act)
        if (residual is None and self.allowed("Add") and self.flip(0.3)) or residual:
            def ok(v):
                return ((before is None or id(v) in before) and v is not y
                        and _broadcast(v.shape, y.shape) == y.shape)
            other = self.pick(ok, lambda: self.new_input(y.shape), p_new=0.3)
            other = self.tame(other, 16.0)
            ins = [y, other] if self.flip(0.6) else [other, y]
            y = self.binary("Add", *ins)
            if act is None and self.flip(0.5):
                y = self.activation(y)
        return y

    def f_pool(self) -> bool:
        if not self.allow_conv:
            return False
        ops = [o for o in ("MaxPool", "AveragePool", "GlobalAveragePool") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick(lambda v: v.rank in (3, 4) and v.numel <= MAX_NUMEL,
                      lambda: self.new_input((self.integer(1, 2), self.integer(1, 6),
                                              self.integer(2, 8), self.integer(2, 8))))
        if op == "GlobalAveragePool":
            flat = frozenset(a for a in x.flat if a == 0)
            self.op(op, [x], x.shape[:2] + (1,) * (x.rank - 2), x.lo, x.hi, flat)
            return True
        kernel, strides, pads_b, pads_e, dils, out_sp = [], [], [], [], [], []
        for size in x.shape[2:]:
            k = self.choice([2, 3, 1])
            s = self.choice([1, 2])
            d = self.choice([1, 2]) if op == "MaxPool" else 1
            pmax = k - 1 if d == 1 else min(k - 1, 1)
            pb, pe = self.integer(0, pmax), self.integer(0, pmax)
            eff = (k - 1) * d + 1
            if size + pb + pe < eff:
                k, d, eff, pb, pe = 1, 1, 1, 0, 0
            kernel.append(k), strides.append(s), dils.append(d), pads_b.append(pb)
            pads_e.append(pe), out_sp.append((size + pb + pe - eff) // s + 1)
        attrs: dict[str, Any] = dict(kernel_shape=kernel)
        if any(s != 1 for s in strides) or self.flip(0.2):
            attrs["strides"] = strides
        if any(pads_b) or any(pads_e):
            attrs["pads"] = pads_b + pads_e
        lo, hi = x.lo, x.hi
        if op == "MaxPool" and (any(d != 1 for d in dils) or self.flip(0.2)):
            attrs["dilations"] = dils
        if op == "AveragePool":
            cip = self.choice([None, 1, 0])
            attrs["count_include_pad"] = cip
            if cip == 1 and attrs.get("pads"):
                lo, hi = min(lo, 0.0), max(hi, 0.0)
        flat = frozenset(a for a in x.flat if a != 1)
        self.op(op, [x], x.shape[:2] + tuple(out_sp), lo, hi, flat, **attrs)
        return True

    def f_matmul(self, bias: bool | None = None, act: bool | str | None = None) -> bool:
        if not (self.allow_matmul and self.allowed("MatMul")):
            return False
        variant = self.choice(["weight", "weight", "activation", "vector"])

        def ok(v):
            return 1 <= v.rank <= 4 and v.shape[-1] <= 64 and v.numel <= 2048

        def make():
            k = self.integer(1, 32)
            lead = [self.integer(1, 8)] + ([self.integer(1, 3)] if self.flip(0.3) else [])
            return self.new_input((*lead[::-1], k))
        a = self.pick(ok, make, p_new=0.15)
        k = a.shape[-1]
        if variant == "activation" and a.rank >= 2:
            a = self.tame(a, min(INPUT_RANGE, math.sqrt(16.0 / k)))
            if self.allow_shapes and self.allowed("Transpose") and self.flip(0.6):   # a @ a^T
                perm = list(range(a.rank))
                perm[-1], perm[-2] = perm[-2], perm[-1]
                bshape = tuple(a.shape[p] for p in perm)
                flat = frozenset(i for i, p in enumerate(perm) if p in a.flat)
                b = self.op("Transpose", [a], bshape, a.lo, a.hi, flat, perm=perm)
            else:
                nn = self.integer(1, 8)
                lim = min(INPUT_RANGE, math.sqrt(16.0 / k))
                b = self.new_input(a.shape[:-2] + (k, nn), -lim, lim)
            out = _broadcast(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
            if _numel(out) > MAX_NUMEL:
                return False
            bound = k * a.bound * b.bound
            flat = frozenset(i for i in range(len(out) - 2) if i in a.flat and i in b.flat)
            y = self.op("MatMul", [a, b], out, -bound, bound, flat)
        else:
            vector_lhs = variant == "vector" and self.flip()
            if vector_lhs and a.rank != 1:
                a = self.new_input((k,)) if self.flip(0.5) else a
            n_out = self.integer(1, 16)
            vector_rhs = variant == "vector" and not vector_lhs
            rng = self.rng()
            if vector_rhs:
                wshape: tuple[int, ...] = (k,)
            elif a.rank >= 3 and self.flip(0.25):
                wshape = (self.choice([a.shape[-3], 1]), k, n_out)
            elif a.rank == 2 and self.flip(0.1):
                wshape = (2, k, n_out)
            else:
                wshape = (k, n_out)
            w = rng.standard_normal(wshape) / math.sqrt(k)
            colsum = np.abs(w).sum(axis=-2 if len(wshape) >= 2 else 0).max()
            if colsum * a.bound > 16:
                w *= 16 / (colsum * a.bound)
                colsum = np.abs(w).sum(axis=-2 if len(wshape) >= 2 else 0).max()
            if a.rank == 1 and len(wshape) == 1:
                out: tuple[int, ...] = ()
            elif a.rank == 1:
                out = wshape[:-2] + (wshape[-1],)
            elif len(wshape) == 1:
                out = a.shape[:-1]
            else:
                out = _broadcast(a.shape[:-2], wshape[:-2]) + (a.shape[-2], wshape[-1])
            if _numel(out) > MAX_NUMEL:
                return False
            wv = self.const(w.astype(np.float32), "w", node_ok=False)
            bound = float(colsum * a.bound)
            if a.rank >= 2 and len(wshape) >= 2:
                off = len(out) - a.rank
                flat = frozenset(i + off for i in a.flat if i < a.rank - 1)
            elif a.rank >= 2:
                flat = frozenset(i for i in a.flat if i < a.rank - 1)
            else:
                flat = frozenset()
            ins = [a, wv]
            y = self.op("MatMul", ins, out, -bound, bound, flat)
        if y.rank >= 1 and self.allowed("Add") and ((bias is None and self.flip(0.5)) or bias):
            c = self.const(self.floats((y.shape[-1],), -0.5, 0.5), "bias")
            y = self.binary("Add", *((y, c) if self.flip(0.8) else (c, y)))
        if (act is None and self.flip(0.4)) or act:
            y = self.activation(y, None if act in (None, True) else act)
        return True

    def f_gemm(self, bias: bool | None = None, act: bool | str | None = None) -> bool:
        if not (self.allow_matmul and self.allowed("Gemm")):
            return False

        def make():
            return self.new_input((self.integer(1, 8), self.integer(1, 32)))
        a = self.pick(lambda v: v.rank == 2 and max(v.shape) <= 64, make, p_new=0.2)
        if a.rank != 2:
            return False
        trans_a = self.flip(0.25)
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        n_out = self.integer(1, 16)
        trans_b = self.flip(0.5)
        rng = self.rng()
        w = rng.standard_normal((k, n_out)) / math.sqrt(k)
        alpha = self.choice([None, 0.5, 2.0, -1.0])
        beta = self.choice([None, 0.5, -1.0])
        al = 1.0 if alpha is None else alpha
        be = 1.0 if beta is None else beta
        colsum = np.abs(w).sum(0).max()
        if abs(al) * colsum * a.bound > 16:
            w *= 16 / (abs(al) * colsum * a.bound)
            colsum = np.abs(w).sum(0).max()
        wv = self.const((w.T if trans_b else w).astype(np.float32), "w", node_ok=False)
        cshape = self.choice([None, (n_out,), (1, n_out), (m, n_out), (m, 1), (), (1,)])
        if (bias is True and cshape is None) or bias is False:
            cshape = (n_out,) if bias else None
        cv = None if cshape is None else self.const(self.floats(cshape, -0.5, 0.5), "gc")
        bound = float(abs(al) * colsum * a.bound + (abs(be) * 0.5 if cv is not None else 0))
        flat = frozenset()
        if (1 if trans_a else 0) in a.flat and (cv is None or len(cshape) < 2 or cshape[0] == 1):
            flat = frozenset({0})
        y = self.op("Gemm", [a, wv, cv], (m, n_out), -bound, bound, flat,
                    alpha=alpha, beta=beta, transA=1 if trans_a else None,
                    transB=1 if trans_b else None)
        if (act is None and self.flip(0.4)) or act:
            self.activation(y, None if act in (None, True) else act)
        return True
