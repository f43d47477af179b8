#!/usr/bin/env bash
# Install everything sft-launch needs on a fresh Debian 12 machine with Python >= 3.11 (idempotent).
#   - torch: the CPU build (`torch==2.13.0` resolves to the local CPU wheel on these machines; plain
#     `torch` would pull several GB of CUDA wheels). On a GPU cluster install your site's torch first.
#   - the project itself, editable, with the train/dev/deepspeed/submitit/eval extras, every dependency at the
#     version in constraints.txt (the tested set; scripts/lock_constraints.py says how to move it on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
py=${PYTHON:-python3}

if ! "$py" -c 'import torch' 2>/dev/null; then
  "$py" -m pip install -q "torch==${SFT_TORCH_VERSION:-2.13.0}"
fi
"$py" -m pip install -q -c constraints.txt -e ".[train,dev,deepspeed,submitit,eval]"
echo "setup: $("$py" -c 'import torch, transformers, accelerate; print("torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__)')"
