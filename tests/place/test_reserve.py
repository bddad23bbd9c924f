"""Reservations that learn (``--cpus auto``, the default): a CPU-bound job's reservation
rises to its measurement, a job key seen before reserves what it used, a share's producer
reserves what its earlier producers used, and an explicit ``--cpus`` stays a hard
reservation. The README's sweep on two cores, as printed: tests/place/test_elastic.py."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.place.inproc import Step
from tests.place.test_daemon import FAST

# A training job that mostly waits on a (simulated) accelerator: it reads a batch from its
# share, says it started, then "steps" (sleeps) until the test releases it, and reads the
# rest of its epoch. It imports no MLflow and its daemons track nothing (``--no-track``):
# what is tested here is what was learnt; the README's sweep, whose jobs import MLflow under
# a tracking daemon, is test_elastic.py's.
SLEEPER = (
    "import os, sys, time\n"
    "from pathlib import Path\n"
    "from tandem.share import Consumer\n"
    "c = Consumer.from_env(batch_size=8)\n"
    "it = iter(c)\n"
    "n = int(next(it).shape[0])\n"
    "out = Path(sys.argv[1])\n"
    "with open(out / 'started', 'a') as f:\n"
    "    f.write(os.environ['TANDEM_JOB_ID'] + '\\n')\n"
    "deadline = time.monotonic() + 300\n"
    "while not (out / 'release').exists() and time.monotonic() < deadline:\n"
    "    time.sleep(0.1)\n"
    "n += sum(int(b.shape[0]) for b in it)\n"
    "with open(out / 'done', 'a') as f:\n"
    "    f.write(f\"{os.environ['TANDEM_JOB_ID']} {n}\\n\")\n"
    "c.close()\n"
)


def _producers(cli) -> list[dict]:  # type: ignore[no-untyped-def]
    """The share groups' producers: job rows of role producer, oldest first."""
    return [j for j in cli.rows() if j["role"] == "producer"]


def _producers_ended(cli) -> bool:  # type: ignore[no-untyped-def]
    """Whether every producer made so far ended, as one stopped after its group's last job does."""
    rows = _producers(cli)
    return bool(rows) and all(j["state"] == "succeeded" for j in rows)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_cpu_bound_job_reserves_its_measurement_and_its_key_learns(inproc) -> None:
    h = inproc("--cpus", "2", *FAST)
    busy_core = Step(cores=1.0)  # a CPU-bound loop: a whole core, until the test ends it
    busy = h.submit("--name", "busy", "--", sys.executable, "busy.py", "stop", steps=busy_core)
    assert h.job(busy)["request"]["cpus"] == "auto"
    reserved = h.run_until(
        lambda: (r := h.job(busy)["reservation"])["from"] == "measured, this run" and r, within=60
    )
    assert reserved["cpus"] >= 0.8, reserved
    assert "measured" in h.cli("show", str(busy)).stdout
    h.finish(busy)
    h.wait_state(busy, {"succeeded"}, within=60)
    again = h.submit("--name", "busy", "--", sys.executable, "busy.py", "stop", steps=busy_core)
    h.wait_state(again, {"running"}, within=60)
    job = h.job(again)
    assert job["reservation"]["from"] == "measured, job key busy, 1 run", job["reservation"]
    assert job["reservation"]["cpus"] >= 0.8
    h.finish(again)
    h.wait_state(again, {"succeeded"}, within=60)


def test_an_explicit_cpus_is_a_hard_reservation(inproc) -> None:
    h = inproc("--cpus", "2", *FAST)
    first = h.submit("--cpus", "1.5", "--", sys.executable, "-c", "wait")
    second = h.submit("--cpus", "1.5", "--", sys.executable, "-c", "wait")
    h.wait_state(first, {"running"})
    job = h.job(first)
    assert {k: job["reservation"][k] for k in ("cpus", "from")} == {"cpus": 1.5, "from": "given"}
    assert job["request"]["cpus"] == 1.5
    h.run_until(lambda: "cores: needs 1.5" in (h.jobs()[second].reason or ""), within=30)
    assert h.job(second)["state"] == "queued"
    h.finish(first)
    h.wait_state(second, {"running"}, within=60)
    h.finish(second)
    h.wait_state(second, {"succeeded"}, within=60)


def test_a_start_up_burst_is_not_what_a_job_reserves() -> None:
    """A job that imports for a few seconds (a whole core) and then mostly waits reserves what
    it goes on to use, not its imports; a CPU-bound one reserves its core; its key learns its
    use past start-up."""
    from tandem.place.records import Job
    from tandem.place.reserve import AUTO_CPUS, PROBE_CORES, STARTUP_MAX_SAMPLES, Learned, Measuring

    learned = Learned()
    waiter = Job(["python", "train.py"], "/tmp", {}, cpus=AUTO_CPUS, name="waiter")
    m = Measuring(waiter, learned)
    assert (m.cores, m.probe) == (PROBE_CORES, True)
    assert not any(m.sample(c) for c in (1.0, 0.98, 1.02, 0.9))  # the import: no measurement yet
    assert m.probe and m.measured() is None
    changed = [m.sample(c) for c in (0.08, 0.1, 0.09)]  # past it: what the job uses
    assert changed == [False, True, False] and not m.probe
    assert m.cores < 0.25 and m.source == "measured, this run"
    learned.seen(waiter.job_key, m.measured())  # type: ignore[arg-type]
    assert learned.reserve(waiter)[0] < 0.25  # the next run of its key: the same, no burst
    busy = Measuring(Job(["python", "busy.py"], "/tmp", {}, cpus=AUTO_CPUS), learned)
    for _ in range(STARTUP_MAX_SAMPLES + 2):  # a core from its start on: its start-up never ends
        busy.sample(1.0)
    assert not busy.probe and busy.cores >= 1.0
    given = Measuring(Job(["python", "x.py"], "/tmp", {}, cpus=0.5), learned)
    assert not given.sample(1.0) and given.cores == 0.5  # --cpus N is a hard reservation


def test_mem_auto_reserves_what_the_job_key_used_and_mem_given_is_hard(inproc) -> None:
    h = inproc("--cpus", "2", "--no-host-load", *FAST)
    holds = Step(mem=210 << 20)  # about 200 MB held until the test ends it
    first = h.submit("--name", "holder", "--", sys.executable, "hold.py", "stop", steps=holds)
    h.wait_state(first, {"running"})
    job = h.job(first)
    assert job["request"]["mem_bytes"] == 0  # auto
    assert job["reservation"]["mem_from"] in ("auto: none until measured", "measured, this run")
    raised = h.run_until(
        lambda: (
            (r := h.job(first)["reservation"])["mem_from"] == "measured, this run"
            and (r["mem_bytes"] or 0) > 200 << 20
            and r
        ),
        within=60,
    )
    assert raised["mem_bytes"] > 220 << 20  # its peak plus 10%
    h.finish(first)
    h.wait_state(first, {"succeeded"}, within=60)
    peak = h.job(first)["peak_mem_bytes"]
    assert peak and peak > 200 << 20, peak
    again = h.submit("--name", "holder", "--", sys.executable, "hold.py", "stop", steps=holds)
    h.wait_state(again, {"running"})
    r = h.job(again)["reservation"]
    assert r["mem_from"] == "measured, job key holder" and r["mem_bytes"] == int(peak * 1.1), r
    assert "RAM auto:" in h.cli("show", str(again)).stdout
    h.finish(again)
    h.wait_state(again, {"succeeded"}, within=60)
    given = h.submit("--mem", "300M", "--name", "holder", "--", sys.executable, "-c", "pass", steps=Step(0.1))
    h.wait_state(given, {"succeeded"}, within=60)
    job = h.job(given)
    assert job["reservation"]["mem_bytes"] == 300 << 20 and job["reservation"]["mem_from"] == "given"
