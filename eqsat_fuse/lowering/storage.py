"""Where each value of a plan lives: its layout over a storage (`layout.view_layouts`), the
dtype each storage is stored in, and which storages are the caller's (graph outputs, made per
run and kept out of the arena).

With `storage_dtype="float16"`, intermediates computed as float32 are stored as float16 (the
kernels load float16, compute float32 and store float16); graph inputs and outputs keep the
model's dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import KernelPlan, itemsize
from .layout import Layout, view_layouts
from .memory import view_roots

# The storage dtypes lowering can store intermediates in. Not the cost model's list
# (`extraction.costmodel.STORAGE_DTYPES`, which also prices bfloat16): a target may be priced
# in a dtype that no backend stores yet.
LOWERED_STORAGE_DTYPES = ("float32", "float16")


@dataclass
class Storage:
    """The storages of one plan: layouts, copies, view roots, external storages, dtypes."""

    plan: KernelPlan
    constants: dict[str, np.ndarray]
    layouts: dict[str, Layout]            # every value -> its layout over some storage
    copies: set[str]                      # views that strides cannot express: copied
    storage_of: dict[str, str]            # every buffer -> the storage its view reads
    external: set[str]                    # storages of graph outputs (the caller's)
    stored: dict[str, str]                # kernel-written storage -> dtype it is stored in

    def stored_dtype(self, name: str) -> str:
        """The dtype storage `name` holds (a kernel's, a constant's or a graph input's)."""
        if name in self.stored:
            return self.stored[name]
        if name in self.constants:
            return str(self.constants[name].dtype)
        return self.plan.inputs[name].dtype

    def nbytes(self, name: str) -> int:
        """The bytes of buffer storage `name` as stored."""
        return self.plan.buffers[name].size * itemsize(self.stored_dtype(name))


def plan_storage(plan: KernelPlan, constants: dict[str, np.ndarray],
                 storage_dtype: str, shared: dict | None = None) -> Storage:
    """Lay out every value and choose each storage's dtype (`storage_dtype` for float32
    intermediates; graph outputs keep the model's dtype). `shared`: the lowerings of one plan
    at several shapes also share the views' layouts (`view_layouts`' memo)."""
    layouts, copies = view_layouts(plan, constants,
                                   None if shared is None else shared.setdefault("views", {}))
    storage_of = view_roots(plan, copies)
    outputs = set(plan.outputs.values())
    external = {layouts[ref].storage for ref in outputs
                if ref in plan.buffers and layouts[ref].storage in plan.buffers}
    stored: dict[str, str] = {}
    for kernel in plan.kernels:
        root = layouts[kernel.output].storage
        if root == kernel.output:
            dtype = kernel.info.dtype
            if storage_dtype == "float16" and dtype == "float32" and root not in external:
                dtype = "float16"
            stored[root] = dtype
    return Storage(plan, constants, layouts, copies, storage_of, external, stored)
