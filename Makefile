# Two entry points for a fresh machine: `make run` (the dashboard) and `make test` (the suite).
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: setup run test

setup: $(VENV)/.installed

# torch is pinned to the CPU build that this project's development machines carry on disk.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	@command -v nvcc >/dev/null || $(PY) -m pip install -q -e '.[cuda-pypi]'
	touch $@

run: setup
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_corpus
	$(PY) manage.py collectstatic --noinput -v0
	$(PY) manage.py serve 127.0.0.1:$(PORT)

# Lint first: a ruff finding fails `make test`, and so CI (.ci/run), before the suite runs.
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q
