# Two commands on a fresh machine: `make demo` (train on the bundled CoDEx-S, serve, predict) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATASETS ?= ../shared/datasets

.PHONY: venv demo test compose-test cuda-image serve console-shot fuzz bench-speed bench-bundle bench-extend wordnet-full clean

# torch==2.13.0 first: on these machines pip takes the CPU wheel from local disk; any other version
# (or a bare `torch`) would pull a multi-GB CUDA build. The package itself asks only torch>=2.3, in its train extra.
# The bench extra (PyKEEN, the paper tables' peers) too: the suite tests the benchmark harness's PyKEEN runs.
$(BIN)/earl: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train,serve,dev,bench]'
	@touch $@

venv: $(BIN)/earl

demo: venv
	$(BIN)/python scripts/demo.py

# Lint and types first (seconds), then the suite in two processes (pytest-xdist), a test file to each at a time:
# most tests use one core (real servers, subprocesses, small graphs), so one process left the second core idle.
test: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest tests -n 2 --dist loadfile

# The Docker images built offline and the compose stack run end to end on 127.0.0.1 (docker/compose_test.sh):
# needs root (apt-get, dockerd), not the venv; prints SKIPPED where dockerd cannot start.
compose-test:
	bash docker/compose_test.sh

# The CUDA worker image built offline from the same Debian base, its size recorded and its smoke test run inside on
# the CPU (docker/cuda_image.sh; bench/results/cuda_image.*). Needs ~20 GB of disk and PyPI for the wheelhouse.
cuda-image:
	bash docker/cuda_image.sh

serve: venv
	$(BIN)/earl serve

# docs/console.png: EARL trained 6 minutes on FB15k-237 (labelled: entities.tsv, relations.tsv), registered with a live
# uvicorn, queried in Debian's chromium (scripts/console_shot.py; reuses runs/console-shot, --retrain to train again).
console-shot: venv
	$(BIN)/python scripts/console_shot.py --data $(DATASETS)/fb15k-237

# schemathesis against a live uvicorn (bench/fuzz.py): 100 examples per operation and phase, at most 10 minutes;
# fails on any 5xx. The test suite runs a 30-second version (tests/api/test_fuzz.py).
FUZZ_BUNDLE := runs/fuzz/bundle.safetensors
$(FUZZ_BUNDLE): | venv
	$(BIN)/earl train earl_service/demo_data/codex-s --out runs/fuzz --dim 16 --steps 30 --batch-size 256 \
		--negatives 16 --eval-every 0 --no-final-eval --threads 1 --no-progress

fuzz: venv $(FUZZ_BUNDLE)
	$(BIN)/python bench/fuzz.py $(FUZZ_BUNDLE) --examples 100 --max-time 600

bench-speed: venv
	$(BIN)/python bench/speed.py --datasets $(DATASETS)

bench-bundle: venv
	$(BIN)/python bench/bundle_sizes.py --datasets $(DATASETS)

bench-extend: venv
	$(BIN)/python bench/extend.py --datasets $(DATASETS)

# WordNet 3.0 whole as a graph to benchmark at scale (earl_service/data/wordnet.py, docs/scaling.md#how-big): 116,650
# entities, 26 relations, 354,552 / 5,000 / 5,000 triples in data/wordnet-full, ~2 s. Needs the database files:
# apt-get install wordnet-base (Debian), or WORDNET_DIR=the folder holding data.noun.
WORDNET_DIR ?= /usr/share/wordnet
wordnet-full: venv
	$(BIN)/python -m earl_service.data.wordnet --wordnet-dir $(WORDNET_DIR) --out data/wordnet-full
	$(BIN)/python -m earl_service.data.wordnet --wordnet-dir $(WORDNET_DIR) --out data/wordnet-full-noinv --no-inverses

# The one prepared GPU check (bench/cuda_check.py, then bench/cuda_profile.py): test_cuda.py, step speed, a short
# compress, then synced step times per number type and the profiler's top ops; ~8 minutes on one GPU, figures in
# bench/results/cuda_check.* and cuda_profile.*. The lent GPU machine has PyTorch, pytest, tqdm and matplotlib but
# no package index and no ../shared: `make cuda-wheels` (here) puts FAISS for its Python 3.12 in .cuda-wheels/ and
# FB15k-237, gzipped, in .cuda-data/; carry both (docs/scaling.md#gpus). --no-deps: the machine's numpy stays.
CUDA_WHEELS := faiss-cpu==1.15.1
cuda-wheels: venv
	$(BIN)/pip download -q --no-deps -d .cuda-wheels --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 $(CUDA_WHEELS)
	mkdir -p .cuda-data/fb15k-237
	for f in train valid test; do gzip -c $(DATASETS)/fb15k-237/$$f.txt > .cuda-data/fb15k-237/$$f.txt.gz; done

CUDA_DATA = $(if $(wildcard .cuda-data),.cuda-data,$(DATASETS))
CUDA_CHECK_ARGS ?=
cuda-check:
	PY=$(PY) DATA=$(CUDA_DATA) CHECK_ARGS="$(CUDA_CHECK_ARGS)" COMPRESS_MIN=2 CHECK_S=600 PROFILE_S=240 \
		bash bench/cuda_device_run.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
