"""What runtime users expect (issue 20 item 4): `--version`, `Compiled.inputs`/`outputs`,
`run --repeat N` and `--profile`, plain-ONNX export (`--inline`), and eqsat-fuse compiling its
own exports."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import eqsat_fuse as ef
from eqsat_fuse.checking.verify import compare, random_feeds
from eqsat_fuse.pipeline import TensorSpec
from eqsat_fuse.tools import profile

from conftest import MODELS_DIR

RESNET = str(MODELS_DIR / "resnet_tiny_op17.onnx")
BERT = str(MODELS_DIR / "bert_tiny_op17.onnx")


def run_cli(*args):
    """Run the command line in a fresh process: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", *args],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def resnet():
    return ef.compile(RESNET)


@pytest.fixture
def feeds_file(tmp_path):
    path = tmp_path / "feeds.npz"
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.savez(path, pixel_values=x)
    return path


# ---- --version ----------------------------------------------------------------------------------

def test_version_prints_the_package_version():
    code, out, err = run_cli("--version")
    assert code == 0, err
    assert out.strip() == f"eqsat-fuse {ef.__version__}"
    assert ef.__version__ == importlib.metadata.version("eqsat-fuse")   # pyproject agrees


# ---- inputs and outputs -------------------------------------------------------------------------

def test_inputs_and_outputs_are_frozen_specs_of_what_run_takes_and_gives(resnet):
    assert list(resnet.inputs) == ["pixel_values"]
    assert resnet.inputs["pixel_values"] == TensorSpec("pixel_values", (1, 3, 64, 64), "float32")
    assert resnet.outputs == {"logits": TensorSpec("logits", (1, 10), "float32")}
    with pytest.raises(dataclasses.FrozenInstanceError):
        resnet.outputs["logits"].shape = (2, 10)
    bert = ef.compile(BERT)
    assert {n: s.dtype for n, s in bert.inputs.items()} == {"input_ids": "int64",
                                                            "attention_mask": "int64"}
    got = bert.run(random_feeds(bert.plan.inputs, 0))
    assert list(bert.outputs) == list(got)
    for name, value in got.items():
        assert bert.outputs[name].shape == value.shape
        assert bert.outputs[name].dtype == value.dtype.name


# ---- run --repeat and --profile -----------------------------------------------------------------

TIMING = re.compile(r"^timing: median (?P<median>[\d.]+) ms, p25-p75 (?P<p25>[\d.]+)-"
                    r"(?P<p75>[\d.]+) ms \(IQR [\d.]+ ms\) over 7 runs after 1 warm-up run, "
                    r"1 thread$", re.M)


def test_run_repeat_and_profile_print_the_timings_and_each_kernel_beside_its_prediction(
        feeds_file, resnet):
    code, out, err = run_cli("run", RESNET, "--inputs", str(feeds_file), "--repeat", "7",
                             "--profile", "--threads", "1", "--quiet")
    assert code == 0, err
    assert "logits: shape [1, 10] float32" in out             # the outputs, as without them
    timing = TIMING.search(out)
    assert timing, out
    assert float(timing["p25"]) <= float(timing["median"]) <= float(timing["p75"])
    table = out.split("profile (numpy backend, 1 threads, each kernel alone, medians of 7 runs)"
                      )[1].splitlines()
    assert "measured/predicted" in table[1]
    rows = [line.split() for line in table[2:] if line.strip()]
    assert len(rows) == len(resnet.program.steps)             # one row per kernel
    predicted = {k.name: k.predicted_us for k in resnet.report.kernels}
    measured = []
    for name, ops, measured_us, predicted_us, ratio, _share in rows:
        assert ops == "+".join(next(k.ops for k in resnet.report.kernels if k.name == name))
        assert float(predicted_us) == pytest.approx(predicted[name], abs=0.01)
        assert float(ratio) == pytest.approx(float(measured_us) / float(predicted_us),
                                             rel=0.02, abs=0.01)
        measured.append(float(measured_us))
    assert measured == sorted(measured, reverse=True)         # slowest first


@pytest.mark.parametrize("args, message", [
    (["--repeat", "0"], "--repeat must be a whole number >= 1, got 0"),
    (["--repeat", "-3"], "--repeat must be a whole number >= 1, got -3"),
])
def test_a_bad_repeat_is_refused_in_one_line(feeds_file, args, message):
    code, out, err = run_cli("run", RESNET, "--inputs", str(feeds_file), *args, "--quiet")
    assert code == 2
    assert err == f"eqsat-fuse: error: {message}\n" and not out


def test_a_repeat_that_is_not_a_number_is_refused_by_argparse(feeds_file):
    code, _, err = run_cli("run", RESNET, "--inputs", str(feeds_file), "--repeat", "many")
    assert code == 2
    assert "argument --repeat: invalid int value: 'many'" in err and "Traceback" not in err


def test_every_new_flag_has_help():
    for command, helps in ([[], {"--version": "print the version"}],
                           [["run"], {"--repeat N": "median", "--profile": "predicted cost"}],
                           [["optimize"], {"--inline": "plain ONNX"}]):
        code, out, _ = run_cli(*command, "--help")
        assert code == 0
        text = " ".join(out.split())
        for flag, words in helps.items():
            assert flag in text and words in text.split(flag, 1)[1], (flag, text)


def test_profile_api_groups_rows_by_ops(resnet):
    feeds = random_feeds(resnet.plan.inputs, 0)
    times = profile.time_runs(resnet, feeds, repeat=3)
    assert times.runs == 3 and times.p25_ms <= times.median_ms <= times.p75_ms
    rows = profile.profile_kernels(resnet, feeds, repeat=2, warmup=1)
    groups = profile.group_by_ops(rows)
    assert sum(g.count for g in groups) == len(rows)
    ops = max({r.ops for r in rows}, key=lambda o: sum(r.ops == o for r in rows))
    conv_relu = next(g for g in groups if g.ops == ops)      # the most frequent kernel
    members = [r for r in rows if r.ops == ops]
    assert conv_relu.count == len(members) > 1
    assert conv_relu.measured_us == pytest.approx(sum(r.measured_us for r in members))
    assert conv_relu.predicted_us == pytest.approx(sum(r.predicted_us for r in members))
    assert profile.KernelTime("k0", "Relu", 3.0, 0.0).ratio is None
    assert profile.KernelTime("k0", "Relu", 3.0, 2.0).ratio == 1.5


# ---- plain ONNX, and reading our own exports ----------------------------------------------------

def _ort_outputs(path_or_model, feeds):
    data = (path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto)
            else str(path_or_model))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_optimize_inline_writes_plain_onnx_that_runs_and_matches(tmp_path, resnet):
    out = tmp_path / "plain.onnx"
    code, _, err = run_cli("optimize", RESNET, "-o", str(out), "--inline", "--quiet")
    assert code == 0, err
    model = onnx.load(str(out))
    assert not model.functions
    assert {o.domain for o in model.opset_import} == {""}
    assert {n.domain for n in model.graph.node} == {""}
    onnx.checker.check_model(model, full_check=True)
    feeds = random_feeds(resnet.plan.inputs, 0)
    result = compare(_ort_outputs(out, feeds), resnet.run(feeds), "ort")
    assert result.ok, result.summary()


def test_inline_needs_an_output_file():
    code, out, err = run_cli("optimize", RESNET, "--inline", "--quiet")
    assert code == 2 and not out
    assert err == "eqsat-fuse: error: --inline needs -o OUT.onnx (it says how the model is " \
                  "written)\n"


def test_to_onnx_inline_matches_the_exported_functions(resnet):
    fused, plain = resnet.to_onnx(), resnet.to_onnx(inline=True)
    assert fused.functions and not plain.functions
    assert len(plain.graph.node) > len(fused.graph.node)
    feeds = random_feeds(resnet.plan.inputs, 1)
    assert compare(_ort_outputs(plain, feeds), _ort_outputs(fused, feeds), "ort").ok


@pytest.mark.parametrize("model", [RESNET, BERT])
def test_eqsat_fuse_compiles_its_own_export_and_it_matches(tmp_path, model):
    original = ef.compile(model)
    path = tmp_path / "fused.onnx"
    exported = original.to_onnx(path)
    functions = len(exported.functions)
    assert functions and any(n.domain == "eqsat_fuse" for n in exported.graph.node)
    feeds = random_feeds(original.plan.inputs, 0)
    expected = original.run(feeds)
    for again in (ef.compile(path), ef.compile(exported)):
        assert again.report.kernels_out == original.report.kernels_out
        got = again.run(feeds)
        assert compare(got, expected, "ort").ok
        assert again.verify().ok
    assert len(exported.functions) == functions                 # the caller's model untouched


def test_the_cli_verifies_an_exported_model(tmp_path):
    path = tmp_path / "fused.onnx"
    ef.compile(RESNET).to_onnx(path)
    code, out, err = run_cli("verify", str(path), "--quiet")
    assert code == 0, err
    assert "OK" in out
