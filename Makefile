PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-all demo lint readme bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 -m "not slow and not gpu and not parity" --durations=15

test-all: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 -m "not gpu and not parity" --durations=25

demo: $(STAMP)
	$(BIN)/subquad train --model vit_attn_micro --data digits --epochs 30 --output runs/demo

lint: $(STAMP)
	$(BIN)/ruff check .

readme: $(STAMP)
	$(BIN)/python -m subquad.cli.readme --write

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
