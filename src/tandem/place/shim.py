"""The per-job supervisor: ``python -m tandem.place.shim ATTEMPT_DIR``.

The daemon starts one shim per attempt in a session of its own, so the shim does not
share the daemon's fate: if the daemon dies (SIGKILL included) the job keeps running and
the shim still records how it ended; a restarted daemon finds the shim by pid and start
time and reads its files. Everything goes through files in the attempt's directory,
each written whole (write, then rename):

- ``spec.json`` (from the daemon): command, cwd, env, the grace period for a cancel.
- ``shim.json``: the shim's pid, start time and machine (boot id), written first.
- ``started.json``: the job's pid, start time and process group, once it has started.
- ``usage.json``: the job's process tree every ``interval`` s: pids, memory, CPU.
- ``output.log``: the job's stdout and stderr.
- ``result.json``: how it ended (:class:`tandem.place.failures.Ending`) and its peaks.

The job runs in a process group of its own. SIGTERM to the shim (a cancel) stops the
whole tree: SIGTERM to the group and every descendant, SIGKILL after the grace period.
When the job's main process ends, what it left behind in its group is stopped the same
way, so no stray worker keeps a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from tandem.place import failures
from tandem.watch.samplers.process_tree import ProcessTreeSampler


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``path`` whole: a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def create_time(pid: int) -> float | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``): unlike a wall-clock
    start time, it does not move when the system clock is stepped. None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return float(stat[stat.rindex(b")") + 2 :].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        try:
            return psutil.Process(pid).create_time()  # no /proc: wall clock, the best there is
        except psutil.Error:
            return None


def host_id() -> str:
    """This machine's boot id: pids and start times mean something only on the machine (and
    boot) they come from. Ray nodes on other machines have another."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return os.uname().nodename


def same_process(pid: int | None, ctime: float | None) -> bool:
    """Is ``pid`` still the process that started at ``ctime`` (:func:`create_time`), alive and
    not a zombie? A reused pid has another start time."""
    if not pid or ctime is None:
        return False
    if create_time(pid) != ctime:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_tree(root: int, pgid: int | None, grace: float, known: Iterable[psutil.Process] = ()) -> None:
    """SIGTERM the group ``pgid``, ``root`` and their descendants; SIGKILL what is left after
    ``grace`` seconds. ``known``: processes seen in the tree earlier (descendants that left
    the group are still found); psutil ties each to its start time, so a pid reused since by
    an unrelated process is never signalled. ``root`` is not reaped here: its parent's
    ``wait()`` must still see how it ended."""
    procs: dict[int, psutil.Process] = {}
    candidates: list[psutil.Process] = [p for p in known if p.is_running()]
    try:
        candidates.append(psutil.Process(root))
    except psutil.Error:
        pass
    for p in candidates:
        procs[p.pid] = p
        try:
            for c in p.children(recursive=True):
                procs[c.pid] = c
        except psutil.Error:
            pass
    procs.pop(os.getpid(), None)

    def signal_all(sig: int) -> None:
        if pgid is not None:
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass
        for p in procs.values():
            try:
                p.send_signal(sig)  # psutil refuses a process whose pid was reused
            except psutil.Error:
                pass

    def wait_gone(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = [p for p in procs.values() if _running(p)]
            if not alive and not _group_alive(pgid):
                return True
            time.sleep(0.05)
        return False

    signal_all(signal.SIGTERM)
    if not wait_gone(grace):
        signal_all(signal.SIGKILL)
        wait_gone(5.0)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _group_alive(pgid: int | None) -> bool:
    """Does a live process (not a zombie: a zombie is only waiting to be reaped) remain in
    process group ``pgid``?"""
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False  # no member at all
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


class Shim:
    def __init__(self, attempt_dir: Path) -> None:
        self.dir = attempt_dir
        self.spec = json.loads((attempt_dir / "spec.json").read_text())
        self.cancelled = False
        self.interval = float(self.spec.get("interval", 1.0))
        self.grace = float(self.spec.get("grace_s", 10.0))

    def _on_term(self, _signum: int, _frame: Any) -> None:
        self.cancelled = True

    def run(self) -> int:
        write_json(
            self.dir / "shim.json", {"pid": os.getpid(), "ctime": create_time(os.getpid()), "host": host_id()}
        )
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal is not a cancel
        log_path = self.dir / "output.log"
        oom_before = failures.oom_kill_count(os.getpid()) or 0
        started = time.time()
        try:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    self.spec["command"],
                    cwd=self.spec["cwd"],
                    env=self.spec["env"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except (FileNotFoundError, NotADirectoryError) as exc:
            return self._finish(127, f"{self.spec['command'][0]}: {exc.strerror}", started, {})
        except OSError as exc:
            return self._finish(126, f"{self.spec['command'][0]}: {exc.strerror}", started, {})
        write_json(
            self.dir / "started.json",
            {"pid": proc.pid, "ctime": create_time(proc.pid), "pgid": proc.pid, "started": started},
        )
        sampler = ProcessTreeSampler(proc.pid, since_start=True)
        peaks = {"peak_mem": 0, "cpu_seconds": 0.0}
        known: dict[int, psutil.Process] = {}
        next_sample = 0.0
        while proc.poll() is None:
            if self.cancelled:
                stop_tree(proc.pid, proc.pid, self.grace, known.values())
                break
            now = time.monotonic()
            if now >= next_sample:
                next_sample = now + self.interval
                self._sample(sampler, peaks, known)
            time.sleep(min(0.1, self.interval))
        returncode = proc.wait()
        if _group_alive(proc.pid):  # what the job left running in its group
            stop_tree(proc.pid, proc.pid, min(self.grace, 5.0), known.values())
        oom_after = failures.oom_kill_count(os.getpid()) or 0
        kernel = failures.kernel_oom_killed(proc.pid) if returncode == -signal.SIGKILL else None
        ending = failures.classify(
            returncode,
            failures.read_tail(log_path),
            cancelled=self.cancelled,
            oom_kills=oom_after - oom_before,
            kernel_oom=kernel is not None,
        )
        return self._write_result(ending, started, peaks, kernel)

    def _sample(
        self, sampler: ProcessTreeSampler, peaks: dict[str, Any], known: dict[int, psutil.Process]
    ) -> None:
        try:
            m = sampler.sample()
        except Exception:  # a process that vanished mid-read: next time
            return
        for pid in sampler.pids:
            if pid not in known or not known[pid].is_running():
                try:
                    known[pid] = psutil.Process(pid)
                except psutil.Error:
                    pass
        with open(self.dir / "metrics.jsonl", "a") as f:  # for the job's MLflow run (tracking.py)
            f.write(json.dumps({"t": time.time(), "m": m}) + "\n")
        mem = int(m.get("system/process_tree/pss_bytes", 0))
        peaks["peak_mem"] = max(peaks["peak_mem"], mem)
        peaks["cpu_seconds"] = sampler.cpu_seconds
        write_json(
            self.dir / "usage.json",
            {
                "t": time.time(),
                "pids": sorted(sampler.pids),
                "mem": mem,
                "peak_mem": peaks["peak_mem"],
                "cpu_seconds": sampler.cpu_seconds,
                "cpu_percent": m.get("system/process_tree/cpu_percent"),
            },
        )

    def _finish(self, code: int, message: str, started: float, peaks: dict[str, Any]) -> int:
        with open(self.dir / "output.log", "ab") as log:
            log.write(f"tandem: {message}\n".encode())
        ending = failures.classify(code, message)
        return self._write_result(ending, started, peaks, None)

    def _write_result(self, ending: Any, started: float, peaks: dict[str, Any], kernel: str | None) -> int:
        write_json(
            self.dir / "result.json",
            {
                "kind": ending.kind,
                "state": ending.state,
                "exit_code": ending.exit_code,
                "signal": ending.signal,
                "cause": ending.cause,
                "line": ending.line or kernel,
                "started": started,
                "ended": time.time(),
                "peak_mem": peaks.get("peak_mem"),
                "cpu_seconds": peaks.get("cpu_seconds"),
            },
        )
        _wake_daemon(self.spec.get("socket"))
        return 0


def _wake_daemon(socket_path: str | None) -> None:
    """Tell the daemon a result is there (best effort: it also looks every tick)."""
    if not socket_path:
        return
    from tandem import _ipc

    try:
        with _ipc.new_socket() as sock:
            sock.settimeout(1.0)
            sock.connect(socket_path)
            _ipc.send_packet(sock, b'{"op": "wake"}', timeout=1.0)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tandem.place.shim ATTEMPT_DIR", file=sys.stderr)
        return 2
    return Shim(Path(argv[0])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
