"""A drop-in loader's producer is found by what makes the data: the user's own code (by
content), the values it was built with, the seed; and a reader checks a few items it loads
itself against its producer's. Nothing the producer runs comes from a working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.timing import scaled

DATA = textwrap.dedent(
    """
    import os, torch

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 24
        def __getitem__(self, i):
            return torch.tensor([LABEL * float(os.environ.get("AUG_SCALE", "1"))]), i
    """
)

TRAIN = textwrap.dedent(
    """
    import json, torch
    from mydata import DS
    from tandem.share import DataLoader

    loader = DataLoader(DS(), batch_size=5, shuffle=True)
    labels, indices = set(), []
    for x, i in loader:
        labels |= set(x[:, 0].tolist())
        indices += i.tolist()
    print(json.dumps({"labels": sorted(labels), "indices": sorted(indices),
                      "producer": loader._consumer.producer_pid}))
    """
)


@pytest.fixture(autouse=True)
def _lingering_producers(drop_in_producers_end, monkeypatch):
    """Producers linger as they do for users (a minute): the next run finds them; the
    fixture ends them after the test."""
    monkeypatch.setenv("TANDEM_SHARE_LINGER_S", "60")


def _project(root: Path, label: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "mydata.py").write_text(DATA.replace("LABEL", str(label)))
    (root / "train.py").write_text(TRAIN)
    return root


def _run(project: Path, cwd: Path | None = None, **env: str) -> dict:
    run = subprocess.run(
        [sys.executable, str(project / "train.py")],
        cwd=cwd or project,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, **env},
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    out["stderr"] = run.stderr
    assert out["indices"] == list(range(24)), out  # an exact epoch
    return out


def test_two_projects_with_their_own_mydata_ds_each_see_their_own_items(tmp_path: Path) -> None:
    a = _run(_project(tmp_path / "a", 0))
    b = _run(_project(tmp_path / "b", 1))
    assert a["labels"] == [0.0]
    assert b["labels"] == [1.0], "the second project read the first one's producer"
    assert a["producer"] != b["producer"]


def test_an_edited_module_rerun_at_once_sees_the_edit(tmp_path: Path) -> None:
    project = _project(tmp_path / "p", 3)
    first = _run(project)
    (project / "mydata.py").write_text(DATA.replace("LABEL", "4"))
    second = _run(project)
    assert first["labels"] == [3.0]
    assert second["labels"] == [4.0]
    third = _run(project)  # unchanged since: the producer of the edited code is shared
    assert third["producer"] == second["producer"]


def test_what_an_item_reads_when_loaded_is_checked_against_the_producer(tmp_path: Path) -> None:
    """An environment variable read in ``__getitem__`` is in no fingerprint: the reader's
    check of a few items finds that its producer's differ, says so, and reads its own."""
    project = _project(tmp_path / "p", 1)
    plain = _run(project, AUG_SCALE="1")
    scaled_run = _run(project, AUG_SCALE="5")
    assert plain["labels"] == [1.0]
    assert scaled_run["labels"] == [5.0], scaled_run["stderr"]
    assert "serves other items than this process loads" in scaled_run["stderr"]
    again = _run(project, AUG_SCALE="5")  # the readers that load alike share their producer
    assert again["producer"] == scaled_run["producer"]
    assert again["labels"] == [5.0]


def test_a_tandem_package_in_the_working_directory_never_runs(tmp_path: Path) -> None:
    """The producer a drop-in starts (in the reader's working directory) imports nothing
    from there: a planted ``tandem/`` never runs."""
    project = _project(tmp_path / "project", 2)
    planted = tmp_path / "elsewhere"
    (planted / "tandem").mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    (planted / "tandem" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n"
    )
    out = _run(project, cwd=planted)
    assert out["labels"] == [2.0]
    assert not marker.exists(), "the planted tandem/ ran"


def test_a_loaders_seed_is_part_of_its_identity(monkeypatch) -> None:
    """``generator=`` and ``torch.manual_seed`` set the order, as torch's loader: loaders
    seeded 7 and 99 do not share a producer; two seeded alike do."""
    import torch

    from tandem.share import DataLoader
    from tandem.share.loader import _plan

    for name in ("TANDEM_JOB_ID", "TANDEM_SHARE"):
        monkeypatch.delenv(name, raising=False)
    data = torch.utils.data.TensorDataset(torch.arange(12.0))

    def named(**kwargs: object) -> str:
        return _plan(DataLoader(data, batch_size=4, shuffle=True, **kwargs)).name

    seven = named(generator=torch.Generator().manual_seed(7))
    assert seven == named(generator=torch.Generator().manual_seed(7))
    assert seven != named(generator=torch.Generator().manual_seed(99))
    torch.manual_seed(7)
    by_global = named()
    torch.manual_seed(99)
    assert by_global != named()
