#!/usr/bin/env bash
# Everything that needs a GPU, in one command (for a lent GPU machine: one device call).
# Run from the repository root with a CUDA build of torch, torchvision and nvidia-ml-py:
#   bash benchmarks/gpu_checks.sh            # results under benchmarks/results, logs under $OUT or /tmp
# About 9 minutes on an H100 with 16 cores.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp/tandem-gpu-checks}
mkdir -p "$out"
nvidia-smi -L
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
# 1. the CUDA tests (they skip elsewhere)
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/share/test_gpu_slab.py tests/share/test_cuda.py \
  tests/share/test_images.py tests/share/test_gpu_io.py tests/share/test_batch_transform.py 2>&1 | tee "$out/gpu_tests.log" | tail -15
# 2. the augmentation's per-sample cost, CPU and GPU
python3 benchmarks/augment_cost.py --out "$out/augment_cost.json"
# 3. the GPU share benchmark (N = 1, 2, 4; limit, private, host, gpu)
python3 benchmarks/gpu_share.py --budget-s 360 --out "$out/gpu_share.json" 2>&1 | tail -30
