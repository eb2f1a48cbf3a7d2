# The README's commands. Each target sets up what it needs first, so on a fresh clone
# `make demo` and `make test` are all there is to type.
#
#   make demo       virtual environment + install, then train the demo model
#   make test       the same plus the test extras and Horovod, then the test suite; then the core tests on
#                   the oldest Python the README promises with the floors' versions (make test-oldest).
#                   Without a Python 3.10 that run is left out, with one line saying so; in CI (CI=true)
#                   its absence fails the run
#   make horovod    build Horovod for this environment's torch (scripts/build_horovod.sh, minutes)
#   make slurm-packages   Slurm, munge and shellcheck from Debian's packages (as root), for the
#                   one-node cluster of lesson 09 and the tests of slurm/
#   make browser-packages Chromium and its chromedriver from Debian's packages (as root), for the
#                   tests that run the lessons in JupyterLab in a real browser
#   make lint       ruff's checks and the layers' contract, without the suite
#   make test-fast  the unit tier (no clusters, notebooks, browsers or launched ranks): the edit-test loop
#   make lab        JupyterLab on the lessons
#   make kernel     register this environment as the Jupyter kernel `dlscale` the lessons name, with only the
#                   lessons' extras (on NERSC's JupyterHub: with the pytorch module loaded, the kernel loads it too);
#                   with IMAGE=... RUNTIME=podman-hpc|shifter|apptainer|podman, a kernel that runs inside the image
#   make exercises  regenerate exercises/ from solutions/
#   make reset LESSON=05   start lesson 05 over: its runs removed, nothing else
#   make slides     each lesson's talk as a reveal.js deck in slides/, from the lessons themselves (offline: reveal.js
#                   is copied beside them)
#
# Knobs: PYTHON (interpreter for the venv), VENV (its folder), TORCH (the torch to install
# first; empty keeps the one the environment already has, e.g. with
# VENV_FLAGS=--system-site-packages on top of a site's PyTorch module), TORCH_INDEX (where pip finds
# it: PyTorch's ROCm index on AMD GPUs), PYTEST_ARGS, TEST_WORKERS (test processes, 3), HOROVOD
# (no = make test skips the Horovod build, and its tests skip), TEST_OLDEST (no = without the oldest-Python
# run), OLDEST_PYTHON, CONSTRAINTS (the versions to install with: constraints.txt; empty lets pip choose).

PYTHON      ?= python3
VENV        ?= .venv
# Under a site's PyTorch module (NERSC's `module load pytorch`: LOADEDMODULES names it) the environment keeps the
# module's torch, built for the site's GPUs and network: a venv on top of the module's packages, and no second
# torch from PyPI over it. TORCH=torch==X still asks for one.
SITE_TORCH  := $(filter pytorch pytorch/%,$(subst :, ,$(LOADEDMODULES)))
VENV_FLAGS  ?= $(if $(SITE_TORCH),--system-site-packages)
# A release the kit is tested with. On Linux, PyPI's build runs on both CUDA GPUs and CPUs.
TORCH       ?= $(if $(SITE_TORCH),,torch==2.13.0)
# Where pip looks for TORCH: empty is PyPI (CUDA builds on Linux). AMD GPUs (Frontier) need PyTorch's
# ROCm index, e.g. TORCH_INDEX=https://download.pytorch.org/whl/rocm6.4 (the README's Frontier guide).
TORCH_INDEX ?=
TEST_EXTRAS ?= dev,notebooks,tracking,profiling,kmeans,hpo,slides
PYTEST_ARGS ?=
HOROVOD     ?= yes
# The versions a green run installed (constraints.txt: on the Python that ran it; elsewhere pip chooses). CONSTRAINTS=
# (empty) lets pip choose everywhere.
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINTS := $(if $(strip $(CONSTRAINTS)),-c $(CONSTRAINTS))
BIN         := $(VENV)/bin

.PHONY: setup setup-dev horovod test-deps slurm-packages browser-packages demo test test-fast test-oldest oldest-check oldest-env lab kernel exercises reset slides lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(if $(strip $(TORCH)),$(BIN)/python -m pip install --quiet $(if $(strip $(TORCH_INDEX)),--index-url $(TORCH_INDEX)) "$(TORCH)")
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) -e .
	touch $@

# timm only for its optimizers, which the benchmark and tests compare with: --no-deps keeps
# out the torchvision that timm's model zoo wants and that a CPU build of torch cannot import.
# Then K-Means's loops are compiled once into numba's cache (~25 s on 2 cores), so the lessons' kernels, their
# ranks and the test processes load them instead of each compiling them at its first fit.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) -e ".[$(TEST_EXTRAS)]"
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) --no-deps "timm>=1.0"
	$(BIN)/python -m dlscale.kmeans.compile_ahead
	touch $@

# Horovod publishes no wheels and its last release needs a one-line fix to compile against
# torch >= 2.1: the script builds it from the PyPI sdist (see its header).
$(VENV)/.installed-horovod: scripts/build_horovod.sh $(VENV)/.installed
	scripts/build_horovod.sh $(BIN)/python
	touch $@

SLURM_PACKAGES := slurmctld slurmd slurm-client munge shellcheck
slurm-packages:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES) || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES))

BROWSER_PACKAGES := chromium chromium-driver
browser-packages:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES))

setup: $(VENV)/.installed

setup-dev: $(VENV)/.installed-dev

horovod: $(VENV)/.installed-horovod

demo: setup
	$(BIN)/dlscale train demo

# As root on Debian or Ubuntu (CI, a container), make test also installs Slurm, munge and
# shellcheck for the tests of slurm/, and Chromium for the browser tests; elsewhere those tests
# skip and say how to install them.
SYSTEM_PACKAGES ?= $(shell [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null && echo slurm-packages browser-packages)

# Three test processes (pytest-xdist), each running torch on one thread. The longest tests are handed
# out first and one process takes each file that shares a module fixture (a Slurm cluster, the browser):
# tests/plugins/scheduling.py's scheduler. Most integration tests wait on ranks, Slurm, a kernel or the browser
# much of the time: with three on 2 cores the suite used 135% of them and took 10% less time than with
# two (docs/benchmarks.md). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3

# The oldest Python the README promises, with the lowest versions pyproject.toml's floors allow
# (scripts/floors.py pins each `>=` to `==`): the kit's core tests (config, the K-Means estimator and
# engine) in a virtual environment of its own. make test builds it while the suite runs and runs it
# last. TEST_OLDEST=no leaves it out; OLDEST_PYTHON names the interpreter (found on the path or in pyenv).
OLDEST_PYTHON ?= $(shell for p in python3.10 $$HOME/.pyenv/versions/3.10*/bin/python3.10 /usr/local/bin/python3.10 \
                   /usr/bin/python3.10; do "$$p" -c '' 2>/dev/null && { echo "$$p"; break; }; done)
OLDEST_VENV ?= .venv-oldest
OLDEST_TESTS ?= tests/unit/test_config.py tests/unit/test_kmeans_estimator.py tests/unit/test_kmeans.py \
                tests/integration/test_kmeans_estimator.py::test_two_gloo_ranks_with_weights_equal_one_process \
                tests/unit/test_train.py::test_model_learns_on_a_tiny_config \
                tests/unit/test_hpo.py::test_a_bad_search_space_is_refused_naming_the_parameter \
                tests/unit/test_hpo.py::test_the_optuna_calls_it_does_not_promise_work_without_a_warning_at_this_version \
                tests/unit/test_hpo.py::test_a_pruned_trial_stops_through_the_engines_stop_path_and_keeps_its_folder \
                tests/unit/test_hpo.py::test_a_journal_torn_mid_record_is_cut_back_and_never_joined_by_the_next_write
TEST_OLDEST ?= yes

IN_CI := $(filter 1 true yes,$(shell echo '$(CI)' | tr A-Z a-z))
OLDEST_LEFT_OUT := make test: left out the oldest-Python run (no Python 3.10 here): install one \
  (pyenv install 3.10 or your system's python3.10) or name it with OLDEST_PYTHON=...; TEST_OLDEST=no hides this line

# What make test does about the oldest Python, said before the suite starts: run it; or, without a
# Python 3.10, fail in CI (which must run it) and elsewhere leave it out, saying so in one line.
oldest-check:
	@if [ "$(TEST_OLDEST)" != yes ]; then exit 0; \
	elif [ -n "$(OLDEST_PYTHON)" ]; then echo "make test: the oldest-Python run uses $(OLDEST_PYTHON)"; \
	elif [ -n "$(IN_CI)" ]; then echo "make test: CI must run the oldest-Python tests, and no Python 3.10 is here (OLDEST_PYTHON)" >&2; exit 1; \
	else echo "$(OLDEST_LEFT_OUT)"; fi

$(OLDEST_VENV)/.installed: pyproject.toml scripts/floors.py
	@[ -n "$(OLDEST_PYTHON)" ] || { echo "make: no Python 3.10 here for the oldest-Python tests: install it, set OLDEST_PYTHON, or TEST_OLDEST=no" >&2; exit 1; }
	$(OLDEST_PYTHON) -m venv $(OLDEST_VENV)
	$(PYTHON) scripts/floors.py > $(OLDEST_VENV)/floors.txt
	$(OLDEST_VENV)/bin/python -m pip install --quiet -r $(OLDEST_VENV)/floors.txt
	$(OLDEST_VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $@

oldest-env: $(OLDEST_VENV)/.installed

OLDEST_WORKERS ?= $(TEST_WORKERS)
# numba's optimizer off: K-Means's loops compile in 30 CPU-s instead of 86, beside the suite, to the same numbers (no
# fastmath, no FMA contraction; docs/testing.md), in a cache of its own that no other environment reads.
test-oldest: oldest-env
	NUMBA_OPT=0 NUMBA_CACHE_DIR=$(OLDEST_VENV)/numba-cache \
	  $(OLDEST_VENV)/bin/python -m pytest $(OLDEST_TESTS) -m "not extras" -p no:cacheprovider \
	  $(if $(filter-out 0 1,$(OLDEST_WORKERS)),-n $(OLDEST_WORKERS))

# Run the oldest-Python tests only where a Python 3.10 was found (oldest-check has said the rest).
RUN_OLDEST := $(if $(filter yes,$(TEST_OLDEST)),$(if $(OLDEST_PYTHON),yes))

# The oldest-Python run goes beside the suite, in one process at the lowest priority (nice), its output in
# .venv-oldest.log: it takes the moments the suite's processes wait (on a 2-vCPU EPYC, 7-9% of the CPU over the whole
# suite, up to 20% while it installs and compiles; the CPUs were never idle). It is done long before the suite is;
# its last lines are printed at the end.
# What make test installs. Horovod's wheel is compiled (both cores, ~140 s on 2) while pip installs the extras and
# numba compiles K-Means's loops (mostly downloading, unpacking, one core), then installed once pip is done: the
# build keeps its tools in a folder of its own, so no two pips write into the venv at once. If the build beside
# fails, make horovod builds it again, alone, and shows why.
test-deps: $(VENV)/.installed
	$(if $(filter yes,$(HOROVOD)),[ -f $(VENV)/.installed-horovod ] || \
	  scripts/build_horovod.sh --wheel-only $(BIN)/python > $(VENV)/horovod-wheel.log 2>&1 &) \
	$(MAKE) --no-print-directory setup-dev; status=$$?; wait; [ $$status = 0 ] || exit $$status; \
	$(if $(filter yes,$(HOROVOD)),$(MAKE) --no-print-directory horovod)

test: oldest-check $(SYSTEM_PACKAGES) test-deps
	$(if $(RUN_OLDEST),(nice -n 19 $(MAKE) --no-print-directory test-oldest OLDEST_WORKERS=1 > $(OLDEST_VENV).log 2>&1) & oldest=$$!;) \
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS); \
	status=$$?; \
	$(if $(RUN_OLDEST),if wait $$oldest; then echo "make test: the oldest-Python run ($(OLDEST_VENV).log):"; \
	tail -n 3 $(OLDEST_VENV).log; else tail -n 60 $(OLDEST_VENV).log; status=1; fi;) \
	[ "$(TEST_OLDEST)" != yes ] || [ -n "$(OLDEST_PYTHON)" ] || echo "$(OLDEST_LEFT_OUT)"; \
	exit $$status

# Ruff's checks and the layers' contract (import-linter), as the tests run them, without the suite
lint: setup-dev
	$(BIN)/ruff check dlscale tests scripts
	$(BIN)/ruff format --check dlscale tests scripts
	$(BIN)/lint-imports

# The unit tier (tests/unit), for the edit-test loop: no Slurm cluster, notebook, browser, Jupyter server, engines or
# launched ranks (those are tests/integration, which make test runs too). About a minute on 2 cores.
test-fast: setup-dev
	$(BIN)/python -m pytest tests/unit \
	  $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS)

lab: kernel
	$(BIN)/jupyter lab --notebook-dir=.

# The lessons' extras only (no test tools): what a hub's kernel needs. Where make test has installed more, that serves.
LESSON_EXTRAS ?= notebooks,kmeans,hpo,tracking,profiling
# Modules the kernel loads before it starts: those this environment was built under (NERSC's pytorch module)
KERNEL_MODULES ?= $(SITE_TORCH)
$(VENV)/.installed-lessons: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) -e ".[$(LESSON_EXTRAS)]"
	touch $@

# First K-Means's loops are compiled ahead into numba's cache beside the package (NUMBA_CACHE_DIR's, where it is set:
# the kernel is given it), for this node's CPU: the kernel's first fit (lesson 08) loads them instead of compiling
# (~25 s on 2 cores, and a room's kernels all at once on a shared node). Seconds where they are there already.
# make kernel IMAGE=dlscale RUNTIME=podman-hpc (or shifter, apptainer with IMAGE=dlscale.sif, podman; GPU=nvidia, amd
# or none): a kernel that runs inside the image (the Containerfile's), started by the hub's Jupyter through the
# runtime; registered in seconds, with no venv here (the module needs only a Python 3.10+). docs/sites.md.
ifeq ($(strip $(IMAGE)),)
kernel: $(if $(wildcard $(VENV)/.installed-dev),$(VENV)/.installed,$(VENV)/.installed-lessons)
	$(BIN)/python -m dlscale.kmeans.compile_ahead
	$(BIN)/python -m dlscale.jobs.kernel --display-name "dlscale ($(shell cd $(VENV) && pwd))" \
	  $(foreach module,$(KERNEL_MODULES),--module $(module))
else
kernel:
	@[ -n "$(RUNTIME)" ] || { echo "make kernel IMAGE=$(IMAGE): name the runtime, RUNTIME=podman-hpc, shifter, apptainer or podman"; exit 2; }
	PYTHONPATH=$(CURDIR) $(PYTHON) -m dlscale.jobs.kernel --image "$(IMAGE)" --runtime "$(RUNTIME)" $(if $(GPU),--gpu $(GPU))
endif

exercises: setup
	$(BIN)/dlscale exercises

# Each lesson's talk as a reveal.js deck in slides/ (dlscale/lessons/slides.py): the instructor talks from the lessons.
# The lessons' extras (the talk cells run for their pictures) and the slides extra: reveal.js, copied once into
# slides/reveal.js/, and the maths as MathML, so that a deck opened from slides/ needs no network.
$(VENV)/.installed-slides: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) -e ".[$(LESSON_EXTRAS),slides]"
	touch $@

slides: $(VENV)/.installed-slides
	$(BIN)/python -m dlscale.lessons.slides --notebooks notebooks --out slides --run

# make reset LESSON=05: lesson 05 starts over (its runs/lesson05* folders removed; your my_*.py kept; nothing else)
reset: setup
	@[ -n "$(LESSON)" ] || { echo "make reset LESSON=NN: name the lesson, e.g. LESSON=05"; exit 2; }
	$(BIN)/dlscale lessons reset $(LESSON)

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(OLDEST_VENV).log runs data wandb .pytest_cache
