# batchq developer tasks (GNU make).

PY ?= python3
VENV = .venv
BIN = $(VENV)/bin
PYTEST_ARGS ?=
LINT_PATHS = batchq tests $(wildcard bench)

.PHONY: install lint test demo clean

install: $(VENV)/.installed

# Create the venv only if missing: re-running `venv` over an existing one made
# by another interpreter version would break it.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

lint: $(VENV)/.installed
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy --strict batchq

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

demo: $(VENV)/.installed
	$(BIN)/python -m batchq.demo

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
