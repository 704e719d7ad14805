"""Targets change decisions: the same graph, compiled for different cost models, runs different
kernels (and every program still computes what the model computes)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.extraction.costmodel import load_cost_model

from conftest import make_model


def compute_kernels(compiled) -> list[list[str]]:
    return [k.ops for k in compiled.report.kernels if k.kind == "compute"]


def shared_gelu_model(n: int):
    """x -> Erf-GELU -> (Sigmoid -> a, Tanh -> b): an expensive elementwise value, two readers."""
    nodes = [helper.make_node("Div", ["x", "root2"], ["q"]),
             helper.make_node("Erf", ["q"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["x", "e1"], ["p"]),
             helper.make_node("Mul", ["p", "half"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["a"]),
             helper.make_node("Tanh", ["g"], ["b"])]
    consts = {"root2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    return make_model(nodes, [("x", [1, n])], [("a", [1, n]), ("b", [1, n])], consts)


def count(kernels: list[list[str]], op: str) -> int:
    return sum(ops.count(op) for ops in kernels)


@pytest.mark.parametrize("extractor", ["greedy-dag", "ilp"])
def test_shared_elementwise_value_recomputed_on_gpu_and_materialized_on_cpu(extractor):
    model = shared_gelu_model(1 << 20)
    # fast: the GELU chain recognized as one Gelu (in exact mode it stays a chain)
    gpu = ef.compile(model, target="gpu", extractor=extractor, numerics="fast")
    cpu = ef.compile(model, target="cpu", extractor=extractor, numerics="fast")
    # gpu: kernels are expensive to launch and arithmetic is cheap: each reader recomputes GELU
    assert count(compute_kernels(gpu), "Gelu") == 2
    assert len(compute_kernels(gpu)) == 2
    # cpu: arithmetic is expensive: GELU is computed once, written, and read by both
    assert count(compute_kernels(cpu), "Gelu") == 1
    assert len(compute_kernels(cpu)) == 3
    for compiled in (gpu, cpu):
        assert compiled.verify().ok


def test_elementwise_chain_fuses_on_cpu_but_not_on_edge_npu():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Tanh", ["s"], ["y"])]
    model = make_model(nodes, [("x", [1, 64, 32, 32])], [("y", [1, 64, 32, 32])])
    cpu = ef.compile(model, target="cpu")
    npu = ef.compile(model, target="edge-npu")
    assert compute_kernels(cpu) == [["Relu", "Sigmoid", "Tanh"]]
    assert compute_kernels(npu) == [["Relu"], ["Sigmoid"], ["Tanh"]]
    assert cpu.verify().ok and npu.verify().ok


def test_edge_npu_runs_conv_bn_activation_as_one_kernel_and_the_residual_add_alone(rng):
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1
    bn = {k: rng.uniform(0.5, 1.5, 8).astype(np.float32) for k in ("s", "b", "m", "v")}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["y"])]
    model = make_model(nodes, [("x", [1, 8, 16, 16])], [("y", [1, 8, 16, 16])], {"w": w, **bn})
    # fast: the BatchNormalization folded into the weights
    npu = ef.compile(model, target="edge-npu", extractor="ilp", numerics="fast")
    cpu = ef.compile(model, target="cpu", extractor="ilp", numerics="fast")
    assert sorted(compute_kernels(npu)) == [["Add"], ["Conv", "Relu"]]
    assert compute_kernels(cpu) == [["Conv", "Relu", "Add"]]
    assert npu.verify().ok and cpu.verify().ok


def test_edge_npu_stores_activations_as_float16():
    model = load_cost_model("edge-npu")
    assert model.storage_dtype == "float16"
    assert model.tensor_bytes((1, 1024), "float32") == 2048
    assert model.tensor_bytes((1, 1024), "float32", activation=False) == 4096
    assert model.tensor_bytes((1, 1024), "int64") == 8192
    assert load_cost_model("cpu").storage_dtype == "float32"


def test_a_kernel_that_fits_on_chip_pays_on_chip_rates():
    prices = load_cost_model("edge-npu").prices("latency")
    small, large = 512 * 1024, 4 * 1024 * 1024
    assert prices.bytes_cost(small) == pytest.approx(small / 128e3)
    assert prices.bytes_cost(large) == pytest.approx(large / 8e3)


@pytest.mark.parametrize("target", ["cpu", "gpu", "edge-npu"])
def test_report_gives_latency_and_energy_and_the_objective_is_chosen(target):
    model = shared_gelu_model(4096)
    latency = ef.compile(model, target=target, extractor="ilp").report
    energy = ef.compile(model, target=target, extractor="ilp", objective="energy").report
    assert latency.objective == "latency" and energy.objective == "energy"
    assert latency.energy_uj > 0 and energy.energy_uj > 0
    # each objective's optimum is at least as good as the other's answer under that objective
    assert energy.energy_uj <= latency.energy_uj * (1 + 1e-9)
    assert latency.cost <= energy.cost * (1 + 1e-9)
    for kernel in latency.kernels:
        if kernel.kind == "compute":
            assert kernel.energy_uj > 0


def test_energy_objective_needs_an_energy_table(tmp_path):
    text = (load_cost_model("cpu").path and open(load_cost_model("cpu").path).read())
    path = tmp_path / "noenergy.toml"
    path.write_text(text[:text.index("[energy]")])
    with pytest.raises(ef.CostModelError, match="energy.*\\[energy\\] table"):
        ef.compile(shared_gelu_model(64), target=str(path), objective="energy")
