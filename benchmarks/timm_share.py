"""timm's own train.py, three runs started at once: upstream's (each its own loaders) against
the one-line change (``from tandem.share.timm import``: one producer per loader for the
three), in one sitting: wall time and CPU-seconds of each arm.

Both arms run ``tests/share/timm_train/train.py`` (timm's, vendored): the *private* arm with
line 35 put back as upstream wrote it, the *shared* arm as it is. The data is an
``ImageFolder`` written here (random-noise JPEGs, ``--size`` pixels a side; ``--per-class``
images in each of 3 classes for training, a quarter of that for validation), trained on with
``--model test_resnet``, ``--input-size 3 R R``, ``--epochs``, ``-b``, ``--workers`` and
``--device cpu``, one torch thread per run (``OMP_NUM_THREADS``, ``--threads``). Each arm has
a fresh runtime directory (``TANDEM_RUNTIME_DIR``) and a linger of 2 s
(``TANDEM_SHARE_LINGER_S``): its producers end by themselves once the runs have gone.

**Wall**: from the start of the three runs to the end of the last. **CPU-s**: every
CPU-second of every process of the arm (the runs, their loader workers, the producers and
theirs), counted after the last of them has ended: this process is a child subreaper, so all
of them end as its descendants (``getrusage(RUSAGE_CHILDREN)`` before and after), and each arm
also runs in a cgroup of its own where one can be made (``sweep_vs.CpuGroup``); both are
lower bounds, the figure is the larger (both are in the JSON). Every run must exit 0; in the
shared arm no loader may read privately and one producer is started per loader.

    python benchmarks/timm_share.py [--per-class 400] [--size 384] [--input 64] [--epochs 2]

Writes ``benchmarks/results/timm_share.{json,md}`` (needs timm and torchvision).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sweep_vs import PR_SET_CHILD_SUBREAPER, CpuGroup, children_cpu_s, reap  # noqa: E402

TRAIN = ROOT.parent / "tests" / "share" / "timm_train" / "train.py"  # read as data, not imported
CHANGED, OURS, UPSTREAM = 35, "from tandem.share.timm import ", "from timm.data import "


def write_scripts(work: Path) -> dict[str, Path]:
    """``{"private": upstream's train.py, "shared": the vendored one}``, in ``work``."""
    lines = TRAIN.read_text().splitlines(keepends=True)
    if not lines[CHANGED - 1].startswith(OURS):
        raise SystemExit(f"{TRAIN}: line {CHANGED} is not the one tandem changed")
    lines[CHANGED - 1] = UPSTREAM + lines[CHANGED - 1][len(OURS) :]
    (work / "upstream_train.py").write_text("".join(lines))
    return {"private": work / "upstream_train.py", "shared": TRAIN}


def write_images(root: Path, per_class: int, size: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("validation", max(1, per_class // 4))):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:04d}.jpg", quality=90)


def run_arm(arm: str, script: Path, data: Path, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"ts-{arm}-"))  # short: socket paths are at most 107 bytes
    runtime = work / "rt"
    env = {k: v for k, v in os.environ.items() if k not in ("TANDEM_JOB_ID", "TANDEM_SHARE")}
    env.update(TANDEM_RUNTIME_DIR=str(runtime), TANDEM_SHARE_LINGER_S="2", OMP_NUM_THREADS=str(args.threads))
    train_args = [
        "--data-dir", str(data), "--model", "test_resnet", "--num-classes", "3",
        "--epochs", str(args.epochs), "-b", str(args.batch), "--workers", str(args.workers),
        "--input-size", "3", str(args.input), str(args.input), "--device", "cpu", "--log-interval", "1000",
    ]  # fmt: skip
    group = CpuGroup(f"tandem-timm-{arm}-{os.getpid()}")
    cpu0 = children_cpu_s()
    began = time.monotonic()
    runs: dict[int, subprocess.Popen] = {}
    for i in range(args.procs):
        out = work / f"run{i}"
        out.mkdir()
        with (out / "stdout").open("wb") as stdout, (out / "stderr").open("wb") as stderr:
            cmd = [sys.executable, str(script), *train_args, "--output", str(out)]
            p = subprocess.Popen(cmd, cwd=out, env=env, stdout=stdout, stderr=stderr, preexec_fn=group.join)
        runs[p.pid] = p
    ended: dict[int, float] = {}
    deadline = time.monotonic() + args.timeout
    while len(ended) < len(runs):  # reap what ends meanwhile (orphans too) until the runs have ended
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in runs:
            runs[pid].returncode = os.waitstatus_to_exitcode(status)
            ended[pid] = time.monotonic() - began
        elif not pid:
            if time.monotonic() > deadline:
                for p in runs.values():
                    p.kill()
            time.sleep(0.05)
    wall = max(ended.values())
    leftovers = reap(time.monotonic() + 60)  # the producers end 2 s after their last reader
    reaped = children_cpu_s() - cpu0
    in_group = group.cpu_s()
    group.remove()
    stderr = [(work / f"run{i}" / "stderr").read_text(errors="replace") for i in range(args.procs)]
    return {
        "arm": arm,
        "script": str(script),
        "exit_codes": [p.returncode for p in runs.values()],
        "wall_s": round(wall, 2),
        "each_run_s": sorted(round(s, 2) for s in ended.values()),
        "cpu_s": round(max(reaped, in_group or 0.0), 2),
        "cpu_s_reaped": round(reaped, 2),
        "cpu_s_cgroup": round(in_group, 2) if in_group is not None else None,
        "cgroup": group.kind,
        "producers_started": len(list(runtime.glob("auto-*.log"))),
        "read_privately": sum("reads privately" in s for s in stderr),
        "leftovers_killed": leftovers,
        "stderr_tails": [s.splitlines()[-3:] for s in stderr],
        "work": str(work),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=400, help="training images per class (3 classes)")
    parser.add_argument("--size", type=int, default=384, help="pixels a side of each JPEG")
    parser.add_argument("--input", type=int, default=64, help="the model's input size (--input-size 3 R R)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds an arm may take")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    parser.add_argument("--keep", action="store_true", help="keep the images and the runs' folders")
    args = parser.parse_args()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper (Linux only): the CPU-s would miss the producers")
    work = Path(tempfile.mkdtemp(prefix="ts-data-"))
    write_images(work / "data", args.per_class, args.size)
    scripts = write_scripts(work)
    arms = [run_arm(arm, scripts[arm], work / "data", args) for arm in ("private", "shared")]
    if not args.keep:
        for folder in [work, *(Path(a.pop("work")) for a in arms)]:
            shutil.rmtree(folder, ignore_errors=True)
    base = arms[0]
    for a in arms:
        a["wall_vs_private"] = round(a["wall_s"] / base["wall_s"], 3)
        a["cpu_vs_private"] = round(a["cpu_s"] / base["cpu_s"], 3) if base["cpu_s"] else None
    given = " ".join(sys.argv[1:])
    result = {
        "command": "python benchmarks/timm_share.py" + (f" {given}" if given else ""),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}",
        "load_before": os.getloadavg(),
        "versions": _versions(),
        "pythonpath": os.environ.get("PYTHONPATH"),  # where another tandem came from, if one did
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "timeout", "keep")},
        "arms": arms,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timm_share.json").write_text(json.dumps(result, indent=1) + "\n")
    n = 3 * args.per_class
    lines = [
        f"# timm's train.py, {args.procs} runs at once: upstream's vs the one-line change ({result['when']})",
        "",
        f"`{result['command']}`; {result['machine']}; {result['versions']}.",
        "",
        f"Workload: test_resnet, {n} training JPEGs ({args.size} px) at {args.input} px, "
        f"{3 * max(1, args.per_class // 4)} for validation, {args.epochs} epochs, -b {args.batch}, "
        f"--workers {args.workers}, OMP_NUM_THREADS={args.threads}, --device cpu.",
        "",
        "| arm | wall s | vs private | CPU-s, all processes | vs private | producers | exit codes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for a in arms:
        lines.append(
            f"| {a['arm']} | {a['wall_s']:.1f} | {a['wall_vs_private']:.2f}x | {a['cpu_s']:.1f} | "
            f"{a['cpu_vs_private']:.2f}x | {a['producers_started']} | {a['exit_codes']} |"
        )
    lines += [
        "",
        f"CPU-s: the larger of the reaped children's rusage and the arm's cgroup ({base['cgroup']}); "
        "the shared arm's producers and their workers included.",
    ]
    (args.out / "timm_share.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = any(any(a["exit_codes"]) for a in arms)
    if failed or arms[1]["read_privately"] or arms[1]["producers_started"] != 2:
        raise SystemExit("a run failed, or the shared arm did not share (see the JSON)")


def _versions() -> str:
    import timm
    import torch
    import torchvision

    return f"torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}"


if __name__ == "__main__":
    main()
