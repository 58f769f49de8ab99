# nnlib: every target does its own setup (virtual environment, packages, MNIST).
#   make lab        open the series in JupyterLab
#   make test       run every test (pytest over tests/ and nbval over every notebook)
#   make quick      the inner loop: every test except nbval, the browser, the book and Binder (a few minutes)
#   make rehearse   execute every notebook headless into build/rehearsal (a classroom rehearsal)
#   make book       the series as a static HTML book in build/book (offline; the notebooks' saved outputs)
#   make browser-test  every notebook run from JupyterLab's menu in headless Chromium (screenshots in
#                   build/browser; make test runs a few of them)
#   make benchmark  nnlib versus PyTorch on the CPU, and 1 versus 2 MPI ranks against PyTorch DDP
#                   (installs torch==2.13.0 into .venv), on the CPU's own BLAS kernel (OPENBLAS_CORETYPE
#                   and OPENBLAS_L2_SIZE unset for the benchmarks alone); appends the results, dated,
#                   to benchmarks/RESULTS.md
#   make multihost  as root: the batch job across 2 and 3 hosts (network namespaces on this machine),
#                   its bytes on the links, and a pulled cable caught by the watchdog (also in make test)
#   make gpu        on a machine with an NVIDIA GPU, its CuPy and PyTorch already installed (nothing is
#                   installed; no registry needed): scripts/gpu-check.sh, at most about 5 minutes: the GPU
#                   tests, the batch job on the GPU against the CPU in every mode, benchmarks/gpu_throughput.py
#                   (nnlib against PyTorch on CUDA), and the figures for notebook 08 recorded into
#                   notebooks/results/gpu-<device>.csv. MPI comes from the wheels in build/wheels:
#   make gpu-wheels on a machine with PyPI: download the mpich, mpi4py and array-api-strict wheels for the GPU
#                   machine's Python (GPU_PYTHON_VERSION, default 3.12) into build/wheels; copy the project

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# JupyterLab refuses to run as root unless told to.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
# ipyparallel writes its profiles here; keep them out of ~/.ipython during tests.
TEST_IPYTHONDIR := $(CURDIR)/build/ipython
GPU_PYTHON ?= python3
GPU_PYTHON_VERSION ?= 3.12
# Processes make test runs the tests in (pytest-xdist): one per core of the 2-core machines it is sized for.
TEST_WORKERS ?= 2

.PHONY: setup data browser lab test quick browser-test rehearse book benchmark multihost gpu gpu-wheels clean

$(VENV)/.installed: pyproject.toml scripts/make-venv.sh
	sh scripts/make-venv.sh $(PYTHON) $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

data: setup
	$(BIN)/python -m nnlib fetch-data

# The browser tests drive Debian's Chromium. As root (CI) it is installed here; a normal user without
# it gets those tests skipped, with that reason.
browser:
	@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "note: could not install chromium; the browser tests will be skipped"; fi

lab: data
	cd notebooks && ../$(BIN)/jupyter lab $(ROOT_FLAG) 00_start_here.ipynb

# pytest-xdist runs the tests in TEST_WORKERS processes; --dist loadgroup keeps each notebook's cells, and
# the test modules that tests/conftest.py names, together in one worker, in order.
# --durations=25 and the summary at the end (tests/conftest.py) say where the time and the processes went.
PYTEST := IPYTHONDIR=$(TEST_IPYTHONDIR) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25
test: data browser
	mkdir -p $(TEST_IPYTHONDIR)
	$(PYTEST) tests notebooks --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

# The inner loop: every test but nbval of the notebooks, the browser, the book and Binder's environment.
quick: data
	mkdir -p $(TEST_IPYTHONDIR)
	$(PYTEST) tests --ignore=tests/test_browser.py --ignore=tests/test_book.py --ignore=tests/test_binder.py

browser-test: data browser
	NNLIB_BROWSER_NOTEBOOKS=all $(BIN)/python -m pytest -v -rs tests/test_browser.py

book: setup
	$(BIN)/python book/build.py build/book

rehearse: data
	$(BIN)/jupyter nbconvert --to notebook --execute --output-dir build/rehearsal notebooks/*.ipynb

benchmark: data
	$(BIN)/python -m pip install --quiet -e '.[benchmark]'
	$(BIN)/python benchmarks/record.py

multihost: data
	$(BIN)/python -m pytest -v -rs tests/test_multihost.py

gpu:
	PYTHON=$(GPU_PYTHON) sh scripts/gpu-check.sh

gpu-wheels: setup
	$(BIN)/python -m pip download --quiet --only-binary=:all: --no-deps --dest build/wheels \
	    --python-version $(GPU_PYTHON_VERSION) --platform manylinux_2_28_x86_64 \
	    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    "mpich>=4.2" "mpi4py>=4.0" "array-api-strict>=2.0"

clean:
	rm -rf $(VENV) build
