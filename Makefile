# Everything runs from the project's own virtual environment, created on first use.
# torch==2.13.0 (CPU) is installed before the project so pip never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.zfree-installed
OUT    ?= runs/study-default

.PHONY: install study smoke test test-slow lab notebooks clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,lab]"
	touch $(STAMP)

install: $(STAMP)

## The main job: the default study on the shipped benchmark and base run -> $(OUT)/report.html
study: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/zfree study --preset default --out $(OUT)

smoke: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/zfree study --preset smoke --out runs/study-smoke

## The default test tier (< 10 minutes on 2 cores); `make test-slow` runs the slow tier.
test: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q

test-slow: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m slow

## JupyterLab in the project's environment (ipywidgets work there).
lab: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/jupyter lab notebooks/

## Regenerate the .ipynb files from their py:percent twins (outputs stay stripped).
notebooks: $(STAMP)
	$(BIN)/jupytext --to ipynb notebooks/*.py

clean-venv:
	rm -rf $(VENV)
