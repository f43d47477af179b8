#!/usr/bin/env bash
# Download the wheels the one-GPU benchmarks need on an offline GPU machine (Python 3.12, x86-64)
# and split them into two folders that each fit one call's 64 MiB carry limit:
#   .whl-a/  TRL, Liger, datasets & co., torchao (FP8), and the first part of the CuTe DSL's CUDA 13 libraries
#   .whl-b/  the rest: flash-attn-4 and its CuTe DSL / quack / tvm-ffi dependencies, the second part
# (bitsandbytes for QLoRA stays in .whl/ alone: 43 MB would not fit beside either part)
# Two consecutive calls on a warm machine: the first copies .whl-a/ to /tmp/w, the second copies
# .whl-b/ there and runs `eval "$(bash bench/offline_wheels.sh /tmp/w)"`, which joins the parts.
# Usage: bash bench/fetch_wheels.sh   (in the repository root; both folders are git-ignored there)
set -euo pipefail
cd "$(dirname "$0")/.."
for dir in .whl .whl-a .whl-b; do
  grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
done
platforms=()
for tag in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${tag}_x86_64")
done
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "$@"
}
CUTLASS=4.8.1
# for the peers (TRL) and our data path; the GPU image lacks these
download trl==1.16.0 liger-kernel==0.8.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 tomli-w==1.2.0
download torchao==0.18.0  # --precision fp8 (train/kernels/float8.py)
# FlashAttention-4 and what it imports; -libs-core holds the `cutlass` Python package itself
download flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==$CUTLASS nvidia-cutlass-dsl-libs-base==$CUTLASS \
  nvidia-cutlass-dsl-libs-core==$CUTLASS nvidia-cutlass-dsl-libs-cu13==$CUTLASS \
  'apache-tvm-ffi>=0.1.11,<0.2' torch-c-dlpack-ext 'quack-kernels>=0.5.3'
rm -rf .whl-a .whl-b && mkdir .whl-a .whl-b
big=$(ls .whl/nvidia_cutlass_dsl_libs_cu13-*.whl)
split -b 50000000 "$big" .whl-a/cu13.part.
mv .whl-a/cu13.part.a[b-z] .whl-b/
basename "$big" > .whl-b/cu13.name
cp .whl/{trl,liger_kernel,datasets,dill,multiprocess,tomli_w,torchao}-*.whl .whl-a/
cp .whl/{flash_attn_4,nvidia_cutlass_dsl,nvidia_cutlass_dsl_libs_base,nvidia_cutlass_dsl_libs_core}-*.whl .whl-b/
cp .whl/{apache_tvm_ffi,torch_c_dlpack_ext,quack_kernels}-*.whl .whl-b/
du -sh .whl-a .whl-b
