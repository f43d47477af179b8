#!/usr/bin/env bash
# Install a folder of wheels on an offline GPU machine into one --target tree, then print the
# PYTHONPATH to export. Usage: source <(bash bench/offline_wheels.sh WHEEL_DIR [TARGET])
# - One pip call for all wheels: the nvidia-cutlass-dsl wheels share the nvidia_cutlass_dsl/ tree, and
#   a second `pip install --target --upgrade` would replace that whole folder (dropping -libs-core).
# - --target skips .pth files, so nvidia_cutlass_dsl/dsl_packages (where `cutlass` lives for
#   flash-attn-4) is added to the path here, as nvidia_cutlass_dsl_packages.pth would do.
# - The default target's path contains site-packages/: quack's kernel cache fingerprints code outside
#   site-packages as its own and fails on cutlass internals it cannot hash (a ContextVar).
# - A wheel too large to carry in one piece may come as STEM.part.* beside STEM.name (its file name).
set -euo pipefail
wheels=${1:?wheel folder} target=${2:-/tmp/site-packages}
for name in "$wheels"/*.name; do
  [ -e "$name" ] || continue
  stem=${name%.name}
  cat "$stem".part.* > "$wheels/$(cat "$name")" && rm -f "$stem".part.* "$name"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$wheels"/*.whl >&2
echo "export PYTHONPATH=$target:$target/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
