# batchq developer tasks (GNU make).

PY ?= python3
VENV = .venv
BIN = $(VENV)/bin
PYTEST_ARGS ?=
LINT_PATHS = batchq tests $(wildcard bench)

.PHONY: install lint test demo clean tools

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

# promtool + prometheus (Debian package `prometheus`) for tests/ops. Installed only when
# missing and possible (apt-get, as root or with password-less sudo); never fails the
# build: without them the promtool and live-Prometheus tests skip.
tools:
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then \
	  :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 \
	  || { $$SUDO apt-get update >/dev/null 2>&1 && \
	       $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; } \
	  || echo "make tools: could not install prometheus; tests/ops promtool/live tests will skip" >&2; \
	else \
	  echo "make tools: no apt-get; install promtool and prometheus to run all of tests/ops" >&2; \
	fi

test: lint tools
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

demo: $(VENV)/.installed
	$(BIN)/python -m batchq.dev.demo

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
