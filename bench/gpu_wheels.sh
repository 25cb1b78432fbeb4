#!/usr/bin/env bash
# Wheels for bench/gpu_check.sh on a lent GPU machine that has its own PyTorch (2.11, Python 3.12
# at last look) but no package index: the pure-Python Jupyter/nbval stack and its few compiled
# dependencies (pyzmq, rpds-py, debugpy, tornado), downloaded HERE for CPython 3.12 / manylinux x86-64.
#
#   bash bench/gpu_wheels.sh            # -> .whl/ (about 20 MB; ignored by git through .git/info/exclude)
#
# Then, on the GPU machine (the device tool's `run`, with carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD && bash bench/gpu_check.sh "$OUT/gpu_check"
# The course packages need no install there: PYTHONPATH=$PWD makes course_utils and course_tools importable.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d .whl \
  "nbval==0.11.0" "pytest-xdist>=3.5" "ipykernel>=6.29" "nbclient>=0.10" "nbformat>=5.9" "ipywidgets>=8.1"
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
