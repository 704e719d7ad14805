"""Builder families of elementwise ops: unary and binary ops, Pow, Where, Sum,
Identity/Dropout, Cast round trips, the opaque ops, the multi-node patterns the rules look for
(Swish, GELU, HardSwish, decomposed LayerNorm and Softmax) and constant subgraphs.

A mixin of `_Builder` (strategies.py): it uses the core's helpers (builder.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto

from .values import (BOUND, MAX_NUMEL, _broadcast, _erf, _flat_elementwise, _numel, _sigmoid,
                     _Val, sampled_interval, table_unary_ops)


class _ElementwiseFamilies:
    # ---- families ------------------------------------------------------------------------------
    # Each draws its operands, emits one or more nodes, and returns False if it could not apply.

    def f_unary(self, op: str | None = None) -> bool:
        ops = [o for o in ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "LeakyRelu", "Erf", "Exp",
                           "HardSigmoid", "HardSwish", "Clip", "Gelu", "Sqrt", "Log",
                           "Reciprocal") if self.allowed(o)]
        ops += [o for o in table_unary_ops() if self.allowed(o)]
        if op is None:
            if not ops:
                return False
            op = self.choice(ops)
        x = self.pick_any()
        self.unary(op, x)
        return True

    def unary(self, op: str, x: _Val) -> _Val:
        lo, hi = x.lo, x.hi
        attrs: dict[str, Any] = {}
        ins: list = [x]
        if op == "Relu":
            nlo, nhi = max(lo, 0.0), max(hi, 0.0)
        elif op == "LeakyRelu":
            alpha = self.choice([None, 0.1, 0.2, 0.01, 0.5])
            a = 0.01 if alpha is None else alpha
            attrs["alpha"] = alpha
            nlo, nhi = (lo if lo >= 0 else a * lo), (hi if hi >= 0 else a * hi)
        elif op == "Sigmoid":
            nlo, nhi = _sigmoid(lo), _sigmoid(hi)
        elif op == "Tanh":
            nlo, nhi = math.tanh(lo), math.tanh(hi)
        elif op == "Erf":
            nlo, nhi = _erf(lo), _erf(hi)
        elif op == "Neg":
            nlo, nhi = -hi, -lo
        elif op == "Abs":
            nlo = 0.0 if lo < 0 < hi else min(abs(lo), abs(hi))
            nhi = max(abs(lo), abs(hi))
        elif op == "Exp":
            x = self.tame(x, 4.0)
            ins = [x]
            nlo, nhi = math.exp(x.lo), math.exp(x.hi)
        elif op == "HardSigmoid":
            alpha, beta = self.choice([(None, None), (1 / 6, 0.5), (0.5, 0.5), (0.2, 0.6)])
            attrs.update(alpha=alpha, beta=beta)
            a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
            nlo, nhi = min(max(a * lo + b, 0.0), 1.0), min(max(a * hi + b, 0.0), 1.0)
        elif op == "HardSwish":
            nlo, nhi = (-0.375 if lo < 0 else 0.0), max(hi, 0.0)
        elif op == "Gelu":
            attrs["approximate"] = self.choice([None, "tanh", "none"])
            nlo, nhi = (-0.18 if lo < 0 else 0.0), max(hi, 0.0)
        elif op == "Clip":
            cmin = self.choice([0.0, None, -1.0, -0.5, -2.0])
            cmax = self.choice([6.0, None, 1.0, 0.5, 2.0])
            ins = [x, None if cmin is None else self.scalar(cmin, rank1=False),
                   None if cmax is None else self.scalar(cmax, rank1=False)]
            nlo = lo if cmin is None else min(max(lo, cmin), cmax if cmax is not None else 1e9)
            nhi = hi if cmax is None else max(min(hi, cmax), cmin if cmin is not None else -1e9)
            nlo, nhi = min(nlo, nhi), max(nlo, nhi)
        elif op == "Sqrt":
            x = self.positive(x, 0.01)
            ins = [x]
            nlo, nhi = math.sqrt(x.lo), math.sqrt(x.hi)
        elif op == "Log":
            x = self.positive(x, 0.1)
            ins = [x]
            nlo, nhi = math.log(x.lo), math.log(x.hi)
        elif op == "Reciprocal":
            x = self.positive(x, 0.1)
            if self.flip(0.3) and self.allowed("Neg"):
                x = self.op("Neg", [x], x.shape, -x.hi, -x.lo, x.flat)
            ins = [x]
            nlo, nhi = 1.0 / x.hi, 1.0 / x.lo
        elif op in table_unary_ops():
            x, nlo, nhi = self.table_unary(op, x)
            ins = [x]
        else:
            raise AssertionError(op)
        return self.op(op, ins, x.shape, nlo, nhi, x.flat, **attrs)

    def table_unary(self, op: str, x: _Val) -> tuple[_Val, float, float]:
        """An operand for a unary op of the operator table (inside its domain, tamed where
        its values would leave the bounds) and the interval of the op's values on it."""
        from ..ops import OPS
        if OPS[op].domain != "any":
            x = self.positive(x, 0.1)
        nlo, nhi = sampled_interval(op, x.lo, x.hi)
        if not (max(abs(nlo), abs(nhi)) <= BOUND):
            x = self.tame(x, 1.0)
            if OPS[op].domain != "any":
                x = self.positive(x, 0.1)
            nlo, nhi = sampled_interval(op, x.lo, x.hi)
        return x, nlo, nhi

    def f_binary(self, op: str | None = None) -> bool:
        ops = [o for o in ("Add", "Mul", "Sub", "Div", "Pow") if self.allowed(o)]
        if op is None:
            if not ops:
                return False
            op = self.choice(ops)
        a = self.pick_any()
        if op == "Pow":
            self.power(a)
            return True
        away = 0.5 if op == "Div" else 0.0
        b = self.operand_for(a, away=away, allow_self=op != "Div")
        first, second = (a, b) if self.flip(0.7) else (b, a)
        if op == "Div" and not (second.lo >= 0.25 or second.hi <= -0.25):
            second = self.positive(second, 0.25)
            if self.flip(0.3) and self.allowed("Neg"):
                second = self.op("Neg", [second], second.shape, -second.hi, -second.lo,
                                 second.flat)
        self.binary(op, first, second)
        return True

    def binary(self, op: str, a: _Val, b: _Val) -> _Val:
        same = a is b
        for _ in range(2):
            lo, hi = self._binary_interval(op, a, b, same)
            if max(abs(lo), abs(hi)) <= BOUND:
                break
            # tame the operands; Div keeps its (positive) divisor
            if op in ("Add", "Sub"):
                a = self.tame(a, BOUND / 2 - 1)
                b = a if same else self.tame(b, BOUND / 2 - 1)
            elif op == "Mul":
                a = self.tame(a, math.sqrt(BOUND) - 0.5)
                b = a if same else self.tame(b, math.sqrt(BOUND) - 0.5)
            else:   # Div: |b| >= 0.25
                a = self.tame(a, BOUND * 0.2)
        lo, hi = self._binary_interval(op, a, b, same)
        out = _broadcast(a.shape, b.shape)
        return self.op(op, [a, b], out, lo, hi, _flat_elementwise(out, [a, b]))

    @staticmethod
    def _binary_interval(op, a, b, same):
        if op == "Add":
            return a.lo + b.lo, a.hi + b.hi
        if op == "Sub":
            if same:
                return 0.0, 0.0
            return a.lo - b.hi, a.hi - b.lo
        if op == "Mul":
            if same:
                lo = 0.0 if a.lo < 0 < a.hi else min(a.lo**2, a.hi**2)
                return lo, max(a.lo**2, a.hi**2)
            p = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
            return min(p), max(p)
        if op == "Div":
            if same:
                return 1.0, 1.0
            inv = [1.0 / b.lo, 1.0 / b.hi]
            p = [a.lo * inv[0], a.lo * inv[1], a.hi * inv[0], a.hi * inv[1]]
            return min(p), max(p)
        raise AssertionError(op)

    def power(self, a: _Val) -> _Val:
        """Pow with a small constant exponent (positive base for fractional or negative ones),
        or, now and then, a positive constant base raised to a bounded tensor."""
        if self.flip(0.15):
            e = self.tame(a, 2.0)
            base = self.const(self.floats(self.operand_shape(e.shape), 0.5, 2.0))
            out = _broadcast(e.shape, base.shape)
            vals = [base.lo ** e.lo, base.lo ** e.hi, base.hi ** e.lo, base.hi ** e.hi]
            return self.op("Pow", [base, e], out, min(vals), max(vals),
                           _flat_elementwise(out, [e, base]))
        p = self.choice([2.0, 0.5, 3.0, 1.5, -1.0, -0.5, 1.0])
        if p in (2.0, 3.0, 1.0):
            a = self.tame(a, BOUND ** (1.0 / p) * 0.9)
            cands = [a.lo ** p, a.hi ** p] + ([0.0] if a.lo < 0 < a.hi else [])
            lo, hi = min(cands), max(cands)
            if p == 2.0:
                lo = max(lo, 0.0)
        else:
            a = self.positive(a, 0.25 if p < 0 else 0.1)
            if p > 0:
                a = self.tame(a, BOUND ** (1.0 / p) * 0.9)
                if a.lo <= 0:         # the taming input may be fresh: keep it positive
                    a = self.positive(a, 0.1)
            lo, hi = sorted([a.lo ** p, a.hi ** p])
        if self.flip(0.2):   # the exponent as a full array of the same value
            y = self.const(np.full(self.operand_shape(a.shape), p, dtype=np.float32), "e")
        else:
            y = self.scalar(p)
        out = _broadcast(a.shape, y.shape)
        return self.op("Pow", [a, y], out, lo, hi, _flat_elementwise(out, [a, y]))

    def f_where(self) -> bool:
        if not self.allowed("Where"):
            return False
        a = self.pick_any()
        b = self.operand_for(a)
        cshape = self.operand_shape(_broadcast(a.shape, b.shape))
        if self.flip(0.1):
            cond = self.new_input(cshape, 0, 1, dtype="bool")
        else:
            cond = self.const(self.rng().random(size=cshape) < 0.5, "cond")
        x, y = (a, b) if self.flip() else (b, a)
        out = _broadcast(cond.shape, a.shape, b.shape)
        if out is None or _numel(out) > MAX_NUMEL:
            cond = self.const(np.array(True), "cond")
            out = _broadcast(a.shape, b.shape)
        flat = _flat_elementwise(out, [cond, x, y])
        self.op("Where", [cond, x, y], out, min(x.lo, y.lo), max(x.hi, y.hi), flat)
        return True

    def f_sum(self) -> bool:
        if not self.allowed("Sum"):
            return False
        a = self.tame(self.pick_any(), BOUND / 3 - 1)
        parts = [a]
        for _ in range(self.integer(0, 2)):
            b = self.tame(self.operand_for(a), BOUND / 3 - 1)
            out = _broadcast(*[p.shape for p in parts], b.shape)
            if out is not None and _numel(out) <= MAX_NUMEL:
                parts.append(b)
        out = _broadcast(*[p.shape for p in parts])
        self.op("Sum", parts, out, sum(p.lo for p in parts), sum(p.hi for p in parts),
                _flat_elementwise(out, parts))
        return True

    def f_identity(self) -> bool:
        ops = [o for o in ("Identity", "Dropout") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick_any()
        if op == "Identity":
            self.op("Identity", [x], x.shape, x.lo, x.hi, x.flat)
            return True
        form = self.choice(["plain", "ratio", "ratio_training", "mask"])
        ins: list = [x]
        if form in ("ratio", "ratio_training"):
            ins.append(self.const(np.array(self.choice([0.5, 0.1, 0.0]), dtype=np.float32), "r"))
        if form == "ratio_training":
            ins.append(self.const(np.array(False), "t"))
        if form == "mask":   # the optional mask output, declared and left unused
            self.op("Dropout", ins, x.shape, x.lo, x.hi, x.flat)
            self.nodes[-1].output.append(self.fresh("mask"))
            return True
        self.op("Dropout", ins, x.shape, x.lo, x.hi, x.flat)
        return True

    def f_cast(self) -> bool:
        if not self.allowed("Cast"):
            return False
        x = self.pick_any()
        via = self.choice([None, TensorProto.DOUBLE, TensorProto.FLOAT16])
        if via is None:
            self.op("Cast", [x], x.shape, x.lo, x.hi, x.flat, to=TensorProto.FLOAT)
            return True
        mid = self.fresh("cast")
        self.node("Cast", [x], [mid], to=via)
        self.op("Cast", [mid], x.shape, x.lo - 0.05, x.hi + 0.05, x.flat, to=TensorProto.FLOAT)
        return True

    def f_opaque(self) -> bool:
        ops = [o for o in ("Softplus", "Sin", "Max", "Min") if self.allowed(o)]
        if not ops:
            return False
        op = self.choice(ops)
        x = self.pick_any()
        if op == "Softplus":
            sp = lambda v: math.log1p(math.exp(-abs(v))) + max(v, 0.0)   # noqa: E731
            self.op("Softplus", [x], x.shape, sp(x.lo), sp(x.hi), x.flat)
        elif op == "Sin":
            self.op("Sin", [x], x.shape, -1.0, 1.0, x.flat)
        else:
            b = self.operand_for(x)
            out = _broadcast(x.shape, b.shape)
            f = max if op == "Max" else min
            self.op(op, [x, b], out, f(x.lo, b.lo), f(x.hi, b.hi), _flat_elementwise(out, [x, b]))
        return True

    def f_pattern(self) -> bool:
        patterns = []
        if self.allowed("Sigmoid", "Mul"):
            patterns.append("swish")
        if self.allowed("Div", "Erf", "Add", "Mul"):
            patterns.append("gelu_erf")
        if self.allowed("Mul", "Pow", "Add", "Tanh"):
            patterns.append("gelu_tanh")
        if self.allowed("Add", "Clip", "Mul", "Div"):
            patterns.append("hardswish")
        if self.allowed("Add", "Relu"):
            patterns.append("bias_relu")
        if self.allowed("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"):
            patterns.append("layernorm")
        if self.allowed("Exp", "ReduceSum", "Div"):
            patterns.append("softmax")
        if not patterns:
            return False
        which = self.choice(patterns)
        if which in ("layernorm", "softmax"):
            x = self.pick_any(lambda v: v.rank >= 1 and v.shape[-1] >= 2, min_rank=1)
            if x.rank == 0 or x.shape[-1] < 2:
                return False
            return self.decomposed_norm(x, which)
        x = self.pick_any()
        f = x.flat

        def sc(value: float, rank1: bool | None = None) -> _Val:
            return self.scalar(value, rank1, like=x)
        if which == "swish":
            s = self.op("Sigmoid", [x], x.shape, _sigmoid(x.lo), _sigmoid(x.hi), f)
            ins = [x, s] if self.flip(0.7) else [s, x]
            self.op("Mul", ins, x.shape, -0.2785 if x.lo < 0 else 0.0, max(x.hi, 0.0), f)
        elif which == "gelu_erf":
            r2 = 1.4142135
            if self.flip(0.5):
                d = self.op("Div", [x, sc(r2)], x.shape, x.lo / r2, x.hi / r2, f)
            else:
                d = self.op("Mul", [x, sc(1 / r2)], x.shape, x.lo / r2, x.hi / r2, f)
            e = self.op("Erf", [d], x.shape, _erf(d.lo), _erf(d.hi), f)
            p = self.op("Add", [e, sc(1.0)], x.shape, e.lo + 1, e.hi + 1, f)
            m = self.op("Mul", [x, p], x.shape, min(0.0, 2 * x.lo), max(0.0, 2 * x.hi), f)
            self.op("Mul", [m, sc(0.5)], x.shape, -0.18 if x.lo < 0 else 0.0, max(x.hi, 0.0), f)
        elif which == "gelu_tanh":
            x = self.tame(x, 3.0)
            f = x.flat
            c = self.op("Pow", [x, sc(3.0)], x.shape, x.lo**3, x.hi**3, f)
            k1, k2 = 0.044715, 0.7978846
            c2 = self.op("Mul", [c, sc(k1)], x.shape, c.lo * k1, c.hi * k1, f)
            s = self.op("Add", [x, c2], x.shape, x.lo + c2.lo, x.hi + c2.hi, f)
            s2 = self.op("Mul", [s, sc(k2)], x.shape, s.lo * k2, s.hi * k2, f)
            t = self.op("Tanh", [s2], x.shape, math.tanh(s2.lo), math.tanh(s2.hi), f)
            p = self.op("Add", [t, sc(1.0)], x.shape, t.lo + 1, t.hi + 1, f)
            h = self.op("Mul", [x, sc(0.5)], x.shape, x.lo * 0.5, x.hi * 0.5, f)
            self.op("Mul", [h, p], x.shape, min(0.0, 2 * h.lo), max(0.0, 2 * h.hi), f)
        elif which == "hardswish":
            a = self.op("Add", [x, sc(3.0)], x.shape, x.lo + 3, x.hi + 3, f)
            c = self.op("Clip", [a, sc(0.0, False), sc(6.0, False)], x.shape,
                        min(max(a.lo, 0), 6), min(max(a.hi, 0), 6), f)
            m = self.op("Mul", [x, c], x.shape, min(0.0, 6 * x.lo), max(0.0, 6 * x.hi), f)
            self.op("Div", [m, sc(6.0)], x.shape, m.lo / 6, m.hi / 6, f)
        else:  # bias_relu
            c = self.const(self.floats(self.operand_shape(x.shape), -1.0, 1.0))
            out = _broadcast(x.shape, c.shape)
            s = self.op("Add", [x, c], out, x.lo + c.lo, x.hi + c.hi,
                        _flat_elementwise(out, [x, c]))
            self.op("Relu", [s], out, max(s.lo, 0), max(s.hi, 0), s.flat)
        return True

    def decomposed_norm(self, x: _Val, which: str) -> bool:
        """LayerNorm or Softmax over the last axis written out op by op, as older exporters do."""
        r = x.rank
        n = x.shape[-1]
        if which == "softmax":
            x = self.tame(x, 4.0)
            e = self.op("Exp", [x], x.shape, math.exp(x.lo), math.exp(x.hi), x.flat)
            s = self.reduce("ReduceSum", e, [r - 1], 1, register=False, tame=False)
            self.op("Div", [e, s], x.shape, e.lo / s.hi, 1.0, x.flat)
            return True
        if (r - 1) in x.flat or n < 2:
            return False
        x = self.tame(x, 8.0)
        if (r - 1) in x.flat:
            return False
        m = self.reduce("ReduceMean", x, [r - 1], 1, register=False)
        d = self.op("Sub", [x, m], x.shape, x.lo - x.hi, x.hi - x.lo, x.flat, register=False)
        sq = self.op("Mul", [d, d], x.shape, 0.0, max(d.lo**2, d.hi**2), x.flat, register=False)
        var = self.reduce("ReduceMean", sq, [r - 1], 1, register=False)
        eps = self.scalar(self.choice([1e-5, 1e-3]), rank1=False)
        ve = self.op("Add", [var, eps], var.shape, var.lo + 1e-5, var.hi + 1e-3, var.flat,
                     register=False)
        sd = self.op("Sqrt", [ve], var.shape, math.sqrt(ve.lo), math.sqrt(ve.hi), var.flat,
                     register=False)
        b = math.sqrt(n)
        y = self.op("Div", [d, sd], x.shape, -b, b, x.flat)
        if self.flip(0.7):
            g = self.const(self.floats((n,), 0.5, 1.5), "gamma")
            y = self.op("Mul", [y, g], x.shape, -b * g.hi, b * g.hi, x.flat)
            beta = self.const(self.floats((n,), -0.5, 0.5), "beta")
            self.op("Add", [y, beta], x.shape, y.lo + beta.lo, y.hi + beta.hi, x.flat)
        return True

    def f_const_subgraph(self) -> bool:
        """A constant computed by nodes that read only initializers, then applied to a value."""
        if not self.allowed("Mul", "Add"):
            return False
        x = self.pick_any()
        shape = self.operand_shape(x.shape)
        kind = self.choice(["bn_scale", "mul_add", "reshape", "neg"])
        if kind == "bn_scale" and self.allowed("Sqrt", "Div"):
            s = self.const(self.floats(shape, 0.5, 1.5), "scale")
            v = self.const(self.floats(shape, 0.5, 1.5), "var")
            ve = self.op("Add", [v, self.scalar(1e-5, like=s)], shape, v.lo, v.hi + 1e-5,
                         register=False)
            sd = self.op("Sqrt", [ve], shape, math.sqrt(ve.lo), math.sqrt(ve.hi), register=False)
            c = self.op("Div", [s, sd], shape, s.lo / sd.hi, s.hi / sd.lo, register=False)
            self.binary("Mul", x, c)
        elif kind == "reshape" and self.allowed("Reshape") and len(shape) >= 1:
            flat = self.const(self.floats((_numel(shape),), -1.0, 1.0), "cflat")
            c = self.op("Reshape", [flat, self.ints(shape)], shape, flat.lo, flat.hi,
                        register=False)
            self.binary("Add", x, c)
        elif kind == "neg" and self.allowed("Neg"):
            c0 = self.const(self.floats(shape, -1.0, 1.0))
            c = self.op("Neg", [c0], shape, -c0.hi, -c0.lo, register=False)
            self.binary("Add" if self.flip() else "Mul", x, c)
        else:
            c1 = self.const(self.floats(shape, -1.0, 1.0))
            c2 = self.const(self.floats(shape, -1.0, 1.0))
            m = self.op("Mul", [c1, c2], shape, -1.0, 1.0, register=False)
            c3 = self.const(self.floats(shape, -1.0, 1.0))
            c = self.op("Add", [m, c3], shape, -2.0, 2.0, register=False)
            self.binary("Mul" if self.flip() else "Add", x, c)
        return True
