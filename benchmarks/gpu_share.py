"""N jobs training on one GPU: the GPU's limit vs private DataLoaders vs tandem's host and GPU
paths vs TensorSocket. `python3 benchmarks/gpu_share.py [--jobs 1,2,4] [--model resnet18]`;
`--smoke` runs its machinery on the CPU. Results: benchmarks/results/gpu_share.{json,md}.
See tandem.bench.gpu_share for what is measured."""

import sys

from tandem.bench.gpu_share import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
