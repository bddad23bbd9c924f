"""The run's own processes: the command and every descendant, including those started later.

CPU is attributed by process, not by host: under collocation, host-wide figures (or sums
over every python process, as radT does) charge one run for another's work. Each sample
walks the tree from the root again, so DataLoader workers and producers started after the
run began are counted; CPU-seconds of descendants that have exited stay counted (their last
reading is kept), so the totals never go backwards.

CPU-seconds count from the first sample (``since_start=False``, right for tracking a
process that has been running a while, as ``track()`` does with its own process) or from
each process's start (``since_start=True``, right for a command the tracker just started).
"""

from __future__ import annotations

import os
import time

import psutil

from tandem.watch.samplers.base import Sampler


def memory_rollup(pid: int) -> tuple[int, int] | None:
    """``(pss, uss)`` bytes of a process from ``/proc/PID/smaps_rollup``, or None.

    PSS splits each shared page among its users (so a run's PSS sums correctly across
    processes that share a tandem slab); USS is what only this process holds (what its
    exit would free).
    """
    pss = uss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith(("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:")):
                    uss += int(line.split()[1]) * 1024
    except OSError:
        return None
    return pss, uss


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of a process (shared pages split among their users), or None."""
    rollup = memory_rollup(pid)
    return rollup[0] if rollup else None


def _has_children_files() -> bool:
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc/PID/task/*/children``: a few small reads,
    where psutil's ``children()`` reads the stat file of every process on the host."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue  # the thread ended
    return out


# PSS and USS come from smaps_rollup, which walks the page tables: about 6 ms for a
# process with torch loaded. They are read at most this share of the time (RSS, from
# the cheap stat files, every sample), so tracking stays far under 1% of a core; in
# between, each process's PSS and USS move with its RSS.
ROLLUP_BUDGET = 0.001


class ProcessTreeSampler(Sampler):
    name = "process_tree"

    def __init__(self, root_pid: int, since_start: bool = True, exclude: set[int] | None = None):
        """``exclude``: pids (with their descendants) left out of the run, e.g. a tracker's
        own helper process; the set may be filled in after construction."""
        self.root_pid = root_pid
        self.exclude = exclude if exclude is not None else set()
        self.since_start = since_start
        self._base: tuple[float, float] | None = None if not since_start else (0.0, 0.0)
        self._procs: dict[int, psutil.Process] = {}
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, start) -> (user, system) s
        self._last: tuple[float, float] | None = None  # (time, total cpu seconds)
        self.pids: frozenset[int] = frozenset()  # the tree's live pids at the last sample
        self._fast_children = _has_children_files()
        self._rollups: dict[tuple[int, float], tuple[int, int, int]] = {}  # -> (pss, uss, rss when read)
        self._rollup_due = 0.0
        self.final_cpu: tuple[float, float] | None = None  # the kernel's total at the end, if known
        self._total_cpu = 0.0
        self._exited = (0.0, 0.0)  # CPU-seconds of the tree's processes that have ended
        self.last: dict[str, float] = {}  # the last sample's metrics
        self._cores = psutil.cpu_count() or 1

    @property
    def cpu_seconds(self) -> float:
        """The run's CPU-seconds (user + system) as of the last sample."""
        return self._total_cpu

    def available(self) -> tuple[bool, str]:
        if not psutil.pid_exists(self.root_pid):
            return False, f"process {self.root_pid} does not exist"
        return True, ""

    def _walk(self) -> list[int]:
        """Pids of the tree, root first; an excluded pid hides its whole subtree."""
        if self._fast_children:
            if not psutil.pid_exists(self.root_pid):
                return []
            found, todo = [], [self.root_pid]
            while todo:
                pid = todo.pop()
                if pid not in self.exclude:
                    found.append(pid)
                    todo.extend(child_pids(pid))
            return found
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
            skip = set(self.exclude)
            for p in procs:
                if p.pid in self.exclude:
                    skip.update(c.pid for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            return []
        return [p.pid for p in procs if p.pid not in skip]

    def _tree(self) -> list[psutil.Process]:
        # Reuse Process objects: psutil keys a process on (pid, create time), so
        # is_running() is False for a pid that another process has taken since.
        tree = []
        for pid in self._walk():
            known = self._procs.get(pid)
            try:
                if known is None or not known.is_running():
                    known = self._procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
            tree.append(known)
        return tree

    def _read_rollup(self, p: psutil.Process) -> tuple[int, int, int] | None:
        r = memory_rollup(p.pid)
        if r is None:
            return None
        try:
            rollup = (*r, p.memory_info().rss)
            self._rollups[(p.pid, p.create_time())] = rollup
        except psutil.Error:
            return None
        return rollup

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        rss = pss = uss = threads = read = written = 0
        pids = set()
        tree = self._tree()
        if now >= self._rollup_due:
            t0 = time.perf_counter()
            self._rollups = {}
            for p in tree:
                self._read_rollup(p)
            self._rollup_due = now + (time.perf_counter() - t0) / ROLLUP_BUDGET
        alive: set[tuple[int, float]] = set()
        for p in tree:
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
            key = (p.pid, p.create_time())  # a reused pid is a new key
            self._cpu[key] = (cpu.user, cpu.system)
            alive.add(key)
            pids.add(p.pid)
            rss += mem.rss
            rollup = self._rollups.get(key)
            if rollup is None:  # a process new since the last read: read it now (once)
                rollup = self._read_rollup(p)
            if rollup is None:
                pss += mem.rss
                uss += mem.rss
            else:
                # Between reads, memory the process gained or gave back since the last read
                # (its RSS change) is counted as its own: growth is mostly private pages.
                grown = mem.rss - rollup[2]
                pss += max(0, rollup[0] + grown)
                uss += max(0, rollup[1] + grown)
            threads += n_threads
            if io is not None:
                read += io.read_bytes
                written += io.write_bytes
        for key in [k for k in self._cpu if k not in alive]:  # exited: keep its CPU, drop the rest
            u, s_ = self._cpu.pop(key)
            self._exited = (self._exited[0] + u, self._exited[1] + s_)
            self._rollups.pop(key, None)
        for pid in [pid for pid in self._procs if pid not in pids]:
            del self._procs[pid]
        user = self._exited[0] + sum(u for u, _ in self._cpu.values())
        system = self._exited[1] + sum(s for _, s in self._cpu.values())
        if self._base is None:
            self._base = (user, system)
        user, system = user - self._base[0], system - self._base[1]
        final = self.final_cpu is not None
        if self.final_cpu is not None:  # wait4's total includes children that lived between samples
            user, system = max(user, self.final_cpu[0]), max(system, self.final_cpu[1])
        self._total_cpu = user + system
        metrics = {
            "system/process_tree/cpu_user_seconds": user,
            "system/process_tree/cpu_system_seconds": system,
            "system/process_tree/rss_bytes": float(rss),
            "system/process_tree/pss_bytes": float(pss),
            "system/process_tree/uss_bytes": float(uss),
            "system/process_tree/threads": float(threads),
            "system/process_tree/processes": float(len(pids)),
            "system/process_tree/read_bytes": float(read),
            "system/process_tree/write_bytes": float(written),
        }
        # Over less than 50 ms the kernel's 10 ms CPU-time ticks would make the percentage noise.
        # Not from the kernel's end-of-run total either: it holds CPU of children that lived
        # any time in the run, which put in the last interval made a rate above the cores.
        if self._last is not None and now - self._last[0] >= 0.05 and not final:
            # percent of one core, like top: 200 means two cores busy; never above the cores
            rate = 100.0 * (user + system - self._last[1]) / (now - self._last[0])
            metrics["system/process_tree/cpu_percent"] = min(rate, 100.0 * self._cores)
        if self._last is None or now - self._last[0] >= 0.05:
            self._last = (now, user + system)
        self.pids = frozenset(pids)
        self.last = metrics
        return metrics
