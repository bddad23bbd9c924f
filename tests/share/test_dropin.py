"""``tandem.share.DataLoader``, the drop-in: processes that build the same loader read one
producer that the first of them starts; it is a torch ``DataLoader``; what cannot be shared
reads privately, said once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.share import DataLoader, shared
from tests.share.conftest import wait_for
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]

# A plain training script: its dataset class is defined in it (pickled by value for the
# producer), every epoch is checked, the batch size comes from the command line.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, torch
    from tandem.share import DataLoader

    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 90
        def __getitem__(self, i):
            return torch.tensor([float(i * i)]), i

    if __name__ == "__main__":
        loader = DataLoader(Squares(), batch_size=int(sys.argv[1]), shuffle=True)
        epochs = []
        for _ in range(2):
            seen = []
            for x, idx in loader:
                assert torch.equal(x[:, 0], (idx * idx).float())  # each item with its own index
                assert torch.equal(loader.last_indices, idx)
                seen += idx.tolist()
            epochs.append(seen)
        print(json.dumps({"epochs": epochs, "producer": loader._consumer.producer_pid,
                          "is_loader": isinstance(loader, torch.utils.data.DataLoader)}))
    """
)


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i


@pytest.fixture(autouse=True)
def _producers_end(drop_in_producers_end):
    """Every test here: the producers its drop-in loaders start go with it."""


def _exact(epoch: list[int], n: int) -> bool:
    return len(epoch) == n and sorted(epoch) == list(range(n))


def test_three_processes_of_one_script_read_one_producer_every_epoch_exactly(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(b)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
        )
        for b in (8, 16, 32)
    ]
    outs = [p.communicate(timeout=scaled(120))[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert all(r["is_loader"] for r in results)
    assert len({r["producer"] for r in results}) == 1, "one producer for the three"
    for r in results:
        assert all(_exact(e, 90) for e in r["epochs"]), r["epochs"]


def test_it_is_torchs_dataloader_with_torchs_attributes_and_public_indices() -> None:
    data = Squares()
    loader = DataLoader(data, batch_size=6, shuffle=True)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert loader.dataset is data and loader.batch_size == 6 and len(loader) == 7
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    loader.sampler.set_epoch = lambda e: None  # what Lightning calls, where a sampler has it
    seen = []
    for x, idx in loader:
        assert torch.equal(x[:, 0].long(), idx) and torch.equal(loader.last_indices, idx)
        seen += idx.tolist()
    assert _exact(seen, 40) and seen != list(range(40))  # shuffled
    assert loader.state_dict()  # where the reading is
    loader.close()


def test_what_a_producer_cannot_reproduce_reads_privately_said_once() -> None:
    data = Squares()
    own = torch.utils.data.SubsetRandomSampler(list(range(0, 40, 2)))
    with pytest.warns(UserWarning, match="sampler \\(SubsetRandomSampler\\) is its own"):
        loader = DataLoader(data, batch_size=5, sampler=own)
        first = [i for _, idx in loader for i in idx.tolist()]
    assert sorted(first) == list(range(0, 40, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a second epoch says nothing
        assert sorted(i for _, idx in loader for i in idx.tolist()) == list(range(0, 40, 2))
        private = DataLoader(data, batch_size=5, share=False)  # asked for: nothing said
        assert [i for _, idx in private for i in idx.tolist()] == list(range(40))

    class Unpicklable(Squares):
        def __init__(self) -> None:
            self.lines = (i for i in range(3))  # a generator does not pickle

    with pytest.warns(UserWarning, match="do not pickle"):
        assert len([b for b in DataLoader(Unpicklable(), batch_size=8)]) == 5


@pytest.mark.parametrize("launcher", [True, False], ids=["launcher", "by-hand"])
def test_ranks_of_a_distributed_sampler_read_disjoint_halves(tmp_path: Path, launcher: bool) -> None:
    """Under a launcher (its run id names the group), and made by hand outside one, as
    torch's loader reads it: the processes reading this data as 2 ranks are one group."""
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, torch
            from torch.utils.data import DistributedSampler
            from tandem.share import DataLoader
            from tests.share.test_dropin import Squares
            data = Squares()
            sampler = DistributedSampler(data, num_replicas=2, rank=int(sys.argv[1]), shuffle=True)
            loader = DataLoader(data, batch_size=4, sampler=sampler)
            print(json.dumps([i for _, idx in loader for i in idx.tolist()]))
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if launcher:
        env["TORCHELASTIC_RUN_ID"] = "ranks-test"  # one group
    for name in ("TORCHELASTIC_RUN_ID", "MASTER_PORT", "TANDEM_JOB_ID"):
        if not (launcher and name == "TORCHELASTIC_RUN_ID"):
            env.pop(name, None)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r)], stdout=subprocess.PIPE, text=True, env=env)
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=scaled(120))[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    halves = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert len(halves[0]) == len(halves[1]) == 20
    assert sorted(halves[0] + halves[1]) == list(range(40))


def test_shared_takes_a_loader_a_library_built_with_its_options() -> None:
    built = torch.utils.data.DataLoader(Squares(), batch_size=10, shuffle=False, drop_last=True)
    loader = shared(built)
    assert isinstance(loader, DataLoader) and loader.batch_size == 10 and loader.drop_last
    assert [i for _, idx in loader for i in idx.tolist()] == list(range(40))  # in order
    assert shared(loader) is loader
    loader.close()


def test_the_producer_ends_once_its_readers_have_gone(runtime_dir: str) -> None:
    loader = DataLoader(Squares(), batch_size=8)
    assert np.array_equal(np.concatenate([idx.numpy() for _, idx in loader]), np.arange(40))
    pid = loader._consumer.producer_pid
    loader.close()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"

    wait_for(gone, timeout=30, what="the producer to end 2 s after its last reader")
    assert not list(Path(runtime_dir).glob("auto-*.spec")), "it removed its spec"


def test_a_job_of_the_manager_reads_its_share_or_privately_said_why(monkeypatch) -> None:
    """Under ``tandem submit --share NAME`` the drop-in reads that share; a job with none
    reads privately (a producer it started would be ended with the job)."""
    import threading

    from tandem.share import Producer

    producer = Producer.from_dataset(Squares(), "defined", batch_size=10)
    serving = threading.Thread(target=producer.serve, kwargs={"epochs": 1})
    serving.start()
    monkeypatch.setenv("TANDEM_JOB_ID", "7")
    monkeypatch.setenv("TANDEM_SHARE", "defined")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = DataLoader(Squares(), batch_size=4)
        assert [i for _, idx in loader for i in idx.tolist()] == list(range(40))
    loader.close()
    serving.join(scaled(30))
    monkeypatch.delenv("TANDEM_SHARE")
    with pytest.warns(UserWarning, match="submit with --share NAME"):
        assert len(list(DataLoader(Squares(), batch_size=4))) == 10


def test_a_dataset_module_beside_the_script_is_found_from_another_directory(tmp_path: Path) -> None:
    """``python src/train.py`` from the project's root: the dataset's module is found beside
    the script (the reader's sys.path), in the producer too."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "mydata.py").write_text(
        "import torch\n\nclass Items(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 30\n"
        "    def __getitem__(self, i):\n        return i\n"
    )
    (tmp_path / "src" / "train.py").write_text(
        "from mydata import Items\nfrom tandem.share import DataLoader\n"
        "print(sorted(i for b in DataLoader(Items(), batch_size=7, shuffle=True) for i in b.tolist()))\n"
    )
    run = subprocess.run(
        [sys.executable, "src/train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=scaled(120)
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == list(range(30))


def test_a_readers_torch_threads_are_fitted_to_the_readers_of_its_producer(monkeypatch) -> None:
    from tandem.share.loader import _NoFit, _ThreadFit

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    first, second = DataLoader(Squares(), batch_size=4), DataLoader(Squares(), batch_size=5)
    threads = torch.get_num_threads()
    try:
        readers = [iter(first), iter(second)]
        for r in readers:
            next(r)  # both attached to the one producer
        cores = len(os.sched_getaffinity(0))
        _ThreadFit(64).fit(first._require_plan().name)
        assert torch.get_num_threads() == max(1, cores // 2)  # the host's cores shared by its 2 readers
        _ThreadFit(1).fit(first._require_plan().name)
        assert torch.get_num_threads() == 1  # never more than it had
        # Where the user chose (the job manager's jobs among them), nothing is fitted.
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert isinstance(_ThreadFit.unless_given(), _NoFit)
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setenv("TANDEM_SHARE_FIT_THREADS", "0")
        assert isinstance(_ThreadFit.unless_given(), _NoFit)
    finally:
        torch.set_num_threads(threads)
        first.close()
        second.close()


def test_a_tensor_dataset_has_one_fingerprint_in_every_process() -> None:
    """torch pickles a tensor under its memory address; the fingerprint writes it by value,
    so that processes building the same ``TensorDataset`` read one producer."""
    code = (
        "import hashlib, pickle, torch\n"
        "from tandem.share._pickled import pickled\n"
        "half = torch.ones(6, 2, dtype=torch.bfloat16)[:, 1]\n"
        "ts = (torch.arange(6.0), half, torch.arange(12).reshape(2, 6).t())\n"
        "payload = pickled(torch.utils.data.TensorDataset(*ts))\n"
        "back = pickle.loads(payload).tensors\n"
        "assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(ts, back))\n"
        "print(hashlib.sha256(payload).hexdigest())\n"
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout
