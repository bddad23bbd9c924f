"""The Hugging Face ``Trainer`` (``tandem.share.hf.SharedTrainer``) and Accelerate
(``shared(accelerator.prepare(loader))``): real processes, one producer, every epoch exact,
ranks under ``torchrun`` reading disjoint parts; Accelerate's prepared loader read through."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tandem.share import DataLoader, shared
from tests.timing import scaled

pytest.importorskip("transformers", reason="needs transformers (make setup installs it)")
accelerate_data = pytest.importorskip("accelerate.data_loader", reason="needs accelerate")

EXAMPLES = Path(__file__).with_name("hf_examples.py")
N = 64  # the examples' dataset


@pytest.fixture(autouse=True)
def _producers_end(drop_in_producers_end):
    """Every test here: the producers its drop-in loaders start go with it."""


def _run(commands: list[list[str]], out: Path) -> list[dict]:
    """Start ``commands`` at once; every process's record, once all have ended."""
    out.mkdir()
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands
    ]
    logs = [p.communicate(timeout=scaled(300))[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(log[-3000:] for log in logs)
    return [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]


def _torchrun(mode: str, out: Path) -> list[str]:
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [*run, str(EXAMPLES), mode, str(out)]


def _one_producer(records: list[dict]) -> None:
    assert all(r["drop_in"] for r in records)
    assert len({r["share"] for r in records}) == 1 and len({r["producer"] for r in records}) == 1, records


def test_two_trainers_at_once_read_one_producer_every_epoch_exact(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLES), "trainer", str(tmp_path / "out")]
    records = _run([command, command], tmp_path / "out")
    assert len(records) == 2
    _one_producer(records)
    for r in records:
        assert len(r["epochs"]) == 2 and all(sorted(e) == list(range(N)) for e in r["epochs"]), r["epochs"]


@pytest.mark.parametrize("mode", ["trainer", "accelerate"])
def test_under_torchrun_two_ranks_read_disjoint_halves_of_one_producer(mode: str, tmp_path: Path) -> None:
    records = _run([_torchrun(mode, tmp_path / "out")], tmp_path / "out")
    assert len(records) == 2
    _one_producer(records)
    first, second = (r["epochs"] for r in records)
    assert len(first) == len(second) == 2
    for a, b in zip(first, second):
        assert len(a) == len(b) == N // 2 and sorted(a + b) == list(range(N)), (a, b)


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i


@pytest.mark.parametrize("split_batches", [False, True])
def test_shared_reads_accelerates_process_split_as_ranks(split_batches: bool) -> None:
    plain = torch.utils.data.DataLoader(Items(), batch_size=8, shuffle=True)
    prepared = accelerate_data.prepare_data_loader(
        plain, num_processes=2, process_index=1, split_batches=split_batches, put_on_device=False
    )
    assert prepared.batch_size is None  # its batches are in a BatchSamplerShard
    loader = shared(prepared)
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    assert (loader.sampler.rank, loader.sampler.num_replicas, loader.sampler.shuffle) == (1, 2, True)
    assert loader.batch_size == (4 if split_batches else 8)
    one = shared(accelerate_data.prepare_data_loader(plain, num_processes=1, put_on_device=False))
    assert isinstance(one.sampler, torch.utils.data.RandomSampler) and one.batch_size == 8
    seen = [i for _, idx in one for i in idx.tolist()]
    assert sorted(seen) == list(range(48)) and one._plan, "read from a producer"
    one.close()


def test_accelerates_prepare_of_a_drop_in_says_it_reads_privately_and_shared_shares_it() -> None:
    """Accelerate's prepare rebuilds a loader of its own class (torch's loading): the
    drop-in says so once, naming the one line that shares it again."""
    drop_in = DataLoader(Items(), batch_size=8, shuffle=True)
    with pytest.warns(UserWarning, match=r"Accelerate's prepare .* tandem.share.shared\(loader\)"):
        prepared = accelerate_data.prepare_data_loader(drop_in, num_processes=1, put_on_device=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only, and nothing from torch's own reading
        accelerate_data.prepare_data_loader(drop_in, num_processes=1, put_on_device=False)
        assert drop_in.pin_memory_device == ""
    again = shared(prepared)
    seen = [i for _, idx in again for i in idx.tolist()]
    assert sorted(seen) == list(range(48)) and again._plan, "read from a producer"
    again.close()


def test_a_batch_sampler_it_cannot_reproduce_stays_the_loaders_and_reads_privately() -> None:
    odd = torch.utils.data.DataLoader(Items(), batch_sampler=[[0, 1], [5, 4, 3]])
    loader = shared(odd)
    assert loader.batch_sampler == [[0, 1], [5, 4, 3]]
    with pytest.warns(UserWarning, match="batch_sampler of its own"):
        assert [idx.tolist() for _, idx in loader] == [[0, 1], [5, 4, 3]]


@pytest.mark.parametrize("share", [True, False])
def test_a_device_moves_every_batch_there_shared_or_private(share: bool) -> None:
    """Accelerate's prepared loader puts its batches on its device; the drop-in made of it
    does too ("meta": a device every machine has)."""
    loader = DataLoader(Items(), batch_size=16, share=share, device="meta")
    batches = list(loader)
    assert len(batches) == 3 and all(
        x.device.type == "meta" and idx.device.type == "meta" for x, idx in batches
    )
    loader.close()
