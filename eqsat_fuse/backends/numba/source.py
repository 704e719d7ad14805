"""The text of one generated kernel module: `ModuleSource` collects the kernel's array
arguments, its integer and float parameters and its code lines, and writes the module (imports
of the hand-written runtime, the `@njit` decorator, the parameters made locals).

`RUNTIME_DIGEST` (a hash of the runtime the modules call) goes into every generated source."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...numerics import fastmath_source
from .scalars import NP_TYPES
from .spaces import Unsupported

# The `fastmath=` flags come from the numerics mode (`eqsat_fuse.numerics.FASTMATH`). In exact
# mode only `contract` (fused multiply-add: it changes the last bits of a result, never which
# elements are NaN, +-inf or signed zero). Not `arcp`: x / y became x * (1 / y), which
# overflows to inf for a subnormal y, and 1 / sqrt(x) a reciprocal-square-root estimate
# whose Newton step gives NaN at 0 and inf (issue 21). Not `nsz`: it let -(x - y) become
# y - x, +0 where ONNX says -0. Fast mode adds both.


def _runtime_digest() -> str:
    """A hash of the hand-written code generated modules call (approx, calls, kernels,
    packed_gemm, int8_gemm, vectors, flash): it goes into every generated source, so editing them never
    reuses stale cached machine code."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("approx.py", "calls.py", "kernels.py", "packed_gemm.py", "int8_gemm.py",
                 "vectors.py", "flash.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


RUNTIME_DIGEST = _runtime_digest()

_PARAM = re.compile(r"\bG\[(\d+)\]")                       # an integer parameter
_ENTRY = re.compile(r"\b(K|PG|I8|FA)\.(\w+)_entry\(")        # a runtime entry called


@functools.lru_cache(maxsize=None)
def held_dtype(dtype) -> str:
    """The dtype of the array a kernel reads a buffer through: float16 is held as uint16
    (Numba has no float16; the kernels convert with F16C)."""
    name = str(np.dtype(dtype))
    return "uint16" if name == "float16" else name


class ModuleSource:
    """Accumulates one generated module: argument names, integer parameters and code lines."""

    def __init__(self, numerics: str = "exact"):
        self.numerics = numerics
        self.params: list[int] = []           # ints (and row tables) packed into one int64 array
        self.fparams: list[float] = []        # float scalars packed into one float32 array
        self.arrays: list[tuple] = []         # kernel array arguments, in order
        self.array_names: dict[Any, str] = {}
        # (dtype as held, ndim) of every array the kernel reads from its address table, in
        # order: out, the arrays, WS (`arg_types`)
        self.array_types: list[tuple[str, int]] = []
        self.out_stored = "float32"
        self.lines: list[str] = []
        self.header: list[str] = []
        self.uses_packed_gemm = False
        self.uses_int8_gemm = False
        self.uses_flash = False
        self.parallel = False
        self.imports: set[str] = set()

    def int_param(self, value: int) -> str:
        self.params.append(int(value))
        return f"G[{len(self.params) - 1}]"

    def table(self, values: np.ndarray) -> str:
        """Appends an int table to the int params; returns the expression of its start index."""
        start = len(self.params) + 1
        expr = self.int_param(start)
        self.params.extend(np.asarray(values, dtype=np.int64).tolist())
        return expr

    def float_param(self, value: float) -> str:
        self.fparams.append(float(value))
        return f"FP[{len(self.fparams) - 1}]"

    def array(self, key, spec, stored: str | None = None) -> str:
        """The name of an array argument: ("storage", name) with its stored dtype, or
        ("array", ndarray), a constant the kernel owns (packed weights, tables)."""
        if key not in self.array_names:
            self.array_names[key] = f"a{len(self.arrays)}"
            self.arrays.append(spec)
            if spec[0] == "array":
                self.array_types.append((held_dtype(spec[1].dtype), max(spec[1].ndim, 1)))
            else:
                self.array_types.append((held_dtype(stored), 1))
        return self.array_names[key]

    def arg_types(self) -> list[tuple[str, int]]:
        """(dtype as held, ndim) of out, the array arguments and WS: what the address table of
        a call must describe (`binder` checks it)."""
        return [(held_dtype(self.out_stored), 1), *self.array_types, ("float32", 1)]

    def _runtime_entries(self) -> list[str]:
        """The line registering the runtime entries the kernel calls (`K.<name>_entry`,
        `PG.<name>_entry`: `calls.runtime_entry`), before its machine code is linked."""
        keys = sorted({f"{m}.{name}" for m, name in _ENTRY.findall("\n".join(self.lines))})
        return [f"KC.use_runtime({', '.join(repr(k) for k in keys)})"] if keys else []

    def source(self) -> str:
        names = ["out", *[self.array_names[k] for k in self.array_names], "WS"]
        decorator = (f"@njit(cache=True, error_model='numpy', fastmath={fastmath_source(self.numerics)}"
                     + (", parallel=True" if self.parallel else "") + ")")
        head = [
            "# generated by eqsat_fuse.backends.numba.backend: one fused kernel",
            f"# runtime {RUNTIME_DIGEST}",
            "import numpy as np",
            "from numba import njit, prange",
            "from eqsat_fuse.backends.numba.approx import (exp_f32, tanh_f32, sigmoid_f32,",
            "    erf_f32, gelu_f32, gelu_tanh_f32, f16_to_f32, f32_to_f16)",
            "from eqsat_fuse.backends.numba import calls as KC",
            "from eqsat_fuse.backends.numba import kernels as K",
            "F32 = np.float32",
            "U = np.uint64      # unsigned indices: no negative-index wraparound, loops vectorize",
            "",
            *self.header,
            *(["from eqsat_fuse.backends.numba import packed_gemm as PG", "PG.ensure_compiled()"]
              if self.uses_packed_gemm else []),
            *(["from eqsat_fuse.backends.numba import int8_gemm as I8", "I8.ensure_compiled()"]
              if self.uses_int8_gemm else []),
            *(["from eqsat_fuse.backends.numba import flash as FA"] if self.uses_flash else []),
            *self._runtime_entries(),
            "",
            decorator,
            "def kernel(A, G, FP):",
        ]
        # integer parameters become locals first: LLVM cannot prove that `out` does not alias
        # G, so G[i] inside a loop would be reloaded each iteration and block vectorization
        used = sorted({int(i) for i in _PARAM.findall("\n".join(self.lines))})
        lines = [_PARAM.sub(r"g\1", line) if "G[" in line else line for line in self.lines]
        views, at = [], 0
        for name, (dtype, ndim) in zip(names, self.arg_types()):
            shape = f"A[{at + 1}]" if ndim == 1 else \
                "(" + "".join(f"A[{at + 1 + d}], " for d in range(ndim)) + ")"
            if dtype not in NP_TYPES:
                raise Unsupported(f"an array of {dtype}")
            views.append(f"    {name} = KC.array_at(A[{at}], {shape}, {NP_TYPES[dtype]})")
            at += 1 + ndim
        body = views + [f"    g{i} = G[{i}]" for i in used] + ["    " + line for line in lines]
        from .kernels import WIDE_VECTORS
        if WIDE_VECTORS:
            body.insert(0, "    K.wide_vectors()")
        body = body or ["    pass"]
        return "\n".join(head + body) + "\n"
