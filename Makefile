# nnlib: every target does its own setup (virtual environment, packages, MNIST).
#   make lab        open the series in JupyterLab
#   make test       run every test (pytest over tests/ and nbval over every notebook)
#   make rehearse   execute every notebook headless into build/rehearsal (a classroom rehearsal)
#   make benchmark  nnlib versus PyTorch on the CPU, and 1 versus 2 MPI ranks against PyTorch DDP
#                   (installs torch==2.13.0 into .venv)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# JupyterLab refuses to run as root unless told to.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
# ipyparallel writes its profiles here; keep them out of ~/.ipython during tests.
TEST_IPYTHONDIR := $(CURDIR)/build/ipython

.PHONY: setup data lab test rehearse benchmark clean

$(VENV)/.installed: pyproject.toml scripts/make-venv.sh
	sh scripts/make-venv.sh $(PYTHON) $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

data: setup
	$(BIN)/python -m nnlib fetch-data

lab: data
	cd notebooks && ../$(BIN)/jupyter lab $(ROOT_FLAG) 00_start_here.ipynb

test: data
	mkdir -p $(TEST_IPYTHONDIR)
	IPYTHONDIR=$(TEST_IPYTHONDIR) $(BIN)/python -m pytest tests notebooks \
	    --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

rehearse: data
	$(BIN)/jupyter nbconvert --to notebook --execute --output-dir build/rehearsal notebooks/*.ipynb

benchmark: data
	$(BIN)/python -m pip install --quiet -e '.[benchmark]'
	$(BIN)/python benchmarks/cpu_throughput.py --threads 1
	$(BIN)/python benchmarks/data_parallel.py

clean:
	rm -rf $(VENV) build
