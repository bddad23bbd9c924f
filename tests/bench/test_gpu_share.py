"""The GPU share benchmark's runner, on the CPU (``--smoke``), and its arithmetic by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tandem.bench import gpu_share
from tandem.bench.gpu_share import (
    GpuShareConfig,
    ModeRun,
    epoch_accounting,
    label_mismatches,
    main,
    private_workers,
    samples_at,
    smoke_config,
    union_rate,
)


def test_union_rate_spans_the_earliest_start_to_the_latest_end():
    # job A: 10 samples/s from t=0 to 10; job B: 20 samples/s from t=5 to 20
    a = [(float(t), 10 * t) for t in range(0, 11)]
    b = [(float(t), 20 * (t - 5)) for t in range(5, 21)]
    rate, t0, t1, samples = union_rate([(0.0, 10.0), (5.0, 20.0)], [a, b])
    assert (t0, t1, samples) == (0.0, 20.0, 400)
    assert rate == pytest.approx(20.0)  # 400 samples over the 20 s span, not 10 + 20
    # work another job did inside the span (its warm-up, say) counts too
    a_more = a + [(float(t), 100 + 5 * (t - 10)) for t in range(11, 21)]
    assert union_rate([(0.0, 10.0), (5.0, 20.0)], [a_more, b])[3] == 450


def test_samples_at_interpolates_a_timeline():
    tl = [(1.0, 10), (3.0, 30)]
    assert samples_at(tl, 0.5) == 0.0 and samples_at(tl, 1.0) == 10.0
    assert samples_at(tl, 2.0) == pytest.approx(20.0) and samples_at(tl, 9.0) == 30.0
    assert samples_at([], 5.0) == 0.0


def test_union_rate_of_nothing_is_zero():
    assert union_rate([], []) == (0.0, 0.0, 0.0, 0)
    assert union_rate([(3.0, 3.0)], [[(3.0, 5)]]) == (0.0, 0.0, 0.0, 0)  # an empty window is left out


def test_epoch_accounting_counts_lost_and_duplicated_per_epoch():
    size = 6
    assert epoch_accounting([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]], size, 2) == (0, 0)
    assert epoch_accounting([[0, 1, 2, 3, 4]], size, 1) == (1, 0)  # 5 missing
    assert epoch_accounting([[0, 1, 2, 3, 4, 5, 5, 5]], size, 1) == (0, 2)  # 5 twice too many
    # one repeated in place of another: one lost and one duplicated
    assert epoch_accounting([[0, 1, 2, 3, 4, 4]], size, 1) == (1, 1)
    # a sample from the next epoch taken early: this epoch duplicates it, the next loses it
    assert epoch_accounting([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5]], size, 2) == (1, 1)
    # out-of-range indices count as duplicated (not one of the dataset's samples)
    assert epoch_accounting([[0, 1, 2, 3, 4, 5, 6, -1]], size, 1) == (0, 2)
    # a missing epoch loses the whole dataset; an extra one duplicates all it holds
    assert epoch_accounting([list(range(size))], size, 2) == (size, 0)
    assert epoch_accounting([list(range(size))] * 3, size, 2) == (0, size)
    # numpy arrays as well as lists
    assert epoch_accounting([np.arange(size)[::-1]], size, 1) == (0, 0)


def test_label_mismatches_compares_with_the_dataset_labels():
    truth = np.array([0, 0, 1, 1, 2])
    assert label_mismatches([[4, 0, 2]], [[2, 0, 1]], truth) == 0
    assert label_mismatches([[4, 0, 2]], [[2, 1, 1]], truth) == 1
    assert label_mismatches([[9]], [[0]], truth) == 1  # an index outside the dataset
    assert label_mismatches([[0, 1]], [[0]], truth) == 2  # lengths differ: all suspect


def test_private_workers_share_the_cores_out():
    assert private_workers("auto", 1, 16) == 8
    assert private_workers("auto", 2, 16) == 7
    assert private_workers("auto", 4, 16) == 3
    assert private_workers("auto", 4, 2) == 1
    assert private_workers(5, 4, 16) == 5


def test_targets_pass_and_fail_on_made_up_runs():
    facts = {"gpu": "NVIDIA H100 80GB HBM3", "cores_usable": 16}

    def mode(
        name: str, rate: float, input_cores: float, lost: int | None = 0, dup: int | None = 0
    ) -> ModeRun:
        pct = 100 * rate / 1000
        return ModeRun(name, 4, samples_per_s=rate, cores_busy=input_cores + 4, input_cores=input_cores,
                       pct_of_limit=pct, lost=lost, duplicated=dup, label_mismatches=0)  # fmt: skip

    runs = [mode("limit", 1000, 0, None, None), mode("private", 300, 12), mode("host", 750, 8),
            mode("gpu", 920, 3.5)]  # fmt: skip
    met = {t["target"].split(" ")[1] if t["target"].startswith("N=") else "integrity": t["met"]
           for t in gpu_share.targets(runs, GpuShareConfig(), facts, [1, 2, 4])}  # fmt: skip
    assert met == {"gpu": True, "host": True, "integrity": True}
    runs[3] = mode("gpu", 920, 4.5)  # too many input cores
    runs[2] = mode("host", 690, 8, lost=1)  # too slow, and one sample lost
    met = [t["met"] for t in gpu_share.targets(runs, GpuShareConfig(), facts, [1, 2, 4])]
    assert met == [False, False, False]
    assert all(t["setting_matches"] for t in gpu_share.targets(runs, GpuShareConfig(), facts, [4])[:2])
    assert not gpu_share.targets(runs, GpuShareConfig(model="resnet50"), facts, [4])[0]["setting_matches"]


def test_without_cuda_the_runner_says_so(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = main(["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "r.json")])
    assert rc == 2
    assert "CUDA needed" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_smoke_run_measures_every_mode_and_writes_the_results(tmp_path):
    """The runner end to end on the CPU: N in {1, 2}, 64 images of about 64x48, one epoch."""
    out = tmp_path / "results" / "gpu_share.json"
    cfg = smoke_config(data_dir=str(tmp_path / "data"))
    modes = ("limit", "private", "host", "gpu", "tensorsocket")
    report = gpu_share.run(cfg, jobs=(1, 2), modes=modes, out=out, smoke=True, command="pytest",
                           log=lambda _s: None)  # fmt: skip
    saved = json.loads(out.read_text())
    assert saved["command"] == "pytest" and saved["jobs"] == [1, 2]
    assert {"cpus", "cores_usable", "torch", "gpu", "platform", "python"} <= set(saved["machine"])
    assert saved["config"]["images"] == 64 and saved["config"]["device"] == "cpu"
    assert "| mode | N | samples/s |" in out.with_suffix(".md").read_text()
    runs = {(r["mode"], r["jobs"]): r for r in saved["runs"]}
    assert set(runs) == {(m, n) for m in modes for n in (1, 2)}
    for n in (1, 2):
        assert runs[("tensorsocket", n)]["status"] == "unavailable"  # never on the CPU
        # the GPU path runs on the CPU where Producer.from_files exists, else says why not
        measured = ["limit", "private", "host"]
        if gpu_share.unavailable("gpu", cfg) is None:
            measured.append("gpu")
        else:
            assert runs[("gpu", n)]["status"] == "unavailable"
        for mode in measured:
            r = runs[(mode, n)]
            assert r["status"] == "ok", (mode, n, r["note"])
            fields = ("samples_per_s", "pct_of_limit", "cpu_s_per_sample", "cores_busy", "window_s")
            assert all(r[f] is not None for f in fields), r
            assert r["samples_per_s"] > 0 and r["window_s"] > 0
            assert len(r["per_job"]) == n and all(j["error"] is None for j in r["per_job"])
            # 64 samples a job, 16 of them (the first step) before the timed window
            assert all(j["samples"] == 64 and j["timed_samples"] == 48 for j in r["per_job"])
            # the union-window rate: every sample trained between the first start and the last
            # end (each job's timed ones, and others' warm-up steps that fell inside the span)
            assert 48 * n <= r["samples"] <= 64 * n
            span = max(j["end"] for j in r["per_job"]) - min(j["start"] for j in r["per_job"])
            assert r["samples_per_s"] == pytest.approx(r["samples"] / span)
            assert r["leaked_producers"] == []
            if mode == "limit":
                assert r["lost"] is None and r["pct_of_limit"] == pytest.approx(100)
            else:
                assert (r["lost"], r["duplicated"], r["label_mismatches"]) == (0, 0, 0), (mode, n)
                assert r["input_cores"] is not None
    integrity = report["targets"][-1]
    assert integrity["met"], integrity
    assert [t["met"] is not None for t in saved["targets"]] == [True] * 3


def _report_start_method(q) -> None:
    import multiprocessing as mp
    import os

    q.put((mp.get_start_method(), os.environ.get("GPU_SHARE_TEST")))


def test_children_have_the_runners_environment_and_the_default_start_method(monkeypatch):
    """Jobs and producers come from a forkserver; their loader workers must still start as in
    a standalone script (a forkserver's child inherits its method, and its DataLoader workers
    would each import torch anew), and they see the runner's environment of now."""
    import multiprocessing as mp

    monkeypatch.setenv("GPU_SHARE_TEST", "now")
    q = gpu_share.CTX.Queue()
    p = gpu_share._start(_report_start_method, q)
    try:
        assert q.get(timeout=60) == (mp.get_all_start_methods()[0], "now")
    finally:
        p.join(10)


def test_modes_that_cannot_run_say_why():
    assert gpu_share.unavailable("private", GpuShareConfig()) is None
    assert gpu_share.unavailable("gpu", GpuShareConfig()) is None
    assert "unknown mode" in gpu_share.unavailable("nonsense", GpuShareConfig())
