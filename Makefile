# The two set-up commands (see README): `make demo` runs the main job on the embedded example,
# `make test` runs the test suite. Both create .venv with a Python >= 3.12 when it is missing.

VENV    := .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
# Test processes (pytest-xdist): one per core, at most 4; a file's tests stay in one process, so
# its module fixtures are built once. TEST_JOBS=0 runs the suite in this process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); if [ $$n -gt 4 ]; then n=4; fi; \
	if [ $$n -lt 2 ]; then n=0; fi; echo $$n)
XDIST   := -n $(TEST_JOBS) --dist loadfile

.PHONY: demo test test-slow fuzz rules venv clean

demo: $(STAMP)
	$(VENV)/bin/eqsat-fuse demo

test: $(STAMP)
	$(PYTHON) -m pytest -q $(XDIST)

# The long sweeps that the default run skips.
test-slow: $(STAMP)
	$(PYTHON) -m pytest -q -m slow

# Random ONNX graphs against onnxruntime: FUZZ_EXAMPLES per backend (default 2000).
fuzz: $(STAMP)
	$(PYTHON) -m pytest -q -s -m fuzz tests/test_fuzz_graphs.py tests/test_fuzz_edges.py

# rules/generated.egg from the operator table (eqsat_fuse/ops.py); a test checks it is current.
rules: $(STAMP)
	$(PYTHON) -m eqsat_fuse.saturation.rulegen

venv: $(STAMP)

$(PYTHON):
	@base=$$(scripts/find-python) || exit 1; \
	echo "creating $(VENV) with $$base"; \
	"$$base" -m venv $(VENV)

$(STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test,docs,cluster]'
	@touch $(STAMP)

clean:
	rm -rf $(VENV) build dist *.egg-info
