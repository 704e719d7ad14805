"""The data-movement family: Concat, Gather, constant Pad and views that strides cannot
express, as generated strided copies (`emit_copy`) from boundary operands into the output."""

from __future__ import annotations

import numpy as np

from ...ir import BodyNode, Operand
from .emitter import Emitter
from .scalars import literal
from .spaces import Tensor, Unsupported, c_strides


def gen_copy(e: Emitter, source: Operand) -> None:
    """A view strides cannot express (a Reshape of a transposed buffer): copy the source in
    its own logical order into the contiguous output."""
    t = boundary(e, source)
    lay = t.layout
    emit_copy(e, t, lay.offset, lay.strides, 0, c_strides(lay.shape), lay.shape)


def gen_movement(e: Emitter) -> None:
    """Concat, constant Pad and Gather as strided copies into the contiguous output."""
    node = e.body[e.root]
    out_shape = tuple(e.kernel.info.shape)
    if node.op == "Concat":
        return _concat(e, node, out_shape)
    if node.op == "Pad":
        return _pad(e, node, out_shape)
    if node.op == "Gather":
        return _gather(e, node, out_shape)
    raise Unsupported(f"movement op {node.op}")


def _concat(e: Emitter, node: BodyNode, out_shape: tuple[int, ...]) -> None:
    """One copy per input, at its offset along the axis."""
    out_strides = c_strides(out_shape)
    code = e.code
    axis = node.attrs["axis"]
    axis = axis + len(out_shape) if axis < 0 else axis
    at = 0
    for arg in node.args:
        t = boundary(e, arg)
        lay = t.layout
        emit_copy(e, t, lay.offset, lay.strides, code.int_param(at * out_strides[axis]),
                  out_strides, lay.shape)
        at += lay.shape[axis]


def _pad(e: Emitter, node: BodyNode, out_shape: tuple[int, ...]) -> None:
    """The pad value written over the output where there is any padding, then the source
    (cropped by negative pads) copied into place."""
    out_strides = c_strides(out_shape)
    code = e.code
    if node.attrs.get("mode", "constant") != "constant":
        raise Unsupported("Pad that is not constant")
    t = boundary(e, node.args[0])
    lay = t.layout
    r = len(lay.shape)
    pads = [int(v) for v in node.attrs["pads"]]
    if len(pads) != 2 * r:
        raise Unsupported("Pad with axes")
    before, after = pads[:r], pads[r:]
    shape, offset = [], lay.offset
    for d in range(r):           # negative pads crop the source
        lo, hi = max(-before[d], 0), max(-after[d], 0)
        shape.append(lay.shape[d] - lo - hi)
        offset += lo * lay.strides[d]
    dst = sum(max(b, 0) * s_ for b, s_ in zip(before, out_strides))
    if any(b > 0 for b in before) or any(x > 0 for x in after):
        value = node.attrs.get("value")
        value = np.asarray(0 if value is None else value).reshape(-1)[:1]
        value = value[0] if value.size else 0
        lit = literal(value, e.out_dtype)
        code.lines.append(f"for i in range({code.int_param(int(np.prod(out_shape)))}):")
        code.lines.append(f"    out[U(i)] = {e.store_expr(lit)}")
    emit_copy(e, t, offset, lay.strides, code.int_param(dst), out_strides, shape)


def _gather(e: Emitter, node: BodyNode, out_shape: tuple[int, ...]) -> None:
    """A loop over the indices (checked against the axis, negative ones wrapped), each
    copying one slice of the data."""
    out_strides = c_strides(out_shape)
    rank = len(out_shape)
    code = e.code
    t = boundary(e, node.args[0])
    ti = boundary(e, node.args[1])
    lay = t.layout
    r = len(lay.shape)
    axis = node.attrs["axis"]
    axis = axis + r if axis < 0 else axis
    if not ti.layout.contiguous or ti.dtype not in ("int64", "int32"):
        raise Unsupported("Gather indices")
    # out = data[:axis] + indices + data[axis+1:] (the index rank from the output: a
    # folded scalar index may be stored with shape (1,))
    irank = rank - (r - 1)
    ni = int(np.prod(out_shape[axis:axis + irank], dtype=np.int64))
    if irank < 0 or ti.layout.size != ni:
        raise Unsupported("Gather shapes")
    inner = int(np.prod(lay.shape[axis + 1:], dtype=np.int64))
    n_axis = lay.shape[axis]
    shape = lay.shape[:axis] + lay.shape[axis + 1:]
    src_strides = lay.strides[:axis] + lay.strides[axis + 1:]
    dst_strides = tuple(out_strides[:axis]) + tuple(out_strides[axis + irank:])
    code.lines.append(f"N = {code.int_param(n_axis)}")
    code.lines.append(f"for j in range({code.int_param(ni)}):")
    idx = e.load_expr(ti, f"{code.int_param(ti.layout.offset)} + j")
    code.lines.append(f"    k = np.int64({idx})")
    code.lines.append("    k = k + N if k < 0 else k")
    code.lines.append("    if k < 0 or k >= N:")
    code.lines.append("        raise IndexError('Gather: index out of range')")
    emit_copy(e, t, f"{code.int_param(lay.offset)} + k * {code.int_param(lay.strides[axis])}",
              src_strides, f"j * {code.int_param(inner)}", dst_strides, shape,
              "    ")


def boundary(e: Emitter, a: Operand) -> Tensor:
    """The tensor an argument reads: a boundary operand, or a resolved view of one."""
    while a.kind == "node":
        node = e.body[a.ref]
        if node.op != "Identity":
            raise Unsupported("data movement of an inline value")
        a = node.args[0]
    if a.kind not in ("buffer", "const", "synthetic"):
        raise Unsupported(f"data movement of {a.kind}")
    return e.tensor(a)


def emit_copy(e: Emitter, t: Tensor, src_off, src_strides, dst_off, dst_strides, shape,
              indent: str = "") -> None:
    """Lines copying `shape` elements of t (at src_off + i.src_strides) to out (at
    dst_off + i.dst_strides). Offsets are expressions; dims are merged where both sides
    allow, the innermost loop is the last merged dim."""
    code = e.code
    dims = [(int(n), int(a), int(b)) for n, a, b in zip(shape, src_strides, dst_strides)
            if n != 1]
    if any(n == 0 for n, _, _ in dims):
        return
    merged: list[tuple[int, int, int]] = []
    for n, a, b in dims:
        if merged and merged[-1][1] == a * n and merged[-1][2] == b * n:
            n0 = merged[-1][0]
            merged[-1] = (n0 * n, a, b)
        else:
            merged.append((n, a, b))
    if len(merged) > 4:
        raise Unsupported("a copy over more than 4 strided dims")
    lines = code.lines
    if not merged:
        lines.append(f"{indent}out[U({dst_off})] = "
                     f"{e.store_expr(e.load_expr(t, str(src_off)))}")
        return
    s_expr, d_expr = [str(src_off)], [str(dst_off)]
    for k, (n, a, b) in enumerate(merged[:-1]):
        lines.append(f"{indent}for i{k} in range({code.int_param(n)}):")
        indent += "    "
        s_expr.append(f"i{k} * {code.int_param(a)}")
        d_expr.append(f"i{k} * {code.int_param(b)}")
    lines.append(f"{indent}s_ = {' + '.join(s_expr)}")
    lines.append(f"{indent}d_ = {' + '.join(d_expr)}")
    n, a, b = merged[-1]
    lines.append(f"{indent}for iL in range({code.int_param(n)}):")
    src = f"s_ + iL" if a == 1 else f"s_ + iL * {code.int_param(a)}"
    dst = f"d_ + iL" if b == 1 else f"d_ + iL * {code.int_param(b)}"
    lines.append(f"{indent}    out[U({dst})] = {e.store_expr(e.load_expr(t, src))}")
