"""The sample generators of the shape and layout operators: Concat, Gather, Pad, Transpose,
Reshape, Flatten, Squeeze, Unsqueeze, Slice, Split and Expand.

Same contract as the generators in generators.py (whose table lists these too):
gen(sample, pattern, want, role, ranks) -> value, the shape `want` honoured when given.
"""

from __future__ import annotations

import numpy as np

from .patterns import Call, Var
from .sample import _Reject


def _list_items(p):
    items = []
    while isinstance(p, Call) and p.op == "TCons":
        items.append(p.args[0])
        p = p.args[1]
    return items, p


def _gen_concat(s, p, want, role, ranks):
    xs, axis = p.args
    items, tail = _list_items(xs)
    if isinstance(tail, Var):
        fresh_tail = tail.name not in s.env
        known_tail = [] if fresh_tail else list(s.env[tail.name] or [])
        extra = s.i(1, 3) if fresh_tail else 0
    elif isinstance(tail, Call) and tail.op == "TNil":
        fresh_tail, known_tail, extra = False, [], 0
    else:
        raise _Reject("Concat: unsupported list pattern")
    free = len(items) + extra               # parts still to instantiate
    if free + len(known_tail) == 0:
        raise _Reject("Concat of nothing")
    # the shape of every part: `want` split along the axis, or a first part's shape varied
    if want is not None:
        if not want:
            raise _Reject("Concat gives rank >= 1")
        ax = s.attr(axis, lambda: s.i(0, len(want) - 1))
        if not 0 <= ax < len(want):
            raise _Reject("Concat: axis outside the rank")
        left = want[ax] - sum(int(t.shape[ax]) for t in known_tail)
        if left < free or (free == 0 and left != 0):
            raise _Reject("Concat: wanted size does not split into the parts")
        cuts = sorted(s.i(1, left - 1) for _ in range(free - 1)) if free > 1 else []
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, left])]
        if any(z < 1 for z in sizes):
            raise _Reject("Concat: empty part")
        shapes = [tuple(z if i == ax else d for i, d in enumerate(want)) for z in sizes]
        values = [s.make(item, shape) for item, shape in zip(items, shapes)]
        tensors = [s.array(shape) for shape in shapes[len(items):]]
    else:
        ax = s.known(axis)
        need = (ax + 1) if isinstance(ax, int) else 1
        if items:
            first = s.make(items[0], None, "any", {r for r in range(1, 5) if r >= need})
        elif known_tail:
            first = known_tail[0]
        else:
            first = s.array(s.random_shape({r for r in range(1, 5) if r >= need}))
        if not isinstance(first, np.ndarray) or first.ndim < 1:
            raise _Reject("Concat needs rank >= 1")
        ax = s.attr(axis, lambda: s.i(0, first.ndim - 1))

        def varied():
            return tuple(s.i(1, 3) if i == ax else d for i, d in enumerate(first.shape))
        values = ([first] if items else []) + [s.make(item, varied()) for item in items[1:]]
        tensors = [first] if not items and not known_tail else []
        tensors += [s.array(varied()) for _ in range(extra - len(tensors))]
    if fresh_tail:
        s.env[tail.name] = tensors
    return s.apply("Concat", [values + known_tail + tensors], {"axis": ax})


def _gen_gather(s, p, want, role, ranks):
    data, indices, axis = p.args
    if want is not None:
        q = s.i(0, min(2, len(want)))
        r = len(want) - q + 1
        ax = s.attr(axis, lambda: s.i(0, r - 1))
        if not 0 <= ax < r:
            raise _Reject("Gather: axis outside the rank")
        n = s.i(1, 4)
        dv = s.make(data, (*want[:ax], n, *want[ax + q:]))
        iv = s.make(indices, tuple(want[ax:ax + q]), ("index", n))
    else:
        dv = s.make(data, None, "any", {1, 2, 3})
        ax = s.attr(axis, lambda: s.i(0, dv.ndim - 1))
        if not 0 <= ax < dv.ndim:
            raise _Reject("Gather: axis outside the rank")
        iv = s.make(indices, tuple(s.i(1, 3) for _ in range(s.i(0, 2))), ("index", dv.shape[ax]))
    return s.apply("Gather", [dv, iv], {"axis": ax})


def _gen_pad(s, p, want, role, ranks):
    x, pads, mode, value = p.args
    md = s.attr(mode, lambda: s.pick(("constant", "reflect", "edge")))
    val = s.attr(value, lambda: s.pick((0.0, 1.5, -1.0)))
    if want is not None:
        r = len(want)
        pd = s.attr(pads, lambda: tuple(s.i(0, min(2, (want[i % r] - 1) // 3))
                                        for i in range(2 * r)))
        if len(pd) != 2 * r:
            raise _Reject("Pad: pads do not match the rank")
        xv = s.make(x, tuple(want[i] - pd[i] - pd[r + i] for i in range(r)))
    else:
        n = s.length_of(pads)
        xv = s.make(x, None, "any", {n // 2} if n else ranks)
        r = xv.ndim
        limit = [(d - 1) if md == "reflect" else 2 for d in xv.shape]
        pd = s.attr(pads, lambda: tuple(s.i(0, min(2, limit[i % r])) for i in range(2 * r)))
    return s.apply("Pad", [xv], {"pads": pd, "mode": md, "value": val})


def _permutation(s, n):
    from hypothesis import strategies as st
    return tuple(s.draw(st.permutations(list(range(n)))))


def _gen_transpose(s, p, want, role, ranks):
    x, perm = p.args
    if want is not None:
        pm = s.attr(perm, lambda: _permutation(s, len(want)))
        if sorted(pm) != list(range(len(want))):
            raise _Reject("Transpose: perm does not match the rank")
        inv = [0] * len(pm)
        for i, q in enumerate(pm):
            inv[q] = want[i]
        xv = s.make(x, tuple(inv))
    else:
        n = s.length_of(perm)
        xv = s.make(x, None, "any", {n} if n is not None else ranks)
        pm = s.attr(perm, lambda: _permutation(s, xv.ndim))
    return s.apply("Transpose", [xv], {"perm": pm})


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _random_reshape(s, total: int) -> tuple:
    rank = s.pick((1, 2, 3, 4))
    dims = []
    left = total
    for _ in range(rank - 1):
        d = s.pick(_divisors(left))
        dims.append(d)
        left //= d
    dims.append(left)
    return tuple(dims)


def _gen_reshape(s, p, want, role, ranks):
    x, shape = p.args
    target = s.known(shape)
    if want is not None and target is not None and tuple(target) != tuple(want):
        raise _Reject("Reshape: shape attribute differs from the wanted shape")
    target = tuple(want) if want is not None else target
    if target is not None:
        xv = s.make(x, _random_reshape(s, int(np.prod(target))))
        s.attr(shape, lambda: target)
    else:
        xv = s.make(x, None, "any", None)
        target = s.attr(shape, lambda: _random_reshape(s, int(xv.size)))
    return s.apply("Reshape", [xv], {"shape": tuple(target)})


def _factor(s, n: int, parts: int) -> list[int]:
    if parts == 0:
        if n != 1:
            raise _Reject("Flatten: a leading size other than 1 needs axis > 0")
        return []
    dims, left = [], n
    for _ in range(parts - 1):
        d = s.pick(_divisors(left))
        dims.append(d)
        left //= d
    return dims + [left]


def _gen_flatten(s, p, want, role, ranks):
    x, axis = p.args
    if want is not None:
        if len(want) != 2:
            raise _Reject("Flatten gives rank 2")
        ax = s.attr(axis, lambda: s.i(0 if want[0] == 1 else 1, 2))
        xv = s.make(x, tuple(_factor(s, want[0], ax) + _factor(s, want[1], s.i(1, 2))))
    else:
        xv = s.make(x, None, "any", None)
        ax = s.attr(axis, lambda: s.i(0, xv.ndim))
    return s.apply("Flatten", [xv], {"axis": ax})


def _gen_squeeze(s, p, want, role, ranks):
    x, axes = p.args
    xv = s.value_if_determined(x)
    if isinstance(xv, np.ndarray):
        ax = s.attr(axes, lambda: s.subset([i for i, d in enumerate(xv.shape) if d == 1]))
    else:
        out = tuple(want) if want is not None else s.random_shape((0, 1, 2, 3))
        ax = s.known(axes)
        if ax is None:
            count = s.i(1, 2)
            ax = s.attr(axes, lambda: tuple(sorted(s.subset(range(len(out) + count))[:count])))
        if any(not 0 <= a < len(out) + len(ax) for a in ax):
            raise _Reject("Squeeze: axes do not fit")
        rest = iter(out)
        shape = tuple(1 if i in ax else next(rest) for i in range(len(out) + len(ax)))
        xv = s.make(x, shape)
    return s.apply("Squeeze", [xv], {"axes": tuple(ax)})


def _gen_unsqueeze(s, p, want, role, ranks):
    x, axes = p.args
    if want is not None:
        ax = s.attr(axes, lambda: s.subset([i for i, d in enumerate(want) if d == 1]))
        if any(not 0 <= a < len(want) or want[a] != 1 for a in ax):
            raise _Reject("Unsqueeze: inserted axes must have size 1 in the result")
        xv = s.make(x, tuple(d for i, d in enumerate(want) if i not in ax))
    else:
        ax = s.known(axes)
        if ax is not None:
            need = max(max(ax) + 1 - len(ax), 0) if ax else 0
            xv = s.make(x, None, "any", {r for r in range(0, 5) if r >= need})
        else:
            xv = s.make(x, None, "any", ranks)
            count = s.i(1, 2)
            ax = s.attr(axes, lambda: tuple(sorted(
                s.subset(range(xv.ndim + count), min_size=count)[:count])))
            if len(ax) != count:
                raise _Reject("Unsqueeze: could not place the axes")
    return s.apply("Unsqueeze", [xv], {"axes": tuple(ax)})


def _gen_slice(s, p, want, role, ranks):
    x, starts, ends, axes, steps = p.args
    if want is not None:
        r = len(want)
        ax = s.attr(axes, lambda: s.subset(range(r))) if r else ()
        stp = s.attr(steps, lambda: tuple(s.pick((1, 2)) for _ in ax))
        shape, sts, ens = list(want), [], []
        for a, step in zip(ax, stp):
            if step < 1:
                raise _Reject("Slice: negative steps are sampled without a wanted shape")
            extra = s.i(0, 2)
            shape[a] = (want[a] - 1) * step + 1 + extra
            start = s.i(0, extra)
            sts.append(start)
            ens.append(start + (want[a] - 1) * step + 1)
        sts = s.attr(starts, lambda: tuple(sts))
        ens = s.attr(ends, lambda: tuple(ens))
        xv = s.make(x, tuple(shape))
    else:
        xv = s.make(x, None, "any", {r for r in (ranks or (1, 2, 3, 4)) if r >= 1} or {1, 2})
        ax = s.attr(axes, lambda: s.subset(range(xv.ndim)))
        stp = s.attr(steps, lambda: tuple(s.pick((1, 1, 2, -1)) for _ in ax))
        sts, ens = [], []
        for a, step in zip(ax, stp):
            n = xv.shape[a]
            start = s.i(0, n - 1)
            if step > 0:
                end = s.pick((s.i(start + 1, n), 2**63 - 1))
            else:
                end = s.pick((s.i(-1, start - 1) if start > 0 else -n - 1, -n - 1))
                if end == -1:
                    end = -n - 1
            sts.append(start)
            ens.append(end)
        sts = s.attr(starts, lambda: tuple(sts))
        ens = s.attr(ends, lambda: tuple(ens))
    return s.apply("Slice", [xv], dict(starts=sts, ends=ens, axes=ax, steps=stp))


def _gen_split(s, p, want, role, ranks):
    x, sizes, axis, index = p.args
    if want is not None:
        if not want:
            raise _Reject("Split gives rank >= 1")
        ax = s.attr(axis, lambda: s.i(0, len(want) - 1))
        parts = s.known(sizes)
        if parts is None:
            count = s.i(1, 3)
            idx = s.attr(index, lambda: s.i(0, count - 1))
            parts = s.attr(sizes, lambda: tuple(want[ax] if k == idx else s.i(1, 3)
                                                for k in range(count)))
        else:
            idx = s.attr(index, lambda: s.i(0, len(parts) - 1))
        shape = tuple(sum(parts) if i == ax else d for i, d in enumerate(want))
        xv = s.make(x, shape)
    else:
        xv = s.make(x, None, "any", {1, 2, 3})
        ax = s.attr(axis, lambda: s.i(0, xv.ndim - 1))
        n = xv.shape[ax]

        def draw_sizes():
            count = s.i(1, min(3, n))
            cuts = sorted(set(s.i(1, n - 1) for _ in range(count - 1))) if n > 1 else []
            return tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))
        parts = s.attr(sizes, draw_sizes)
        idx = s.attr(index, lambda: s.i(0, len(parts) - 1))
    return s.apply("Split", [xv], {"split": tuple(parts), "axis": ax, "index": idx})


def _gen_expand(s, p, want, role, ranks):
    x, shape = p.args
    target = s.known(shape)
    if want is not None:
        if target is not None and tuple(target) != tuple(want):
            raise _Reject("Expand: shape attribute differs from the wanted shape")
        xv = s.make(x, s.sub_shape(want))
        target = s.attr(shape, lambda: tuple(want))
    elif target is not None:
        xv = s.make(x, s.sub_shape(target))
    else:
        xv = s.make(x, None, "any", {0, 1, 2, 3})
        extra = tuple(s.i(1, 3) for _ in range(s.i(0, 1)))
        target = s.attr(shape, lambda: extra + tuple(s.i(1, 3) if d == 1 else d
                                                     for d in xv.shape))
    return s.apply("Expand", [xv], {"shape": tuple(target)})
