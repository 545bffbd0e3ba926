# batchq developer tasks (GNU make).

PY ?= python3
VENV = .venv
BIN = $(VENV)/bin
PYTEST_ARGS ?=
LINT_PATHS = batchq tests $(wildcard bench)

.PHONY: install lint test demo demo-sendtime clean tools

install: $(VENV)/.installed

# Create the venv only if missing: re-running `venv` over an existing one made
# by another interpreter version would break it.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test,docs]'
	touch $@ $(VENV)/.runtime

# The demo needs only the runtime (batchq and its dependencies), not the test toolchain:
# its own stamp, unless `make install` already installed a superset.
$(VENV)/.runtime: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -e .
	touch $@

lint: $(VENV)/.installed
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy --strict batchq

# Debian packages the tests use, each installed only when its command is missing and
# apt-get can (as root or with password-less sudo); never fails the build: without them
# the tests that need them skip with a message saying so.
#   prometheus (promtool + prometheus): tests/ops
#   chromium + chromium-driver (/usr/bin/chromedriver): the browser tests of tests/web
TOOL_PACKAGES = prometheus:promtool:prometheus chromium:chromium chromium-driver:chromedriver

tools:
	@missing=; \
	for spec in $(TOOL_PACKAGES); do \
	  pkg=$${spec%%:*}; cmds=$${spec#*:}; \
	  for c in $$(echo $$cmds | tr : ' '); do \
	    command -v $$c >/dev/null 2>&1 || { missing="$$missing $$pkg"; break; }; \
	  done; \
	done; \
	if [ -z "$$missing" ]; then \
	  :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; updated=; \
	  for pkg in $$missing; do \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$pkg >/dev/null 2>&1 \
	    || { [ -z "$$updated" ] && updated=1 && $$SUDO apt-get update >/dev/null 2>&1 && \
	         $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$pkg >/dev/null 2>&1; } \
	    || echo "make tools: could not install $$pkg; the tests that need it will skip" >&2; \
	  done; \
	else \
	  echo "make tools: no apt-get; install$$missing to run all of tests/ops and tests/web" >&2; \
	fi

test: lint tools
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

demo: $(VENV)/.runtime
	$(BIN)/python -m batchq.dev.demo

demo-sendtime: $(VENV)/.runtime
	$(BIN)/python -m batchq.dev.demo_sendtime

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
