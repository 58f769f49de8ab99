#!/bin/sh
# Create the virtual environment $2 with interpreter $1, with pip in it.
# Works where Debian/Ubuntu lack the python3-venv package (no ensurepip): the
# environment is then made without pip, and pip is bootstrapped from its wheel on PyPI.
set -e
PYTHON=${1:-python3}
VENV=${2:-.venv}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    exit 0
fi
rm -rf "$VENV"
if "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
    exit 0
fi
echo "note: '$PYTHON -m venv' failed (python3-venv not installed?); bootstrapping pip from PyPI instead" >&2
rm -rf "$VENV"
"$PYTHON" -m venv --without-pip "$VENV"
"$PYTHON" -m pip download --quiet --no-deps --dest "$VENV/bootstrap" pip
wheel=$(ls "$VENV"/bootstrap/pip-*.whl)
"$VENV/bin/python" "$wheel/pip" install --quiet --no-index "$wheel"
