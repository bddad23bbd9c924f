"""The GPU share benchmark's driver: every mode at every N, the targets, the report, the
command line."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tandem.bench.data import ImageFolder
from tandem.bench.gpu_share.accounting import _cores
from tandem.bench.gpu_share.config import (
    CTX,
    DEFAULT_OUT,
    DTYPES,
    MODES,
    PRELOAD,
    SMOKE_MODES,
    SMOKE_OUT,
    CudaNeeded,
    GpuShareConfig,
    smoke_config,
)
from tandem.bench.gpu_share.jobs import prepare_images, resolve_model
from tandem.bench.gpu_share.measure import ModeRun, run_one


# --------------------------------------------------------------------------- driver
def machine_facts(cfg: GpuShareConfig) -> dict:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cores_usable": _cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    try:
        import torchvision

        facts["torchvision"] = torchvision.__version__
    except Exception:  # noqa: BLE001
        facts["torchvision"] = None
    if cfg.device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(cfg.device).index or 0
        props = torch.cuda.get_device_properties(index)
        facts["gpu"] = props.name
        facts["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return facts


def _cross_run(runs: list[ModeRun]) -> None:
    """% of the limit (and cores over it) from the ``limit`` run of the same N; input cores."""
    limits = {r.jobs: r for r in runs if r.mode == "limit" and r.status == "ok" and r.samples_per_s}
    for r in runs:
        limit = limits.get(r.jobs)
        if r.cores_busy is None:
            continue
        if limit is not None and r.samples_per_s:
            r.pct_of_limit = 100.0 * r.samples_per_s / limit.samples_per_s
        if r.mode != "limit":
            r.input_cores = r.cores_by_role.get("producer", 0.0) + r.cores_by_role.get("workers", 0.0)
            if limit is not None and limit.cores_busy is not None:
                r.cores_over_limit = r.cores_busy - limit.cores_busy


def targets(runs: list[ModeRun], cfg: GpuShareConfig, facts: dict, jobs: Sequence[int]) -> list[dict]:
    """The issue's targets (set for N=4 ResNet-18 on an H100 with 16 cores), pass or fail."""
    n = 4 if 4 in jobs else max(jobs)
    setting = (
        cfg.model == "resnet18"
        and n == 4
        and "H100" in str(facts.get("gpu"))
        and facts.get("cores_usable") == 16
    )

    def find(mode: str) -> ModeRun | None:
        return next((r for r in runs if r.mode == mode and r.jobs == n), None)

    def share_target(mode: str, pct_min: float, cores_max: float | None) -> dict:
        text = f"N={n} {mode} path >= {pct_min:g}% of the limit" + (
            f" with <= {cores_max:g} cores busy for input" if cores_max is not None else ""
        )
        r = find(mode)
        if r is None or r.status != "ok" or r.pct_of_limit is None:
            why = "not run" if r is None else r.note or f"no limit run for N={n}"
            return {"target": text, "measured": why, "met": False, "setting_matches": setting}
        measured = f"{r.pct_of_limit:.0f}% of the limit, {r.input_cores or 0:.1f} input cores"
        met = r.pct_of_limit >= pct_min and (cores_max is None or (r.input_cores or 0) <= cores_max)
        met = met and setting  # a target counts as met only in the setting it was set for
        return {
            "target": text,
            "measured": measured,
            "value": r.pct_of_limit,
            "input_cores": r.input_cores,
            "met": met,
            "setting_matches": setting,
        }

    out = [share_target("gpu", 90, 4), share_target("host", 70, None)]
    checked = [r for r in runs if r.mode != "limit" and r.status in ("ok", "failed")]
    accounted = [r for r in checked if r.lost is not None]
    lost = sum(r.lost or 0 for r in accounted)
    dup = sum(r.duplicated or 0 for r in accounted)
    bad = sum(r.label_mismatches or 0 for r in accounted)
    failed = [f"{r.mode} x{r.jobs}" for r in checked if r.status == "failed"]
    measured = f"lost {lost}, duplicated {dup}, wrong labels {bad} over {len(accounted)} run(s)"
    if failed:
        measured += f"; failed: {', '.join(failed)}"
    out.append(
        {
            "target": "no sample lost or duplicated (each job's each epoch a permutation)",
            "measured": measured,
            "met": bool(accounted) and not failed and lost == dup == bad == 0,
            "setting_matches": True,
        }
    )
    return out


COLUMNS = (
    "mode",
    "N",
    "samples/s",
    "% limit",
    "CPU ms/sample",
    "cores busy",
    "input cores",
    "J/sample",
    "lost",
    "dup",
    "note",
)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table_rows(runs: list[ModeRun]) -> list[list[str]]:
    rows = []
    for r in runs:
        rate = "-" if r.status in ("unavailable", "skipped") else f"{r.samples_per_s:.0f}"
        cpu_ms = None if r.cpu_s_per_sample is None else 1000 * r.cpu_s_per_sample
        rows.append(
            [
                r.mode,
                str(r.jobs),
                rate,
                _fmt(r.pct_of_limit, ".0f"),
                _fmt(cpu_ms, ".2f"),
                _fmt(r.cores_busy, ".1f"),
                _fmt(r.input_cores, ".1f"),
                _fmt(r.joules_per_sample, ".3f"),
                _fmt(r.lost, "d"),
                _fmt(r.duplicated, "d"),
                r.note[:120],
            ]
        )
    return rows


def text_table(runs: list[ModeRun]) -> str:
    rows = [list(COLUMNS), *table_rows(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows)


def write_markdown(report: dict, runs: list[ModeRun], path: Path) -> None:
    m, c = report["machine"], report["config"]
    lines = [
        f"# tandem GPU share benchmark: results of {report['when']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: GPU {m.get('gpu') or 'none'}, {m['cores_usable']} usable cores ({m['cpus']} CPUs), "
        f"{m['platform']}, Python {m['python']}, torch {m['torch']} (CUDA {m['cuda']}), "
        f"torchvision {m.get('torchvision')}.",
        "",
        f"Workload: {c['images']} generated JPEGs ({c['min_side']}-{c['max_side']} px sides, "
        f"{c['classes']} classes), {c['epochs']} epoch(s) per job, batch {c['batch_size']}, crop "
        f"{c['crop']}, model {c['model']} (bf16 autocast, channels-last, SGD), first {c['warmup']} "
        f"and last {c['cooldown']} steps of each job untimed. Loader workers: private "
        f"{c['workers']} per job, host producer "
        f"{c['producer_workers']}, GPU-path producer {c['gpu_workers']}; GPU-path dtype {c['dtype']}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(runs)]
    lines += ["", "| target | measured | met | setting as specified |", "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(
            f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} "
            f"| {'yes' if t['setting_matches'] else 'no'} |"
        )
    lines += ["", "Definitions:", ""] + [f"- {k}: {v}" for k, v in report["definitions"].items()]
    path.write_text("\n".join(lines) + "\n")


DEFINITIONS = {
    "samples/s": "all jobs' timed samples over the union of their timed windows, from the "
    "earliest job's first timed step to the latest job's last (GPU synchronised at both ends; "
    "each job's first `warmup` and last `cooldown` steps untimed, so that input buffers filled "
    "in the warm-up and drained at the end count for nothing)",
    "% limit": "samples/s as a share of the limit mode's (synthetic batches on the GPU) for the same N",
    "CPU ms/sample": "CPU time of every process of the run (jobs, producer, loader workers), "
    "sampled from the process tree every 0.2 s, over the same window, per timed sample",
    "cores busy": "that CPU time over the window's length; by role in the JSON (cores_by_role)",
    "input cores": "cores busy in the processes that do nothing but input: the producer and the "
    "loader workers (the jobs' own processes are left out; cores_over_limit in the JSON is the "
    "run's cores busy less the limit mode's for the same N)",
    "J/sample": "GPU energy (NVML total-energy counter, whole device) over the window, per timed sample",
    "lost/dup": "over every job and epoch: dataset indices an epoch missed / had more than once",
}


def run(
    cfg: GpuShareConfig | None = None,
    *,
    jobs: Sequence[int] = (1, 2, 4),
    modes: Sequence[str] | None = None,
    out: Path | None = None,
    smoke: bool = False,
    command: str | None = None,
    budget_s: float | None = None,
    log: Callable[[str], None] = lambda s: print(s, flush=True),
) -> dict:
    """Run every mode for every N in ``jobs``; write ``out`` (JSON) and its ``.md``; return
    the report. ``smoke``: on the CPU (``cfg`` defaults to :func:`smoke_config`).
    ``budget_s``: runs that would start after this many seconds are skipped."""
    began = time.monotonic()
    if CTX.get_start_method() == "forkserver":
        CTX.set_forkserver_preload(PRELOAD)
    if cfg is None:
        cfg = smoke_config() if smoke else GpuShareConfig()
    if smoke:
        cfg = _replace(cfg, device="cpu")
    elif cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise CudaNeeded(
            "CUDA needed: this benchmark trains on a GPU and torch sees none here "
            f"(torch {torch.__version__}); --smoke runs its machinery on the CPU"
        )
    model, model_note = resolve_model(cfg.model)
    cfg = _replace(cfg, model=model)
    modes = tuple(modes or (SMOKE_MODES if smoke else MODES))
    out = Path(out or (SMOKE_OUT if smoke else DEFAULT_OUT))
    facts = machine_facts(cfg)
    where = facts.get("gpu") or "CPU (smoke)"
    log(
        f"gpu_share: {where}, {facts['cores_usable']} cores, torch {facts['torch']}; {cfg.model} "
        f"batch {cfg.batch_size}, {cfg.images} images x {cfg.epochs} epoch(s), N in {list(jobs)}, "
        f"modes {list(modes)}"
    )
    if model_note:
        log(f"note: {model_note}")
    t = time.monotonic()
    root = prepare_images(cfg)
    truth = np.array([label for _, label in ImageFolder(root, crop=cfg.crop).samples], dtype=np.int64)
    log(f"images ready in {root} ({time.monotonic() - t:.1f} s)")
    report: dict[str, Any] = {
        "machine": facts,
        "config": asdict(cfg),
        "command": command or f"python3 benchmarks/gpu_share.py{' --smoke' if smoke else ''}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "jobs": list(jobs),
        "modes": list(modes),
        "notes": [model_note] if model_note else [],
        "definitions": DEFINITIONS,
    }
    runs: list[ModeRun] = []
    plan = [(n, mode) for n in jobs for mode in modes]
    for k, (n, mode) in enumerate(plan, 1):
        if budget_s is not None and time.monotonic() - began > budget_s:
            runs.append(ModeRun(mode, n, status="skipped", note=f"skipped: over the {budget_s:g} s budget"))
            continue
        log(f"[{k}/{len(plan)}] {mode} x{n} ({time.monotonic() - began:.0f} s in) ...")
        r = run_one(mode, n, cfg, str(root), truth)
        runs.append(r)
        _cross_run(runs)
        log(
            f"    {r.status}: {r.samples_per_s:.0f} samples/s, window {r.window_s:.1f} s of "
            f"{r.elapsed_s:.1f} s, cores busy {_fmt(r.cores_busy, '.1f')}, lost {_fmt(r.lost, 'd')}, "
            f"dup {_fmt(r.duplicated, 'd')}" + (f"; {r.note}" if r.note else "")
        )
        _write(report, runs, cfg, facts, jobs, out)  # after every run: a cut-off run keeps its results
    report = _write(report, runs, cfg, facts, jobs, out)
    log("")
    log(text_table(runs))
    log("")
    for tgt in report["targets"]:
        where = "" if tgt["setting_matches"] else " [not the target's setting: N=4 resnet18, H100, 16 cores]"
        log(f"{'PASS' if tgt['met'] else 'FAIL'}: {tgt['target']} (measured {tgt['measured']}){where}")
    log(f"results written to {out} and {out.with_suffix('.md')} ({time.monotonic() - began:.0f} s)")
    return report


def _write(
    report: dict, runs: list[ModeRun], cfg: GpuShareConfig, facts: dict, jobs: Sequence[int], out: Path
) -> dict:
    report["runs"] = [asdict(r) for r in runs]
    report["targets"] = targets(runs, cfg, facts, jobs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    write_markdown(report, runs, out.with_suffix(".md"))
    return report


def _replace(cfg: GpuShareConfig, **changes: Any) -> GpuShareConfig:
    from dataclasses import replace

    return replace(cfg, **changes)


def _workers_arg(text: str) -> int | str:
    if text == "auto":
        return text
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a non-negative integer or 'auto'")
    return value


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu_share",
        description="N jobs training on one GPU from one JPEG folder: the GPU's limit, private "
        "DataLoaders, tandem's host path, tandem's GPU path, TensorSocket.",
    )
    p.add_argument(
        "--jobs", type=_int_list, default=None, help="comma-separated N (default 1,2,4; smoke 1,2)"
    )
    p.add_argument("--modes", default=None, help=f"comma-separated, of {','.join(MODES)} (default all)")
    p.add_argument("--model", default=None, help="torchvision model or bench model (default resnet18)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=None, help="default 128")
    p.add_argument("--images", type=int, default=None, help="JPEGs generated (default 4096)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per job (default 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps per job (default 20)")
    p.add_argument("--cooldown", type=int, default=None, help="untimed last steps per job (default 20)")
    p.add_argument("--classes", type=int, default=None, help="default 100")
    p.add_argument("--min-side", dest="min_side", type=int, default=None, help="default 333")
    p.add_argument("--max-side", dest="max_side", type=int, default=None, help="default 500")
    p.add_argument(
        "--workers",
        type=_workers_arg,
        default=None,
        help="private: loader workers per job (default auto: the cores / N, at most 8)",
    )
    p.add_argument(
        "--producer-workers",
        dest="producer_workers",
        type=_workers_arg,
        default=None,
        help="host path: the producer's loader workers (default auto)",
    )
    p.add_argument(
        "--gpu-workers",
        dest="gpu_workers",
        type=_workers_arg,
        default=None,
        help="GPU path: the producer's file-reading workers (default 4)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="GPU path's images (default bf16)")
    p.add_argument(
        "--timeout",
        dest="run_timeout_s",
        type=float,
        default=None,
        help="seconds per run from the common start (default 180)",
    )
    p.add_argument(
        "--budget-s",
        dest="budget_s",
        type=float,
        default=None,
        help="skip the runs that would start after this many seconds",
    )
    p.add_argument("--data-dir", dest="data_dir", default=None, help="default data/bench-images")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON path; the markdown goes beside it (default {DEFAULT_OUT})",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="on the CPU: a tiny model and images, modes limit, private, host, gpu (its CPU fallback)",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python3 benchmarks/gpu_share.py") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    base = smoke_config() if args.smoke else GpuShareConfig()
    given = {
        f.name: getattr(args, f.name)
        for f in fields(GpuShareConfig)
        if getattr(args, f.name, None) is not None
    }
    cfg = _replace(base, **given)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else None
    bad = [m for m in modes or () if m not in MODES]
    if bad:
        print(f"gpu_share: unknown mode(s) {bad}: use {', '.join(MODES)}", file=sys.stderr)
        return 2
    try:
        jobs = args.jobs or ([1, 2] if args.smoke else [1, 2, 4])
        run(
            cfg,
            jobs=jobs,
            modes=modes,
            out=args.out,
            smoke=args.smoke,
            command=f"{prog} {shlex.join(argv)}".strip(),
            budget_s=args.budget_s,
        )
    except (CudaNeeded, ValueError) as exc:
        print(f"gpu_share: {exc}", file=sys.stderr)
        return 2
    return 0
