#!/usr/bin/env bash
# The GPU check as one command: scripts/gpu_check.py (its own deadline 510 s) under a hard limit,
# SIGTERM at 550 s and SIGKILL 10 s later, then all it wrote but checkpoints and shards packed
# into one archive, DIR.tgz beside DIR (default out/gpu_check). Flags after DIR go to
# gpu_check.py; PYTHON is the python that has torch (default python3).
#
#   bash scripts/gpu_check.sh                            # on a CUDA machine: out/gpu_check.tgz
#   bash scripts/gpu_check.sh /tmp/check --cpu-smoke     # every stage at toy sizes on a CPU
dir="${1:-out/gpu_check}"
shift
timeout -k 10 550 "${PYTHON:-python3}" "$(dirname "$0")/gpu_check.py" --out "$dir" "$@"
status=$?
tar czf "$dir.tgz" --exclude='*.pt' --exclude='*.npy' -C "$(dirname "$dir")" "$(basename "$dir")"
exit $status
