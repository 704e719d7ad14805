"""Extraction from the command line and the API: extractors, objectives, explanations, and
`eqsat-fuse calibrate`."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

import eqsat_fuse as ef
from eqsat_fuse.backends import BACKENDS
from eqsat_fuse.cli import main
from eqsat_fuse.errors import CostModelError
from eqsat_fuse.extraction.costmodel import load_cost_model

from conftest import MODELS_DIR

RESNET = str(MODELS_DIR / "resnet_tiny_op17.onnx")
ROOT = MODELS_DIR.parent.parent


def test_calibrate_writes_a_cost_file_and_never_overwrites_without_force(tmp_path):
    out = tmp_path / "mine.toml"
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "calibrate", "--quick",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "[calibrate] 1/" in proc.stderr and "launch overhead" in proc.stderr
    model = load_cost_model(out)
    # named after the file and the machine, never the shipped target's "cpu"
    assert model.target == f"mine@{platform.node()}" != load_cost_model("cpu").target
    assert platform.node() in model.description
    assert model.launch_us > 0 and model.op_us_by_class
    assert model.flops_per_element["Erf"] >= 1 and model.has_energy()
    before = out.read_text()
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "calibrate", "--quick",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "already exists; pass --force" in proc.stderr
    assert out.read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp left


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_calibrate_measures_the_backend_it_is_asked_for(tmp_path, backend):
    out = tmp_path / f"{backend}.toml"
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "calibrate", "--quick",
                           "--backend", backend, "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert f'backend = "{backend}"' in text
    assert f"Prices are those of the {'NumPy' if backend == 'numpy' else 'Numba'} backend" in text
    model = load_cost_model(out)
    assert model.launch_us > 0 and all(r > 0 for r in model.rates_gflops.values())
    if backend == "numba":          # its attention step's fit is in the file, not dropped
        assert "attention_gflops = " in text and "attention_op_us = " in text
    # the file prices what it measured: a model compiled for it runs and matches onnxruntime
    compiled = ef.compile(RESNET, target=str(out), backend=backend)
    assert compiled.report.target == model.target and compiled.verify().ok


def test_a_cost_file_names_a_known_backend_or_none(tmp_path):
    shipped = (ROOT / "extract" / "cpu.toml").read_text()
    # the shipped prices are those of the backend ef.compile runs by default
    assert load_cost_model("cpu").backend == next(iter(BACKENDS))
    bad = tmp_path / "bad.toml"
    bad.write_text(shipped.replace('backend = "numba"', 'backend = "fortran"'))
    with pytest.raises(CostModelError, match=r"bad\.toml:\d+: target\.backend .*numpy, numba"):
        load_cost_model(bad)


def test_optimize_with_ilp_energy_and_edge_npu_reports_both_predictions(capsys):
    assert main(["optimize", RESNET, "--json", "--quiet", "--target", "edge-npu",
                 "--extractor", "ilp", "--objective", "energy", "--ilp-seconds", "20"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["objective"] == "energy" and report["extractor"] == "ilp"
    assert report["cost"] > 0 and report["energy_uj"] > 0
    assert report["extraction"]["gap"] is not None and report["extraction"]["gap"] < 1e-3
    assert all(k["energy_uj"] > 0 for k in report["kernels"] if k["kind"] == "compute")


def test_explain_shows_what_each_fusion_is_worth(capsys):
    assert main(["optimize", RESNET, "--explain", "--fast-math", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "what each fusion is worth" in out
    line = next(l for l in out.splitlines() if "Conv+Relu" in l and "without" in l)
    assert "with" in line and "(+" in line          # splitting it back costs more


def test_unknown_extractor_and_objective_are_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["optimize", RESNET, "--extractor", "magic"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["optimize", RESNET, "--objective", "speed"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("extractor", ["tree", "greedy-dag", "ilp"])
def test_every_extractor_compiles_a_model_that_matches_onnxruntime(extractor):
    compiled = ef.compile(RESNET, extractor=extractor, ilp_seconds=20)
    assert compiled.report.extractor == extractor
    assert compiled.verify().ok


def test_fusion_values_split_the_kernel_back_at_its_boundaries():
    # under the optimal extractor no fused kernel is cheaper split (the greedy one can fuse a
    # producer that its consumer then materializes: an epilogue's pass is then not worth it)
    compiled = ef.compile(RESNET, extractor="ilp", ilp_seconds=20)
    values = compiled.extraction.fusion_values()
    fused = {tuple(k.ops) for k in compiled.report.fused}
    assert values and all(len(v.ops) > 1 for v in values)
    assert {tuple(sorted(v.ops)) for v in values} == {tuple(sorted(ops)) for ops in fused}
    for value in values:
        assert value.with_cost == pytest.approx(compiled.report.cost)
        assert value.without_cost is None or value.without_cost >= value.with_cost - 1e-6
