"""timm's own train.py, changed in one line (``from tandem.share.timm import``), run as three
plain processes at once: all three exit 0, one producer serves each of its loaders (train and
eval) for all three, and every epoch of every process is every sample exactly once.

The run needs timm and torchvision (skipped without them); tests/share/timm_train/README.md
says where train.py comes from."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

from tests.share.conftest import wait_for
from tests.timing import scaled


def _missing() -> str | None:
    try:
        import timm.data  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a torchvision built for another torch raises others
        return f"needs timm and torchvision ({type(exc).__name__}: {exc})"
    return None


needs_timm = pytest.mark.skipif(bool(_missing()), reason=_missing() or "")

HERE = Path(__file__).resolve().parent / "timm_train"
TRAIN = HERE / "train.py"
CHANGED = 35  # the one line of train.py that differs from upstream's (1-based)
UPSTREAM_LINE = "from timm.data import "
OURS_LINE = "from tandem.share.timm import "
COMMIT = "aa4b5850c1543fa488abf260f18390eda46cf85d"  # timm's, README.md
CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS, BATCH = 3, 16, 4, 8  # 48 train images: 6 whole batches


def upstream_text() -> str:
    """Upstream's train.py: the vendored one with line 35 put back."""
    lines = TRAIN.read_text().splitlines(keepends=True)
    assert lines[CHANGED - 1].startswith(OURS_LINE), lines[CHANGED - 1]
    lines[CHANGED - 1] = UPSTREAM_LINE + lines[CHANGED - 1][len(OURS_LINE) :]
    return "".join(lines)


def test_the_vendored_train_py_is_upstreams_but_for_line_35() -> None:
    upstream = upstream_text()
    want = (HERE / "upstream.sha256").read_text().split()[0]
    assert hashlib.sha256(upstream.encode()).hexdigest() == want
    diff = difflib.unified_diff(upstream.splitlines(), TRAIN.read_text().splitlines(), n=0, lineterm="")
    changed = [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changed) == 2 and changed[0].startswith("-" + UPSTREAM_LINE), changed
    git_dir = os.environ.get("TIMM_GIT_DIR")  # a clone of timm, to compare with its own file
    if git_dir:
        theirs = subprocess.run(
            ["git", "-C", git_dir, "show", f"{COMMIT}:train.py"], capture_output=True, text=True, check=True
        ).stdout
        assert theirs == upstream


def _make_images(root: Path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", TRAIN_PER_CLASS), ("validation", VAL_PER_CLASS)):
        for c in range(CLASSES):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:03d}.png")


def _ours(runtime_dir: str) -> list[psutil.Process]:
    """Every process of this test's (train.py, producers, their workers): they have its
    runtime directory in their environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("TANDEM_RUNTIME_DIR") == runtime_dir:
                found.append(proc)
        except (psutil.Error, OSError):
            pass
    return found


@pytest.fixture
def nothing_left(runtime_dir: str):
    """Whatever this test started goes with it, even where it failed."""
    yield
    for proc in _ours(runtime_dir):
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@needs_timm
def test_create_loader_shares_timms_loader_or_keeps_timms_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nothing_left: None
) -> None:
    import warnings

    import torch
    from timm.data.loader import PrefetchLoader

    from tandem.share import DataLoader
    from tandem.share.timm import create_dataset, create_loader

    monkeypatch.setenv("TANDEM_SHARE_LINGER_S", "1")
    _make_images(tmp_path)
    common = dict(input_size=(3, 32, 32), batch_size=8, is_training=True, device=torch.device("cpu"))
    data = create_dataset("", root=str(tmp_path), split="train", is_training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shared, nothing to say
        wrapped = create_loader(data, **common)  # timm's default: a PrefetchLoader around the loader
        multi = create_loader(data, use_multi_epochs_loader=True, **common)
    assert isinstance(wrapped, PrefetchLoader) and isinstance(wrapped.loader, DataLoader)
    assert wrapped.dataset is data and len(wrapped) == 6 and wrapped.loader.drop_last
    assert isinstance(create_loader(data, use_prefetcher=False, **common), DataLoader)
    # --use-multi-epochs-loader: its endless sampler wraps the batch sampler; the drop-in takes
    # the sampler under it, one pass an epoch as timm's loader has
    assert isinstance(multi.loader, DataLoader) and type(multi.sampler) is torch.utils.data.RandomSampler
    assert len(multi) == 6
    for _ in range(2):
        seen = [i for _ in multi.loader for i in multi.loader.last_indices.tolist()]
        assert sorted(seen) == list(range(CLASSES * TRAIN_PER_CLASS))
    multi.loader.close()
    with pytest.warns(UserWarning, match="reads privately") as said:  # scheduled batch sizes
        scheduled = create_loader(data, input_size_choices=[24, 32], **common)
    assert len(said) == 1, [str(w.message) for w in said]
    assert type(scheduled.loader) is torch.utils.data.DataLoader  # timm's, as it built it
    assert type(scheduled.batch_sampler).__name__ == "ScheduledBatchSampler"


@needs_timm
@pytest.mark.timeout(scaled(200))
def test_three_timm_train_py_share_one_producer_every_epoch_exactly(
    tmp_path: Path, runtime_dir: str, nothing_left: None
) -> None:
    data, record = tmp_path / "data", tmp_path / "record"
    _make_images(data)
    record.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TANDEM_JOB_ID", "TANDEM_SHARE")}
    env.update(
        TANDEM_RUNTIME_DIR=runtime_dir,
        TANDEM_SHARE_LINGER_S="1",  # the producers end a second after their last reader
        TANDEM_TEST_RECORD=str(record),
        PYTHONPATH=os.pathsep.join(p for p in (str(HERE / "record"), env.get("PYTHONPATH")) if p),
        OMP_NUM_THREADS="1",  # three jobs on a small machine
    )
    args = [
        "--data-dir", str(data), "--model", "test_resnet", "--num-classes", str(CLASSES),
        "--epochs", "2", "-b", str(BATCH), "--workers", "1", "--input-size", "3", "32", "32",
        "--device", "cpu", "--log-interval", "1000",
    ]  # fmt: skip
    runs = []
    for i in range(3):
        out = tmp_path / f"run{i}"
        out.mkdir()
        with (out / "stdout").open("w") as stdout, (out / "stderr").open("w") as stderr:
            cmd = [sys.executable, str(TRAIN), *args, "--output", str(out)]
            runs.append((out, subprocess.Popen(cmd, cwd=out, env=env, stdout=stdout, stderr=stderr)))
    for out, proc in runs:
        try:
            proc.wait(timeout=scaled(150))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"train.py in {out} did not end: {_tail(out / 'stderr')}") from None
    for out, proc in runs:
        assert proc.returncode == 0, _tail(out / "stderr")
        assert "reads privately" not in (out / "stderr").read_text(), _tail(out / "stderr")

    # split -> epoch -> pid -> indices; split -> producer pids
    seen: dict[str, dict[int, dict[int, list[int]]]] = defaultdict(lambda: defaultdict(dict))
    producers: dict[str, set[int]] = defaultdict(set)
    files = sorted(record.glob("*.jsonl"))
    assert sorted(int(f.stem) for f in files) == sorted(p.pid for _, p in runs)
    for f in files:
        for line in f.read_text().splitlines():
            batch = json.loads(line)
            assert batch["indices"] is not None, "a loader read privately"
            seen[batch["split"]][batch["epoch"]].setdefault(int(f.stem), []).extend(batch["indices"])
            producers[batch["split"]].add(batch["producer"])
    for split, n in (("train", CLASSES * TRAIN_PER_CLASS), ("validation", CLASSES * VAL_PER_CLASS)):
        assert sorted(seen[split]) == [0, 1], f"{split}: epochs {sorted(seen[split])}"
        for epoch, by_pid in seen[split].items():
            assert len(by_pid) == 3, f"{split} epoch {epoch}: read by {len(by_pid)} processes"
            for pid, indices in by_pid.items():
                assert sorted(indices) == list(range(n)), f"{split} epoch {epoch}, pid {pid}: {indices}"
        assert len(producers[split]) == 1, f"{split}: producers {producers[split]}"
    assert producers["train"] != producers["validation"]  # a loader each
    assert len(list(Path(runtime_dir).glob("auto-*.log"))) == 2, "one producer started per loader"

    # The producers and their workers end by themselves once their readers have gone.
    wait_for(lambda: not _ours(runtime_dir), timeout=30, what="the producers to end")
