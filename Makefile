# rmqstore: `make test`, `make demo`, `make bench [SCALE=...]`, `make clean`.
# Each target creates .venv when it is missing (python3.11, else python3) and installs the package
# editable with the extras it needs; a stamp file per extras set re-runs pip only when
# pyproject.toml changes.

VENV      := .venv
PY        := $(VENV)/bin/python
SCALE     ?= full
PYTEST_ARGS ?=

.PHONY: all test demo bench clean distclean install node-client

all: test

# Python's bytecode cache goes to .venv/pycache and is written even where PYTHONDONTWRITEBYTECODE is set (as on
# the machines this was built on): else every process of the suite (pytest workers, Spark's Python workers,
# the CLI's children) compiled numpy, pyarrow and pyspark again, 74 s of a fresh clone's `make test`.
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache

$(PY):
	@if command -v python3.11 >/dev/null 2>&1; then python3.11 -m venv $(VENV); \
	else python3 -m venv $(VENV); fi

# .venv/.stamp-X installs '.[X]' (X a comma-separated list of extras; 'base' installs '.'). With uv
# (from PyPI, into the venv) when it installs: about half pip's time on a fresh machine (pyspark, grpcio);
# else with pip.
# pyspark comes from PyPI as a source package, built on the machine: the install takes about 3 GB of disk
# (1.1 GB .venv, 1.9 GB of uv's cache in ~/.cache/uv; measured on a fresh machine). With less free than that
# make says so before pip's own "No space left on device" (it goes on: the cache may already hold it).
$(VENV)/.stamp-%: pyproject.toml | $(PY)
	@free=$$(df -Pm "$${UV_CACHE_DIR:-$$HOME/.cache}" . 2>/dev/null | awk 'NR>1 {print $$4}' | sort -n | head -1); \
	if [ -n "$$free" ] && [ "$$free" -lt 3500 ]; then \
		echo "make: only $$free MB free on $$(df -P . | awk 'NR>1 {print $$6}') or ~/.cache;" \
		"installing pyspark takes about 3 GB (a source build)" >&2; fi
	@spec='.$(if $(filter base,$*),,[$*])'; \
	if $(PY) -m pip install --disable-pip-version-check -q uv >/dev/null 2>&1 && \
		$(PY) -m uv pip install -q --python $(PY) -e "$$spec"; then :; \
	else echo "installing with pip"; $(PY) -m pip install --disable-pip-version-check -q -e "$$spec"; fi
	@touch $@

install: $(VENV)/.stamp-spark,test,bench,grpc,docs

# Three workers (pytest-xdist) on two cores, a test module per worker at a time: the suite's Spark sessions,
# child processes and tmpfs mounts stay within their module; the longest modules start first (tests/conftest.py
# MODULE_SECONDS; --no-loadscope-reorder keeps that order). Two workers left the cores idle a fifth of the time
# (tests waiting on child processes, brokers and Spark's workers): 81 % busy against 98 % with three, and
# 853 s against 745 s of pytest in runs of the same hour. PYTEST_ARGS='-n 0' runs it in one process.
# It needs the golden stores RocketMQ 4.4.0 wrote: $RMQSTORE_GOLDEN, by default ../shared/golden beside the
# repository.
RMQSTORE_GOLDEN ?= $(abspath ../shared/golden)
export RMQSTORE_GOLDEN
test: $(VENV)/.stamp-spark,test,bench,grpc,docs node-client
	@echo "make test: 8 to 10 minutes on 2 cores; golden data from RMQSTORE_GOLDEN=$(RMQSTORE_GOLDEN)"
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The official Node 5.x client for tests/proxy/test_grpc_node.py, when npm is there (else that test skips).
node-client:
	@if command -v npm >/dev/null 2>&1 && [ ! -d .node/node_modules/rocketmq-client-nodejs ]; then \
		npm install --prefix .node --no-audit --no-fund --silent rocketmq-client-nodejs@1.0.8 \
		|| echo "npm install of rocketmq-client-nodejs failed: tests/proxy/test_grpc_node.py will skip"; fi

demo: $(VENV)/.stamp-spark
	$(PY) -m rmqstore.tools.demo

bench: $(VENV)/.stamp-spark,bench
	$(PY) -m rmqstore.tools.benchsuite --scale $(SCALE)

# Generated files only; the virtualenv stays (`make distclean` removes it too).
clean:
	rm -rf demo-store .pytest_cache .hypothesis build dist src/*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .node
