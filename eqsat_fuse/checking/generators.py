"""The per-operator sample generators of the compute operators, and the table of all of them.

A generator builds a value of one operator of the term language for a `_Sample`: given the
shape the result must have (or none), it derives shapes and attributes for the operands
(Conv channels divisible by the group, MatMul inner dimensions, broadcast-compatible operands,
axes inside the rank...), instantiates them through the sample and evaluates the operator.
The generators of the shape and layout operators (Concat, Reshape, Slice...) are in
shape_generators.py; `generator_for` gives the one for an operator, any of them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from ..ops import OPS
from .patterns import Call, Var
from .primitives import _Unsupported
from .sample import _edge_values, _Reject, _Sample
from .shape_generators import (_gen_concat, _gen_expand, _gen_flatten, _gen_gather, _gen_pad,
                               _gen_reshape, _gen_slice, _gen_split, _gen_squeeze,
                               _gen_transpose, _gen_unsqueeze)


# ---- generators: one per operator ---------------------------------------------------------------
# gen(sample, pattern, want, role, ranks) -> value. `want` is the shape the result must have (or
# None), `role` what the data is for ("positive" feeds a Sqrt...), `ranks` the allowed ranks.

_LEAVES = {"Input", "Const", "Absent", "Scalar", "Ints"}


def _eps(s: _Sample) -> float:
    return s.pick((1e-5, 1e-3, 0.1, 0.5, 1.0)) if s.coin() else s.f(1e-3, 1.0)


# what a unary op's operand is drawn for: the op's `domain` in the operator table (positive for
# Sqrt...), else the role asked of the op itself where the op is the identity on values, else any
# value. A role is never pushed down through arithmetic (a Sqrt of x * x does not make x
# positive), and only a fast rule's ordinary samples honour it (sample.py: `ASSUMPTIONS`).
_ROLE_PASSING = {"Mat", "Identity", "Dropout"}

# attribute drawers of the elementwise operators, one per attribute slot
_UNARY_ATTRS: dict[str, list[Callable[[_Sample], Any]]] = {
    "LeakyRelu": [lambda s: s.pick((0.01, 0.1, 0.2, 1.5))],
    "HardSigmoid": [lambda s: s.pick((0.2, 1 / 6, 0.5)), lambda s: s.pick((0.5, 0.0, 0.25))],
    "Gelu": [lambda s: s.pick(("none", "tanh"))],
    "Cast": [lambda s: s.pick(("float32", "float64", "float16", "int64", "int32", "float32"))],
}


# the input slots of the quantization ops that hold integers (of one dtype per op)
INTEGER_SLOTS = {"QuantizeLinear": ("zero_point",), "DequantizeLinear": ("x", "zero_point")}


def _gen_unary(s, p, want, role, ranks):
    op = p.op
    domain = OPS[op].domain
    child_role = domain if domain != "any" else role if op in _ROLE_PASSING else "any"
    x = s.make(p.args[0], want, child_role, ranks)
    if op == "Mat":
        return x
    spec = OPS[op]
    drawers = _UNARY_ATTRS.get(op, [])
    values = [s.attr(slot, (lambda d=drawers[i]: d(s)) if i < len(drawers) else (lambda: 0.5))
              for i, slot in enumerate(p.args[1:])]
    return s.apply(op, [x], dict(zip(spec.attrs, values)))


def _gen_clip(s, p, want, role, ranks):
    x = s.make(p.args[0], want, "any", ranks)
    lo = s.optional(p.args[1], (), "low")
    hi = s.optional(p.args[2], (), "high")
    return s.apply("Clip", [x, lo, hi], {})


def _operand_priority(s, a):
    if s.determined(a):
        return 0
    if isinstance(a, Call) and a.op not in _LEAVES:
        return 1
    return 2


def _cover(s, want, n: int, covered) -> list[tuple]:
    """n shapes that broadcast together to exactly `want` (with `covered[j]`: axis j already
    has its full size from a known operand): each a random broadcastable shape, then every
    axis of size > 1 nobody has yet given to one of them (mutual broadcasting included)."""
    r = len(want)
    shapes = [list(s.sub_shape(want)) for _ in range(n)]
    for j in range(r):
        if want[j] == 1 or covered[j]:
            continue
        if any(len(sh) >= r - j and sh[j - (r - len(sh))] == want[j] for sh in shapes):
            continue
        sh = shapes[s.i(0, n - 1)]
        while len(sh) < r - j:
            sh.insert(0, 1)
        sh[j - (r - len(sh))] = want[j]
    return [tuple(sh) for sh in shapes]


def _gen_broadcast(s, p, want, role, ranks):
    op, args = p.op, p.args
    roles = {"Add": ("any", "any"), "Mul": ("any", "any"), "Sub": ("any", "any"),
             "Div": ("any", "nonzero"), "Pow": ("positive", "exponent"),
             "Where": ("bool", "any", "any")}.get(op)
    if op in INTEGER_SLOTS:
        integer = ("int", s.pick(("uint8", "int8", "int16", "uint16")))   # the integer side
        roles = tuple(integer if slot in INTEGER_SLOTS[op] else "any" for slot in OPS[op].inputs)
    if roles is None:                    # another op of the table: its domain for every operand
        roles = (OPS[op].domain,) * len(args)
    if op == "Pow" and isinstance(args[1], Var):
        exponent = s.hints.splat.get(args[1].name)
        if exponent is not None and float(exponent).is_integer():
            roles = ("any", "exponent")
    order = sorted(range(len(args)), key=lambda i: _operand_priority(s, args[i]))
    values: list = [None] * len(args)
    free = [i for i in order if not s.determined(args[i])]
    leaves_only = all(_operand_priority(s, args[i]) == 2 and s.hinted_shape(args[i]) is None
                      and s.rank_of(args[i]) is None for i in free)
    if want is None and free and leaves_only and len(free) == len(args):
        want = s.random_shape(ranks)                 # free operands: choose the result first
    if want is None:
        base = None
        for i in order:
            a = args[i]
            if base is None:
                values[i] = s.make(a, None, roles[i], ranks)
                if not isinstance(values[i], np.ndarray):
                    raise _Reject(f"{op} operand is absent")
                base = values[i].shape
            elif s.determined(a):
                values[i] = s.eval(a)
            else:
                shape = s.hinted_shape(a)
                values[i] = s.make(a, shape if shape is not None
                                   else s.sub_shape(base, s.rank_of(a)), roles[i])
        return s.apply(op, values, {})
    want = tuple(want)
    for i in order:
        if s.determined(args[i]):
            values[i] = s.eval(args[i])
    known = [v.shape for v in values if isinstance(v, np.ndarray)]
    covered = [any(len(k) >= len(want) - j and k[j - (len(want) - len(k))] == want[j]
                   for k in known) for j in range(len(want))]
    full = next((i for i in free if _operand_priority(s, args[i]) == 1
                 and s.rank_of(args[i]) in (None, len(want))
                 and s.hinted_shape(args[i]) in (None, want)), None)
    rest = [i for i in free if i != full]
    if full is not None:
        values[full] = s.make(args[full], want, roles[full])
        covered = [True] * len(want)
    shapes = _cover(s, want, len(rest), covered) if rest else []
    for i, shape in zip(rest, shapes):
        a = args[i]
        r = s.rank_of(a)
        if r is not None and r > len(want):
            raise _Reject(f"{op} operand of rank {r} cannot give rank {len(want)}")
        hinted = s.hinted_shape(a)
        if hinted is not None:
            shape = hinted
        elif r is not None and r != len(shape):
            shape = s.sub_shape(want, r)
        values[i] = s.make(a, shape, roles[i])
    return s.apply(op, values, {})


def _gen_batchnorm(s, p, want, role, ranks):
    x, scale, bias, mean, var, eps = p.args
    rs = {r for r in (ranks or (2, 3, 4, 5)) if 2 <= r <= 5} or {2, 3, 4, 5}
    xv = s.make(x, want, "any", rs if want is None else None)
    if not isinstance(xv, np.ndarray) or xv.ndim < 2:
        raise _Reject("BatchNormalization needs rank >= 2")
    c = (xv.shape[1],)
    values = [xv, s.make(scale, c), s.make(bias, c), s.make(mean, c), s.make(var, c, "positive")]
    return s.apply("BatchNormalization", values, {"epsilon": s.attr(eps, lambda: _eps(s))})


def _spatial_rank(s, want, tensors, attr_lengths, ranks, default=(2, 1, 3)):
    if want is not None:
        return len(want) - 2
    for t in tensors:
        r = s.rank_of(t)
        if r is not None:
            return r - 2
    for n, per in attr_lengths:
        if n is not None:
            return n // per
    if ranks:
        options = [r - 2 for r in sorted(ranks) if 3 <= r <= 5]
        return s.pick(options) if options else 0
    return s.pick(default)


def _gen_conv(s, p, want, role, ranks):
    x, w, b, pads, strides, dil, g = p.args
    xv, wv = s.value_if_determined(x), s.value_if_determined(w)
    nd = _spatial_rank(s, want, [x, w], [(s.length_of(pads), 2), (s.length_of(strides), 1),
                                         (s.length_of(dil), 1)], ranks)
    if not 1 <= nd <= 3:
        raise _Reject("Conv: spatial rank outside 1..3")
    wname = s.var_for(w)

    def wd(axis):
        return s.dim_hint(wname, axis) if wname is not None else None
    if wv is not None:
        M, Cg, ks = wv.shape[0], wv.shape[1], tuple(wv.shape[2:])
    else:
        M, Cg = wd(0), wd(1)
        ks = tuple(wd(2 + i) or s.i(1, 3) for i in range(nd))
    if want is not None:
        if M is not None and M != want[1]:
            raise _Reject("Conv: output channels fixed elsewhere")
        M = want[1]
    C = xv.shape[1] if isinstance(xv, np.ndarray) and xv.ndim >= 2 else None
    G = s.known(g)
    if G is None:
        style = s.pick(("dense", "grouped", "depthwise", "dense"))
        if C is not None and Cg is not None:
            G = C // Cg if Cg and C % Cg == 0 else 0
        elif style == "dense":
            G = 1
        elif style == "grouped":
            G = 2
        else:
            G = C if C is not None else (M if M is not None else s.i(2, 4))
            Cg = 1 if Cg is None else Cg
    if not G or G < 1:
        raise _Reject("Conv: no valid group")
    if Cg is None:
        Cg = C // G if C is not None else s.i(1, 3)
    if M is None:
        M = G * s.i(1, 3)
    if M % G or Cg < 1 or (C is not None and C != G * Cg):
        raise _Reject("Conv: channels do not divide into groups")
    G = s.attr(g, lambda: G)
    st = s.attr(strides, lambda: tuple(s.pick((1, 2, 1)) for _ in range(nd)))
    dl = s.attr(dil, lambda: tuple(s.pick((1, 1, 2)) for _ in range(nd)))
    if len(st) != nd or len(dl) != nd:
        raise _Reject("Conv: attribute lengths do not match the spatial rank")
    outs = None
    if not isinstance(xv, np.ndarray):
        outs = want[2:] if want is not None else tuple(s.i(1, 3) for _ in range(nd))

    def draw_pads():
        if outs is None:
            return tuple(s.i(0, 1) for _ in range(2 * nd))
        room = [(outs[i] - 1) * st[i] + (ks[i] - 1) * dl[i] for i in range(nd)]
        begins = [s.i(0, min(1, room[i])) for i in range(nd)]
        return tuple(begins + [s.i(0, min(1, room[i] - begins[i])) for i in range(nd)])
    pd = s.attr(pads, draw_pads)
    if len(pd) != 2 * nd:
        raise _Reject("Conv: attribute lengths do not match the spatial rank")
    if isinstance(xv, np.ndarray):
        N, insp = xv.shape[0], xv.shape[2:]
    else:
        N = want[0] if want is not None else s.i(1, 2)
        insp = []
        for i in range(nd):
            eff = (ks[i] - 1) * dl[i] + 1
            n = (outs[i] - 1) * st[i] + eff - pd[i] - pd[nd + i] + s.i(0, st[i] - 1)
            if n < 1:
                raise _Reject("Conv: padding larger than the input")
            insp.append(n)
    xv = s.make(x, (N, G * Cg, *insp))
    wv = s.make(w, (M, Cg, *ks))
    bv = s.optional(b, (M,))
    return s.apply("Conv", [xv, wv, bv], dict(pads=pd, strides=st, dilations=dl, group=G))


def _gen_conv_transpose(s, p, want, role, ranks):
    x, w, b, pads, strides, dil, g, opad = p.args
    xv, wv = s.value_if_determined(x), s.value_if_determined(w)
    nd = _spatial_rank(s, want, [x, w], [(s.length_of(pads), 2), (s.length_of(strides), 1),
                                         (s.length_of(dil), 1), (s.length_of(opad), 1)], ranks)
    if not 1 <= nd <= 3:
        raise _Reject("ConvTranspose: spatial rank outside 1..3")
    G = s.attr(g, lambda: s.pick((1, 1, 2)))
    if wv is not None:
        C, Mg, ks = wv.shape[0], wv.shape[1], tuple(wv.shape[2:])
    else:
        C = xv.shape[1] if isinstance(xv, np.ndarray) else G * s.i(1, 3)
        Mg = want[1] // G if want is not None else s.i(1, 3)
        ks = tuple(s.i(1, 3) for _ in range(nd))
    if want is not None and want[1] != G * Mg:
        raise _Reject("ConvTranspose: output channels do not match the group")
    if C % G:
        raise _Reject("ConvTranspose: channels do not divide into groups")
    st = s.attr(strides, lambda: tuple(s.pick((1, 2)) for _ in range(nd)))
    dl = s.attr(dil, lambda: tuple(s.pick((1, 1, 2)) for _ in range(nd)))
    op = s.attr(opad, lambda: tuple(s.i(0, max(a, d) - 1) for a, d in zip(st, dl)))
    if isinstance(xv, np.ndarray):
        N, insp = xv.shape[0], tuple(xv.shape[2:])
    else:
        N = want[0] if want is not None else s.i(1, 2)
        insp = None
    known_pads = s.known(pads)
    if known_pads is None and want is not None and insp is None:
        insp, begins, ends = [], [], []
        for i in range(nd):
            o, k = want[2 + i], ks[i]
            n = max(1, -(-(o - op[i] - (k - 1) * dl[i] - 1) // st[i]) + 1) + s.i(0, 1)
            total = st[i] * (n - 1) + op[i] + (k - 1) * dl[i] + 1 - o
            if total < 0:
                raise _Reject("ConvTranspose: cannot reach the wanted size")
            begin = s.i(0, total)
            insp.append(n)
            begins.append(begin)
            ends.append(total - begin)
        pd = s.attr(pads, lambda: tuple(begins + ends))
    else:
        pd = s.attr(pads, lambda: tuple(s.i(0, 1) for _ in range(2 * nd)))
        if insp is None:
            insp = tuple(s.i(1, 3) for _ in range(nd))
    xv = s.make(x, (N, C, *insp))
    wv = s.make(w, (C, Mg, *ks))
    bv = s.optional(b, (G * Mg,))
    return s.apply("ConvTranspose", [xv, wv, bv], dict(pads=pd, strides=st, dilations=dl,
                                                      group=G, output_padding=op))


def _gen_matmul(s, p, want, role, ranks):
    a, b = p.args
    av, bv = s.value_if_determined(a), s.value_if_determined(b)
    av = av if isinstance(av, np.ndarray) and av.ndim >= 1 else None
    bv = bv if isinstance(bv, np.ndarray) and bv.ndim >= 1 else None
    ra = av.ndim if av is not None else s.rank_of(a)
    rb = bv.ndim if bv is not None else s.rank_of(b)
    # ranks of the operands
    if want is not None:
        r = len(want)
        if r == 0:
            ra, rb = ra or 1, rb or 1
        elif r == 1:
            if ra is None and rb is None:
                ra, rb = s.pick(((1, 2), (2, 1)))
            elif ra is None:
                ra = 2 if rb == 1 else 1
            elif rb is None:
                rb = 2 if ra == 1 else 1
        else:
            if ra is None:
                ra = r if (rb or 0) < r else s.pick(tuple(range(2, r + 1)))
            if rb is None:
                rb = r if ra < r else s.pick(tuple(range(2, r + 1)))
    else:
        ra = ra or s.pick((2, 3, 1, 4, 2))
        rb = rb or s.pick((2, 1, 3, 2))
    # inner, outer and batch dims: from the known operands, the wanted shape, or drawn
    K = (av.shape[-1] if av is not None else
         bv.shape[-2] if bv is not None and bv.ndim >= 2 else
         bv.shape[0] if bv is not None else s.i(1, 4))
    if want is not None and ra >= 2 and rb >= 2:
        M, N, batch = want[-2], want[-1], tuple(want[:-2])
    elif want is not None and ra >= 2:
        M, N, batch = want[-1], None, tuple(want[:-1])
    elif want is not None and rb >= 2:
        M, N, batch = None, want[-1], tuple(want[:-1])
    else:
        M = av.shape[-2] if av is not None and av.ndim >= 2 else s.i(1, 4)
        N = bv.shape[-1] if bv is not None and bv.ndim >= 2 else s.i(1, 4)
        known = [v.shape[:-2] for v in (av, bv) if v is not None and v.ndim > 2]
        batch = (tuple(np.broadcast_shapes(*known)) if known else
                 tuple(s.i(1, 3) for _ in range(max(ra, rb) - 2)))
    if av is not None:
        a_shape = av.shape
    elif ra == 1:
        a_shape = (K,)
    else:
        full = ra - 2 >= len(batch) or bv is not None and bv.ndim - 2 < len(batch)
        a_batch = batch[len(batch) - (ra - 2):] if full else s.sub_shape(batch, ra - 2)
        a_shape = (*a_batch, M or s.i(1, 4), K)
    if bv is not None:
        b_shape = bv.shape
    elif rb == 1:
        b_shape = (K,)
    else:
        a_full = len(a_shape) - 2 >= len(batch) and tuple(a_shape[:-2][-len(batch):] if batch
                                                            else ()) == batch
        b_batch = s.sub_shape(batch, rb - 2) if a_full else batch[len(batch) - (rb - 2):]
        b_shape = (*b_batch, K, N or s.i(1, 4))
    return s.apply("MatMul", [s.make(a, tuple(a_shape)), s.make(b, tuple(b_shape))], {})


def _gen_gemm(s, p, want, role, ranks):
    a, b, c, alpha, beta, ta, tb = p.args
    TA = s.attr(ta, lambda: s.pick((0, 1)))
    TB = s.attr(tb, lambda: s.pick((0, 1)))
    av, bv = s.value_if_determined(a), s.value_if_determined(b)
    M, N = want if want is not None and len(want) == 2 else (s.i(1, 4), s.i(1, 4))
    K = s.i(1, 4)
    if isinstance(av, np.ndarray) and av.ndim == 2:
        M, K = (av.shape[1], av.shape[0]) if TA else av.shape
    if isinstance(bv, np.ndarray) and bv.ndim == 2:
        K, N = (bv.shape[1], bv.shape[0]) if TB else bv.shape
    av = s.make(a, (K, M) if TA else (M, K))
    bv = s.make(b, (N, K) if TB else (K, N))
    cv = s.optional(c, s.sub_shape((M, N)))
    attrs = dict(alpha=s.attr(alpha, lambda: s.pick((1.0, 0.5, -1.5, 2.0))),
                 beta=s.attr(beta, lambda: s.pick((1.0, 0.5, -1.5, 2.0))), trans_a=TA, trans_b=TB)
    return s.apply("Gemm", [av, bv, cv], attrs)


def _axis_operand(s, op: str, x, axis, want, ranks):
    """The operand of an operator with an axis attribute: of a rank above the axis if the axis
    is already fixed (and of the wanted shape, if one is wanted)."""
    ax = s.known(axis)
    need = (ax + 1) if isinstance(ax, int) else 1
    rs = {r for r in (ranks or range(1, 5)) if r >= need} if want is None else None
    xv = s.make(x, want, "any", rs)
    if not isinstance(xv, np.ndarray) or xv.ndim < 1:
        raise _Reject(f"{op} needs rank >= 1")
    return xv


def _gen_softmax(s, p, want, role, ranks):
    x, axis = p.args
    xv = _axis_operand(s, "Softmax", x, axis, want, ranks)
    return s.apply("Softmax", [xv], {"axis": s.attr(axis, lambda: s.i(0, xv.ndim - 1))})


def _gen_layernorm(s, p, want, role, ranks):
    x, scale, bias, axis, eps = p.args
    xv = _axis_operand(s, "LayerNormalization", x, axis, want, ranks)
    ax = s.attr(axis, lambda: s.i(0, xv.ndim - 1))
    norm = tuple(xv.shape[ax:])
    values = [xv, s.make(scale, norm), s.optional(bias, norm)]
    return s.apply("LayerNormalization", values,
                   {"axis": ax, "epsilon": s.attr(eps, lambda: _eps(s))})


def _gen_reduce(s, p, want, role, ranks):
    x, axes, keep = p.args
    xv = s.value_if_determined(x)
    if xv is not None or want is None:
        if xv is None:
            ax = s.known(axes)
            need = max(ax) + 1 if ax else 1
            xv = s.make(x, None, "any", {r for r in range(1, 5) if r >= need})
        if not isinstance(xv, np.ndarray) or xv.ndim < 1:
            raise _Reject(f"{p.op} needs rank >= 1")
        ax = s.attr(axes, lambda: s.subset(range(xv.ndim)))
        kd = s.attr(keep, lambda: s.pick((1, 0)))
    else:
        kd = s.attr(keep, lambda: s.pick((1, 0)))
        if kd:
            ax = s.attr(axes, lambda: s.subset([i for i, d in enumerate(want) if d == 1]))
            if any(not 0 <= a < len(want) or want[a] != 1 for a in ax):
                raise _Reject(f"{p.op}: kept axes must have size 1")
            shape = tuple(s.i(1, 4) if i in ax else d for i, d in enumerate(want))
        else:
            def draw_axes():
                count = s.i(1, 2)
                return s.subset(range(len(want) + count), min_size=1)
            ax = s.attr(axes, draw_axes)
            if any(not 0 <= a < len(want) + len(ax) for a in ax):
                raise _Reject(f"{p.op}: axes do not fit the wanted rank")
            rest = iter(want)
            shape = tuple(s.i(1, 4) if i in ax else next(rest)
                          for i in range(len(want) + len(ax)))
        xv = s.make(x, shape)
    return s.apply(p.op, [xv], {"axes": tuple(ax), "keepdims": kd})


def _gen_pool(s, p, want, role, ranks):
    x = p.args[0]
    slots = dict(zip(OPS[p.op].attrs, p.args[1:]))
    xv = s.value_if_determined(x)
    nd = _spatial_rank(s, want, [x], [(s.length_of(slots["kernel_shape"]), 1),
                                      (s.length_of(slots["strides"]), 1)], ranks, default=(2, 1))
    if isinstance(xv, np.ndarray):
        nd = xv.ndim - 2
    if not 1 <= nd <= 3:
        raise _Reject(f"{p.op}: spatial rank outside 1..3")
    ks = s.attr(slots["kernel_shape"], lambda: tuple(s.i(1, 3) for _ in range(nd)))
    st = s.attr(slots["strides"], lambda: tuple(s.pick((1, 2)) for _ in range(nd)))
    dl = s.attr(slots["dilations"], lambda: tuple(s.pick((1, 1, 2)) for _ in range(nd)))
    pd = s.attr(slots["pads"], lambda: tuple(s.i(0, min(1, ks[i % nd] - 1))
                                             for i in range(2 * nd)))
    ceil = s.attr(slots["ceil_mode"], lambda: s.pick((0, 1)))
    attrs = dict(kernel_shape=ks, pads=pd, strides=st, dilations=dl, ceil_mode=ceil)
    if "count_include_pad" in slots:
        attrs["count_include_pad"] = s.attr(slots["count_include_pad"], lambda: s.pick((0, 1)))
    if len(ks) != nd or len(st) != nd or len(dl) != nd or len(pd) != 2 * nd:
        raise _Reject(f"{p.op}: attribute lengths do not match the spatial rank")
    if not isinstance(xv, np.ndarray):
        N, C = (want[0], want[1]) if want is not None else (s.i(1, 2), s.i(1, 3))
        outs = want[2:] if want is not None else tuple(s.i(1, 3) for _ in range(nd))
        insp = []
        for i in range(nd):
            eff = (ks[i] - 1) * dl[i] + 1
            n = (outs[i] - 1) * st[i] + eff - pd[i] - pd[nd + i]
            n += 0 if ceil else s.i(0, st[i] - 1)
            if n < 1:
                raise _Reject(f"{p.op}: padding larger than the input")
            insp.append(n)
        xv = s.make(x, (N, C, *insp))
    return s.apply(p.op, [xv], attrs)


def _gen_gap(s, p, want, role, ranks):
    x = p.args[0]
    if want is not None:
        if len(want) < 3 or any(d != 1 for d in want[2:]):
            raise _Reject("GlobalAveragePool gives size-1 spatial dims")
        xv = s.make(x, (want[0], want[1], *(s.i(1, 3) for _ in want[2:])))
    else:
        xv = s.make(x, None, "any", {r for r in (ranks or (3, 4, 5)) if 3 <= r <= 5} or {3, 4})
    return s.apply("GlobalAveragePool", [xv], {})


def _gen_lrn(s, p, want, role, ranks):
    x, size, alpha, beta, bias = p.args
    xv = s.make(x, want, "any", None if want is not None else {3, 4})
    attrs = dict(size=s.attr(size, lambda: s.pick((1, 3, 5))),
                 alpha=s.attr(alpha, lambda: s.pick((1e-4, 0.1, 1.0))),
                 beta=s.attr(beta, lambda: s.pick((0.75, 0.5, 1.0))),
                 bias=s.attr(bias, lambda: s.pick((1.0, 2.0))))
    return s.apply("LRN", [xv], attrs)



def _gen_leaf(s, p, want, role, ranks):
    name = s.attr(p.args[0], lambda: s.fresh_name(p.op))
    key = (p.op, name)
    if key not in s.leaves:
        var = s.plan.names.get(p)
        if var is not None:
            s.leaves[key] = s.tensor(var, s.fresh_shape(var, want, ranks), role)
        else:
            shape = want if want is not None else s.random_shape(ranks)
            s.leaves[key] = s.array(shape, role, f"({p.op} {name})")
    return s.leaves[key]


@functools.lru_cache(maxsize=None)
def _edge_tuple(dtype: str, family: str) -> tuple:
    return tuple(float(v) for v in _edge_values(dtype, family))


def _gen_scalar(s, p, want, role, ranks):
    def value():
        if s.edges and s.coin():
            dt = s.known(p.args[1])
            dt = dt if dt in ("float16", "float32", "float64") else s.dtype.name
            family = "bounded" if s.plan.contraction else "all"
            return s.pick(_edge_tuple(dt, family))
        if not s.exact and role in ("positive", "nonzero"):
            s.assumed.add((str(p.args[0]), role))
            if role == "positive":
                return s.pick((1.0, 0.5, 2.0)) if s.coin() else s.f(0.05, 2.0)
            return s.pick((1.0, -1.0, 0.5, 2.0))
        return s.pick((0.0, -0.0, 1.0, -1.0, 0.5, 2.0)) if s.coin() else s.f(-2.0, 2.0)
    v = s.attr(p.args[0], value)
    dt = s.attr(p.args[1], lambda: s.dtype.name)
    return s.apply("Scalar", [], {"value": v, "dtype": dt})


def _gen_ints(s, p, want, role, ranks):
    n = want[0] if want is not None and len(want) == 1 else s.i(1, 3)
    values = s.attr(p.args[0], lambda: tuple(s.i(0, 3) for _ in range(n)))
    return s.apply("Ints", [], {"values": values})


def _gen_absent(s, p, want, role, ranks):
    return None


def _default_attr(s, sort: str):
    if sort == "i64":
        return s.i(0, 2)
    if sort == "f64":
        return s.pick((1.0, 0.5, -1.0))
    if sort == "String":
        return s.dtype.name
    if sort == "IVec":
        return tuple(s.i(0, 2) for _ in range(s.i(1, 3)))
    raise _Reject(f"no values for sort {sort}")


def _gen_generic(s, p, want, role, ranks):
    """Operators without their own generator: operands drawn freely, then evaluated."""
    spec = OPS.get(p.op)
    if spec is None or spec.kind == "opaque":
        raise _Unsupported(f"{p.op} has no NumPy evaluation")
    sorts = s.plan.constructors.get(p.op, ((), ""))[0]
    n = len(spec.inputs)
    tensors = [s.make(a, None) for a in p.args[:n]]
    attrs = {name: s.attr(a, lambda srt=srt: _default_attr(s, srt))
             for name, a, srt in zip(spec.attrs, p.args[n:], sorts[n:])}
    return s.apply(p.op, tensors, attrs)


# the operators with a generator of their own; the other elementwise ops of the operator table
# take `_gen_unary` (one input) or `_gen_broadcast` (several), see `generator_for`
_GENERATORS: dict[str, Callable] = {
    "Mat": _gen_unary, "Clip": _gen_clip, "BatchNormalization": _gen_batchnorm, "Conv": _gen_conv,
    "ConvTranspose": _gen_conv_transpose, "MatMul": _gen_matmul, "Gemm": _gen_gemm,
    "Softmax": _gen_softmax, "LayerNormalization": _gen_layernorm,
    "ReduceMean": _gen_reduce, "ReduceSum": _gen_reduce, "MaxPool": _gen_pool,
    "AveragePool": _gen_pool, "GlobalAveragePool": _gen_gap, "LRN": _gen_lrn,
    "Concat": _gen_concat, "Gather": _gen_gather, "Pad": _gen_pad, "Transpose": _gen_transpose,
    "Reshape": _gen_reshape, "Flatten": _gen_flatten, "Squeeze": _gen_squeeze,
    "Unsqueeze": _gen_unsqueeze, "Slice": _gen_slice, "Split": _gen_split,
    "Expand": _gen_expand, "Input": _gen_leaf, "Const": _gen_leaf, "Scalar": _gen_scalar,
    "Ints": _gen_ints, "Absent": _gen_absent,
}


def generator_for(op: str) -> Callable:
    """The generator of an operator: its own; an elementwise op's by its arity; else
    `_gen_generic`."""
    own = _GENERATORS.get(op)
    if own is not None:
        return own
    spec = OPS.get(op)
    if spec is not None and spec.kind == "elementwise":
        return _gen_unary if len(spec.inputs) == 1 else _gen_broadcast
    return _gen_generic
