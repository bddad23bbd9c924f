"""The run's own processes: the command and every descendant, including those started later.

CPU is attributed by process, not by host: under collocation, host-wide figures (or sums
over every python process, as radT does) charge one run for another's work. Each sample
walks the tree from the root again, so DataLoader workers and producers started after the
run began are counted; CPU-seconds of descendants that have exited stay counted (their last
reading is kept), so the totals never go backwards.
"""

from __future__ import annotations

import time

import psutil


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of a process (shared pages split among their users), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ProcessTreeSampler:
    name = "process_tree"

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self._procs: dict[int, psutil.Process] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> last (user, system) seconds
        self._last: tuple[float, float] | None = None  # (time, total cpu seconds)

    def available(self) -> tuple[bool, str]:
        if not psutil.pid_exists(self.root_pid):
            return False, f"process {self.root_pid} does not exist"
        return True, ""

    def _tree(self) -> list[psutil.Process]:
        try:
            root = self._procs.get(self.root_pid) or psutil.Process(self.root_pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        # Reuse Process objects: psutil keys a process on (pid, create time), so a reused
        # pid is a new process, and cpu_percent needs the same object between calls.
        tree = []
        for p in found:
            known = self._procs.get(p.pid)
            if known is None or known.create_time() != p.create_time():
                known = self._procs[p.pid] = p
            tree.append(known)
        return tree

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        rss = pss = threads = read = written = 0
        alive = 0
        for p in self._tree():
            try:
                with p.oneshot():
                    cpu = p.cpu_times()
                    mem = p.memory_info()
                    n_threads = p.num_threads()
                    try:
                        io = p.io_counters()
                    except (psutil.AccessDenied, AttributeError):
                        io = None
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            self._cpu[p.pid] = (cpu.user, cpu.system)
            alive += 1
            rss += mem.rss
            pss += pss_bytes(p.pid) or mem.rss
            threads += n_threads
            if io is not None:
                read += io.read_bytes
                written += io.write_bytes
        user = sum(u for u, _ in self._cpu.values())
        system = sum(s for _, s in self._cpu.values())
        metrics = {
            "system/process_tree/cpu_user_seconds": user,
            "system/process_tree/cpu_system_seconds": system,
            "system/process_tree/rss_bytes": float(rss),
            "system/process_tree/pss_bytes": float(pss),
            "system/process_tree/threads": float(threads),
            "system/process_tree/processes": float(alive),
            "system/process_tree/read_bytes": float(read),
            "system/process_tree/write_bytes": float(written),
        }
        if self._last is not None and now > self._last[0]:
            # percent of one core, like top: 200 means two cores busy
            metrics["system/process_tree/cpu_percent"] = (
                100.0 * (user + system - self._last[1]) / (now - self._last[0])
            )
        self._last = (now, user + system)
        return metrics
