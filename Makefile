# rmqstore: `make test`, `make demo`, `make bench [SCALE=...]`, `make clean`.
# Each target creates .venv when it is missing (python3.11, else python3) and installs the package
# editable with the extras it needs; a stamp file per extras set re-runs pip only when
# pyproject.toml changes.

VENV      := .venv
PY        := $(VENV)/bin/python
SCALE     ?= full
PYTEST_ARGS ?=

.PHONY: all test demo bench clean distclean install

all: test

$(PY):
	@if command -v python3.11 >/dev/null 2>&1; then python3.11 -m venv $(VENV); \
	else python3 -m venv $(VENV); fi

# .venv/.stamp-X installs '.[X]' (X a comma-separated list of extras; 'base' installs '.').
$(VENV)/.stamp-%: pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -e '.$(if $(filter base,$*),,[$*])'
	@touch $@

install: $(VENV)/.stamp-spark,test,bench

# Two workers (pytest-xdist), a test module per worker at a time: the suite's Spark sessions, child
# processes and tmpfs mounts stay within their module. PYTEST_ARGS='-n 0' runs it in one process.
test: $(VENV)/.stamp-spark,test,bench
	$(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

demo: $(VENV)/.stamp-spark
	$(PY) -m rmqstore.tools.demo

bench: $(VENV)/.stamp-spark,bench
	$(PY) -m rmqstore.tools.benchsuite --scale $(SCALE)

# Generated files only; the virtualenv stays (`make distclean` removes it too).
clean:
	rm -rf demo-store .pytest_cache .hypothesis build dist src/*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
