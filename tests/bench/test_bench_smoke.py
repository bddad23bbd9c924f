"""The benchmark and demo machinery on a tiny workload (figures are not asserted: speed
targets live in benchmarks/, not in unit tests)."""

from __future__ import annotations

import torch

from tandem.bench.data import ImageFolder
from tandem.bench.images import make_image_folder
from tandem.bench.models import MODELS
from tandem.bench.share_bench import CLOCK_MARK, STALL_KEY, JobSpec, ShareBenchConfig, run_one


def test_image_folder_is_generated_once_and_decodes(tmp_path):
    root = make_image_folder(tmp_path / "img", images=12, classes=3, min_side=64, max_side=80)
    stamp = (root / "class00" / "000000.jpg").stat().st_mtime_ns
    make_image_folder(tmp_path / "img", images=12, classes=3, min_side=64, max_side=80)
    assert (root / "class00" / "000000.jpg").stat().st_mtime_ns == stamp, "reused, not rewritten"
    ds = ImageFolder(root, crop=48)
    assert len(ds) == 12 and ds.classes == ["class00", "class01", "class02"]
    image, label = ds[5]
    assert image.shape == (3, 48, 48) and image.dtype == torch.float32
    assert label == ds.classes.index(ds.samples[5][0].parent.name)
    assert -3 < float(image.mean()) < 3


def test_models_train_on_a_batch():
    x, y = torch.randn(4, 3, 64, 64), torch.tensor([0, 1, 2, 3])
    for name, make in MODELS.items():
        model = make()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        assert torch.isfinite(loss), name


def test_private_and_shared_runs_deliver_every_sample(tmp_path):
    cfg = ShareBenchConfig(images=24, epochs=1, batch_size=8, crop=48, workers=1, run_timeout_s=120,
                 data_dir=str(tmp_path))  # fmt: skip
    root = str(make_image_folder(tmp_path / "img", images=24, classes=3, min_side=64, max_side=80))
    jobs = [JobSpec("cnn", "tiny_cnn", 8), JobSpec("sleep", None, 5)]
    for mode in ("private", "tandem"):
        result = run_one(mode, jobs, "mixed", cfg, root)
        assert not result.note, result.note
        assert sorted(j.samples for j in result.per_job) == [24, 24], mode
        assert result.cpu_s > 0 and result.samples_per_s > 0 and result.peak_pss_mib > 0


def test_demo_jobs_are_tracked_as_runs_of_a_group(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tandem.watch.report import load_runs, plot

    store = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    cfg = ShareBenchConfig(images=16, epochs=1, batch_size=8, crop=48, workers=1, run_timeout_s=120,
                 data_dir=str(tmp_path))  # fmt: skip
    root = str(make_image_folder(tmp_path / "img", images=16, classes=2, min_side=64, max_side=80))
    result = run_one("tandem", [JobSpec("cnn", "tiny_cnn", 8)], "cnn", cfg, root, track_group="smoke-g")
    assert not result.note, result.note
    runs = load_runs(["group:smoke-g"], store)
    assert sorted(r.name for r in runs) == ["producer", JobSpec("cnn", "tiny_cnn", 8).label(cfg)]
    job = next(r for r in runs if r.name != "producer")
    assert job.summary["samples"] == 16 and job.summary["cpu_seconds"] > 0
    assert all(r.status == "FINISHED" for r in runs)
    plot(runs, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert MlflowClient(store).get_run(job.run_id).data.tags["group"] == "smoke-g"
    # Where the figures' clock started: after every job was built, before any ended.
    clock_ms = float(job.tags[CLOCK_MARK])
    assert job.start_ms < clock_ms <= job.series["system/process_tree/cpu_percent"][-1][0]


def test_private_jobs_data_stall_is_logged_as_the_job_measured_it(tmp_path, monkeypatch):
    """tandem's consumers report their stall to tandem.watch; a private DataLoader does not,
    so the runner logs what each job measured (time blocked in next()) to its run."""
    from tandem.watch.report import load_runs

    store = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    cfg = ShareBenchConfig(images=16, epochs=1, batch_size=8, crop=48, workers=1, run_timeout_s=120,
                 data_dir=str(tmp_path))  # fmt: skip
    root = str(make_image_folder(tmp_path / "img", images=16, classes=2, min_side=64, max_side=80))
    spec = JobSpec("cnn", "tiny_cnn", 4)
    result = run_one("private", [spec], "cnn", cfg, root, track_group="smoke-p")
    assert not result.note, result.note
    (run,) = load_runs(["group:smoke-p"], store)
    stalls = [v for _, v in run.series[STALL_KEY]]
    assert stalls == sorted(stalls), "a running total"
    assert stalls[-1] == result.per_job[0].stall_s > 0
    assert CLOCK_MARK in run.tags
