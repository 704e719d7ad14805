"""The fusions that exporters spell differently (issue 14): each spelling, hand-built with
onnx.helper, must fuse the same way and the program must match onnxruntime on both backends.

- Conv -> BatchNormalization -> per-channel Mul/Add (DenseNet-style): one Conv (+ Relu).
- GELU, erf form, as torch's legacy exporter, the dynamo exporter and onnxscript/tf2onnx write
  it (association of the 0.5, Div by sqrt 2 or Mul by 1/sqrt 2, constant order), and the tanh
  form (GPT-2), with Pow(x, 3) or x*x*x: one Gelu in the contraction's kernel.
- SiLU, x * Sigmoid(x) and x / (1 + exp(-x)): one kernel with its contraction (no new op).
- GELU after a Reshape of a Gemm (GPT-2's Conv1D): fused with the Gemm.
- RMSNorm after a residual Add, in four spellings: one row kernel, the residuals in their
  MatMuls' epilogues.
- `Report.fusions` counts what was fused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from conftest import make_model

N = helper.make_node
BACKENDS = ["numpy", "numba"]


def f32(value):
    return np.asarray(value, np.float32)


def _rand(*shape, seed=0, low=None, high=None):
    rng = np.random.default_rng(seed + sum(shape))
    if low is not None:
        return rng.uniform(low, high, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def compute_ops(report) -> list[list[str]]:
    return [k.ops for k in report.kernels if k.kind == "compute"]


# ---- Conv -> BatchNormalization -> per-channel Mul -> Add -> Relu ----

def conv_bn_scale_shift(cshape, bias):
    inits = {"w": _rand(8, 4, 3, 3), "s": _rand(8, low=0.5, high=1.5), "beta": _rand(8, seed=1),
             "mean": _rand(8, seed=2), "var": _rand(8, low=0.5, high=1.5, seed=3),
             "c": _rand(*cshape, low=0.5, high=1.5, seed=4), "d": _rand(*cshape, seed=5),
             "b": _rand(8, seed=6)}
    nodes = [N("Conv", ["x", "w"] + (["b"] if bias else []), ["cv"], pads=[1, 1, 1, 1]),
             N("BatchNormalization", ["cv", "s", "beta", "mean", "var"], ["bn"]),
             N("Mul", ["bn", "c"], ["m"]), N("Add", ["m", "d"], ["a"]), N("Relu", ["a"], ["y"])]
    return make_model(nodes, [("x", [1, 4, 8, 8])], [("y", [1, 8, 8, 8])], inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cshape", [(8, 1, 1), (1, 8, 1, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_bn_then_channel_scale_and_shift_fold_into_the_conv(backend, cshape, bias):
    compiled = ef.compile(conv_bn_scale_shift(cshape, bias), backend=backend, numerics="fast")
    report = compiled.report
    assert compute_ops(report) == [["Conv", "Relu"]]
    assert report.fusions.get("Conv+Relu") == 1
    assert compiled.verify().ok


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_exact_mode_conv_bn_scale_shift_is_still_one_kernel(backend):
    """Not folded into the weights (fast only), the BatchNormalization, scale and shift run
    as the Conv's epilogue: no extra kernel, no extra pass over memory."""
    compiled = ef.compile(conv_bn_scale_shift((8, 1, 1), True), backend=backend)
    (ops,) = compute_ops(compiled.report)
    assert ops[0] == "Conv" and ops[-1] == "Relu" and len(ops) > 2, ops
    assert compiled.verify().ok


# ---- GELU spellings after a MatMul + bias ----

SQRT2, RSQRT2, C_TANH = math.sqrt(2.0), 1.0 / math.sqrt(2.0), math.sqrt(2.0 / math.pi)


def erf_arg(x, out, spelling):
    if spelling == "div":
        return [N("Div", [x, "sqrt2"], [out])], {"sqrt2": f32(SQRT2)}
    return [N("Mul", [x, "rsqrt2"], [out])], {"rsqrt2": f32(RSQRT2)}


def gelu_erf_nodes(x, spelling, association):
    """u = 1 + erf(x / sqrt 2) (or x * 0.7071..), then x * u * 0.5 in one of three
    associations, the way each exporter writes it."""
    nodes, inits = erf_arg(x, "q", spelling)
    inits.update(one=f32(1.0), half=f32(0.5))
    nodes += [N("Erf", ["q"], ["e"])]
    if association == "torch-legacy":      # (x * (erf + 1)) * 0.5
        nodes += [N("Add", ["e", "one"], ["u"]), N("Mul", [x, "u"], ["p"]),
                  N("Mul", ["p", "half"], ["y"])]
    elif association == "dynamo":          # x * (0.5 * (1 + erf))
        nodes += [N("Add", ["one", "e"], ["u"]), N("Mul", ["half", "u"], ["hu"]),
                  N("Mul", [x, "hu"], ["y"])]
    else:                                  # onnxscript / tf2onnx: (0.5 * x) * (1 + erf)
        nodes += [N("Add", ["e", "one"], ["u"]), N("Mul", ["half", x], ["hx"]),
                  N("Mul", ["hx", "u"], ["y"])]
    return nodes, inits


def gelu_tanh_nodes(x, cube):
    """GPT-2's 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    inits = {"k": f32(0.044715), "c": f32(C_TANH), "one": f32(1.0), "half": f32(0.5),
             "three": f32(3.0)}
    if cube == "pow":
        nodes = [N("Pow", [x, "three"], ["x3"])]
    else:
        nodes = [N("Mul", [x, x], ["x2"]), N("Mul", ["x2", x], ["x3"])]
    nodes += [N("Mul", ["k", "x3"], ["kx3"]), N("Add", [x, "kx3"], ["i"]),
              N("Mul", ["c", "i"], ["ci"]), N("Tanh", ["ci"], ["t"]),
              N("Add", ["one", "t"], ["u"]), N("Mul", ["half", x], ["hx"]),
              N("Mul", ["hx", "u"], ["y"])]
    return nodes, inits


def after_matmul(nodes, inits, d=16, n=32, rows=8):
    inits = dict(inits, w=_rand(d, n, seed=7), b=_rand(n, seed=8))
    head = [N("MatMul", ["x", "w"], ["mm"]), N("Add", ["mm", "b"], ["h"])]
    return make_model(head + nodes, [("x", [rows, d])], [("y", [rows, n])], inits)


ERF_CASES = [(s, a) for s in ("div", "mul") for a in ("torch-legacy", "dynamo", "onnxscript")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spelling,association", ERF_CASES)
def test_gelu_erf_spellings_become_one_gelu_in_the_matmul_kernel(backend, spelling, association):
    compiled = ef.compile(after_matmul(*gelu_erf_nodes("h", spelling, association)),
                          backend=backend, numerics="fast")
    report = compiled.report
    assert len(compute_ops(report)) == 1 and compute_ops(report)[0][-1] == "Gelu", \
        compute_ops(report)
    assert "Erf" not in compute_ops(report)[0]
    assert report.fusions.get("Gelu") == 1
    assert compiled.verify().ok


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cube", ["pow", "products"])
def test_gelu_tanh_is_one_gelu_even_on_large_tensors(backend, cube):
    # 128 x 3072, GPT-2's c_fc: priced at the erf form's Gelu, the chain used to win here
    compiled = ef.compile(after_matmul(*gelu_tanh_nodes("h", cube), d=64, n=3072, rows=128),
                          backend=backend, numerics="fast")
    report = compiled.report
    assert compute_ops(report) == [["Gemm", "Gelu"]], compute_ops(report)
    assert report.fusions.get("Gelu") == 1 and report.fusions.get("Gemm+Gelu") == 1
    assert compiled.verify().ok


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_exact_mode_the_gelu_chain_stays_in_the_matmul_kernel(backend):
    """The recognizers are fast only (Gelu computes 0.5 * x first); the spelled-out chain
    still runs as the contraction's epilogue, one kernel."""
    compiled = ef.compile(after_matmul(*gelu_erf_nodes("h", "div", "dynamo")), backend=backend)
    (ops,) = compute_ops(compiled.report)
    assert "Erf" in ops and "Gelu" not in ops, ops
    assert compiled.verify().ok


def test_a_wrong_constant_is_no_gelu():
    nodes, inits = gelu_erf_nodes("h", "div", "dynamo")
    inits["half"] = f32(0.25)
    report = ef.compile(after_matmul(nodes, inits), numerics="fast").report
    assert "Gelu" not in report.fusions
    assert all("Gelu" not in ops for ops in compute_ops(report))


# ---- SiLU: already one kernel with its contraction ----

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spelling", ["sigmoid", "exp"])
def test_silu_runs_in_the_matmul_kernel(backend, spelling):
    if spelling == "sigmoid":
        nodes, inits = [N("Sigmoid", ["h"], ["s"]), N("Mul", ["h", "s"], ["y"])], {}
    else:
        nodes = [N("Neg", ["h"], ["nh"]), N("Exp", ["nh"], ["e"]), N("Add", ["one", "e"], ["d"]),
                 N("Div", ["h", "d"], ["y"])]
        inits = {"one": f32(1.0)}
    compiled = ef.compile(after_matmul(nodes, inits), backend=backend)
    ops = compute_ops(compiled.report)
    assert len(ops) == 1 and ops[0][0] == "Gemm", ops
    assert compiled.verify().ok


# ---- GELU after a Reshape of the contraction (GPT-2's Conv1D: view -> addmm -> view) ----

@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_after_reshape_of_a_gemm_fuses_with_it(backend):
    nodes, inits = gelu_tanh_nodes("h", "pow")
    inits.update(w=_rand(16, 32, seed=9), b=_rand(32, seed=10),
                 s1=np.array([8, 16], np.int64), s2=np.array([1, 8, 32], np.int64))
    head = [N("Reshape", ["x", "s1"], ["xr"]), N("Gemm", ["xr", "w", "b"], ["g"]),
            N("Reshape", ["g", "s2"], ["h"])]
    model = make_model(head + nodes, [("x", [1, 8, 16])], [("y", [1, 8, 32])], inits)
    compiled = ef.compile(model, backend=backend, numerics="fast")
    assert compute_ops(compiled.report) == [["Gemm", "Gelu"]], compute_ops(compiled.report)
    assert compiled.verify().ok


# ---- RMSNorm after a residual Add (Llama's decoder layer) ----

RMS_SPELLINGS = ["hf-legacy", "div", "reciprocal", "pow-minus-half"]


def rmsnorm_after_residual(spelling):
    """x = x0 + x0 @ W (a residual), y = w * RMSNorm(x), out = x + y @ W2: x is read by the
    norm's reduction, its epilogue and the second residual."""
    d = 32
    inits = {"W": _rand(d, d, seed=1) * 0.2, "W2": _rand(d, d, seed=2) * 0.2,
             "w": _rand(d, seed=3), "two": f32(2.0), "eps": f32(1e-6), "one": f32(1.0),
             "mhalf": f32(-0.5)}
    nodes = [N("MatMul", ["x0", "W"], ["h"]), N("Add", ["x0", "h"], ["x"])]
    nodes.append(N("Mul", ["x", "x"], ["sq"]) if spelling == "div" else
                 N("Pow", ["x", "two"], ["sq"]))
    nodes += [N("ReduceMean", ["sq"], ["m"], axes=[-1], keepdims=1),
              N("Add", ["m", "eps"], ["v"])]
    if spelling == "pow-minus-half":
        nodes += [N("Pow", ["v", "mhalf"], ["r"]), N("Mul", ["x", "r"], ["n"])]
    elif spelling == "div":
        nodes += [N("Sqrt", ["v"], ["s"]), N("Div", ["x", "s"], ["n"])]
    elif spelling == "reciprocal":
        nodes += [N("Sqrt", ["v"], ["s"]), N("Reciprocal", ["s"], ["r"]),
                  N("Mul", ["r", "x"], ["n"])]
    else:                                   # transformers' LlamaRMSNorm, torch's legacy export
        nodes += [N("Sqrt", ["v"], ["s"]), N("Div", ["one", "s"], ["r"]),
                  N("Mul", ["x", "r"], ["n"]), N("Cast", ["n"], ["nc"], to=1)]
    nodes += [N("Mul", ["w", "nc" if spelling == "hf-legacy" else "n"], ["y"]),
              N("MatMul", ["y", "W2"], ["h2"]), N("Add", ["x", "h2"], ["out"])]
    return make_model(nodes, [("x0", [1, 16, d])], [("out", [1, 16, d])], inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spelling", RMS_SPELLINGS)
def test_rmsnorm_after_a_residual_is_one_row_kernel(backend, spelling):
    compiled = ef.compile(rmsnorm_after_residual(spelling), backend=backend)
    ops = compute_ops(compiled.report)
    # the residual Adds ride in their MatMuls' epilogues; the norm, from x * x to the weight,
    # is one kernel reading x once (it was four: Add, Pow, ReduceMean.., Mul+Mul)
    assert len(ops) == 3, ops
    assert ops[0] == ["MatMul", "Add"] and ops[2] == ["MatMul", "Add"], ops
    assert ops[1][:2] in (["Mul", "ReduceMean"], ["Pow", "ReduceMean"]) and ops[1][-1] == "Mul", ops
    assert compiled.verify().ok


# ---- the fusion counts ----

def test_fusions_in_the_report_summary_and_dict():
    nodes, inits = gelu_erf_nodes("h", "div", "torch-legacy")
    report = ef.compile(after_matmul(nodes, inits), numerics="fast").report
    assert report.as_dict()["fusions"] == report.fusions
    assert report.fusions == {"Gelu": 1, "Gemm+Gelu": 1}
    text = report.summary()
    assert "fused ops     1 Gelu" in text and "1 x Gemm+Gelu" in text
