"""The backend interface (`backends.base`) and registry (`backends.BACKENDS`): what lowering
asks of a backend, checked with a backend registered for the test."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_fuse as ef
from eqsat_fuse import backends
from eqsat_fuse.backends.base import Unsupported
from eqsat_fuse.backends.numpy.backend import NumpyBackend
from eqsat_fuse.checking.verify import random_feeds
from eqsat_fuse.demo import demo_model
from eqsat_fuse.errors import EqsatFuseError
from eqsat_fuse.lowering import lower as lowering


class _RunsNothing(NumpyBackend):
    """A backend that can run no kernel: every kernel falls back to the NumPy evaluation."""

    name = "runs-nothing"

    def prepare(self, kernel):
        return Unsupported("the test backend runs nothing")


@pytest.fixture(scope="module")
def plan():
    return ef.compile(demo_model()).program.plan


def test_the_registry_names_the_backends_lowering_and_the_cli_offer():
    assert tuple(backends.BACKENDS) == ("numba", "numpy") == lowering.BACKENDS
    assert backends.backend_names() == lowering.BACKENDS


def test_the_default_backend_is_numba_and_the_environment_may_name_another(monkeypatch):
    """What a user who names no backend gets (docs/backends.md gives the measurements), in the
    library and the CLI alike; the suite itself runs such compiles on NumPy (conftest)."""
    import subprocess
    import sys
    monkeypatch.delenv(backends.DEFAULT_ENV, raising=False)
    assert ef.compile(demo_model()).report.backend == "numba"
    cli = subprocess.run([sys.executable, "-m", "eqsat_fuse.cli", "demo"], capture_output=True,
                         text=True)
    assert cli.returncode == 0, cli.stderr
    assert "backend numba" in cli.stdout
    monkeypatch.setenv(backends.DEFAULT_ENV, "numpy")
    assert ef.compile(demo_model()).report.backend == "numpy"
    assert ef.compile(demo_model(), backend="numba").report.backend == "numba"   # explicit wins
    monkeypatch.setenv(backends.DEFAULT_ENV, "cuda")
    with pytest.raises(EqsatFuseError, match="EQSAT_FUSE_BACKEND='cuda' is not a backend"):
        ef.compile(demo_model())


def test_an_unknown_backend_is_refused_with_the_registered_names(plan):
    with pytest.raises(EqsatFuseError, match="choose one of numba, numpy"):
        lowering.lower(plan, "cuda")


def test_a_registered_backend_is_driven_through_the_interface(plan, monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "runs-nothing", _RunsNothing)
    feeds = random_feeds(plan.inputs, seed=0)
    program = lowering.lower(plan, "runs-nothing")
    reference = lowering.lower(plan, "numpy")
    report = program.report
    assert program.backend == "runs-nothing" and report.compiled_kernels == 0
    assert len(report.fallback_kernels) + report.copy_kernels + report.opaque_kernels \
        == report.kernels == reference.report.kernels
    assert all(f.endswith("(the test backend runs nothing)") for f in report.fallback_kernels)
    got, want = program.run(feeds), reference.run(feeds)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
