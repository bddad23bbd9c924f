"""A small real training job for the job-manager benchmark: ``python -m tandem.bench.place_job``.

Two kinds, as on a real shared server:

- ``wait``: mostly waiting on an accelerator. Each step runs a tiny CNN's forward and
  backward on the CPU (milliseconds), then sleeps ``--device-ms`` as if a GPU kernel were
  running: little CPU, most of the time waiting. What a GPU job looks like to the host.
- ``cpu``: CPU-bound. A small ResNet trains on one core (``torch.set_num_threads(1)``).

``--steps`` sets the work, so a job's time alone is its steps' time. ``--oom-once FILE``:
on the first run (FILE absent) the job prints PyTorch's CUDA out-of-memory error after a
few steps and exits 1, as a job that outgrew its GPU memory does; the retry succeeds.
``--hold MB`` keeps that much host memory allocated (a job's footprint).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from tandem.bench.models import small_resnet, tiny_cnn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tandem.bench.place_job")
    ap.add_argument("--kind", choices=["wait", "cpu"], required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device-ms", type=float, default=100.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--oom-once", metavar="FILE")
    ap.add_argument("--hold", type=int, default=0, metavar="MB")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_cnn() if args.kind == "wait" else small_resnet(width=24)
    size = 64 if args.kind == "wait" else 112
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch, 3, size, size)
    y = torch.randint(0, 8, (args.batch,))
    held = bytearray(args.hold << 20)  # touched below, so it is resident
    for i in range(0, len(held), 4096):
        held[i] = 1
    t0 = time.perf_counter()
    for step in range(args.steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.kind == "wait":
            time.sleep(args.device_ms / 1000)
        if args.oom_once and step == 3 and not os.path.exists(args.oom_once):
            open(args.oom_once, "w").close()
            print(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                "capacity of 79.19 GiB of which 1.12 GiB is free.",
                file=sys.stderr,
            )
            return 1
    print(f"{args.kind}: {args.steps} steps in {time.perf_counter() - t0:.2f} s, loss {loss.item():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
