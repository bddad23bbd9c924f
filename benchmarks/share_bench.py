"""Run the shared-loading benchmark: `python benchmarks/share_bench.py [--quick] [--jobs 1,2,4]`.

Same as `tandem bench share`; results go to benchmarks/results/share.json.
"""

from tandem.cli import main

if __name__ == "__main__":
    import sys

    main(["bench", "share", *sys.argv[1:]])
