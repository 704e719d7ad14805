"""Sixteen-lane float32 vector code for the channel-blocked kernels and the row folds, as
Numba intrinsics.

Numba has no vector type, and a loop over sixteen lanes of an array keeps its sums in memory:
a tap's multiply-add then loads and stores the accumulator every time (the channel-blocked
depthwise convolution ran 2-5x slower than onnxruntime's that way). These intrinsics write the
loops in LLVM IR with `<16 x float>` values, so the accumulators stay in registers; Numba
caches the machine code with the kernel that calls them.

Numba keys that cache by the calling function's own file (`kernels.py`, `packed_gemm.py`), not
this one: after editing this file, touch those too (generated kernels are keyed by both, see
`source.RUNTIME_DIGEST`).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16
_F32 = ir.FloatType()
_V16 = ir.VectorType(_F32, LANES)
_I64 = ir.IntType(64)
_MASK = ir.VectorType(ir.IntType(32), LANES)        # a shuffle's lane indices


def _counted_loop(builder, count, inits: list, step, name: str) -> list:
    """The IR of `for i in range(count): values = step(i, values)` from `inits` (a list of
    LLVM values; `step` builds the loop body and returns the new values in the same order);
    returns the values after the loop, `inits` when count <= 0."""
    start = builder.block
    loop = builder.append_basic_block(f"{name}.loop")
    done = builder.append_basic_block(f"{name}.done")
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(_I64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(_I64)
    values = [builder.phi(v.type) for v in inits]
    new = step(i, values)
    i1 = builder.add(i, ir.Constant(_I64, 1))
    end = builder.block
    builder.cbranch(builder.icmp_signed("<", i1, count), loop, done)
    i.add_incoming(ir.Constant(_I64, 0), start)
    i.add_incoming(i1, end)
    for value, init, updated in zip(values, inits, new):
        value.add_incoming(init, start)
        value.add_incoming(updated, end)
    builder.position_at_end(done)
    finals = []
    for init, updated in zip(inits, new):
        finals.append(builder.phi(init.type))
        finals[-1].add_incoming(init, start)
        finals[-1].add_incoming(updated, end)
    return finals


def _tap_sums(pixels: int):
    """The intrinsic `f(out, x, w, offs, taps, step)` on integer addresses: for p < `pixels`,
    out[16p : 16p + 16] = sum over t < taps of w[16t : 16t + 16] * x[offs[t] + p*step : +16]
    (float32 vectors; `offs` int64 offsets in floats), summed in tap order from +0 with fused
    multiply-adds, as the per-channel loops sum them."""

    def typer(typingctx, out, x, w, offs, taps, step):
        sig = types.none(out, x, w, offs, taps, step)

        def codegen(context, builder, signature, args):
            ints = [context.cast(builder, v, t, types.int64)
                    for v, t in zip(args, signature.args)]
            out_a, x_a, w_a, offs_a, taps_v, step_v = ints
            fptr, vptr = _F32.as_pointer(), _V16.as_pointer()
            out_p = builder.inttoptr(out_a, fptr)
            x_p = builder.inttoptr(x_a, fptr)
            w_p = builder.inttoptr(w_a, fptr)
            offs_p = builder.inttoptr(offs_a, _I64.as_pointer())
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
            zero = ir.Constant(_V16, [0.0] * LANES)

            def tap(t, accs):
                off = builder.load(builder.gep(offs_p, [t]))
                wv = builder.load(builder.bitcast(
                    builder.gep(w_p, [builder.mul(t, ir.Constant(_I64, LANES))]), vptr), align=4)
                new = []
                for p, acc in enumerate(accs):
                    at = builder.add(off, builder.mul(step_v, ir.Constant(_I64, p)))
                    xv = builder.load(builder.bitcast(builder.gep(x_p, [at]), vptr), align=4)
                    new.append(builder.call(fma, [wv, xv, acc]))
                return new

            finals = _counted_loop(builder, taps_v, [zero] * pixels, tap, "taps")
            for p, final in enumerate(finals):
                dst = builder.gep(out_p, [ir.Constant(_I64, LANES * p)])
                builder.store(final, builder.bitcast(dst, vptr), align=4)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = f"tap_sums{pixels}"
    return intrinsic(typer)


tap_sums4 = _tap_sums(4)
tap_sums1 = _tap_sums(1)


def _block_swap(builder, rows: list, d: int) -> list:
    """One stage of the 16 x 16 transpose: in every 2d x 2d block of the matrix whose rows
    are `rows`, the upper right and lower left d x d blocks swap places (after the stages
    d = 8, 4, 2, 1 the matrix is transposed)."""
    out = list(rows)
    for r in range(LANES):
        if r & d:
            continue
        lo = [c if not c & d else LANES + c - d for c in range(LANES)]
        hi = [c + d if not c & d else LANES + c for c in range(LANES)]
        out[r] = builder.shuffle_vector(rows[r], rows[r + d], ir.Constant(_MASK, lo))
        out[r + d] = builder.shuffle_vector(rows[r], rows[r + d], ir.Constant(_MASK, hi))
    return out


def _lanes_below(builder, n):
    """The <16 x i1> mask of lanes i < n."""
    lanes = ir.VectorType(_I64, LANES)
    index = ir.Constant(lanes, list(range(LANES)))
    splat = builder.shuffle_vector(
        builder.insert_element(ir.Constant(lanes, None), n, ir.Constant(ir.IntType(32), 0)),
        ir.Constant(lanes, None), ir.Constant(_MASK, [0] * LANES))
    return builder.icmp_signed("<", index, splat)


@intrinsic
def transpose16(typingctx, dst, dld, src, sld, nr, nc):
    """dst[c * dld + r] = src[r * sld + c] for r < nr, c < nc (r, c < 16; float32, integer
    addresses, strides in floats): sixteen masked vector loads, 64 shuffles, sixteen masked
    stores, where scalar loops move one float at a time (the channel-blocked depthwise
    convolution's copies into and out of its [pixel][channel] layout)."""
    sig = types.none(dst, dld, src, sld, nr, nc)

    def codegen(context, builder, signature, args):
        dst_a, dld_v, src_a, sld_v, nr_v, nc_v = [
            context.cast(builder, v, t, types.int64) for v, t in zip(args, signature.args)]
        fptr, vptr = _F32.as_pointer(), _V16.as_pointer()
        mask_ty = ir.VectorType(ir.IntType(1), LANES)
        load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            _V16, [vptr, ir.IntType(32), mask_ty, _V16]), "llvm.masked.load.v16f32.p0")
        store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [_V16, vptr, ir.IntType(32), mask_ty]), "llvm.masked.store.v16f32.p0")
        src_p, dst_p = builder.inttoptr(src_a, fptr), builder.inttoptr(dst_a, fptr)
        zero = ir.Constant(_V16, [0.0] * LANES)
        none = ir.Constant(mask_ty, [0] * LANES)
        cols, rows = _lanes_below(builder, nc_v), []
        for r in range(LANES):
            live = builder.icmp_signed("<", ir.Constant(_I64, r), nr_v)
            at = builder.gep(src_p, [builder.mul(sld_v, ir.Constant(_I64, r))])
            rows.append(builder.call(load, [builder.bitcast(at, vptr), ir.Constant(
                ir.IntType(32), 4), builder.select(live, cols, none), zero]))
        for d in (8, 4, 2, 1):
            rows = _block_swap(builder, rows, d)
        lanes = _lanes_below(builder, nr_v)
        for c in range(LANES):
            live = builder.icmp_signed("<", ir.Constant(_I64, c), nc_v)
            at = builder.gep(dst_p, [builder.mul(dld_v, ir.Constant(_I64, c))])
            builder.call(store, [rows[c], builder.bitcast(at, vptr), ir.Constant(
                ir.IntType(32), 4), builder.select(live, lanes, none)])
        return context.get_dummy_value()

    return sig, codegen


def _tap_max(step: int):
    """The intrinsic `f(out, x, offs, taps, n)` on integer addresses: for lanes i < n (<= 16),
    out[i] = the max over t < taps of x[offs[t] + i * `step`] (offsets in floats; step 1 or 2,
    two loads and a shuffle of the even lanes), from -inf, a NaN counting as float32's lowest
    value and the first of equal values kept: `kernels.pool2d`'s max, taps in its order."""

    def typer(typingctx, out, x, offs, taps, n):
        sig = types.none(out, x, offs, taps, n)

        def codegen(context, builder, signature, args):
            out_a, x_a, offs_a, taps_v, n_v = [context.cast(builder, v, t, types.int64)
                                               for v, t in zip(args, signature.args)]
            fptr, vptr = _F32.as_pointer(), _V16.as_pointer()
            mask_ty = ir.VectorType(ir.IntType(1), LANES)
            load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                _V16, [vptr, ir.IntType(32), mask_ty, _V16]), "llvm.masked.load.v16f32.p0")
            store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                ir.VoidType(), [_V16, vptr, ir.IntType(32), mask_ty]),
                "llvm.masked.store.v16f32.p0")
            align = ir.Constant(ir.IntType(32), 4)
            zero = ir.Constant(_V16, [0.0] * LANES)
            lowest = ir.Constant(_V16, [-3.4028234663852886e38] * LANES)
            x_p = builder.inttoptr(x_a, fptr)
            offs_p = builder.inttoptr(offs_a, _I64.as_pointer())
            # the floats each load reads: lanes below n (step 1); below 2n - 1 (step 2)
            if step == 1:
                masks = [_lanes_below(builder, n_v)]
            else:
                last = builder.sub(builder.mul(n_v, ir.Constant(_I64, 2)), ir.Constant(_I64, 1))
                masks = [_lanes_below(builder, last),
                         _lanes_below(builder, builder.sub(last, ir.Constant(_I64, LANES)))]

            def tap(t, accs):
                at = builder.gep(x_p, [builder.load(builder.gep(offs_p, [t]))])
                parts = [builder.call(load, [builder.bitcast(builder.gep(
                    at, [ir.Constant(_I64, LANES * h)]), vptr), align, m, zero])
                    for h, m in enumerate(masks)]
                v = parts[0] if step == 1 else builder.shuffle_vector(
                    parts[0], parts[1], ir.Constant(_MASK, list(range(0, 2 * LANES, 2))))
                v = builder.select(builder.fcmp_ordered("ord", v, v), v, lowest)
                return [builder.select(builder.fcmp_ordered(">", v, accs[0]), v, accs[0])]

            final, = _counted_loop(builder, taps_v, [ir.Constant(_V16, [float("-inf")] * LANES)],
                                   tap, "max")
            builder.call(store, [final, builder.bitcast(builder.inttoptr(out_a, fptr), vptr),
                                 align, _lanes_below(builder, n_v)])
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = f"tap_max{step}"
    return intrinsic(typer)


tap_max1 = _tap_max(1)
tap_max2 = _tap_max(2)


def _lane_fold(kind: str):
    """The intrinsic `f(row, blocks, mean) -> float32` on an integer address: sixteen lanes
    folded over row[16b : 16b + 16] for b < blocks, each lane in order, then the lanes in order
    0..15: "sum" adds v, "sumsq" adds (v - mean) * (v - mean) (a fused multiply-add, as the
    runtime's `contract` flag made of that loop), "max" ("min") takes v where v > (<) the
    running value or v is NaN (a NaN stays). The extremes fold four blocks at a time into four
    accumulators, joined in order before the tail blocks: one compare-and-select chain is
    latency-bound (401,408 floats: 52 us against NumPy's 21); the value is the same, which of
    two equal values (+0 and -0) is not specified. The loops of `kernels.row_sum`, `row_sumsq`,
    `row_max` and `row_min` with the lanes in a register: over an array of sixteen floats LLVM
    loaded and stored every lane at every step (Softmax's row passes ran at 3 floats a
    nanosecond). `row` is contiguous."""

    def typer(typingctx, row, blocks, mean):
        sig = types.float32(row, blocks, mean)

        def codegen(context, builder, signature, args):
            row_a, blocks_v = [context.cast(builder, v, t, types.int64)
                               for v, t in zip(args[:2], signature.args[:2])]
            mean_v = context.cast(builder, args[2], signature.args[2], types.float32)
            fptr, vptr = _F32.as_pointer(), _V16.as_pointer()
            row_p = builder.inttoptr(row_a, fptr)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
            extreme = kind in ("max", "min")
            init = {"max": float("-inf"), "min": float("inf")}.get(kind, 0.0)
            first = ir.Constant(_V16, [init] * LANES)
            splat = builder.shuffle_vector(
                builder.insert_element(ir.Constant(_V16, None), mean_v,
                                       ir.Constant(ir.IntType(32), 0)),
                ir.Constant(_V16, None), ir.Constant(_MASK, [0] * LANES))

            def take(v, acc):
                return builder.or_(builder.fcmp_ordered(">" if kind == "max" else "<", v, acc),
                                   builder.fcmp_unordered("uno", v, v))

            def load(b):
                at = builder.gep(row_p, [builder.mul(b, ir.Constant(_I64, LANES))])
                return builder.load(builder.bitcast(at, vptr), align=4)

            def block(b, accs, skip):
                acc, = accs
                v = load(builder.add(b, skip))
                if kind == "sum":
                    return [builder.fadd(acc, v)]
                if kind == "sumsq":
                    d = builder.fsub(v, splat)
                    return [builder.call(fma, [d, d, acc])]
                return [builder.select(take(v, acc), v, acc)]

            start = ir.Constant(_I64, 0)
            if extreme:                       # four blocks at a time, four accumulators
                four = ir.Constant(_I64, 4)

                def quad(q, accs):
                    return [builder.select(take(v, acc), v, acc) for v, acc in zip(
                        [load(builder.add(builder.mul(q, four), ir.Constant(_I64, j)))
                         for j in range(4)], accs)]

                accs = _counted_loop(builder, builder.sdiv(blocks_v, four), [first] * 4,
                                     quad, "quad")
                first = accs[0]
                for acc in accs[1:]:
                    first = builder.select(take(acc, first), acc, first)
                start = builder.mul(builder.sdiv(blocks_v, four), four)
            final, = _counted_loop(builder, builder.sub(blocks_v, start), [first],
                                   lambda b, accs: block(b, accs, start), "fold")
            total = ir.Constant(_F32, init)
            for k in range(LANES):
                lane = builder.extract_element(final, ir.Constant(ir.IntType(32), k))
                if extreme:
                    total = builder.select(take(lane, total), lane, total)
                else:
                    total = builder.fadd(total, lane)
            return total

        return sig, codegen

    typer.__name__ = f"lane_{kind}"
    return intrinsic(typer)


lane_sum = _lane_fold("sum")
lane_sumsq = _lane_fold("sumsq")
lane_max = _lane_fold("max")
lane_min = _lane_fold("min")


__all__ = ["LANES", "lane_max", "lane_min", "lane_sum", "lane_sumsq", "tap_max1", "tap_max2", "tap_sums1",
           "tap_sums4", "transpose16"]
