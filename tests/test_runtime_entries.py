"""Generated kernels call the large hand-written runtime functions through entry points
(`backends.numba.calls.runtime_entry`): the kernel's code holds a call to a symbol, not a copy
of the function compiled again, and a second process links the cached kernel against the
symbol its module registers on import."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from numba import njit
from numba.core.errors import TypingError
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.backends.numba import kernels as K

from conftest import compile_in_two_processes, make_model


def _depthwise_then_pool(rng):
    """A strided depthwise Conv (the channel-blocked path) and a global AveragePool."""
    w = rng.standard_normal((24, 1, 5, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=24, pads=[2] * 4,
                              strides=[2, 2]),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[9, 9])]
    return make_model(nodes, [("x", [1, 24, 18, 18])], [("y", [1, 24, 1, 1])], {"w": w})


def test_kernels_call_the_runtime_by_symbol_not_by_copy(tmp_path, rng):
    program = ef.compile(_depthwise_then_pool(rng), backend="numba", cache_dir=tmp_path,
                         threads=1)
    assert program.verify(seed=4).ok
    sources = "".join(p.read_text() for p in tmp_path.glob("k_*.py"))
    assert "K.depthwise2d_entry((" in sources and "K.pool2d_entry((" in sources
    assert "KC.use_runtime('K.depthwise2d')" in sources
    # each kernel's LLVM IR calls the entry's symbol, never the runtime function itself
    # (called by name, its code would be linked in and compiled again with the kernel)
    calls = {}
    for path in tmp_path.glob("k_*.py"):
        ir = _fresh_ir(path)
        for name in ("depthwise2d", "pool2d"):
            calls.setdefault(name, set()).update(re.findall(rf"@([\w.$]*{name}\w*)\(", ir))
    assert calls == {"depthwise2d": {"eqsat_fuse_rt_K_depthwise2d"},
                     "pool2d": {"eqsat_fuse_rt_K_pool2d"}}


def _fresh_ir(path) -> str:
    """The LLVM IR of a generated kernel module compiled anew here (Numba shows no IR of
    code it loaded from its cache, and this process may have loaded the same source)."""
    import types as pytypes

    from numba import typeof

    from eqsat_fuse.backends.numba.segments import KERNEL_SIGNATURE_EXAMPLE
    module = pytypes.ModuleType(f"probe_{path.stem}")
    source = path.read_text().replace("cache=True", "cache=False")
    exec(compile(source, str(path), "exec"), module.__dict__)
    module.kernel.compile(tuple(typeof(x) for x in KERNEL_SIGNATURE_EXAMPLE))
    return "".join(module.kernel.inspect_llvm().values())


def test_a_second_process_links_cached_kernels_against_the_registered_entries(tmp_path, rng):
    path = tmp_path / "model.onnx"
    onnx.save(_depthwise_then_pool(rng), path)
    first, second = compile_in_two_processes(path, tmp_path / "kernels", threads=1)
    assert first[2] and second[2]
    assert second[0] == 0 and second[1] == first[0] + first[1]


def test_an_entry_called_with_other_types_is_refused_by_name():
    @njit
    def wrong(x, acc):
        K.pool2d_entry((x, 0, 1, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, acc))

    with pytest.raises(TypingError, match=r"K.pool2d: argument 0 is array\(float64"):
        wrong(np.zeros(4), np.zeros(1, np.float32))
