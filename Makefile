# Two commands do everything on a fresh machine: `make demo` and `make test`.
# The environment is built from uv.lock alone (uv sync --frozen); uv itself is
# installed into .tools/ with pip when it is not on PATH.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
RUN := $(VENV)/bin
COMPILED_TESTS := tests/test_admission.py tests/test_limiter.py tests/test_asgi.py tests/test_estimate.py \
	tests/test_config.py tests/test_metrics.py tests/test_bounded.py \
	tests/limits/test_limits.py tests/limits/test_little.py tests/limits/test_limits_failure_modes.py \
	tests/sim/test_sim_scenarios.py tests/sim/test_sim_engine.py tests/sim/test_sim_targets.py \
	tests/proxy/test_proxy.py tests/client/test_client.py

.PHONY: demo test lint typecheck pytest pytest-compiled compiled bench clean env

env: $(VENV)/.synced

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --all-extras --group dev
	@touch $@

demo: env
	$(RUN)/loadshed demo

lint: env
	$(RUN)/ruff check src tests bench
	$(RUN)/ruff format --check src tests bench

typecheck: env
	$(RUN)/mypy --strict src

pytest: env
	$(RUN)/pytest

# The mypyc build of the per-request hot path (hatch_build.py): a platform wheel in
# dist/compiled, unpacked into build/compiled; PYTHONPATH=build/compiled runs it in
# place of src/ (bench/middleware_instructions.py compares the two). Needs a C
# compiler and Python's headers.
compiled: env
	rm -rf dist/compiled build/compiled
	LOADSHED_MYPYC=1 $(UV) build --quiet --wheel --no-build-isolation --python $(RUN)/python \
		--out-dir dist/compiled
	$(UV) pip install --quiet --python $(RUN)/python --no-deps --target build/compiled \
		dist/compiled/*.whl
	PYTHONPATH=build/compiled $(RUN)/python -c "import loadshed.asgi as m, sys; \
		sys.exit(0 if m.__file__.endswith(('.so', '.pyd')) else 'not compiled: ' + m.__file__)"

# The tests of everything compiled (and what drives it), run against the compiled
# build; skipped with a message where there is no C compiler or no Python headers.
pytest-compiled: env
	@if $(RUN)/python -c "import shutil, sys, sysconfig, pathlib; \
		headers = pathlib.Path(sysconfig.get_paths()['include'], 'Python.h'); \
		sys.exit(0 if (shutil.which('cc') or shutil.which('gcc')) and headers.exists() else 1)"; \
	then $(MAKE) --no-print-directory compiled && \
		PYTHONPATH=build/compiled $(RUN)/pytest -p no:cacheprovider $(COMPILED_TESTS); \
	else echo "pytest-compiled: SKIPPED, no C compiler or no Python.h (the compiled build is optional)"; fi

test: lint typecheck pytest pytest-compiled

clean:
	rm -rf $(VENV) .tools build dist .mypy_cache .pytest_cache .ruff_cache
