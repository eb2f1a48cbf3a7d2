# The README's commands. Each target sets up what it needs first, so on a fresh clone
# `make demo` and `make test` are all there is to type.
#
#   make demo       virtual environment + install, then train the demo model
#   make test       the same plus the test extras and Horovod, then the test suite
#   make horovod    build Horovod for this environment's torch (scripts/build_horovod.sh, minutes)
#   make lab        JupyterLab on the lessons
#   make kernel     register this environment as a Jupyter kernel (e.g. on NERSC's JupyterHub)
#   make exercises  regenerate exercises/ from solutions/
#
# Knobs: PYTHON (interpreter for the venv), VENV (its folder), TORCH (the torch to install
# first; empty keeps the one the environment already has, e.g. with
# VENV_FLAGS=--system-site-packages on top of a site's PyTorch module), PYTEST_ARGS, HOROVOD
# (no = make test skips the Horovod build, and its tests skip).

PYTHON      ?= python3
VENV        ?= .venv
VENV_FLAGS  ?=
# A release the kit is tested with. On Linux, PyPI's build runs on both CUDA GPUs and CPUs.
TORCH       ?= torch==2.13.0
TEST_EXTRAS ?= dev,notebooks,tracking,profiling,kmeans
PYTEST_ARGS ?=
HOROVOD     ?= yes
BIN         := $(VENV)/bin

.PHONY: setup setup-dev horovod demo test lab kernel exercises clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(if $(strip $(TORCH)),$(BIN)/python -m pip install --quiet "$(TORCH)")
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# timm only for its optimizers, which the benchmark and tests compare with: --no-deps keeps
# out the torchvision that timm's model zoo wants and that a CPU build of torch cannot import.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[$(TEST_EXTRAS)]"
	$(BIN)/python -m pip install --quiet --no-deps "timm>=1.0"
	touch $@

# Horovod publishes no wheels and its last release needs a one-line fix to compile against
# torch >= 2.1: the script builds it from the PyPI sdist (see its header).
$(VENV)/.installed-horovod: scripts/build_horovod.sh $(VENV)/.installed
	scripts/build_horovod.sh $(BIN)/python
	touch $@

setup: $(VENV)/.installed

setup-dev: $(VENV)/.installed-dev

horovod: $(VENV)/.installed-horovod

demo: setup
	$(BIN)/dlscale train demo

test: setup-dev $(if $(filter yes,$(HOROVOD)),horovod)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lab: setup-dev
	$(BIN)/jupyter lab --notebook-dir=.

kernel: setup-dev
	$(BIN)/python -m ipykernel install --user --name dlscale --display-name "dlscale ($(shell cd $(VENV) && pwd))"

exercises: setup
	$(BIN)/dlscale exercises

clean:
	rm -rf $(VENV) runs data wandb .pytest_cache
