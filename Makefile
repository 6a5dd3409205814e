PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs: the library alone for the demo (BASE_STAMP), and with the dev extra (tests, docs, ONNX, PyAV, ruff)
# for everything else (STAMP).
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

# Where torch and torchvision come from. Off by default: PyPI, with the rest (on Linux that build brings CUDA and
# Triton, about 4.3 GB). CPU=1, or TORCH_INDEX=URL, installs them from PyTorch's wheel index first, e.g. the CPU build:
#   make demo CPU=1      (= make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu)
# It applies when the install runs: on a fresh clone, or after `make clean`.
CPU ?= 0
TORCH_INDEX ?= $(if $(filter 1,$(CPU)),https://download.pytorch.org/whl/cpu,)
INSTALL_TORCH = $(if $(TORCH_INDEX),$(BIN)/python -m pip install -q torch torchvision --index-url $(TORCH_INDEX),)

.PHONY: test test-all test-data demo lint readme bench clean docs docs-serve wheel

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(BASE_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(INSTALL_TORCH)
	$(BIN)/python -m pip install -q -e .
	touch $(BASE_STAMP)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(INSTALL_TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP) $(BASE_STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow and not gpu and not parity and not data" --durations=15

test-all: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not gpu and not parity and not data" --durations=25

# The tests about the bytes of the Debian data packages themselves (the readers are tested everywhere on files the
# tests write). They need `apt-get install dataset-fashion-mnist linux-doc-6.12` and fail, not skip, without them.
test-data: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m data

DEMO_MODEL ?= l2vit_micro
DEMO_OUT := runs/demo-$(shell date +%Y%m%d-%H%M%S)

# One thread: for a model this small per-op overhead dominates, and two OpenMP threads on a shared 2-core machine
# ran 5x slower than one.
demo: export OMP_NUM_THREADS = 1
# The library alone; a checkout that has the dev install (make test) uses that one.
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(BASE_STAMP))
	$(BIN)/subquad train --model $(DEMO_MODEL) --data digits --img-size 32 --epochs 10 --log-interval 0 --output $(DEMO_OUT)
	$(BIN)/subquad eval --model $(DEMO_MODEL) --checkpoint $(DEMO_OUT)/best.safetensors
	@$(BIN)/python -c "from subquad.data.small import save_digits_image as s; print('true label of digit.png:', s('$(DEMO_OUT)/digit.png'))"
	$(BIN)/subquad predict --model $(DEMO_MODEL) --checkpoint $(DEMO_OUT)/best.safetensors $(DEMO_OUT)/digit.png
	@echo "next: . $(BIN)/activate, then e.g. subquad predict --checkpoint $(DEMO_OUT) YOUR.png, subquad models,"
	@echo "      subquad train --model flatten_swin_micro --data digits --img-size 32 --epochs 3 (see README: After make demo)"

lint: $(STAMP)
	$(BIN)/ruff check .

# The README's family table, the model zoo (docs/models.md), the mechanism table (docs/mechanisms.md) and the site's
# home page (docs/index.md, from README.md); tests/test_readme.py fails when any of them is stale.
readme: $(STAMP)
	$(BIN)/python -m subquad_cli.readme --write

# The documentation site (MkDocs + Material + mkdocstrings, the docs extra; the dev extra includes it).
# --strict: a broken link, a page missing from the nav or an unresolved API reference fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# A wheel in dist/ (recipes and the sample image inside); tests/test_wheel.py installs one into a fresh venv.
wheel: $(STAMP)
	$(BIN)/python -m pip wheel . --no-deps --no-build-isolation -w dist

clean:
	rm -rf $(VENV) .pytest_cache build dist site *.egg-info

.PHONY: figures
# README figures: the "Cost" plot (attention sweep on this machine, CSV kept in benchmarks/results/) and the
# "What attention sees" figures (subquad analyze on the bundled sample image).
figures: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/attention.py --overwrite --tokens 14,28,56,112,224 --repeats 3 --max-time 30 \
		--plot docs/cost.png
	$(BIN)/python -m subquad_cli analyze --model l2vit_tiny --seed 0 --overwrite --out docs/analyze
