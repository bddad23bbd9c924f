#!/usr/bin/env bash
# Everything that needs a GPU, in parts that each fit one device call (10 minutes).
# Run from the repository root with a CUDA build of torch, torchvision and nvidia-ml-py:
#   bash benchmarks/gpu_checks.sh tests     # the CUDA tests (they skip elsewhere), ~3 min
#   bash benchmarks/gpu_checks.sh stages    # each stage of the GPU path's producer, ~2 min
#   bash benchmarks/gpu_checks.sh share     # gpu_share.py, N = 1, 2, 4, all modes, ~7 min
#   bash benchmarks/gpu_checks.sh tests stages   # several parts in one call
# Results and logs go to $OUT (or /tmp/tandem-gpu-checks).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp/tandem-gpu-checks}
mkdir -p "$out"
quiet='warn|rationality|super\(\)'
nvidia-smi -L
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
for part in "${@:-tests stages share}"; do
  for p in $part; do
    echo "== $p"
    case $p in
      tests)
        timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/share/test_gpu_slab.py \
          tests/share/test_cuda.py tests/share/test_images.py tests/share/test_gpu_io.py \
          tests/share/test_batch_transform.py >"$out/gpu_tests.log" 2>&1
        tail -25 "$out/gpu_tests.log" ;;
      stages)
        timeout 240 python3 benchmarks/gpu_pipeline_stages.py --out "$out/gpu_pipeline_stages.json" 2>&1 |
          grep -v -i -E "$quiet" ;;
      share)
        timeout 560 python3 benchmarks/gpu_share.py --budget-s 400 --out "$out/gpu_share.json" 2>&1 | tail -30 ;;
      *)
        echo "unknown part '$p': tests, stages or share" >&2; exit 2 ;;
    esac
  done
done
