# The two commands a newcomer runs: `make demo` and `make test`.
# Both create ./.venv on first use and install everything (torch 2.14.1, SGLang 0.5.23, ~5 min).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specdiff-installed

.PHONY: install demo test lint bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1
	$(PY) -m pip install -q -e ".[sglang,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdiff demo $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
