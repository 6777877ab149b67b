#!/usr/bin/env bash
# One seed of one arm of an experiment: train_gpt2.py with that seed into log/ARM-SEED, so that
# `python plot.py log/base-* log/edit-*` compares the arms. docs/cluster.md ("Seeds of an
# experiment") runs the seeds with it on one machine, on a GPU node and as a SLURM array
# (scripts/seeds.sbatch).
#
#   scripts/seeds.sh ARM SEED [train_gpt2.py flags...]
#   scripts/seeds.sh base 1 --preset shakespeare_char --max_steps 500 --eval_interval 25
#   PROGRAM=../edit/train_gpt2.py scripts/seeds.sh edit 1 ...   # an edit in its own checkout
#
# Run it from the checkout's root: log/ and the flags' paths are relative to where it runs.
# PROGRAM is the train_gpt2.py to run (default: the one here).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: scripts/seeds.sh ARM SEED [train_gpt2.py flags...]" >&2
    exit 2
fi
arm="$1"
seed="$2"
shift 2

# exec: the trainer takes this process's place, so a stop signal (Ctrl-C, SLURM's) reaches it.
# The seed and log_dir come last: they win over any in the flags.
exec python "${PROGRAM:-train_gpt2.py}" "$@" --seed "$seed" --log_dir "log/$arm-$seed"
