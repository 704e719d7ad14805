"""What the kernel generator reads of a kernel (its geometry), as a key, and one generated
implementation shared by the kernels whose geometry is the same up to the names.

A transformer's layers are the same kernels over other buffers: the layer-3 KV-cache Concat and
the layer-4 one read operands of the same shapes, layouts and dtypes, and the generator writes
the same source and the same parameters for both. `geometry` names a kernel's values and
storages by where they first appear (the output, then the body's operands in order), so those
kernels get one key; `renamed` gives the implementation generated for one of them to another,
its array arguments and in-place inputs renamed position by position. The
generator's output depends on names only through which operands are the same value or share a
storage, and the key keeps both: the implementation computes the renamed kernel exactly. A
constant is in the key by its value when it is small (a scale, an epsilon), else by its
identity (a layer's own weights are never shared); an implementation whose arguments name
a storage the kernel's operands do not (a scratch the generator made) is not shared at all.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...ir import Kernel


def kernel_names(kernel: Kernel) -> list[str]:
    """The kernel's values in order of first appearance: the output, then body operands."""
    seen = {kernel.output: None}
    for node in kernel.body:
        for a in node.args:
            if a.kind in ("buffer", "const"):
                seen.setdefault(a.ref, None)
    return list(seen)


SMALL_CONSTANT = 64        # elements: a constant this small is keyed by its value


def _constant(value: Any):
    """A constant in the key: a small one by its value (the layers' equal scales and
    epsilons, each its own array), any other by its identity (a layer's own weights)."""
    if value is None:
        return None
    if getattr(value, "size", SMALL_CONSTANT + 1) <= SMALL_CONSTANT:
        return (value.dtype.str, value.shape, value.tobytes())
    return id(value)


def geometry(backend: Any, kernel: Kernel) -> tuple[tuple, list[str]]:
    """The key of everything the generator reads of `kernel`, its values and storages named
    by position: its body, and each operand's layout, dtypes, storage and constant (a tuple of
    frozen values and the attributes' repr, which tells 1 from 1.0 and True); and the
    kernel's storages, in the order of their positions (what an implementation names)."""
    names = kernel_names(kernel)
    value_key = {n: f"v{i}" for i, n in enumerate(names)}
    storages: dict[str, str] = {}
    body = tuple((n.op, tuple((a.kind, value_key[a.ref]) if a.kind in ("buffer", "const")
                              else (a.kind, a.ref) for a in n.args), repr(n.attrs))
                 for n in kernel.body)
    parts: list = [kernel.kind, kernel.info, body]
    plan, constants = backend.plan, backend.constants
    for name in names:
        lay = backend.layouts.get(name)
        storage = lay.storage if lay is not None else None
        frozen = None if lay is None else (storages.setdefault(storage, f"s{len(storages)}"),
                                           lay.offset, lay.shape, lay.strides)
        parts.append((value_key[name], frozen, storage == name, backend.stored.get(storage),
                      storage in backend.external,
                      plan.buffers.get(storage) if storage else None, plan.buffers.get(name),
                      _constant(constants.get(name)), _constant(constants.get(storage)),
                      name in plan.inputs and plan.inputs[name]))
    return tuple(parts), list(storages)


def shareable(impl: Any, storages: list[str]) -> bool:
    """Whether `impl` can be renamed for another kernel: every storage its arguments name, and
    every input it overwrites, is one of its kernel's operands' storages."""
    known = set(storages)
    return all(spec[0] == "array" or (spec[0] == "storage" and spec[1] in known)
               for spec in impl.args) and all(n in known for n in impl.inplace_inputs)


def renamed(impl: Any, storages: list[str], to: list[str]) -> Any:
    """`impl`, generated for the kernel whose storages are `storages`, for the kernel of the
    same by-position geometry whose storages are `to`."""
    storages = dict(zip(storages, to))
    out = replace(impl, args=[("storage", storages[spec[1]]) if spec[0] == "storage" else spec
                              for spec in impl.args],
                  inplace_inputs={storages[n] for n in impl.inplace_inputs})
    out.params, out.fparams, out.out_stored = impl.params, impl.fparams, impl.out_stored
    return out
