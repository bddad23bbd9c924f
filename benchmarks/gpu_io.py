"""Storage to GPU, random reads: `python benchmarks/gpu_io.py [--quick] [--size-gib 8] [--seconds 5]`.

Same as `tandem bench io` (CPU-centric pread + pinned copy against cuFile, 4 KiB to 4 MiB);
results go to benchmarks/results/gpu_io.{json,md}. See tandem.bench.io_bench.
"""

from tandem.cli import main

if __name__ == "__main__":
    import sys

    main(["bench", "io", *sys.argv[1:]])
