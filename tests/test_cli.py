"""The command line: every command works, and a user's mistake ends in one clear line."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from eqsat_fuse.cli import main

from conftest import MODELS_DIR

RESNET = str(MODELS_DIR / "resnet_tiny_op17.onnx")


def run_cli(*args):
    """Run the installed console script in a fresh process: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", *args],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_demo_compiles_runs_verifies_and_says_what_was_fused():
    code, out, err = run_cli("demo")
    assert code == 0, err
    assert re.search(r"\bConv\+[\w+]*Relu\b", out) and "MatMul+Add" in out
    assert "45 ONNX nodes before" in out and "kernels after" in out
    assert "verify against onnxruntime: OK" in out
    assert "[eqsat-fuse] saturate..." in err          # progress goes to stderr


def test_every_command_has_help(capsys):
    for command in ([], ["demo"], ["optimize"], ["run"], ["verify"]):
        with pytest.raises(SystemExit) as info:
            main([*command, "--help"])
        assert info.value.code == 0
        assert "usage: eqsat-fuse" in capsys.readouterr().out


def test_optimize_json_has_the_documented_keys(capsys):
    assert main(["optimize", RESNET, "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("nodes_in", "kernels_out", "stop_reason", "egraph_nodes", "cost", "peak_bytes",
                "timings", "matches_per_rule", "kernels"):
        assert key in report
    assert report["kernels_out"] < report["nodes_in"]


def test_optimize_explain_lists_rules_and_kernel_costs(capsys):
    assert main(["optimize", RESNET, "--explain", "--fast-math", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "conv2d-nobias-bn-fold" in out and "Conv+Relu" in out and " us " in out
    explained = out.split("rules that shaped the extracted program")[1]   # shown first
    shaped, matched = explained.split("rewrites that matched")
    assert "conv2d-nobias-bn-fold" in shaped and "fuse-relu" in shaped
    matched = matched.split("kernels (")[0]
    assert "mul-commute" in matched and "analysis rules not shown: --explain-facts" in matched
    for fact in ("dtype-add", "shape-mat", "elementwise-mul", "boundary-mat"):
        assert fact not in out                       # analysis facts only on request


def test_explain_facts_lists_the_analysis_facts_after_the_rewrites(capsys):
    assert main(["optimize", RESNET, "--explain-facts", "--quiet"]) == 0
    out = capsys.readouterr().out
    rewrites, facts = out.split("analysis facts that matched")
    assert "rules that shaped" in rewrites and "rewrites that matched" in rewrites
    assert "dtype-add" not in rewrites and "not shown" not in rewrites
    assert "dtype-add" in facts and "shape-mat" in facts and "mul-commute" not in facts


def feeds_file(tmp_path):
    path = tmp_path / "feeds.npz"
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.savez(path, pixel_values=x)
    return path


def test_run_writes_outputs_and_never_overwrites_without_force(tmp_path, capsys):
    feeds, out = feeds_file(tmp_path), tmp_path / "out.npz"
    assert main(["run", RESNET, "--inputs", str(feeds), "-o", str(out), "--quiet"]) == 0
    first = np.load(out)["logits"]
    assert first.shape == (1, 10)
    before = out.read_bytes()
    assert main(["run", RESNET, "--inputs", str(feeds), "-o", str(out), "--quiet"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["run", RESNET, "--inputs", str(feeds), "-o", str(out), "--force",
                 "--quiet"]) == 0
    assert not list(tmp_path.glob(".out.npz.*")), "the temporary file was left behind"


def test_run_refuses_to_overwrite_its_inputs(tmp_path, capsys):
    feeds = feeds_file(tmp_path)
    assert main(["run", RESNET, "--inputs", str(feeds), "-o", str(feeds), "--force",
                 "--quiet"]) == 2
    assert "refusing to overwrite the input" in capsys.readouterr().err


def test_verify_exits_zero_on_a_match(capsys):
    assert main(["verify", RESNET, "--quiet"]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["optimize", "no/such/model.onnx"], "no/such/model.onnx: no such file"),
    (["optimize", RESNET, "--target", "tpu"], "unknown target 'tpu'"),
    (["run", RESNET, "--inputs", "missing.npz"], "missing.npz: no such file"),
    (["optimize", RESNET, "--input-shape", "pixel_values"], "expected NAME=D1,D2"),
])
def test_user_mistakes_end_in_one_clear_line(args, message):
    code, out, err = run_cli(*args, "--quiet")
    assert code == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--max-nodes", "-5"], "budget nodes (--max-nodes) must be a whole number >= 1, got -5"),
    (["--max-nodes", "0"], "budget nodes (--max-nodes) must be a whole number >= 1, got 0"),
    (["--max-iterations", "-1"], "(--max-iterations) must be a whole number >= 0, got -1"),
    (["--max-seconds", "0"], "(--max-seconds) must be a number > 0, got 0.0"),
    (["--max-seconds", "-2.5"], "(--max-seconds) must be a number > 0, got -2.5"),
    (["--ilp-seconds", "-1"], "(--ilp-seconds) must be a number > 0, got -1.0"),
])
def test_negative_or_zero_budgets_are_refused(capsys, args, message):
    assert main(["optimize", RESNET, *args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eqsat-fuse: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["verify", "optimize"])
def test_a_reader_that_goes_away_ends_the_command_quietly(command):
    # `eqsat-fuse verify MODEL | head -1`: head is gone before anything is printed
    proc = subprocess.Popen([sys.executable, "-m", "eqsat_fuse.cli", command, RESNET, "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141               # what a shell shows for SIGPIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_several_input_shapes_follow_one_flag(capsys):
    bert = str(MODELS_DIR / "bert_tiny_op17.onnx")
    assert main(["optimize", bert, "--input-shape", "input_ids=1,16", "attention_mask=1,16",
                 "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels_out"] > 0
    with pytest.raises(SystemExit) as info:          # the model after the shapes is read as one
        main(["optimize", "--input-shape", "input_ids=1,16", bert])
    assert info.value.code == 2
    assert "give MODEL before --input-shape" in capsys.readouterr().err


def test_a_resized_input_verifies_against_the_resized_original():
    code, out, err = run_cli("verify", RESNET, "--input-shape", "pixel_values=4,3,64,64",
                             "--quiet")
    assert code == 0, err
    assert "verify against onnxruntime: OK" in out


def test_float16_storage_and_its_looser_tolerance_are_said_and_can_be_declined(capsys):
    assert main(["verify", RESNET, "--target", "edge-npu", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "intermediates are stored in float16, so float outputs are held to float16's " \
           "tolerances (rtol 0.01, atol 0.01)" in out
    assert main(["verify", RESNET, "--target", "edge-npu", "--storage-dtype", "float32",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "float16" not in out and "rtol 0.001, atol 0.0001" in out
    assert main(["optimize", RESNET, "--target", "edge-npu", "--quiet"]) == 0
    assert "storage       intermediates in float16" in capsys.readouterr().out
    assert main(["optimize", RESNET, "--target", "cpu", "--storage-dtype", "float16",
                 "--quiet"]) == 0
    assert "storage       intermediates in float16" in capsys.readouterr().out


def test_bad_rule_file_is_named_with_line_and_column(tmp_path):
    rules = tmp_path / "bad.egg"
    rules.write_text('\n\n(rewrite (Relu x) (Nope x) :ruleset fuse :name "oops")\n')
    code, _, err = run_cli("optimize", RESNET, "--rules", str(rules), "--quiet")
    assert code == 2
    assert f"{rules}:3:" in err and "Unbound function Nope" in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("eqsat-fuse: error: ")
    assert len([line for line in err.splitlines() if not line.startswith("[")]) == 1


def test_wrong_feed_names_the_input(tmp_path):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, pixel_values=np.zeros((1, 3, 32, 32), np.float32))
    code, _, err = run_cli("run", RESNET, "--inputs", str(feeds), "--quiet")
    assert code == 2
    assert "input 'pixel_values' has shape [1, 3, 32, 32]" in err and "[1, 3, 64, 64]" in err


def test_threads_sets_the_programs_thread_count_and_a_bad_one_is_refused(capsys):
    assert main(["optimize", RESNET, "--threads", "1", "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend_report"]["threads"] == 1
    assert main(["optimize", RESNET, "--threads", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "threads must be a whole number >= 1" in err and err.count("\n") == 1
