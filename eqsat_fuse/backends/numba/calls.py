"""How compiled code calls compiled code: a generated kernel's arrays from its address table
(`array_at`), a segment's kernels through their entry points (`call_at`, `run_calls`), and
the hand-written runtime through entry points too (`runtime_entry`, `use_runtime`), so that
no caller links and compiles again the code it calls."""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array


def entry_point(fn, sig: tuple) -> int:
    """The address of the entry point of dispatcher `fn`'s overload for the argument types
    `sig`, compiled (or loaded from Numba's disk cache) first if it is not yet."""
    if sig not in fn.overloads:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn.compile(sig)
    result = fn.overloads[sig]
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


def launch_threading_layer() -> None:
    """Start Numba's threading layer before a generated module is loaded.

    Numba starts it when it compiles a parallel loop, and that also registers the symbols the
    loop's machine code calls (`allocate_sched`, ...). Machine code loaded from the cache skips
    the compile, and linking it in a process that has not started the layer aborts the whole
    process ("LLVM ERROR: Symbol not found: allocate_sched"): a second process running a model
    whose kernels have parallel loops, or call one (`gemm_parallel`), died that way. Starting
    it is idempotent and costs about a millisecond, once."""
    from numba.np.ufunc import parallel
    parallel._launch_threads()


@intrinsic
def array_at(typingctx, addr, shape, dtype):
    """The C-contiguous array of `dtype` at integer address `addr` with `shape` (an int or a
    tuple of ints): what a kernel makes of its address table. Like `numba.carray`, in a few
    instructions (carray's checks cost milliseconds of compile per call)."""
    ndim = 1 if isinstance(shape, types.Integer) else len(shape)
    element = getattr(dtype, "instance_type", None) or dtype.dtype
    arrty = types.Array(element, ndim, "C")
    sig = arrty(addr, shape, dtype)

    def codegen(context, builder, signature, args):
        ary = context.make_array(arrty)(context, builder)
        ptr = builder.inttoptr(args[0], context.get_value_type(types.CPointer(element)))
        itemsize = context.get_abi_sizeof(context.get_data_type(element))
        intp = context.get_value_type(types.intp)
        if ndim == 1:
            dims = [args[1]]
        else:
            dims = [builder.extract_value(args[1], i) for i in range(ndim)]
        dims = [context.cast(builder, d, t, types.intp) for d, t in
                zip(dims, [shape] if ndim == 1 else shape.types)]
        strides, step = [], ir.Constant(intp, itemsize)
        for d in reversed(dims):
            strides.insert(0, step)
            step = builder.mul(step, d)
        populate_array(ary, data=ptr, shape=cgutils.pack_array(builder, dims, intp),
                       strides=cgutils.pack_array(builder, strides, intp),
                       itemsize=ir.Constant(intp, itemsize), meminfo=None)
        return ary._getvalue()

    return sig, codegen


@intrinsic
def call_at(typingctx, addr, args):
    """Call the compiled function whose entry point is at integer `addr` with the tuple `args`.

    Program segments call their kernels through addresses rather than by name: a call by name
    links the callee's machine code into the caller, which LLVM then optimizes again. The
    callee must have been compiled for exactly the types of `args` and return None.
    """
    sig = types.none(addr, args)
    argtys = tuple(args.types)

    def codegen(context, builder, signature, llargs):
        fnty = context.call_conv.get_function_type(types.none, argtys).as_pointer()
        callee = builder.inttoptr(llargs[0], fnty)
        values = [builder.extract_value(llargs[1], i) for i in range(len(argtys))]
        status, _ = context.call_conv.call_function(builder, callee, types.none, argtys,
                                                    values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return sig, codegen


# ---- calls into the hand-written runtime through entry points ----------------------------------
# A generated kernel that calls a runtime function by name links that function's code into its
# own, and LLVM optimizes and compiles it again for every kernel: a kernel that calls
# `depthwise2d` took 2.2 s to compile, one that calls it through an entry point 0.06 s. An
# exported function is compiled once per process for one declared signature (from Numba's disk
# cache), registered as an LLVM symbol, and called by that symbol (`runtime_entry`), as the
# packed GEMM's microkernel is. A generated module registers the entries it calls when it is
# imported (`use_runtime`), before its kernel's machine code, cached or new, is linked.

F32_ARRAY = types.Array(types.float32, 1, "C")
I64_ARRAY = types.Array(types.int64, 1, "C")
F32_ARRAY3 = types.Array(types.float32, 3, "C")
I64 = types.int64

_ENTRIES: dict = {}          # "K.name" / "PG.name" -> _RuntimeEntry


class _RuntimeEntry:
    def __init__(self, fn, key: str, argtypes: tuple) -> None:
        self.fn, self.key, self.argtypes = fn, key, argtypes
        self.symbol = "eqsat_fuse_rt_" + key.replace(".", "_")
        self.address = 0

    def ensure(self) -> None:
        """Compile (or load) the function for its signature and register its symbol, once."""
        if self.address:
            return
        import llvmlite.binding as llvm
        launch_threading_layer()          # the function may have parallel loops
        address = entry_point(self.fn, self.argtypes)
        llvm.add_symbol(self.symbol, address)
        self.address = address


def runtime_entry(fn, key: str, argtypes: list):
    """The intrinsic `<fn>_entry(args)` calling `fn` through its entry point: `args` a tuple
    of `argtypes` (arrays exactly; any integer where int64 is declared, converted)."""
    entry = _RuntimeEntry(fn, key, tuple(argtypes))
    _ENTRIES[key] = entry

    def typer(typingctx, args):
        given = tuple(args.types)
        if len(given) != len(entry.argtypes):
            raise TypingError(f"{key}: {len(given)} arguments, the entry takes "
                              f"{len(entry.argtypes)}")
        for i, (have, want) in enumerate(zip(given, entry.argtypes)):
            ok = have == want if isinstance(want, types.Array) else \
                isinstance(have, (types.Integer, types.Boolean))
            if not ok:
                raise TypingError(f"{key}: argument {i} is {have}, the entry takes {want}")
        entry.ensure()                    # before this kernel's code is linked
        sig = types.none(args)

        def codegen(context, builder, signature, llargs):
            values = [context.cast(builder, builder.extract_value(llargs[0], i), have, want)
                      for i, (have, want) in enumerate(zip(given, entry.argtypes))]
            fnty = context.call_conv.get_function_type(types.none, entry.argtypes)
            callee = cgutils.get_or_insert_function(builder.module, fnty, entry.symbol)
            status, _ = context.call_conv.call_function(builder, callee, types.none,
                                                        entry.argtypes, values)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = fn.__name__ + "_entry"
    return intrinsic(typer)


def use_runtime(*keys: str) -> None:
    """Register the runtime entries a generated module calls (run when it is imported)."""
    for key in keys:
        _ENTRIES[key].ensure()


@njit(cache=True, error_model="numpy")
def run_calls(E, T, A, G, F):
    """Run a program segment: call i is the kernel at entry point E[i] with its address table
    A[T[6i]:T[6i+1]], its integer parameters G[T[6i+2]:T[6i+3]] and float ones
    F[T[6i+4]:T[6i+5]].

    Every generated kernel has this one signature, `kernel(A, G, FP)`, and makes its arrays
    from the table (`array_at`), so this loop is compiled once per machine, not per program
    (a generated segment of 220 calls took 29 s to compile).
    """
    for i in range(E.size):
        j = 6 * i
        call_at(E[i], (A[T[j]:T[j + 1]], G[T[j + 2]:T[j + 3]], F[T[j + 4]:T[j + 5]]))
