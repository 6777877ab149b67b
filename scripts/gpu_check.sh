#!/usr/bin/env bash
# The first GPU check (issue 29) in one command: scripts/gpu_check.py's stages (preflight,
# correctness against the CPU reference, the compiled step at B=64/32/16, evaluation, a
# torchrun run and its resume), each result written as it ends, within --deadline (510 s).
#
#   bash scripts/gpu_check.sh                      # on a CUDA machine: out/gpu_check/
#   bash scripts/gpu_check.sh --out DIR            # results and compile caches in DIR
#   bash scripts/gpu_check.sh --cpu-smoke          # every stage at toy sizes on a CPU
#   bash scripts/gpu_check.sh --help               # every flag
#
# PYTHON (default python3) is the interpreter with torch; GPU_CHECK_OUT is the default --out.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null; then
    echo "gpu_check.sh: error: no $PYTHON on PATH: set PYTHON to the python that has torch" >&2
    exit 1
fi
exec "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/gpu_check.py" "$@"
