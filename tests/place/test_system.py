"""A lab's server: one system manager (``tandem daemon start --system``, run as root) for two
real local users (``useradd``) who submit with plain ``tandem submit`` (``TANDEM_SYSTEM_DIR``
set, nothing else). Each job runs as its submitter; the cores reserved never pass the
manager's 2; the second user's first job starts before the first user's third (fair share);
a user cannot cancel, show or read the logs of the other's job, and their ``ls`` shows it
without its command; requests are the kernel's peer's, never what a client says."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.place.reads import StateReader
from tests.other_user import OtherUser, two_users  # noqa: F401 (the fixture)
from tests.place.test_daemon import DATASET
from tests.timing import scaled, until

# Busy (a core) until the test says go (once all 8 jobs are queued: the first ones hold the
# cores meanwhile), then a second more; then says who it ran as.
JOB = (
    "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): pass\nt = time.process_time()\n"
    "while time.process_time() - t < 1: pass\nprint('uid', os.getuid())"
)


@pytest.fixture
def system(two_users: tuple[OtherUser, OtherUser]) -> Iterator[Path]:  # noqa: F811
    """A system manager of 2 cores and 4G, its folder where both users may reach its socket."""
    base = Path(tempfile.mkdtemp(prefix="tandem-system-"))
    env = {**os.environ, "TANDEM_SYSTEM_DIR": str(base)}
    start = [sys.executable, "-m", "tandem.cli", "daemon", "start", "--system", "--cpus", "2"]
    start += ["--mem", "4G"]
    done = subprocess.run(start, env=env, capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    try:
        yield base
    finally:
        stop = [sys.executable, "-m", "tandem.cli", "daemon", "stop"]
        subprocess.run(stop, env=env, capture_output=True, text=True, timeout=scaled(60))
        log = base / "state" / "daemon.log"  # shown where the test failed (its teardown's output)
        print(f"--- {log}, its end:\n{log.read_text(errors='replace')[-4000:] if log.exists() else '(none)'}")
        shutil.rmtree(base, ignore_errors=True)


def _tandem(user: OtherUser, base: Path, *args: str) -> subprocess.CompletedProcess:
    return user.run(user.tandem(*args), env=user.env(TANDEM_SYSTEM_DIR=str(base)), timeout=scaled(60))


def _submit(user: OtherUser, base: Path) -> int:
    done = _tandem(user, base, "submit", "--", user.python, "-c", JOB, str(base / "go"))
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_two_users_one_manager_fair_share_each_job_as_its_submitter(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    a, b = two_users
    mine = [_submit(a, system) for _ in range(6)]
    theirs = [_submit(b, system) for _ in range(2)]
    reader = StateReader(system / "state")  # root reads the manager's file
    try:
        (system / "go").touch()  # all 8 queued: those running go on to their end
        until(
            lambda: [j.state for j in reader.jobs()] == ["succeeded"] * 8,
            240,
            lambda: f"the 8 jobs did not all succeed: {[(j.id, j.state, j.cause) for j in reader.jobs()]}",
        )
        jobs = {j.id: j for j in reader.jobs(attempts=True)}
        for job_id, user in [(i, a) for i in mine] + [(i, b) for i in theirs]:
            job = jobs[job_id]
            assert job.owner == user.uid and job.owner_gid == user.gid
            out = (reader.attempt_dir(job.attempts[-1]) / "output.log").read_text()
            assert f"uid {user.uid}" in out, out  # it ran as its submitter
        # The cores reserved at any moment never pass the manager's 2.
        spans = [
            (at.started, at.ended or at.started, at.placement.reservation.resources.cores)
            for j in jobs.values()
            for at in j.attempts
            if at.placement.reservation is not None
        ]
        for t, _, _ in spans:
            assert sum(c for s, e, c in spans if s <= t < e) <= 2.0 + 1e-9
        # Fair share: the second user's first job before the first user's third.
        assert jobs[theirs[0]].started is not None and jobs[mine[2]].started is not None
        timeline = [
            (i, round(e["t"] - jobs[1].submitted, 2), e["kind"]) for i in jobs for e in reader.events(i)
        ]
        assert jobs[theirs[0]].started < jobs[mine[2]].started, str(sorted(timeline, key=lambda e: e[1]))
    finally:
        reader.close()
    # The first user may not touch or read the second's job, and sees it without its command.
    for args in (("cancel", str(theirs[0])), ("show", str(theirs[0])), ("logs", str(theirs[0]))):
        done = _tandem(a, system, *args)
        assert done.returncode == 2 and "another user's" in done.stderr, (args, done.stdout, done.stderr)
    waited = _tandem(a, system, "wait", str(theirs[0]))
    assert waited.returncode == 125 and "another user's" in waited.stderr, waited.stderr
    assert _tandem(a, system, "wait").returncode == 0  # all of their own: ended
    listed = _tandem(a, system, "ls")
    assert listed.returncode == 0 and b.name in listed.stdout and a.name in listed.stdout
    other = next(r for r in json.loads(_tandem(a, system, "ls", "--json").stdout) if r["id"] == theirs[0])
    assert other["command"] == [] and other["cwd"] == "" and other["owner"] == b.uid
    own = _tandem(a, system, "show", str(mine[0]))
    assert own.returncode == 0 and "-c" in own.stdout
    assert f"uid {a.uid}" in _tandem(a, system, "logs", str(mine[0])).stdout
    # Root sees the host's users by fair share.
    env = {**os.environ, "TANDEM_SYSTEM_DIR": str(system)}
    status = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "daemon", "status", "--system"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stderr
    assert f"{a.name}: 0 running" in status.stdout and f"{b.name}: 0 running" in status.stdout, status.stdout
    # Only root (or the admin group) stops the manager.
    stop = _tandem(a, system, "daemon", "stop")
    assert stop.returncode != 0 and "only root" in stop.stderr


ATTACKS = r"""
import json, socket, sys
from pathlib import Path
from tandem.place import protocol
from tandem.place.client import DaemonError, request_at
from tandem.place.model import JobSpec
sock, victim = Path(sys.argv[1]), int(sys.argv[2])
said = {}
def attempt(name, message):
    try:
        said[name] = repr(request_at(sock, message, 10.0))
    except DaemonError as exc:
        said[name] = f"refused: {exc}"
# A request that names another user: the field is not the protocol's, the peer is who counts.
wire = {**protocol.to_wire(protocol.Cancel([victim])), "uid": 0, "owner": 0}
said["forged"] = json.dumps(protocol.exchange(sock, wire, 10.0))
attempt("cancel", protocol.Cancel([victim]))
attempt("cancel_all", protocol.Cancel([], everything=True))
attempt("read", protocol.ReadJobs(job_id=victim))
attempt("log", protocol.ReadLog(victim))
attempt("not_started", protocol.NotStarted(victim, 1, "x"))
attempt("stop", protocol.Stop())
# A flood of connections held open: the manager closes this user's beyond its cap.
held = []
for _ in range(200):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(str(sock))
    held.append(s)
print(json.dumps(said))
sys.stdout.flush()
sys.stdin.readline()  # held open until the test has checked the other user is answered
"""


def test_another_users_requests_are_refused_whatever_the_request_says(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    a, b = two_users
    victim = _submit(b, system)
    attacker = a.popen(
        [a.python, "-c", ATTACKS, str(system / "daemon.sock"), str(victim)],
        env=a.env(TANDEM_SYSTEM_DIR=str(system)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None and attacker.stdin is not None
        said = json.loads(attacker.stdout.readline() or "{}")
        assert said, attacker.stderr.read() if attacker.stderr else ""
        for name in ("forged", "cancel", "read", "log", "not_started", "stop"):
            assert "another user" in said[name] or "only" in said[name], (name, said[name])
        assert "cancelled=[]" in said["cancel_all"]  # --all of a user: their own, none here
        listed = _tandem(b, system, "ls")  # the flood held open: the other user is answered
        assert listed.returncode == 0 and str(victim) in listed.stdout, listed.stderr
        attacker.stdin.write("\n")
        attacker.stdin.flush()
    finally:
        attacker.kill()
        attacker.wait()
    (system / "go").touch()
    reader = StateReader(system / "state")
    try:
        until(
            lambda: (j := reader.job(victim)) is not None and j.state == "succeeded", 120, "the victim's job"
        )
    finally:
        reader.close()
    # The Python API goes through the host's manager too: a job of theirs, waited for and read.
    api = (
        "import tandem.jobs as tj\n"
        f"j = tj.submit([{a.python!r}, '-c', 'import os; print(\"uid\", os.getuid())'])\n"
        "print(j.wait(120), j.logs().strip())\n"
    )
    done = a.run([a.python, "-c", api], env=a.env(TANDEM_SYSTEM_DIR=str(system)), timeout=scaled(120))
    assert done.returncode == 0 and done.stdout.split() == ["succeeded", "uid", str(a.uid)], done.stderr
    # `logs -f` follows a job of theirs through the manager, as it writes, to its end.
    go_on = system / "go-on"
    said = "import os, sys, time\nprint('one', flush=True)\n"
    said += "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\nprint('two', flush=True)"
    job = int(_tandem(a, system, "submit", "--", a.python, "-c", said, str(go_on)).stdout)
    follower = a.popen(
        a.tandem("logs", "-f", str(job)),
        env=a.env(TANDEM_SYSTEM_DIR=str(system)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None and follower.stdout.readline() == "one\n"
        assert follower.poll() is None, "it follows the job while it runs"
        go_on.touch()
        out, err = follower.communicate(timeout=scaled(60))
        assert follower.returncode == 0 and out == "two\n", (out, err)
    finally:
        follower.kill()
        follower.wait()


# Its reader says who it ran as, and who its producer runs as.
READER = (
    "import os, sys\n"
    "from tandem.share import Consumer\n"
    "c = Consumer.from_env(batch_size=8)\n"
    "n = sum(int(b.shape[0]) for b in c)\n"
    "runs_as = os.stat(f'/proc/{c.producer_pid}').st_uid\n"
    "print('read', n, 'from', c.producer_pid, 'as', os.getuid(), 'its producer as', runs_as)\n"
    "c.close()\n"
)


def test_a_share_group_is_served_by_a_producer_run_as_its_definer(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """A share group under the system manager: its producer runs as the user who defined it
    and feeds their jobs (one producer, a whole epoch each); the other user may neither read
    it nor take its name."""
    a, b = two_users
    for user, name, text in (
        (a, "toy_data.py", DATASET),
        (a, "reader.py", READER),
        (b, "toy_data.py", DATASET),
    ):
        (user.home / name).write_text(text)
        os.chown(user.home / name, user.uid, user.gid)
    defined = _tandem(
        a, system, "share", "define", "toy", "--dataset", "toy_data.py:make", "--batch-size", "4"
    )
    assert defined.returncode == 0 and "defined 'toy'" in defined.stdout, defined.stderr
    ids = []
    for _ in range(2):
        submit = ["submit", "--share", "toy", "--group", "sweep", "--cpus", "0.5", "--"]
        done = _tandem(a, system, *submit, a.python, "reader.py")
        assert done.returncode == 0, done.stderr
        ids.append(int(done.stdout))
    # A group of the same name of the other user's: theirs, not a part of the first's sweep.
    done = _tandem(b, system, "submit", "--group", "sweep", "--cpus", "0.5", "--", b.python, "-c", "pass")
    assert done.returncode == 0, done.stderr
    theirs_id = int(done.stdout)
    # The other user: not their share, to read or to define again.
    theirs = _tandem(b, system, "submit", "--share", "toy", "--", b.python, "-c", "pass")
    assert theirs.returncode == 2 and "another user's" in theirs.stderr, theirs.stderr
    again = _tandem(b, system, "share", "define", "toy", "--dataset", "toy_data.py:make")
    assert again.returncode == 2 and "another user's" in again.stderr, again.stderr
    waited = a.run(
        a.tandem("wait", *map(str, ids)), env=a.env(TANDEM_SYSTEM_DIR=str(system)), timeout=scaled(240)
    )
    logs = [_tandem(a, system, "logs", str(i)).stdout for i in ids]
    assert waited.returncode == 0, (waited.stderr, logs)
    said = [line.split() for out in logs for line in out.splitlines() if line.startswith("read ")]
    # A whole epoch each, as their user, from one producer run as its definer.
    assert [(w[1], w[5], w[9]) for w in said] == [("64", str(a.uid), str(a.uid))] * 2, logs
    assert said[0][3] == said[1][3], "one producer fed both"
    # Each user's `tandem report group:sweep` is their own sweep's table, read through the
    # manager (its state is root's) and from their own store.
    assert _tandem(b, system, "wait", str(theirs_id)).returncode == 0
    for user, jobs in ((a, ids), (b, [theirs_id])):
        report = _tandem(user, system, "report", "group:sweep", "--json")
        assert report.returncode == 0, report.stderr
        (sweep,) = json.loads(report.stdout)["groups"]
        assert [r["id"] for r in sweep["jobs"]] == jobs, sweep
        assert {r["state"] for r in sweep["jobs"]} == {"succeeded"}, sweep
    reader = StateReader(system / "state")
    try:
        (producer,) = [j for j in reader.jobs() if j.role == "producer" and j.share == "toy"]
        assert producer.owner == a.uid
    finally:
        reader.close()


GUEST_READER = (  # reads a whole epoch, then tries to write into the memory it read from
    "import mmap, os\n"
    "from tandem.share import Consumer\n"
    "c = Consumer.from_env(batch_size=8)\n"
    "n = sum(int(b.shape[0]) for b in c)\n"
    "runs_as = os.stat(f'/proc/{c.producer_pid}').st_uid\n"
    "checked = written = 0\n"
    "for fd in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        if not os.readlink(f'/proc/self/fd/{fd}').startswith('/memfd:tandem:pub:'):\n"
    "            continue\n"
    "    except OSError:\n"
    "        continue\n"
    "    checked += 1\n"
    "    for attempt in (lambda: os.open(f'/proc/self/fd/{fd}', os.O_RDWR),\n"
    "                    lambda: mmap.mmap(int(fd), 4096, mmap.MAP_SHARED, mmap.PROT_WRITE)):\n"
    "        try:\n"
    "            attempt()\n"
    "            written += 1\n"
    "        except OSError:\n"
    "            pass\n"
    "flood = '-'\n"
    "if runs_as != os.getuid():  # a guest's connections beyond its 16 (this reader's one of them)\n"
    "    import socket\n"
    "    from tandem.share import protocol\n"
    "    extra = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(16)]\n"
    "    for s in extra:\n"
    "        s.connect(os.environ['TANDEM_SHARE_SOCKET'])\n"
    "    flood = type(protocol.recv(extra[-1], timeout=60)[0]).__name__\n"
    "    for s in extra:\n"
    "        s.close()\n"
    "print('read', n, 'as', os.getuid(), 'its producer as', runs_as, 'over', c.transport,\n"
    "      'segments', checked, 'writable', written, 'flood', flood)\n"
    "c.close()\n"
)


def test_a_public_share_serves_another_users_jobs_read_only(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """A share its definer marks public (`share define --public`) feeds the other user's jobs
    too, from one producer run as its definer: they read a whole epoch as themselves, over
    the socket, through descriptors they can neither write nor open again for writing; a
    flood of their connections is refused past 16."""
    a, b = two_users
    for user in (a, b):
        for name, text in (("toy_data.py", DATASET), ("reader.py", GUEST_READER)):
            (user.home / name).write_text(text)
            os.chown(user.home / name, user.uid, user.gid)
    define = ("share", "define", "pub", "--dataset", "toy_data.py:make", "--batch-size", "4", "--public")
    defined = _tandem(a, system, *define)
    assert defined.returncode == 0 and "defined 'pub'" in defined.stdout, defined.stderr
    # The other user's job comes first, so its producer is made for them: with code of theirs
    # on their PYTHONPATH (a sitecustomize, run by every interpreter that has it there).
    marks = system / "marks"  # in the manager's folder: gone with it, whatever happens
    marks.mkdir()
    marks.chmod(0o777)
    evil = system / "evil"  # theirs, and every user's to read
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(f"import os\nopen('{marks}/ran-as-' + str(os.getuid()), 'w')\n")
    for path, mode in ((evil, 0o755), (evil / "sitecustomize.py", 0o644)):
        os.chown(path, b.uid, b.gid)
        path.chmod(mode)
    ids = {}
    for user in (b, a):
        env = user.env(TANDEM_SYSTEM_DIR=str(system))
        if user is b:
            env["PYTHONPATH"] = f"{evil}{os.pathsep}{env['PYTHONPATH']}"
        submit = ("submit", "--share", "pub", "--cpus", "0.5", "--", user.python, "reader.py")
        done = user.run(user.tandem(*submit), env=env, timeout=scaled(60))
        assert done.returncode == 0, done.stderr
        ids[user.uid] = int(done.stdout)
    said = {}
    for user in (a, b):
        waited = _tandem(user, system, "wait", str(ids[user.uid]))
        out = _tandem(user, system, "logs", str(ids[user.uid])).stdout
        assert waited.returncode == 0, (waited.stderr, out)
        (said[user.uid],) = [line.split() for line in out.splitlines() if line.startswith("read ")]
    # read N as UID its producer as UID over TRANSPORT segments K writable W flood REPLY
    for user in (a, b):
        words = said[user.uid]
        assert (words[1], words[3], words[7]) == ("64", str(user.uid), str(a.uid)), words
        assert int(words[11]) > 0, words  # it held the batches' memory it read
    guest = said[b.uid]
    assert guest[9] == "socket" and guest[13] == "0", guest  # read-only to the other user
    assert guest[15] == "Refused" and said[a.uid][15] == "-", guest  # 16 connections of theirs at most
    # Their code ran as them (their job), never as the definer (the producer: the definer's
    # environment as defined, not the job's that started it).
    assert sorted(p.name for p in marks.iterdir()) == [f"ran-as-{b.uid}"]
    # The other user may not take its name, nor remove it.
    again = _tandem(b, system, "share", "define", "pub", "--dataset", "toy_data.py:make")
    assert again.returncode == 2 and "another user's" in again.stderr, again.stderr


DROP_IN = (  # a script's drop-in loader: no --share, no definition
    "import json, os, sys\n"
    "import torch\n"
    "from tandem.share import DataLoader\n"
    "class Squares(torch.utils.data.Dataset):\n"
    "    def __len__(self):\n"
    "        return 40\n"
    "    def __getitem__(self, i):\n"
    "        return torch.tensor([float(i * i)]), i\n"
    "loader = DataLoader(Squares(), batch_size=int(sys.argv[1]), shuffle=True)\n"
    "exact = []\n"
    "for _ in range(2):\n"
    "    seen = []\n"
    "    for x, idx in loader:\n"
    "        assert torch.equal(x[:, 0], (idx * idx).float())\n"
    "        seen += idx.tolist()\n"
    "    exact.append(sorted(seen) == list(range(40)))\n"
    "pid = loader._consumer.producer_pid if loader._consumer else None\n"
    "uid = os.stat(f'/proc/{pid}').st_uid if pid else None\n"
    "said = {'exact': exact, 'producer': pid, 'producer_uid': uid, 'uid': os.getuid()}\n"
    "print('outcome', json.dumps(said))\n"
)


def test_a_drop_in_loaders_jobs_read_an_auto_share_of_their_users(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """A drop-in loader's jobs under the system manager read an auto share as on a user's own
    daemon: one producer job for a user's sweep, run as that user, every epoch exact; the other
    user's job of the same script and data reads a share of its own (a producer run as them)."""
    a, b = two_users
    for user in (a, b):
        (user.home / "train.py").write_text(DROP_IN)
        os.chown(user.home / "train.py", user.uid, user.gid)
    done = _tandem(
        a, system, "submit", "--grid", "bs=4,5", "--cpus", "0.5", "--", a.python, "train.py", "{bs}"
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(_tandem(a, system, "ls", "--json").stdout)
    ids = {a.uid: [r["id"] for r in rows if r["role"] != "producer" and r["user"] == a.name]}
    assert len(ids[a.uid]) == 2, rows
    done = _tandem(b, system, "submit", "--cpus", "0.5", "--", b.python, "train.py", "4")
    assert done.returncode == 0, done.stderr
    ids[b.uid] = [int(done.stdout)]
    outcomes = {}
    for user in (a, b):
        for job in ids[user.uid]:
            waited = user.run(
                user.tandem("wait", str(job)),
                env=user.env(TANDEM_SYSTEM_DIR=str(system)),
                timeout=scaled(300),
            )
            out = _tandem(user, system, "logs", str(job)).stdout
            assert waited.returncode == 0, (waited.stderr, out)
            (line,) = [x for x in out.splitlines() if x.startswith("outcome ")]
            outcomes[job] = json.loads(line.removeprefix("outcome "))
    for user in (a, b):
        for job in ids[user.uid]:
            o = outcomes[job]
            assert o["exact"] == [True, True] and o["uid"] == o["producer_uid"] == user.uid, o
    first, second = (outcomes[j]["producer"] for j in ids[a.uid])
    assert first == second, "one producer for the user's sweep"
    assert outcomes[ids[b.uid][0]]["producer"] != first
    reader = StateReader(system / "state")
    try:
        producers = [j for j in reader.jobs() if j.role == "producer"]
        assert sorted(p.owner for p in producers) == sorted([a.uid, b.uid]), producers
    finally:
        reader.close()


def test_a_share_of_a_selection_is_made_and_served_as_its_definer(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """`share define --select METHOD:BUDGET` under the system manager: its selection job runs
    as the definer and leaves its id in a folder of theirs (the manager reads it as them, then
    removes it); the producer, run as them, serves the selected items only, from their store."""
    a, _b = two_users
    for name, text in (("toy_data.py", DATASET), ("reader.py", READER)):
        (a.home / name).write_text(text)
        os.chown(a.home / name, a.uid, a.gid)
    define = ("share", "define", "half", "--dataset", "toy_data.py:make", "--batch-size", "4")
    defined = _tandem(a, system, *define, "--select", "random:0.5")
    assert defined.returncode == 0 and "its selection (random:0.5) is made once by job" in defined.stderr, (
        defined.stderr
    )
    done = _tandem(a, system, "submit", "--share", "half", "--cpus", "0.5", "--", a.python, "reader.py")
    assert done.returncode == 0, done.stderr
    job = int(done.stdout)
    waited = a.run(a.tandem("wait", str(job)), env=a.env(TANDEM_SYSTEM_DIR=str(system)), timeout=scaled(300))
    out = _tandem(a, system, "logs", str(job)).stdout
    assert waited.returncode == 0, (waited.stderr, out)
    (said,) = [line.split() for line in out.splitlines() if line.startswith("read ")]
    assert said[1] == "32" and said[9] == str(a.uid), out  # half of 64 items, from their producer
    reader = StateReader(system / "state")
    try:
        (share,) = [s for s in reader.shares() if s.name == "half"]
        assert share.selection is not None and share.owner == a.uid
        (selector,) = [j for j in reader.jobs() if j.name == "select-half"]
        assert selector.state == "succeeded" and selector.owner == a.uid
    finally:
        reader.close()
    stored = a.home / ".local" / "state" / "tandem" / "selections" / share.selection
    assert stored.is_dir(), list(stored.parent.parent.rglob("*"))  # in their own store
    # Each attempt's folder of theirs goes as it ends (the producer's once its group is done).
    folders = system / "users" / str(a.uid) / "jobs"
    until(lambda: not any(folders.iterdir()), 120, lambda: f"left: {list(folders.iterdir())}")


def test_a_users_own_daemon_beside_the_system_manager_is_said_and_stopped_with_own(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """A user's own daemon, started before the host's manager, serves no command while the
    manager runs: each command the manager serves says so, and `daemon stop --own` stops it."""
    a, _b = two_users
    alone = a.run(a.tandem("daemon", "start"), env=a.env(TANDEM_SYSTEM_DIR=str(system / "none")))
    try:
        assert alone.returncode == 0, alone.stderr
        listed = _tandem(a, system, "ls")
        assert listed.returncode == 0, listed.stderr
        assert "the host's system manager serves this command; your own daemon" in listed.stderr
        stopped = _tandem(a, system, "daemon", "stop", "--own")
        assert stopped.returncode == 0 and "daemon stopped" in stopped.stderr, stopped.stderr
        listed = _tandem(a, system, "ls")
        assert listed.returncode == 0 and "your own daemon" not in listed.stderr, listed.stderr
        status = _tandem(a, system, "daemon", "status")
        assert "the host's system manager" in status.stdout and "your own daemon" not in status.stdout
    finally:
        a.run(a.tandem("daemon", "stop"), env=a.env(TANDEM_SYSTEM_DIR=str(system / "none")))


LOGS_ITS_OWN = (  # MLflow takes MLFLOW_RUN_ID out of the environment as it resumes the run
    "import os\n"
    "print('run', os.environ.get('MLFLOW_RUN_ID'), 'store', os.environ.get('MLFLOW_TRACKING_URI'))\n"
    "import mlflow\n"
    "mlflow.log_metric('loss', 0.25)\n"
)
READ_STORE = (
    "import sqlite3, sys\n"
    "db = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True)\n"
    "rows = db.execute('SELECT DISTINCT key FROM metrics WHERE run_uuid = ?', (sys.argv[2],))\n"
    "keys = {k for (k,) in rows}\n"
    "(status,) = db.execute('SELECT status FROM runs WHERE run_uuid = ?', (sys.argv[2],)).fetchone()\n"
    "print(status, ' '.join(sorted(keys)))\n"
)


def test_a_users_jobs_runs_are_in_their_own_store_which_the_job_writes_too(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """Under the system manager a job's MLflow run is in its user's store, theirs only: the
    job is told it (its own mlflow.log_metric lands there, beside the manager's samples), and
    they read it (tandem report, sqlite) where the other user may not."""
    a, b = two_users
    done = _tandem(a, system, "submit", "--", a.python, "-c", LOGS_ITS_OWN)
    assert done.returncode == 0, done.stderr
    job = int(done.stdout)
    waited = _tandem(a, system, "wait", str(job))
    out = _tandem(a, system, "logs", str(job)).stdout
    assert waited.returncode == 0, out
    store = system / "users" / str(a.uid) / "mlflow" / "mlflow.db"
    said = out.split()
    run_id = said[said.index("run") + 1]
    assert said[said.index("store") + 1] == f"sqlite:///{store}", out
    shown = json.loads(_tandem(a, system, "show", str(job), "--json").stdout)
    assert shown["mlflow_run_id"] == run_id, (shown, out)
    # Theirs alone: the folder and the store, the way to them root's.
    assert store.stat().st_uid == a.uid and stat.S_IMODE(store.stat().st_mode) == 0o600
    assert store.parent.stat().st_uid == a.uid and stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    above = store.parent.parent.stat()
    assert stat.S_IMODE(above.st_mode) == 0o711 and above.st_uid == 0

    def read(user: OtherUser) -> subprocess.CompletedProcess:
        return user.run([user.python, "-c", READ_STORE, str(store), run_id], timeout=scaled(60))

    # Closed by their helper once the job ended, its samples and the job's own metric in it.
    until(lambda: "summary/run_s" in read(a).stdout, 120, lambda: f"the run: {read(a)}")
    status, *keys = read(a).stdout.split()
    assert status == "FINISHED" and "loss" in keys and "summary/cpu_seconds" in keys, keys
    assert any(k.startswith("system/") or k.startswith("proc/") for k in keys), keys  # its samples
    theirs = read(b)
    assert theirs.returncode != 0 and "unable to open" in theirs.stderr, theirs.stderr
    report = _tandem(a, system, "report", f"job:{job}", "--json")
    assert report.returncode == 0, report.stderr
    assert [r["run_id"] for r in json.loads(report.stdout)["runs"]] == [run_id], report.stdout


def test_a_user_who_changes_their_mlflow_folder_harms_no_one_else(
    system: Path,
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """The manager (root) writes and reads a user's MLflow queue as that user: a pipe, a link
    to a file of root's, their queue made a link to a folder of root's stall nothing, read
    nothing of root's, write nothing there; their jobs run on, the other user's too."""
    a, b = two_users
    mine = system / "users" / str(a.uid) / "mlflow"

    def ran(user: OtherUser) -> int:
        job = int(_tandem(user, system, "submit", "--", user.python, "-c", "print('done')").stdout)
        assert _tandem(user, system, "wait", str(job)).returncode == 0, _tandem(
            user, system, "show", str(job)
        )
        return job

    ran(a)  # their folder and queue made
    plant = (
        "import os, sys\n"
        "done = os.path.join(sys.argv[1], 'track', 'done')\n"
        "os.mkfifo(os.path.join(done, '77-1.json'))\n"
        "os.symlink(sys.argv[2], os.path.join(done, '78-1.json'))\n"
    )
    secret = system / "root-only.json"
    secret.write_text(json.dumps({"job_id": 1, "attempt": 1, "final": True, "run_id": "root's"}))
    os.chmod(secret, 0o600)
    planted = a.run([a.python, "-c", plant, str(mine), str(secret)])
    assert planted.returncode == 0, planted.stderr
    second = ran(a)  # the pipe stalled nothing: its run made and recorded
    until(
        lambda: json.loads(_tandem(a, system, "show", str(second), "--json").stdout)["mlflow_run_id"],
        60,
        "the second job's run recorded",
    )
    first = json.loads(_tandem(a, system, "show", "1", "--json").stdout)
    assert first["mlflow_run_id"] != "root's", "root's file was not read as theirs"
    # Their queue swapped for a link to a folder of root's: nothing is written there.
    victim = system / "victim"
    victim.mkdir(mode=0o700)
    swap = (
        "import os, sys\nos.rename(sys.argv[1], sys.argv[1] + '.old')\nos.symlink(sys.argv[2], sys.argv[1])\n"
    )
    swapped = a.run([a.python, "-c", swap, str(mine / "track"), str(victim)])
    assert swapped.returncode == 0, swapped.stderr
    third = ran(a)
    shown = _tandem(a, system, "show", str(third)).stdout
    assert "not recorded in MLflow" in shown, shown
    ran(b)  # the other user's jobs run on
    assert os.listdir(victim) == [], "nothing written in root's folder"
    assert _tandem(b, system, "ls").returncode == 0
