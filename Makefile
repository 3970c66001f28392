# Two commands do everything on a fresh machine: `make demo` and `make test`.
# The environment is built from uv.lock alone (uv sync --frozen); uv itself is
# installed into .tools/ with pip when it is not on PATH.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
RUN := $(VENV)/bin

.PHONY: demo test lint typecheck pytest bench clean env

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

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .tools .mypy_cache .pytest_cache .ruff_cache
