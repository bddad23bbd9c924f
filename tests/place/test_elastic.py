"""Cores are elastic, RAM is strict (issue 33, point 4): a share's producer is reserved as a
job of its own, a job of learnt cores starts where the host's measured use leaves room, the jobs of a
share group run together up to a bound, and a running job's reservation follows its use
down as well as up. The pure scheduler first (the simulator calls the same), then the
README's sweep as printed: with a core busy from outside (in this process, fake time), and
under a real daemon."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tandem.place.policies import HostSlot, Limits, Packing
from tandem.place.scheduler import Waiting, plan, share_bound
from tests.place.inproc import Step
from tests.place.needs import host_slot, waiting
from tests.place.test_daemon import DATASET
from tests.place.test_reserve import _lines
from tests.timing import scaled, until

pytestmark = pytest.mark.warm  # Python jobs start warm, as a user's do

GIB = 1 << 30


def _host(**kw: object) -> HostSlot:
    base: dict[str, object] = {"cpus_total": 2.0, "mem_total": 16 * GIB}
    return host_slot(**{**base, **kw})  # type: ignore[arg-type]


def _plan(queue: list[Waiting], host: HostSlot):  # type: ignore[no-untyped-def]
    return plan(queue, host, [], Packing(), Limits(), now=100.0)


def test_a_running_producer_is_in_the_hosts_reserved_never_charged_to_its_jobs() -> None:
    # RAM is strict (no share group passes it): the producer, a job of its own, is reserved
    # as it runs (8 GiB here), and four jobs of 1 GiB of its group fit the 16 GiB beside it.
    running = [waiting(i, 0, float(i), 0.2, GIB, share="s", share_jobs=0) for i in range(1, 5)]
    assert len(_plan(running, _host(mem_reserved=8 * GIB)).placements) == 4
    out = _plan(running, _host(mem_reserved=13 * GIB))
    assert len(out.placements) == 3 and out.reasons[4].startswith("RAM: needs 1.0G"), out.reasons


def test_learnt_cores_start_on_measured_room_given_cores_wait_for_reservations() -> None:
    full = _host(cpus_reserved=2.0, jobs=2, all_jobs=2, cpus_busy=0.6)
    learnt = waiting(1, 0, 1.0, 0.5, GIB, elastic=True)
    given = waiting(2, 0, 2.0, 0.5, GIB)
    out = _plan([learnt, given], full)
    assert [p.job_id for p in out.placements] == [1]
    assert out.reasons[2] == "cores: needs 0.5, 0 of 2 free", out.reasons
    # Each job placed counts for the rest of the pass: 0.6 + 0.5 + 0.5 + 0.5 > 2.
    alike = [waiting(i, 0, float(i), 0.5, GIB, elastic=True) for i in range(1, 5)]
    out = _plan(alike, full)
    assert [p.job_id for p in out.placements] == [1, 2]
    assert out.reasons[3] == "cores: needs 0.5, 0 of 2 free; 0.40 of 2 cores measured idle"
    # A busy host (load from outside the manager) leaves no room: nothing elastic starts.
    out = _plan([learnt], _host(cpus_reserved=2.0, jobs=2, all_jobs=2, cpus_busy=1.8))
    assert out.placements == [] and "0.20 of 2 cores measured idle" in out.reasons[1]
    # Not measured: reservations decide alone.
    assert _plan([learnt], _host(cpus_reserved=2.0, jobs=2, all_jobs=2)).placements == []
    # A job starting counts at what its program used at start, not its reservation.
    starting = waiting(1, 0, 1.0, 0.25, GIB, elastic=True, startup_cpus=1.0)
    assert _plan([starting], _host(cpus_reserved=2.0, jobs=2, all_jobs=2, cpus_busy=1.2)).placements == []


def test_a_share_groups_jobs_run_together_up_to_four_a_core_ram_still_strict() -> None:
    host = _host(cpus_reserved=2.0, jobs=3, all_jobs=3, cpus_busy=2.0)
    assert share_bound(host) == 8
    queue = [waiting(i, 0, float(i), 0.5, GIB, share="s", share_jobs=6) for i in range(1, 5)]
    out = _plan(queue, host)
    assert [p.job_id for p in out.placements] == [1, 2]  # 6 running + 2 placed = the bound
    assert out.reasons[3].startswith("cores: needs 0.5"), out.reasons
    out = _plan(queue, _host(cpus_reserved=2.0, mem_reserved=15 * GIB + GIB // 2))
    assert out.placements == [] and out.reasons[1].startswith("RAM: needs 1.0G")
    # The exclusive policy keeps its one CPU job at a time.
    from tandem.place.policies import Exclusive

    out = plan(queue, _host(jobs=1, all_jobs=1), [], Exclusive(), Limits(), now=100.0)
    assert out.placements == []


def test_a_running_jobs_reservation_follows_its_use_down_as_well_as_up() -> None:
    from tandem.place.records import Job
    from tandem.place.reserve import AUTO_CPUS, FOLLOW_SAMPLES, Learned, Measuring

    learned = Learned({"name:j": [1.0]})  # learnt at a core before
    m = Measuring(Job(["python", "j.py"], "/", cpus=AUTO_CPUS, learn_key="name:j"), learned)
    assert m.cores == 1.0 and not m.probe
    for _ in range(5):
        m.sample(0.1)  # leaves its start-up at once (under a probe's cores)
    assert m.cores == 1.0  # a few quiet seconds: kept
    changed = [m.sample(0.1) for _ in range(FOLLOW_SAMPLES)]
    assert changed.count(True) == 1 and m.cores < 0.2 and m.source == "measured, this run"
    # Up within the few samples that reach its window's 95th percentile (one spike is not).
    assert [m.sample(0.9) for _ in range(3)] == [False, False, True] and m.cores == 1.0
    assert not m.sample(0.9)  # written only when it moves


TRAIN = (  # the README's train.py: imports MLflow, waits on a "GPU step" per batch
    "import os, sys, time\n"
    "import mlflow  # noqa: F401 (a training script's import: seconds of a whole core)\n"
    "from pathlib import Path\n"
    "from tandem.share import Consumer\n"
    "out, me = Path(sys.argv[1]), os.environ['TANDEM_JOB_ID']\n"
    "c = Consumer.from_env(batch_size=8)\n"
    "epochs = []\n"
    "for epoch in range(3):\n"
    "    seen = []\n"
    "    for b in c:\n"
    "        seen += [int(x) for x in b.flatten().tolist()]\n"
    "        if epoch == 0 and len(seen) == 8:\n"
    "            with open(out / 'started', 'a') as f:\n"
    "                f.write(me + '\\n')\n"
    "            deadline = time.monotonic() + 300\n"
    "            while not (out / 'release').exists() and time.monotonic() < deadline:\n"
    "                time.sleep(0.1)\n"
    "        time.sleep(0.02)  # the GPU step\n"
    "    epochs.append(sorted(seen) == list(range(64)))\n"
    "with open(out / 'done', 'a') as f:\n"
    "    f.write(f'{me} {epochs.count(True)} {len(epochs)}\\n')\n"
    "c.close()\n"
)
LRS = ("0.1", "0.03", "0.01", "0.003")


def _readme_sweep(cli, tmp_path: Path) -> list[int]:  # type: ignore[no-untyped-def]
    """The README's loop as printed: four submits, no --cpus."""
    return [
        cli.submit(
            "--share",
            "imagenet",
            "--group",
            "lr-sweep",
            "--name",
            f"r18-lr{lr}",
            "--",
            sys.executable,
            "train.py",
            str(tmp_path),
            "--lr",
            lr,
        )  # fmt: skip
        for lr in LRS
    ]


def _all_done(cli, tmp_path: Path, ids: list[int]) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "release").write_text("")
    assert cli("wait", *map(str, ids), timeout=scaled(120)).returncode == 0, cli("ls").stdout
    done = {int(j): (int(exact), int(n)) for j, exact, n in map(str.split, _lines_of(tmp_path / "done"))}
    assert all(done[i] == (3, 3) for i in ids), done  # every epoch exact
    (tmp_path / "release").unlink()


def _lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _trivial_job_beside(cli) -> None:  # type: ignore[no-untyped-def]
    """``tandem submit -- true`` beside the sweep starts within 10 s where the host is under
    half busy (the sweep's jobs wait on their "GPU step"). On a host that other work keeps
    busier (a loaded CI machine) it rightly waits for measured room: then it must say so,
    with the figures, and start once the sweep no longer holds the cores."""
    import psutil

    t0 = time.monotonic()
    trivial = cli.submit("--", "true")
    psutil.cpu_percent()
    deadline = t0 + scaled(10)
    while time.monotonic() < deadline:
        if cli.job(trivial)["state"] in ("running", "succeeded"):
            print(f"trivial job started {time.monotonic() - t0:.1f} s after its submit")
            return
        time.sleep(0.2)
    busy = psutil.cpu_percent() / 100
    job = cli.job(trivial)
    assert busy > 0.5, f"the host was {busy:.0%} busy; job {trivial} still {job['state']}: {cli('ls').stdout}"
    assert job["state"] == "queued" and "cores measured idle" in job["reason"], job
    print(f"trivial job held back on a host {busy:.0%} busy: {job['reason']}")


def test_the_readme_sweep_with_one_core_busy_from_outside_runs_three_of_four_at_once(
    inproc, tmp_path: Path, monkeypatch
) -> None:
    """The README's sweep as printed on a daemon of 2 cores and its defaults (host load on),
    one core kept busy by a process the manager does not run, each point a second of a
    whole core at its start (its imports) and then a third of one: at least three of the four
    run at once beside their producer. (In this process, fake time: what is tested is the
    admission's; the sweep on a real daemon is the test below.)"""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "toy_data.py").write_text("def make():\n    return list(range(64))\n")
    (tmp_path / "train.py").write_text("")
    h = inproc("--cpus", "2")
    h.outside_cores = 1.0
    h.cli("share", "define", "imagenet", "--dataset", "toy_data.py:make", "--batch-size", "4")
    h.launcher.default = Step(cores=0.33, burst_s=1.0, burst_cores=1.0)
    ids = _readme_sweep(h, tmp_path)
    peak = 0

    def three_at_once() -> bool:
        nonlocal peak
        peak = max(peak, sum(h.state_of(i) == "running" for i in ids))
        return peak >= 3

    h.run_until(three_at_once, within=120)
    (producer,) = [j for j in h.json("ls") if j["role"] == "producer"]
    assert producer["state"] == "running", producer
    for i in ids:
        h.run_until(lambda i=i: h.state_of(i) == "running", within=120)
        h.finish(i)
    h.run_until(lambda: h.ended(*ids, producer["id"]), within=120)
    assert all(h.state_of(i) == "succeeded" for i in ids)


def test_the_readme_sweep_runs_three_of_four_at_once(cli, tmp_path: Path) -> None:
    """Defaults (host load on), 2 cores, a fresh state dir, idle host, real processes: at
    least three of four at once beside their producer, and beside them a trivial job starts
    within seconds. (That the next sweep after a restart starts every point at what was
    learnt is a decision: the in-process test below.)"""
    (tmp_path / "toy_data.py").write_text(DATASET)
    (tmp_path / "train.py").write_text(TRAIN)
    cli("daemon", "start", "--cpus", "2")
    cli("share", "define", "imagenet", "--dataset", "toy_data.py:make", "--batch-size", "4")
    ids = _readme_sweep(cli, tmp_path)
    started = tmp_path / "started"
    until(lambda: len(_lines(started)) >= 3, 60, "fewer than 3 of 4 ran at once")
    # Together, none waiting for the first one's measurement, each measured on its
    # own run (or lent the figure of a point already measured)...
    began = [int(i) for i in _lines(started)]
    reasons = [row["reason"] or "" for row in cli.rows()]
    assert not any("measurement" in r for r in reasons), reasons
    sources = {i: cli.job(i)["reservation"]["from"] for i in began}
    lent = "measured, job key r18-lr"
    assert all(s in ("probe", "measured, this run") or s.startswith(lent) for s in sources.values()), sources
    # ...beside their producer, a running job row of its own.
    (producer,) = [row for row in cli.rows() if row["role"] == "producer"]
    assert producer["state"] == "running" and producer["started"] is not None, producer
    _trivial_job_beside(cli)
    _all_done(cli, tmp_path, ids)
    assert cli("wait", timeout=scaled(60)).returncode == 0, cli("ls").stdout


def test_after_a_restart_the_next_readme_sweep_starts_every_point_at_what_was_learnt(
    inproc, tmp_path: Path, monkeypatch
) -> None:
    """The README's sweep ran to its end; the daemon is stopped and a new one started over
    the same state: the next sweep of the same template starts all its points in its first
    pass at what its key was measured at (kept in the state), none a probe."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "toy_data.py").write_text("def make():\n    return list(range(64))\n")
    (tmp_path / "train.py").write_text("")
    h = inproc("--cpus", "2")
    h.cli("share", "define", "imagenet", "--dataset", "toy_data.py:make", "--batch-size", "4")
    h.launcher.default = Step(cores=0.33, burst_s=1.0, burst_cores=1.0)
    ids = _readme_sweep(h, tmp_path)
    for i in ids:  # each runs a while past its start-up (measured), then ends
        h.run_until(lambda i=i: h.state_of(i) == "running", within=120)
    h.step(30.0)
    for i in ids:
        h.finish(i)
    h.run_until(lambda: h.ended(*ids), within=60)
    assert all(h.state_of(i) == "succeeded" for i in ids), [
        (j["id"], j["state"], j["reason"]) for j in h.json("ls", "--all")
    ]
    h.run_until(
        lambda: all(j["state"] in ("succeeded", "cancelled") for j in h.json("ls", "--all")), within=120
    )
    h = h.restart()
    again = _readme_sweep(h, tmp_path)
    h.run_until(lambda: all(h.state_of(i) == "running" for i in again), within=5)
    for i in again:
        job = h.job(i)
        assert job["reservation"]["from"].startswith("measured, job key r18-lr"), job
        assert job["placement"]["probe"] is False, job
