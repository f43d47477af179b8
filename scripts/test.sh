#!/usr/bin/env bash
# Run the whole test suite, the real-SLURM tests included (the local 3-node cluster is brought up
# first and torn down afterwards). Assumes scripts/setup.sh and `tests/slurm/cluster.sh install` ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/slurm/cluster.sh up --nodes 3  # 3: the dead-node tests requeue a 2-node job on the other two
trap 'bash tests/slurm/cluster.sh down >/dev/null 2>&1 || true' EXIT
# Fewer usable nodes than the cluster brought up is a failure of the real-SLURM tests, not a skip.
SFT_REQUIRE_SLURM_NODES=3 python3 -m pytest -q "$@"
