"""Re-measure only the hand-off latency: `python benchmarks/handoff_check.py`."""

from tandem.bench.share_bench import measure_handoff

if __name__ == "__main__":
    for shape in ((64, 4096), (64, 3, 224, 224), (64, 3, 361, 361)):
        h = measure_handoff(shape, steps=40)
        print(f"{'x'.join(map(str, shape)):>14} {h['mbytes']:6.1f} MB  median {h['median_ms']:.3f} ms"
              f"  p90 {h['p90_ms']:.3f} ms")
