#!/bin/sh
# The GPU check (issue 37), for a bare GPU machine with no package registry; at most about 5 minutes.
#
#   sh scripts/gpu-check.sh              on the GPU machine, from the project root (make gpu does this)
#   sh scripts/gpu-check.sh --dry-run    on any machine, no GPU: as far as it goes on the CPU (the batch
#                                        jobs' GPU runs and the recorder with tests/stand_in_cupy.py as CuPy,
#                                        the benchmark in its --dry-run mode); nothing is recorded
#
# It installs nothing from a registry. It needs python3 with NumPy, CuPy 14+ (already installed: it is never
# pip-installed here), PyTorch with CUDA and pytest, as the H200 machine had (../shared/notes/gpu.md), and
# brings along:
#   - this project (run from its root);
#   - the MPI wheels, mpich, mpi4py and array-api-strict for that Python (cp312, manylinux x86_64), in
#     $NNLIB_WHEELS (default build/wheels; `make gpu-wheels` downloads them on a machine with PyPI). They are
#     installed with pip --no-index --no-deps --prefix into $NNLIB_MPI_PREFIX (default /tmp/nnlib-mpi), whose
#     lib/ and bin/ go on LD_LIBRARY_PATH and PATH (pip --target would drop the mpich wheel's lib/);
#     without them, a Python that already imports mpi4py and has mpiexec on PATH is used as it is;
#   - MNIST, the four .gz files, in $NNLIB_DATA (default ../shared/data/mnist).
#
# Steps: the GPU tests (tests/test_backend.py, tests/test_gpu.py), the batch job on the GPU against the CPU
# for every mode (scripts/gpu_job_equality.py), benchmarks/gpu_throughput.py, and the recording for notebook
# 07 (python -m nnlib gpu-benchmark --results-dir notebooks/results). Each step has a time limit; the check
# goes on after a failed step and exits 1 if any failed.

set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
TESTS_LIMIT=70  # a dry run may take longer: its time is not the check's
[ $DRY_RUN -eq 1 ] && TESTS_LIMIT=300
export NNLIB_DATA=${NNLIB_DATA:-$ROOT/../shared/data/mnist}
WHEELS=${NNLIB_WHEELS:-$ROOT/build/wheels}
PREFIX=${NNLIB_MPI_PREFIX:-/tmp/nnlib-mpi}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export IPYTHONDIR="$ROOT/build/ipython"
WORK="$ROOT/build/gpu-check"
mkdir -p "$WORK" "$IPYTHONDIR"
BEGAN=$(date +%s)
FAILED=""

step() {  # step NAME SECONDS COMMAND...: run it with a time limit, say how long it took and how it ended
    name=$1 limit=$2
    shift 2
    echo
    echo "== $name (at most $limit s)"
    started=$(date +%s)
    timeout "$limit" "$@"
    code=$?
    [ $code -eq 124 ] && echo "$name: stopped after $limit s"
    [ $code -ne 0 ] && FAILED="$FAILED $name"
    echo "== $name: exit $code, $(( $(date +%s) - started )) s"
}

echo "GPU check of nnlib at $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
if [ ! -f "$NNLIB_DATA/train-images-idx3-ubyte.gz" ]; then
    echo "error: no MNIST in NNLIB_DATA=$NNLIB_DATA (the four .gz files; set NNLIB_DATA to their folder)"
    exit 2
fi
if [ $DRY_RUN -eq 0 ]; then
    "$PYTHON" -c "from nnlib.course.environment import gpu_status; usable, why = gpu_status(); print(why); exit(not usable)" \
        || { echo "error: no usable GPU here (see above); sh scripts/gpu-check.sh --dry-run checks the script on the CPU"; exit 2; }
    "$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'PyTorch finds no CUDA GPU'" \
        || { echo "error: PyTorch with CUDA is needed for the benchmark against PyTorch"; exit 2; }
fi

# MPI from the wheels brought along (no registry: --no-index).
if ls "$WHEELS"/mpich-*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps --prefix "$PREFIX" "$WHEELS"/*.whl || exit 2
    SITE=$("$PYTHON" -c "import sys; print(f'$PREFIX/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages')")
    export PYTHONPATH="$SITE:$PYTHONPATH" LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$PREFIX/bin:$PATH"
    echo "MPI: the wheels in $WHEELS, installed into $PREFIX"
elif "$PYTHON" -c "import mpi4py.MPI" 2>/dev/null && command -v mpiexec >/dev/null; then
    echo "MPI: mpi4py as installed, $(command -v mpiexec)"
else
    echo "error: no MPI: put the mpich, mpi4py and array-api-strict wheels in $WHEELS (make gpu-wheels), or set NNLIB_WHEELS"
    exit 2
fi

step "GPU tests" "$TESTS_LIMIT" "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/test_backend.py tests/test_gpu.py
if [ $DRY_RUN -eq 1 ]; then
    step "batch job, GPU against CPU (stand-in CuPy)" 150 "$PYTHON" scripts/gpu_job_equality.py --stand-in
    step "GPU throughput against PyTorch (dry run on the CPU)" 60 "$PYTHON" benchmarks/gpu_throughput.py --dry-run --rounds 2 --epochs 1
    SHIM=$("$PYTHON" -c "import sys; sys.path.insert(0, 'tests'); from stand_in_cupy import write_cupy_shim; print(write_cupy_shim('$WORK'))")
    step "recording for notebook 08 (stand-in CuPy, small)" 60 env PYTHONPATH="$SHIM:$PYTHONPATH" "$PYTHON" -m nnlib \
        gpu-benchmark --hidden 16 32 --samples 512 --largest 128 --repeats 1 --results-dir "$WORK/results"
else
    step "batch job, GPU against CPU" 80 "$PYTHON" scripts/gpu_job_equality.py
    step "GPU throughput against PyTorch" 70 "$PYTHON" benchmarks/gpu_throughput.py
    step "recording for notebook 08" 80 "$PYTHON" -m nnlib gpu-benchmark --results-dir notebooks/results
fi

echo
echo "GPU check: $(( $(date +%s) - BEGAN )) s in all; failed:${FAILED:- none}"
[ $DRY_RUN -eq 0 ] && [ -z "$FAILED" ] && echo "Recorded in notebooks/results/: commit it, then re-run notebook 08 to show it."
[ -z "$FAILED" ]
