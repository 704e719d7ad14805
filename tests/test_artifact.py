"""Saved artifacts (issue 20 item 1): `Compiled.save` -> `eqsat_fuse.load` in a fresh process
gives the same outputs bit for bit with no JIT; a tampered, truncated or foreign artifact is
refused with one clear line (or, for another machine or version, recompiled with a warning);
nothing is overwritten without force, and never the model."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import eqsat_fuse as ef
from eqsat_fuse.artifacts import FORMAT_VERSION
from eqsat_fuse.artifacts.store import _npy
from eqsat_fuse.cli import main

from conftest import MODELS_DIR, make_model


def _model(rng):
    """x -> Conv+Relu -> flatten -> MatMul+Add -> Softmax (y), and Less(x, c) (m, an opaque
    node): compiled kernels, a view, a constant-weight product and an opaque step."""
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32),
             "shape": np.array([1, 64], np.int64),
             "fc": rng.standard_normal((64, 10)).astype(np.float32),
             "fb": rng.standard_normal(10).astype(np.float32),
             "c": np.float32(0.25)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("Reshape", ["relu", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "fc"], ["mm"]),
             helper.make_node("Add", ["mm", "fb"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
             helper.make_node("Less", ["x", "c"], ["m"])]
    return make_model(nodes, [("x", [1, 3, 4, 4])],
                      [("y", [1, 10]), ("m", [1, 3, 4, 4], TensorProto.BOOL)], inits)


def _feeds(compiled) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {name: rng.standard_normal(spec.shape).astype(spec.dtype)
            for name, spec in compiled.inputs.items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """backend -> (artifact folder, feeds, outputs of the compiled program); the Numba one
    compiled in this process (its modules stay loaded), the NumPy one in numerics="fast"."""
    root = tmp_path_factory.mktemp("artifacts")
    model = root / "model.onnx"
    model.write_bytes(_model(np.random.default_rng(0)).SerializeToString())
    out = {}
    for backend, numerics in (("numba", "exact"), ("numpy", "fast")):
        compiled = ef.compile(model, backend=backend, numerics=numerics,
                              cache_dir=root / "kernel-cache")
        feeds = _feeds(compiled)
        folder = compiled.save(root / f"{backend}.eqsat")
        out[backend] = (folder, feeds, compiled.run(feeds))
    return out


def _load_in_fresh_process(folder: Path, feeds: dict, tmp_path: Path) -> tuple[dict, dict]:
    """Load and run the artifact in a new Python: (outputs, what it reports: Numba compile
    events, the backend's JIT counts, the numerics mode)."""
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = textwrap.dedent(f"""
        import json, numpy as np
        from numba.core import event
        import eqsat_fuse as ef
        with event.install_recorder("numba:compile") as compiles:
            program = ef.load({str(folder)!r})
            outputs = program.run(dict(np.load({str(tmp_path / 'feeds.npz')!r})))
        np.savez({str(tmp_path / 'outputs.npz')!r}, **outputs)
        b = program.report.backend_report
        print(json.dumps({{"compile_events": len(compiles.buffer), "jit_compiled":
                          b["jit_compiled"], "jit_loaded": b["jit_loaded"],
                          "sources": b["sources"], "numerics": program.report.numerics}}))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    with np.load(tmp_path / "outputs.npz") as data:
        outputs = {name: data[name] for name in data.files}
    return outputs, json.loads(run.stdout.strip().splitlines()[-1])


def _assert_bit_for_bit(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        assert got[name].tobytes() == want[name].tobytes(), name


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_loaded_artifact_runs_bit_for_bit_in_a_fresh_process_without_jit(saved, backend,
                                                                           tmp_path):
    folder, feeds, want = saved[backend]
    got, facts = _load_in_fresh_process(folder, feeds, tmp_path)
    _assert_bit_for_bit(got, want)
    assert facts["compile_events"] == 0 and facts["jit_compiled"] == 0
    if backend == "numba":
        assert facts["jit_loaded"] == facts["sources"] > 0
    else:
        assert facts["numerics"] == "fast"


def test_the_manifest_records_versions_cpu_and_every_files_hash(saved):
    folder = saved["numba"][0]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["environment"]["cpu"]["name"] and manifest["environment"]["numba"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == on_disk - {"manifest.json"}
    assert any(name.endswith(".nbi") for name in manifest["files"])
    assert any(name.startswith("kernels/k_") for name in manifest["files"])


def _copy(saved, tmp_path, backend="numba") -> Path:
    copy = tmp_path / "copy.eqsat"
    shutil.copytree(saved[backend][0], copy)
    return copy


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda a: _flip_last_byte(a / "constants" / "0.npy"),
     r"constants/0\.npy is not the file that was saved"),
    (lambda a: next((a / "kernels").glob("k_*.py")).write_text("import os\n"),
     r"kernels/k_\w+\.py is not the file that was saved"),
    (lambda a: _flip_last_byte(next((a / "kernels" / "numba").glob("*.nbi"))),
     r"kernels/numba/.*\.nbi is not the file that was saved"),
    (lambda a: (a / "program.json").unlink(), r"program\.json is missing"),
    (lambda a: (a / "manifest.json").write_text((a / "manifest.json").read_text()[:200]),
     r"manifest\.json is damaged or truncated"),
    (lambda a: (a / "manifest.json").write_text(
        (a / "manifest.json").read_text().replace('"format_version": 1', '"format_version": 9')),
     r"artifact format version 9 .* reads version 1"),
])
def test_a_tampered_or_truncated_artifact_is_refused_with_one_clear_line(saved, tmp_path, damage,
                                                                         message):
    copy = _copy(saved, tmp_path)
    damage(copy)
    with pytest.raises(ef.ArtifactError, match=message) as caught:
        ef.load(copy)
    assert "\n" not in str(caught.value)


def _foreign(saved, tmp_path) -> Path:
    """The Numba artifact as if saved with another Numba."""
    copy = _copy(saved, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["environment"]["numba"] = "0.1.0"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_an_artifact_from_another_numba_is_recompiled_with_a_warning_or_refused(saved, tmp_path):
    copy = _foreign(saved, tmp_path)
    with pytest.warns(ef.ArtifactWarning, match=r"compiled for Numba 0\.1\.0 \(this is .*\): "
                                                r"compiling them again"):
        program = ef.load(copy)
    _, feeds, want = saved["numba"]
    _assert_bit_for_bit(program.run(feeds), want)
    with pytest.raises(ef.ArtifactError, match=r"compiled for Numba 0\.1\.0.*recompile=True"):
        ef.load(copy, recompile=False)


def test_saved_kernels_false_hands_numba_no_file_of_the_artifact(saved, monkeypatch):
    from eqsat_fuse.artifacts import store

    def refuse(*args):
        raise AssertionError("a cache file of the artifact was placed for Numba")

    monkeypatch.setattr(store.kernels, "place", refuse)
    folder, feeds, want = saved["numba"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # compiling is asked for: no warning
        _assert_bit_for_bit(ef.load(folder, saved_kernels=False).run(feeds), want)


def test_the_files_are_read_in_a_thread_beside_the_warm_up_and_a_failure_there_is_harmless(
        saved, monkeypatch):
    import threading

    from eqsat_fuse import backends
    from eqsat_fuse.artifacts import reading
    seen = []
    real_read = reading.read_files

    def read_files(path, listed):
        seen.append(("read", threading.current_thread() is threading.main_thread()))
        return real_read(path, listed)

    def fail(name):
        seen.append((name, threading.current_thread() is threading.main_thread()))
        raise RuntimeError("the warm-up broke")

    monkeypatch.setattr(reading, "read_files", read_files)
    monkeypatch.setattr(backends, "warm_up", fail)
    folder, feeds, want = saved["numba"]
    _assert_bit_for_bit(ef.load(folder).run(feeds), want)        # lowering did it itself
    assert sorted(seen) == [("numba", True), ("read", False)]


def test_a_damaged_artifact_read_in_the_thread_is_refused_in_the_caller(saved, tmp_path):
    copy = _copy(saved, tmp_path)
    _flip_last_byte(copy / "program.json")
    with pytest.raises(ef.ArtifactError, match="program.json is not the file that was saved"):
        ef.load(copy)


def test_the_numba_warm_up_loads_the_microkernel_and_the_segment_loop():
    from numba import typeof

    from eqsat_fuse import backends
    from eqsat_fuse.backends.numba import packed_gemm as PG
    from eqsat_fuse.backends.numba.calls import run_calls
    backends.warm_up("numba")
    ints, floats = typeof(np.zeros(1, np.int64)), typeof(np.zeros(1, np.float32))
    assert (ints, ints, ints, ints, floats) in run_calls.overloads
    assert PG._ENGINE is not None or not PG.AVAILABLE
    backends.warm_up("numpy")                 # a backend with nothing to warm: nothing happens


def test_save_never_overwrites_without_force_nor_the_model(saved, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(_model(np.random.default_rng(1)).SerializeToString())
    compiled = ef.compile(model)
    target = compiled.save(tmp_path / "a.eqsat")
    with pytest.raises(ef.ArtifactError, match=r"already exists; pass force=True"):
        compiled.save(target)
    (target / "constants" / "0.npy").write_bytes(b"damaged")
    compiled.save(target, force=True)                     # an artifact is replaced with force
    assert ef.load(target).run(_feeds(compiled)).keys() == {"y", "m"}
    with pytest.raises(ef.ArtifactError, match="refusing to overwrite the input model"):
        compiled.save(model, force=True)
    with pytest.raises(ef.ArtifactError, match="refusing to overwrite the input model"):
        compiled.save(tmp_path, force=True)               # the folder that holds the model
    other = tmp_path / "notes"
    other.mkdir()
    with pytest.raises(ef.ArtifactError, match="not an eqsat-fuse artifact; refusing"):
        compiled.save(other, force=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp left


def test_a_loaded_program_saves_again_with_the_same_kernels(saved, tmp_path):
    folder, feeds, want = saved["numba"]
    again = ef.load(folder).save(tmp_path / "again.eqsat")
    _assert_bit_for_bit(ef.load(again).run(feeds), want)
    files = [json.loads((f / "manifest.json").read_text())["files"] for f in (folder, again)]
    assert {k: v for k, v in files[1].items() if k.startswith("kernels/")} == \
        {k: v for k, v in files[0].items() if k.startswith("kernels/")}


def test_a_loaded_program_says_verify_needs_the_model(saved):
    program = ef.load(saved["numpy"][0])
    assert program.outputs["y"].shape == (1, 10)
    with pytest.raises(ef.EqsatFuseError, match="verify needs the ONNX model"):
        program.verify()


def test_cli_optimize_save_then_run_the_artifact(tmp_path, capsys):
    model = MODELS_DIR / "resnet_tiny_op17.onnx"
    folder = tmp_path / "resnet.eqsat"
    assert main(["optimize", str(model), "--save", str(folder), "--quiet"]) == 0
    assert f"wrote the compiled program to {folder}" in capsys.readouterr().out
    program = ef.load(folder)
    feeds = _feeds(program)
    np.savez(tmp_path / "feeds.npz", **feeds)
    assert main(["run", str(folder), "--inputs", str(tmp_path / "feeds.npz"),
                 "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as data:
        _assert_bit_for_bit({name: data[name] for name in data.files}, program.run(feeds))
    assert main(["optimize", str(model), "--save", str(folder), "--quiet"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main(["run", str(folder), "--inputs", str(tmp_path / "feeds.npz"),
                 "--backend", "numba"]) == 2
    assert "is a saved artifact, already compiled: --backend does not apply" \
        in capsys.readouterr().err
    _flip_last_byte(folder / "program.json")
    assert main(["run", str(folder), "--inputs", str(tmp_path / "feeds.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eqsat-fuse: error: ") and err.count("\n") == 1
    assert "program.json is not the file that was saved" in err


def test_cli_run_prints_a_foreign_artifacts_warning_in_one_line(saved, tmp_path, capsys):
    copy = _foreign(saved, tmp_path)
    np.savez(tmp_path / "feeds.npz", **saved["numba"][1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # none escapes as a Python warning
        assert main(["run", str(copy), "--inputs", str(tmp_path / "feeds.npz")]) == 0
    err = capsys.readouterr().err
    assert "[eqsat-fuse] warning: " in err and "compiling them again" in err


def test_a_process_that_only_loads_and_runs_imports_no_compiler(saved, tmp_path):
    # `import eqsat_fuse` imports the rest on first use; loading and running an artifact needs
    # lowering and the backend, not saturation (egglog), the rule checker or SciPy's special
    # functions (Numba itself imports the bare `scipy` package to check its version)
    folder, feeds, want = saved["numba"]
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = textwrap.dedent(f"""
        import sys, numpy as np
        import eqsat_fuse as ef
        bare = sorted(m for m in ("numba", "egglog", "scipy", "onnxruntime", "onnx")
                      if m in sys.modules)
        outputs = ef.load({str(folder)!r}).run(dict(np.load({str(tmp_path / 'feeds.npz')!r})))
        print(bare, sorted(m for m in ("egglog", "scipy.special", "eqsat_fuse.saturation.saturate",
                                       "eqsat_fuse.checking.rulecheck") if m in sys.modules))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[]", "[]"]


def test_loading_imports_onnx_only_for_a_program_with_opaque_nodes():
    # what loads and lowers a saved program imports no `onnx` (0.1 s) and no importer: only an
    # Opaque node, which runs through onnx.reference, needs it
    script = ("import sys, eqsat_fuse.compiled, eqsat_fuse.artifacts.store, "
              "eqsat_fuse.lowering.lower, eqsat_fuse.backends.numba.binder; "
              "print(sorted(m for m in ('onnx', 'eqsat_fuse.frontend.importer') "
              "if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("value", [
    np.zeros((3, 5), np.float32), np.arange(7, dtype=np.int64), np.array(2.5, np.float64),
    np.zeros((2, 0, 3), np.float16), np.ones((1, 1, 1, 1), bool), np.arange(4, dtype=">i4")])
def test_constants_read_back_from_the_headers_numpy_writes(value):
    data = io.BytesIO()
    np.lib.format.write_array(data, value, allow_pickle=False)
    back = _npy(data.getvalue(), "constants/0.npy")
    assert back.dtype == value.dtype and back.shape == value.shape
    assert back.tobytes() == value.tobytes()


def test_a_constant_of_fortran_order_or_short_data_is_refused():
    data = io.BytesIO()
    np.lib.format.write_array(data, np.zeros((3, 4), np.float32, order="F"), allow_pickle=False)
    with pytest.raises(ef.ArtifactError, match="Fortran-ordered"):
        _npy(data.getvalue(), "constants/0.npy")
    data = io.BytesIO()
    np.lib.format.write_array(data, np.zeros((3, 4), np.float32), allow_pickle=False)
    with pytest.raises(ef.ArtifactError, match=r"does not fill its shape \[3, 4\]"):
        _npy(data.getvalue()[:-4], "constants/0.npy")


def test_the_lazy_package_exports_every_public_name():
    for name in ef.__all__:
        assert getattr(ef, name) is not None
    assert set(ef.__all__) <= set(dir(ef))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ef.nothing


def test_the_cli_imports_no_egglog_until_rules_run():
    # `eqsat-fuse --version` and `run DIR` start without importing egglog (0.2 s)
    script = "import sys, eqsat_fuse.cli; print('egglog' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
