"""The Numba backend: one generated, compiled loop nest per fused kernel, called in sequence
by one hand-written compiled loop per program segment.

For each kernel, `NumbaBackend.prepare` writes the source of one Python module holding one
`@njit` function, from the kernel body only (generated identifiers; numbers enter the source as
`repr` of floats and ints; nothing of the model's names or strings). Shapes, offsets and
broadcast tables are arguments, so kernels with the same structure share one source and one
compiled function. Modules are written to a cache folder named by the hash of their source (and
of the hand-written runtime they call, `RUNTIME_DIGEST`) and compiled with `cache=True`, so a
second process loads the machine code instead of compiling.

This module holds `NumbaBackend` (prepare: generate and load a kernel; the on-disk cache;
compile) and `generate`, which picks the kernel family. The generator's parts: `emitter` (the
`Emitter`, the state and small API every family writes one kernel with), the families as
functions over it (`elementwise`, `contraction`, `rows`, `movement`), `scalars` (the source of
one op on scalars), `spaces` (tensors, iteration spaces, layout arithmetic), `source` (the
module text, `RUNTIME_DIGEST`) and `segments` (a segment's tables). The hand-written runtime the
generated modules call: `kernels`, `approx`, `packed_gemm`, and `calls` (how compiled code
calls compiled code). The large runtime functions (`depthwise2d`, `pool2d`, the packed GEMMs)
are called through entry points (`calls.runtime_entry`): called by name, each one's code was
linked into every kernel that calls it and compiled again there (2.2 s for a kernel calling
`depthwise2d`, 0.06 s through its entry).

Every kernel has one signature, `kernel(A, G, FP)`: it makes its arrays from its address table
`A` (`calls.array_at`), so all compile for the same argument types. Segments: lowering groups
consecutive compiled kernels (everything between NumPy-only steps: opaque nodes, fallbacks),
and one hand-written loop, `calls.run_calls`, calls a segment's kernels in order through
their entry points from tables (`segments`), so Python dispatches once per segment instead of
once per kernel (a dispatch with 7 array arguments costs a few microseconds; tiny models run
30-150 kernels), and no code is compiled per segment (a generated segment function of 220
calls, the earlier design, took 29 s of a 43 s cold compile).

Kernel families:
- elementwise (any broadcasting, views read in place): one pass over the output, viewed as rows
  x columns where every operand is a row base plus a column stride; each input element is read
  once and each output element written once; float32 polynomial exp/tanh/erf (`approx`) keep
  the loop vectorized (512-bit vectors on AVX-512, `kernels.wide_vectors`); indices are
  unsigned (`U(...)`), since Numba's negative-index wraparound on signed indices turns the
  loads into gathers; large outputs of cheap (memory-bound) bodies are written through an L1
  tile with non-temporal stores (no read-for-ownership of the output);
- Conv, MatMul and Gemm: one GEMM per matrix product, then the fused epilogue. On AVX-512
  CPUs, constant-weight MatMul/Gemm run `packed_gemm.gemm` (weights packed into column panels
  at compile time, a register-blocked microkernel: 1.2x OpenBLAS on the BERT-base shapes), and
  Conv runs `packed_gemm.gemm_rows` (weights packed into row tiles, the input read through a
  table of row offsets: each im2col row is a shifted view of a padded, phase-split input
  plane, so no im2col matrix is built; `conv_packed`); where the products are long (3x3
  over 64 channels and more) a Conv goes positions x channels instead, the microkernel reading
  A straight from the planes against the weights packed into column panels (`conv_positions`:
  no output column is padding). Depthwise Conv runs direct loops (3x3
  taps summed in registers). Other CPUs use BLAS: `np.dot` (im2col, direct 1x1), shifted GEMMs
  over the padded input for stride-1 convolutions on wide planes, and `kernels.gemm`,
  which takes leading dimensions and transposes so transposed or sliced views need no copy.
  BLAS runs single-threaded while a program runs (`eqsat_fuse.threads`), so with more than one
  thread a large product is split among Numba's threads (`kernels.gemm_parallel`, or the
  batch of a batched product in `prange`) and its epilogue rows run in `prange`; a Conv of
  at least 1M multiply-adds shares its channel blocks (depthwise), column chunks (packed)
  or ranges of positions (positions x channels) among the threads in one parallel region, each part with its own scratch;
- Softmax and LayerNormalization: one row at a time, prologue (the fused elementwise input),
  the row statistics in 16 independent lanes (a vectorized reduction without reassociation)
  and the epilogue; ReduceMean/ReduceSum/ReduceMax/ReduceMin over trailing axes (an
  epilogue that reads the reduced input or a prologue value, x - mean(x) or Softmax written
  out, runs per element of the row after its sum), pooling (2-D); with more than one thread
  and 64K elements or more the rows are shared among the threads in ranges
  (`rows.share_rows`);
- data movement (Concat, Gather, constant Pad, views that strides cannot express) as
  generated strided copies.

Anything else falls back to the NumPy evaluation of that kernel (writing into the same arena
slot); `fallbacks` lists those kernels with the reason. So do kernels on dtypes Numba has no
type for (bfloat16, float8, int4...) and kernels with an empty operand or output.

Float16 storage: a buffer stored as float16 is held as uint16 here (Numba has no float16) and
converted with the F16C instructions on load and store; arithmetic is float32.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...ir import BodyNode, Kernel, KernelPlan, Operand
from ...lowering.layout import Layout
from ...ops import OPS
from .attention import gen_attention
from .cache import default_cache_dir
from .contraction import gen_conv, gen_matmul
from .integer import gen_conv_integer, gen_matmul_integer
from .elementwise import broadcast_epilogue, gen_elementwise
from .emitter import Emitter
from .movement import gen_copy, gen_movement
from .rows import gen_pool, gen_reduce, gen_rows
from .scalars import NP_TYPES
from .segments import KERNEL_SIGNATURE_EXAMPLE
from .spaces import Tensor, Unsupported

__all__ = ["NumbaBackend", "Impl", "JitStats", "Unsupported", "default_cache_dir",
           "module_origin"]


@dataclass
class JitStats:
    kernels: int = 0                  # compiled kernels used by the program
    sources: int = 0                  # distinct generated sources
    compiled: int = 0                 # compiled in this process or its workers
    workers: int = 0                  # worker processes that compiled kernels
    loaded: int = 0                   # loaded from the on-disk cache
    seconds: float = 0.0              # time spent generating, compiling and loading
    fallbacks: list[tuple[str, str]] = field(default_factory=list)   # (kernel, why)
    copies: int = 0                   # movement kernels run as NumPy copies


@dataclass
class Impl:
    """What `prepare` gives lowering: a compiled kernel and how to call it."""

    fn: Any
    args: list                        # ("storage", name) | ("array", ndarray)
    arg_types: list = field(default_factory=list)   # (dtype as held, ndim): out, args, WS
    workspace_bytes: int = 0
    workspace_dtype: str = "float32"
    inplace_inputs: set = field(default_factory=set)
    source_hash: str = ""


# ---- kernel families ----------------------------------------------------------------------------

def generate(e: Emitter) -> None:
    """Writes the kernel with the family its body calls for: elementwise or movement
    without an anchor; else by its one anchor (prologue and epilogue nodes around it)."""
    ops = [n.op for n in e.body]
    anchors = [i for i, n in enumerate(e.body)
               if OPS.get(n.op) is not None and OPS[n.op].kind in ("anchor", "reduction")]
    if any(op not in OPS for op in ops):
        raise Unsupported("unknown op")
    if len(anchors) == 0:
        kinds = {OPS[op].kind for op in ops}
        if kinds <= {"elementwise", "view"}:
            return gen_elementwise(e)
        if "movement" in kinds:
            return gen_movement(e)
        raise Unsupported(f"body of {', '.join(sorted(set(ops)))}")
    if len(anchors) > 1:
        raise Unsupported("more than one anchor")
    a = anchors[0]
    op = e.body[a].op
    epilogue = [i for i in range(len(e.body)) if i != a and e.depends_on(i, a)]
    prologue = [i for i in range(len(e.body)) if i != a and i not in epilogue]
    for i in prologue + epilogue:
        if OPS[e.body[i].op].kind not in ("elementwise",):
            raise Unsupported(f"{e.body[i].op} next to {op}")
    if op in ("MatMul", "Gemm"):
        gen_matmul(e, a, prologue, epilogue)
        if e.pending_broadcast:
            broadcast_epilogue(e, *e.pending_broadcast)
        return None
    if op == "MatMulInteger":
        return gen_matmul_integer(e, a, prologue, epilogue)
    if op == "ConvInteger":
        return gen_conv_integer(e, a, prologue, epilogue)
    if op == "Conv":
        gen_conv(e, a, prologue, epilogue)
        if e.pending_broadcast:
            broadcast_epilogue(e, *e.pending_broadcast)
        return None
    if op in ("Softmax", "LayerNormalization"):
        return gen_rows(e, a, prologue, epilogue)
    if op in ("ReduceMean", "ReduceSum", "GlobalAveragePool", "ReduceMax", "ReduceMin"):
        return gen_reduce(e, a, prologue, epilogue)
    if op in ("MaxPool", "AveragePool"):
        return gen_pool(e, a, prologue, epilogue)
    if op == "FusedAttention":
        return gen_attention(e, a, prologue, epilogue)
    raise Unsupported(f"anchor {op}")


# generated module file name (k_<digest>.py) -> the file this process loaded
# it from: the module may come from another cache folder that an earlier program used
_ORIGINS: dict[str, Path] = {}


def module_origin(file_name: str) -> Path | None:
    """The file this process loaded the generated module `file_name` from, if it did: where
    Numba keeps its machine code (`eqsat_fuse.artifacts` copies it into a saved artifact)."""
    return _ORIGINS.get(file_name)


def _holds(path: Path, source: str) -> bool:
    """Whether the cached module file at `path` holds exactly `source` (only then is it run)."""
    try:
        return path.read_text() == source
    except (OSError, UnicodeDecodeError):
        return False


# ---- the backend: sources, cache, compile, bind -------------------------------------------------

class NumbaBackend:
    """Builds compiled kernels for one lowered program."""

    def __init__(self, plan: KernelPlan, constants: dict[str, np.ndarray],
                 layouts: dict[str, Layout], stored: dict[str, str],
                 cache_dir: str | Path | None = None, threads: int | None = None,
                 numerics: str = "exact", shared: dict | None = None):
        from ...threads import resolve
        self.plan = plan
        self.numerics = numerics             # the generated kernels' fast-math flags
        self.constants = constants
        self.layouts = layouts
        self.stored = stored
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.threads = resolve(threads)
        self.synthetic: dict[Any, Tensor] = {}
        self.external = {layouts[ref].storage for ref in plan.outputs.values() if ref in layouts}
        self.stats = JitStats()
        self.modules: dict[str, Any] = {}
        self.entries: dict[Any, int] = {}          # kernel dispatcher -> its entry's address
        self._packer = None                         # the thread `packed` copies weights in
        self._packing: list = []                    # its copies not yet waited for
        # packed weights by the memory they were packed from, kept by the lowerings of one
        # plan at several shapes (BackendContext.shared), which fold the constants once
        self._packed = {} if shared is None else shared.setdefault("packed", {})

    # -- tensors --
    def operand_dtype(self, a: Operand) -> str:
        if a.kind == "flit":
            return "float32"
        if a.kind == "synthetic":
            return self.synthetic[a.ref].dtype
        if a.kind == "const":
            return str(np.asarray(self.constants[a.ref]).dtype)
        if a.ref in self.plan.inputs:
            return self.plan.inputs[a.ref].dtype
        return self.plan.buffers[a.ref].dtype

    def stored_dtype(self, name: str) -> str:
        return self.stored.get(name) or self.dtype_of(name)

    def dtype_of(self, name: str) -> str:
        if name in self.constants:
            return str(np.asarray(self.constants[name]).dtype)
        if name in self.plan.inputs:
            return self.plan.inputs[name].dtype
        return self.plan.buffers[name].dtype

    def tensor(self, a: Operand) -> Tensor:
        if a.kind == "synthetic":
            return self.synthetic[a.ref]
        if a.kind not in ("buffer", "const"):
            raise Unsupported(f"operand {a.kind}")
        lay = self.layouts.get(a.ref)
        if lay is None:
            raise Unsupported("an operand without a layout")
        dtype = self.dtype_of(a.ref)
        if dtype not in NP_TYPES:     # bfloat16, float8, int4...: Numba has no such type
            raise Unsupported(f"operand of dtype {dtype}")
        if lay.size == 0:
            raise Unsupported("an empty operand")
        return Tensor(lay.storage, dtype, self.stored_dtype(lay.storage), lay)

    # -- kernels --
    def prepare(self, kernel: Kernel) -> Impl:
        """Generate, cache and compile one kernel; raises Unsupported for the NumPy fallback."""
        started = time.perf_counter()
        body = [BodyNode(n.op, list(n.args), dict(n.attrs)) for n in kernel.body]
        k = Kernel(kernel.name, kernel.output, kernel.inputs, body, kernel.kind, kernel.info,
                   kernel.eclass)
        gen = Emitter(self, k)
        if int(np.prod(kernel.info.shape, dtype=np.int64)) == 0:
            raise Unsupported("an empty output")
        if kernel.info.dtype not in ("float32", "float64", "int64", "int32", "bool", "int8",
                                     "uint8", "int16", "uint16") and \
                gen.out_stored != "float16":
            raise Unsupported(f"output dtype {kernel.info.dtype}")
        if kernel.kind == "alias":          # a view strides cannot express: a copy
            if len(body) != 1 or not body[0].args:
                raise Unsupported("alias kernel")
            gen_copy(gen, body[0].args[0])
        else:
            gen.resolve_views()
            generate(gen)
        source = gen.code.source()
        fn, digest = self.load(source)
        impl = Impl(fn=fn, args=gen.code.arrays, arg_types=gen.code.arg_types(),
                    workspace_bytes=4 * gen.workspace,
                    inplace_inputs=gen.inplace, source_hash=digest)
        impl.params = np.asarray(gen.code.params or [0], dtype=np.int64)
        impl.fparams = np.asarray(gen.code.fparams or [0.0], dtype=np.float32)
        impl.out_stored = gen.out_stored
        self.stats.seconds += time.perf_counter() - started
        self.stats.kernels += 1
        return impl

    def load(self, source: str, prefix: str = "kernel"):
        """The function of a generated module (written to the cache folder, named by hash)."""
        digest = hashlib.sha256(source.encode()).hexdigest()[:24]
        key = f"{prefix}_{digest}"
        if key in self.modules:
            return self.modules[key], digest
        folder = self.cache_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{prefix[0]}_{digest}.py"
        if not _holds(path, source):     # missing, or truncated or edited since: write it anew
            tmp = folder / f".{prefix[0]}_{digest}.{os.getpid()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, path)
        name = f"eqsat_fuse_{prefix}_{digest}"
        module = sys.modules.get(name)
        if module is None:
            from .calls import launch_threading_layer
            launch_threading_layer()      # before any machine code that may call it loads
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception:
                del sys.modules[name]
                raise
        _ORIGINS.setdefault(path.name, Path(module.__file__))
        fn = getattr(module, prefix)
        self.modules[key] = fn
        self.stats.sources += 1
        return fn, digest

    def packed(self, b: np.ndarray) -> np.ndarray:
        """Constant weights B packed into the GEMM's panels (`packed_gemm.pack`). With more
        than one thread the copy runs in a worker thread: its page faults and copying (0.1 s
        for the 180 MB of a 1,869-node decoder's weights) overlap generating and linking the
        other kernels; `finish_packing` waits for it, before the program runs."""
        key = (b.__array_interface__["data"][0], b.shape, b.strides, b.dtype.str)
        if key in self._packed:
            return self._packed[key][1]
        out = self._pack(b)
        self._packed[key] = (b, out)               # b kept: its address stays its own
        return out

    def _pack(self, b: np.ndarray) -> np.ndarray:
        from . import packed_gemm as PG
        if self.threads <= 1:
            return PG.pack(b)
        if self._packer is None:
            from concurrent.futures import ThreadPoolExecutor
            self._packer = ThreadPoolExecutor(1, thread_name_prefix="eqsat-fuse-pack")
        out = PG.panels_for(b)
        self._packing.append(self._packer.submit(PG.pack_into, b, out))
        return out

    def finish_packing(self) -> None:
        """Wait for the copies `packed` started (re-raising what failed in one)."""
        packing, self._packing = self._packing, []
        for done in packing:
            done.result()
        if self._packer is not None:
            self._packer.shutdown()
            self._packer = None

    def precompile(self, fns: list) -> None:
        """Compile the kernels `fns` on the program's cores at once (`parallel_jit`); the
        binder's `entry` calls then find them compiled or in the disk cache."""
        from .parallel_jit import compile_all
        started, seconds = time.perf_counter(), self.stats.seconds
        self.stats.workers, elsewhere = compile_all(fns, self.threads, self.entry)
        self.stats.compiled += elsewhere
        self.stats.loaded -= elsewhere          # counted as loaded when `entry` meets them
        self.stats.seconds = seconds + time.perf_counter() - started   # wall time, once

    def entry(self, fn) -> int:
        """Compile (or load) a generated kernel for the one signature every kernel has,
        `kernel(A, G, FP)`; its entry point's address (what `calls.run_calls` calls), looked
        up once per kernel source (a program calls most of its sources many times)."""
        address = self.entries.get(fn)
        if address is None:
            address = self.entries[fn] = self.compile(fn, KERNEL_SIGNATURE_EXAMPLE)
        return address

    def compile(self, fn, args: tuple) -> int:
        """Compile (or load from the disk cache) `fn` for the types of `args`; the address of
        that overload's entry point (for `calls.call_at`)."""
        from numba import typeof

        from .calls import entry_point
        started = time.perf_counter()
        sig = tuple(typeof(x) for x in args)
        fresh, hits = sig not in fn.overloads, sum(fn.stats.cache_hits.values())
        address = entry_point(fn, sig)
        if fresh:
            if sum(fn.stats.cache_hits.values()) > hits:
                self.stats.loaded += 1
            else:
                self.stats.compiled += 1
        self.stats.seconds += time.perf_counter() - started
        return address
