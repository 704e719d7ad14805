"""The Numba backend end to end: every exported model, compiled with backend="numba", matches
onnxruntime; nothing falls back to NumPy; float16 storage; the kernel cache on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.checking.verify import random_feeds

from conftest import MODELS_DIR, compile_in_two_processes, make_model, real_models

MODELS = [m["file"] for m in real_models()]


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """One kernel cache for the whole session (JIT once per kernel), never the user's cache."""
    return tmp_path_factory.getbasetemp() / "numba-kernel-cache"


@pytest.fixture(scope="module", params=MODELS)
def compiled(request, kernel_cache):
    return request.param, ef.compile(MODELS_DIR / request.param, backend="numba",
                                     cache_dir=kernel_cache)


@pytest.fixture(scope="module", params=["numpy", "numba"])
def backend(request):
    return request.param


def test_real_model_matches_onnxruntime_on_numba(compiled):
    name, program = compiled
    result = program.verify(seed=1)
    assert result.ok, f"{name}\n{result.summary()}"
    for check in result.outputs:
        assert check.rtol <= 1e-3 and check.atol <= 1e-4


def test_no_kernel_falls_back_to_numpy(compiled):
    name, program = compiled
    info = program.report.backend_report
    assert info["backend"] == "numba"
    assert info["fallback_kernels"] == [], name
    assert info["compiled_kernels"] > 0


@pytest.mark.parametrize("file", ["bert_tiny_op17.onnx", "gpt2_tiny_op17.onnx"])
def test_the_layers_of_a_transformer_share_their_generated_kernels(file, kernel_cache):
    """The second layer's kernels that read no weights (attention, softmax, norms, adds) are
    the first one's over other buffers: the generator writes each once and the second layer
    runs it renamed (`backends.numba.geometry`), and the program still computes what
    onnxruntime does."""
    program = ef.compile(MODELS_DIR / file, backend="numba", cache_dir=kernel_cache)
    info = program.report.backend_report
    assert 0 < info["generated_kernels"] < info["compiled_kernels"], info
    result = program.verify(seed=3)
    assert result.ok, result.summary()


def test_numba_runs_are_repeatable_and_outputs_are_owned_by_the_caller(compiled):
    name, program = compiled
    feeds = random_feeds(program.plan.inputs, 2)
    first = program.run(feeds)
    kept = {k: v.copy() for k, v in first.items()}
    second = program.run(feeds)
    for key in first:
        np.testing.assert_array_equal(first[key], kept[key])     # not overwritten by run 2
        np.testing.assert_array_equal(second[key], kept[key])


@pytest.mark.parametrize("file", [
    "resnet_tiny_op17.onnx", "bert_tiny_op17.onnx",
    pytest.param("mobilenetv2_tiny_op17.onnx", marks=pytest.mark.slow),
    pytest.param("vit_tiny_op17.onnx", marks=pytest.mark.slow)])
def test_float16_storage_matches_at_float16_tolerance(file, backend, kernel_cache):
    program = ef.compile(MODELS_DIR / file, backend=backend, storage_dtype="float16",
                         cache_dir=kernel_cache)
    assert program.report.backend_report["storage_dtype"] == "float16"
    result = program.verify(seed=1)
    assert result.ok, result.summary()
    assert all(c.rtol == 1e-2 for c in result.outputs if c.rtol)
    # graph outputs keep the model's dtype
    out = program.run(random_feeds(program.plan.inputs, 0))
    assert all(v.dtype == np.float32 for v in out.values() if v.dtype.kind == "f")


def _odd_names_model():
    """A model whose names are code-like strings: none may reach generated source."""
    rng = np.random.default_rng(0)
    x, w = "x'); import os; os.system('echo pwned') #", "w\"\"\"\nraise SystemExit"
    y = "y = __import__('os')"
    nodes = [helper.make_node("MatMul", [x, w], ["mm\n\t"], name="n'\"1"),
             helper.make_node("Relu", ["mm\n\t"], ["r#"], name="n2"),
             helper.make_node("Sigmoid", ["r#"], ["s"], name="n3"),
             helper.make_node("Mul", ["s", "r#"], [y], name="n4")]
    return make_model(nodes, [(x, [4, 8])], [(y, [4, 6])],
                      {w: rng.standard_normal((8, 6)).astype(np.float32)})


def test_generated_source_never_contains_model_text(tmp_path):
    program = ef.compile(_odd_names_model(), backend="numba", cache_dir=tmp_path)
    assert program.verify().ok
    sources = "".join(p.read_text() for p in tmp_path.glob("*.py"))
    assert sources
    for fragment in ("pwned", "SystemExit", "__import__", "mm\n", "n'"):
        assert fragment not in sources


def test_second_process_loads_kernels_from_the_disk_cache(tmp_path):
    model = tmp_path / "m.onnx"
    import onnx
    onnx.save(_odd_names_model(), model)
    runs = compile_in_two_processes(model, tmp_path / "cache")
    (compiled_1, loaded_1, ok_1), (compiled_2, loaded_2, ok_2) = runs
    assert ok_1 and ok_2
    assert compiled_1 > 0
    assert compiled_2 == 0 and loaded_2 == compiled_1 + loaded_1


def test_an_edited_cache_file_is_rewritten_not_run(tmp_path):
    """A generated module in the cache is run only if it holds the source its name hashes."""
    cache = tmp_path / "cache"
    first = ef.compile(_odd_names_model(), backend="numba", cache_dir=cache)
    marker = tmp_path / "ran"
    files = sorted(cache.glob("*.py"))
    assert files
    for path in files:     # someone appends code to every cached module
        path.write_text(path.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    # a fresh process (this one has the modules imported already)
    script = textwrap.dedent(f"""
        import onnx, eqsat_fuse as ef
        from test_numba_models import _odd_names_model
        c = ef.compile(_odd_names_model(), backend="numba", cache_dir={str(cache)!r})
        print(c.verify().ok)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.strip().splitlines()[-1] == "True"
    assert not marker.exists()
    assert all(str(marker) not in path.read_text() for path in files)   # rewritten
    assert first.verify().ok


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    from eqsat_fuse.backends.numba.backend import default_cache_dir
    monkeypatch.setenv("EQSAT_FUSE_CACHE_DIR", str(tmp_path / "k"))
    assert default_cache_dir() == tmp_path / "k"
