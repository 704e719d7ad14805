"""Stage 4 at the stage: decode, the memory plan and view layouts, each on inputs built by hand,
so a lowering bug shows up here and not as a verify mismatch far from its cause."""

from __future__ import annotations

import numpy as np
from onnx import helper

from eqsat_fuse.extraction.costmodel import load_cost_model
from eqsat_fuse.extraction.cost import roots_of
from eqsat_fuse.extraction.registry import extract
from eqsat_fuse.frontend.encode import encode
from eqsat_fuse.frontend.importer import import_model
from eqsat_fuse.ir import BodyNode, Kernel, KernelPlan, Operand, TensorInfo
from eqsat_fuse.lowering.decode import decode
from eqsat_fuse.lowering.layout import view_layouts
from eqsat_fuse.lowering.memory import plan_memory
from eqsat_fuse.saturation.saturate import saturate
from eqsat_fuse.saturation.serialized import fill_missing_facts, read_egraph

from conftest import make_model

F32 = "float32"


def _unary(name: str, src: str, op: str = "Relu", shape=(4, 8)) -> Kernel:
    return Kernel(name=f"k_{name}", output=name, inputs=[src],
                  body=[BodyNode(op, [Operand("buffer", src)], {})], kind="compute",
                  info=TensorInfo(tuple(shape), F32))


def _alias(name: str, src: str, shape, op="Reshape", attrs=None) -> Kernel:
    attrs = {"shape": tuple(shape)} if attrs is None else attrs
    return Kernel(name=f"v_{name}", output=name, inputs=[src],
                  body=[BodyNode(op, [Operand("buffer", src)], attrs)], kind="alias",
                  info=TensorInfo(tuple(shape), F32))


def _plan(kernels: list[Kernel], output: str, shape=(4, 8)) -> KernelPlan:
    return KernelPlan(kernels=kernels, buffers={k.output: k.info for k in kernels},
                      inputs={"x": TensorInfo(tuple(shape), F32)}, outputs={"y": output},
                      constants={}, initializers={})


def _overlaps(memory) -> list[tuple[str, str]]:
    items = list(memory.lifetimes.items())
    bad = []
    for i, (a, (s1, e1)) in enumerate(items):
        for b, (s2, e2) in items[i + 1:]:
            if s1 <= e2 and s2 <= e1:
                lo1, lo2 = memory.offsets[a], memory.offsets[b]
                if not (lo1 + memory.sizes[a] <= lo2 or lo2 + memory.sizes[b] <= lo1):
                    bad.append((a, b))
    return bad


def test_a_chain_reuses_the_storage_of_buffers_that_died():
    # x -> a -> b -> c -> d -> y: at most two intermediates live at once, so two slots suffice
    names = ["a", "b", "c", "d"]
    kernels = [_unary(n, src) for n, src in zip(names, ["x", *names[:-1]])]
    kernels.append(_unary("y", "d"))
    memory = plan_memory(_plan(kernels, "y"), external={"y"})
    assert memory.lifetimes["a"] == (0, 1) and memory.lifetimes["d"] == (3, 4)
    assert "y" not in memory.lifetimes            # the graph output is the caller's, not the arena's
    assert not _overlaps(memory)
    buffer = 4 * 8 * 4
    assert memory.lower_bound_bytes == 2 * buffer
    assert memory.arena_bytes == 2 * buffer < memory.separate_bytes == 4 * buffer
    assert memory.last_use["b"] == 2 and "b" in memory.free_after[2]


def test_a_view_moves_no_data_and_keeps_its_root_alive():
    # a view of `a` read at the last step keeps `a`'s storage from being reused before it
    kernels = [_unary("a", "x"), _alias("va", "a", (8, 4)), _unary("b", "x"),
               _unary("c", "b"), _unary("y", "va", shape=(8, 4))]
    memory = plan_memory(_plan(kernels, "y", shape=(4, 8)), external={"y"})
    assert memory.storage_of["va"] == "a" and "va" not in memory.lifetimes
    assert memory.lifetimes["a"] == (0, 4)
    assert not _overlaps(memory)


def test_in_place_when_the_backend_allows_it_and_workspaces_live_one_step():
    kernels = [_unary("a", "x"), _unary("b", "a", "Tanh"), _unary("y", "b")]
    plan = _plan(kernels, "y")
    apart = plan_memory(plan, external={"y"})
    shared = plan_memory(plan, external={"y"}, inplace_ok=lambda step, kernel, name: True,
                         workspace={1: 1000})
    assert apart.inplace == {} and shared.inplace == {"b": "a"}
    assert shared.storage_of["b"] == "a" and "b" not in shared.lifetimes
    assert shared.workspace == {1: "workspace#1"} and shared.lifetimes["workspace#1"] == (1, 1)
    assert shared.sizes["workspace#1"] == 1000
    assert not _overlaps(shared)


def test_view_layouts_give_strided_views_and_copy_what_strides_cannot_express():
    t = _alias("t", "x", (8, 4), op="Transpose", attrs={"perm": (1, 0)})
    r = _alias("r", "t", (32,))                   # flattening a transpose needs a copy
    plan = _plan([t, r, _unary("y", "r", shape=(32,))], "y")
    layouts, copies = view_layouts(plan, {})
    assert layouts["x"].storage == "x" and layouts["x"].contiguous
    assert layouts["t"].storage == "x" and layouts["t"].strides == (1, 8)   # in elements
    assert not layouts["t"].contiguous
    assert copies == {"r"} and layouts["r"].storage == "r" and layouts["r"].contiguous


def test_decode_orders_kernels_after_what_they_read_and_maps_every_output():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["y"]),
             helper.make_node("Tanh", ["r"], ["z"])]
    model = make_model(nodes, [("x", [4, 8])], [("y", [32]), ("z", [4, 8])],
                       initializers={"w": rng.standard_normal((8, 8)).astype(np.float32),
                                     "shape": np.array([32], dtype=np.int64)})
    graph = import_model(model)
    encoding = encode(graph)
    egraph, _ = saturate(encoding)
    eg = read_egraph(egraph)
    fill_missing_facts(eg)
    extraction = extract(eg, roots_of(eg, encoding.output_vars), load_cost_model("cpu"),
                         "greedy-dag")
    plan = decode(eg, extraction, encoding, graph)

    written = set(plan.inputs) | set(plan.constants)
    for kernel in plan.kernels:
        assert all(name in written for name in kernel.inputs), kernel.name
        written.add(kernel.output)
    assert set(plan.outputs) == {"y", "z"} and all(ref in written
                                                   for ref in plan.outputs.values())
    by_output = {k.output: k for k in plan.kernels}
    y = by_output[plan.outputs["y"]]
    assert y.kind == "alias" and y.ops == ["Reshape"] and y.info.shape == (32,)
    # the Sigmoid rides on the MatMul as its epilogue: one compute kernel computes both
    fused = [k for k in plan.kernels if "MatMul" in k.ops]
    assert len(fused) == 1 and "Sigmoid" in fused[0].ops
    assert by_output[plan.outputs["z"]].info == TensorInfo((4, 8), F32)
