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

.PHONY: figures
# README figures: the "Cost" plot (attention sweep on this machine, CSV kept in benchmarks/results/) and the
# "What attention sees" figures (subquad analyze on the bundled sample image).
figures: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/attention.py --tokens 14,28,56,112,224 --repeats 3 --max-time 30 \
		--plot docs/cost.png
	$(BIN)/python -m subquad.cli analyze --model l2vit_tiny --out docs/analyze
