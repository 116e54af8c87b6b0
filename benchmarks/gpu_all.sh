#!/usr/bin/env bash
# Every GPU check of the adapter in one prepared run (a lent GPU's time is short):
#   1. benchmarks/gpu_check.py       predicted against measured peak and step time, four workloads
#   2. benchmarks/copy_engine_cuda.py the copier's CUDA engine trained bitwise against a deep copy
#   3. benchmarks/torch_fuzz.py       the differential fuzz profile on CUDA (as many models as fit)
# Usage: bash benchmarks/gpu_all.sh OUTDIR [FUZZ_SECONDS]. Each step has its own time limit, so a
# slow one cannot eat the others' time; every report is written into OUTDIR as it is made.
set -u
out=${1:?usage: gpu_all.sh OUTDIR [FUZZ_SECONDS]}
fuzz_s=${2:-90}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
timeout 200 python3 benchmarks/gpu_check.py --steps 10 --out "$out/gpu_check.md" || echo "gpu_check: exit $?"
timeout 90 python3 benchmarks/copy_engine_cuda.py --out "$out/copy_engine_cuda.md" || echo "copy_engine_cuda: exit $?"
timeout "$fuzz_s" python3 benchmarks/torch_fuzz.py --device cuda --models 2000 --shrink 3 --out "$out/torch_fuzz_cuda.md" || echo "torch_fuzz: stopped (exit $?)"
python3 benchmarks/torch_fuzz.py --device cuda --models 2000 --report --out "$out/torch_fuzz_cuda.md" >/dev/null && head -30 "$out/torch_fuzz_cuda.md"
