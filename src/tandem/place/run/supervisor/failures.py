"""How a job attempt ended: the job manager's failure classifier.

:func:`classify` turns what is known after a job's process exits (its return code, the tail of
its log, whether it was cancelled, and the host's OOM evidence) into an :class:`Ending`: a
``kind`` (why it ended), the job ``state`` it maps to, and a short ``cause`` and log ``line``
for ``tandem ls``/``show``. Only the two out-of-memory kinds are ``retryable``: the placer can
try again with more memory or on a freer GPU, whereas a bug fails the same way every time.

The OOM evidence, each piece read by a helper here:

- GPU OOM: the framework's message in the log (:func:`find_gpu_oom`); a CUDA OOM is an
  exception, so the process usually exits with 1 and only the text tells it apart from a bug.
- host OOM: the kernel's OOM killer sends SIGKILL, which looks exactly like ``kill -9`` from the
  return code alone. The evidence is an ``oom_kill`` counter that grew while the job ran (its
  own cgroup's, its memory cgroup's v1 or v2, else the host's: the supervisor's
  :class:`~tandem.place.run.supervisor.cgroups.OomWatch`) or the kernel's "Killed process" line
  (:func:`kernel_oom_killed`). A SIGKILL without either is reported as a signal, never
  guessed to be an OOM.

Each helper reads only what an unprivileged process may read and answers ``None`` where it
cannot (``kernel.dmesg_restrict``, a container without /dev/kmsg); the classifier then goes
by what it has.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

KINDS = ("ok", "gpu_oom", "host_oom", "signal", "exit", "not_found", "cancelled")
RETRYABLE = ("gpu_oom", "host_oom")
_STATES = {"ok": "succeeded", "gpu_oom": "oom", "host_oom": "oom", "cancelled": "cancelled"}

MAX_LINE = 300  # longest log line kept in an Ending: enough for a CUDA OOM message's numbers
_CGROUP_ROOT = Path("/sys/fs/cgroup")  # where cgroup v2 is mounted unless mountinfo says otherwise
_KMSG_MAX_RECORDS = 20_000  # the kernel ring buffer holds a few thousand; a bound, not a target
_KMSG_RECORD_BYTES = 16 * 1024  # one read() is one record; a buffer smaller than it: EINVAL

# Substrings that mark a GPU out-of-memory error (case-sensitive).
_GPU_OOM_MARKS = (
    "torch.OutOfMemoryError",  # PyTorch's exception as recent releases name it
    "torch.cuda.OutOfMemoryError",  # ... and as older ones do
    "CUDA out of memory",  # PyTorch's message, also what an MPS client over its pinned limit sees
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not allocate its workspace
    "CUDA_ERROR_OUT_OF_MEMORY",  # driver API (numba, cupy, JAX, an MPS client over its limit)
    "cudaErrorMemoryAllocation",  # runtime API (cupy, plain CUDA C++)
    "ResourceExhaustedError",  # TensorFlow's exception class
)
_OUT_OF_MEMORY = re.compile(r"out of memory", re.IGNORECASE)
_CUDA = re.compile(r"cuda", re.IGNORECASE)  # "CUDA error", "cuda:0", NCCL's "Cuda failure"
# TensorFlow's and XLA's status code is also used for quotas and queues, so it counts only
# with memory words on the same line ("OOM when allocating", "Out of memory while trying").
_RESOURCE_EXHAUSTED_MEMORY = re.compile(r"OOM|memory", re.IGNORECASE)

# The last line of a Python traceback: "ValueError: ...", "torch.OutOfMemoryError: ...".
_PY_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::|$)")
_ERRORISH = re.compile(
    r"\b(?:error|fatal|panic|exception|not found|failed|aborted|segmentation fault|core dumped)\b",
    re.IGNORECASE,
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour codes from rich/colorlog output
_KILLED_PROCESS = re.compile(r"\bKilled process (\d+)\b")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as "\040"


@dataclass(frozen=True)
class Ending:
    """How one job attempt ended (see the module docstring)."""

    kind: str  # one of KINDS
    state: str  # the job state: "succeeded", "oom", "cancelled" or "failed"
    exit_code: int | None  # the process's exit code; None when a signal ended it
    signal: str | None  # "SIGKILL" etc. when a signal ended it
    cause: str  # short text for `tandem ls`/`show`
    line: str | None  # the log (or kernel) line that shows the cause, at most MAX_LINE chars

    @property
    def retryable(self) -> bool:
        """Whether trying again with more memory may succeed (an OOM), unlike a bug."""
        return self.kind in RETRYABLE


def _clip(line: str) -> str:
    line = _ANSI.sub("", line).strip()
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def _is_gpu_oom(line: str) -> bool:
    if any(mark in line for mark in _GPU_OOM_MARKS):
        return True
    if "RESOURCE_EXHAUSTED" in line:
        return bool(_RESOURCE_EXHAUSTED_MEMORY.search(line))
    return bool(_OUT_OF_MEMORY.search(line) and _CUDA.search(line))


def find_gpu_oom(text: str) -> str | None:
    """The log line that shows a GPU out-of-memory error, stripped, or None.

    Among matching lines, the first one with PyTorch's "Tried to allocate" wins (it has the
    sizes); otherwise the first matching line.
    """
    first = None
    for raw in text.splitlines():
        if not _is_gpu_oom(raw):
            continue
        if "Tried to allocate" in raw:
            return raw.strip()
        if first is None:
            first = raw.strip()
    return first


def _error_line(text: str) -> str | None:
    """The last line that looks like the error: a Python exception line, else an error word,
    else the last line the job wrote (``SystemExit("no such file: data.csv")`` says it so)."""
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines()]
    for line in reversed(lines):
        if _PY_EXCEPTION.match(line):
            return _clip(line)
    for line in reversed(lines):
        if _ERRORISH.search(line):
            return _clip(line)
    return next((_clip(line) for line in reversed(lines) if line), None)


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def classify(
    returncode: int,
    log_tail: str,
    *,
    cancelled: bool = False,
    oom_kills: int = 0,
    kernel_oom: bool | str | None = False,
    oom_where: str | None = None,
) -> Ending:
    """Classify an attempt from its return code (negative: killed by that signal) and log tail.

    ``oom_kills``: how many processes the OOM killer killed in the job's cgroup while it ran
    (see :func:`oom_kill_count`; pass the difference from before the start if the cgroup is
    shared). ``kernel_oom``: whether the kernel logged killing the job's process; the line from
    :func:`kernel_oom_killed` may be passed as is and then becomes the Ending's ``line``.
    ``oom_where``: which counter ``oom_kills`` comes from
    (:class:`~tandem.place.run.supervisor.cgroups.OomWatch`), said in the cause.
    """
    exit_code = returncode if returncode >= 0 else None
    sig = signal_name(-returncode) if returncode < 0 else None

    def ending(kind: str, cause: str, line: str | None) -> Ending:
        return Ending(kind, _STATES.get(kind, "failed"), exit_code, sig, cause, line)

    if cancelled:
        return ending("cancelled", "cancelled", None)
    if returncode == 0:
        return ending("ok", "succeeded", None)
    oom_line = find_gpu_oom(log_tail)
    if oom_line is not None:
        return ending("gpu_oom", "GPU out of memory", _clip(oom_line))
    killed = returncode == -signal.SIGKILL or returncode == 128 + signal.SIGKILL  # 137: via a shell
    if killed and (oom_kills > 0 or kernel_oom):
        counter = f"oom_kill {oom_where}" if oom_where else "oom_kill"
        cause = "host out of memory (" + (counter if oom_kills > 0 else "kernel OOM killer") + ")"
        return ending("host_oom", cause, _clip(kernel_oom) if isinstance(kernel_oom, str) else None)
    if returncode < 0:
        return ending("signal", f"killed by {sig}", _error_line(log_tail))
    if returncode == 127:
        return ending("not_found", "command not found (exit 127)", _error_line(log_tail))
    cause = f"exit {returncode}"
    if 128 < returncode < 128 + 65 and not signal_name(returncode - 128).startswith("signal "):
        # A shell reports a child killed by signal N as 128+N; say which, without claiming it.
        cause += f" (128+{signal_name(returncode - 128)})"
    return ending("exit", cause, _error_line(log_tail))


def read_tail(path: Path, max_bytes: int = 64 * 1024) -> str:
    """The last ``max_bytes`` of a log file as text ("" if it is missing or unreadable).

    When the file is longer, the cut-off first line is dropped (if a newline follows it), so
    every returned line is whole and no half character is decoded.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(max_bytes)
    except OSError:
        return ""
    if start > 0:
        newline = data.find(b"\n")
        if newline >= 0:
            data = data[newline + 1 :]
    return data.decode("utf-8", errors="replace")


def _cgroup2_mount() -> tuple[Path, str]:
    """Where the cgroup v2 hierarchy is mounted and which cgroup is its root (from mountinfo)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return _CGROUP_ROOT, "/"
    for entry in text.splitlines():
        left, sep, right = entry.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            mount_point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            return Path(mount_point), fields[3]
    return _CGROUP_ROOT, "/"


def cgroup_dir(pid: int) -> Path | None:
    """The cgroup v2 directory of a live process, or None (no such process, cgroup v1 only).

    Read it while the process lives: ``/proc/PID`` is gone once it has been reaped.
    """
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for entry in text.splitlines():
        if entry.startswith("0::"):
            mount, root = _cgroup2_mount()
            path = entry[3:].removesuffix(" (deleted)")
            if root != "/" and (path == root or path.startswith(root + "/")):
                path = path[len(root) :]
            found = mount / path.lstrip("/")
            return found if found.is_dir() else None
    return None


def oom_kill_count(pid_or_cgroup: int | Path) -> int | None:
    """The ``oom_kill`` count of a cgroup v2 (of a live pid's cgroup, or a cgroup directory).

    The count covers the cgroup and its descendants since the cgroup was made: for a cgroup that
    is not the job's own, compare with the count taken at the job's start. None when it cannot be
    read (cgroup v1, no memory controller there, a kernel older than 4.13).
    """
    directory = cgroup_dir(pid_or_cgroup) if isinstance(pid_or_cgroup, int) else Path(pid_or_cgroup)
    if directory is None:
        return None
    try:
        text = (directory / "memory.events").read_text()
    except OSError:
        return None
    for entry in text.splitlines():
        key, _, value = entry.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _kill_line(record: str, pid: int) -> str | None:
    """The message of one /dev/kmsg record if it is the OOM killer killing ``pid``."""
    _, sep, message = record.partition(";")
    if not sep:
        return None
    message = message.split("\n", 1)[0]  # continuation lines (" SUBSYSTEM=...") follow
    found = _KILLED_PROCESS.search(message)
    if found is None or int(found.group(1)) != pid:
        return None
    return message.strip()


def _record_time(record: str) -> float | None:
    """A /dev/kmsg record's timestamp in seconds since boot ("prio,seq,usec,flags;...")."""
    fields = record.split(";", 1)[0].split(",")
    try:
        return int(fields[2]) / 1e6
    except (IndexError, ValueError):
        return None


def kernel_oom_killed(pid: int, *, since: float | None = None) -> str | None:
    """The kernel's "Killed process PID (...)" line from /dev/kmsg, or None.

    ``since``: a ``time.monotonic()`` from before the process started; older records are
    skipped, so a reused pid does not match a kill from long ago (the kernel stamps records
    with its own clock, close to the monotonic one; a second of slack covers the difference).
    Reads without blocking up to the end of the ring buffer, at most a bounded number of
    records; None where /dev/kmsg cannot be read (``kernel.dmesg_restrict``, containers).
    Never raises.
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    found = None
    try:
        found = _scan_kmsg(fd, pid, since)
    except Exception:  # a diagnostic must never take the job manager down
        found = None
    finally:
        os.close(fd)
    return _clip(found) if found is not None else None


def _scan_kmsg(fd: int, pid: int, since: float | None) -> str | None:
    """The latest OOM-kill line for ``pid`` among the records readable now from ``fd``."""
    found = None
    for _ in range(_KMSG_MAX_RECORDS):
        try:
            data = os.read(fd, _KMSG_RECORD_BYTES)
        except BlockingIOError:
            break  # EAGAIN: the end of the buffer
        except OSError as e:
            if e.errno == errno.EPIPE:
                continue  # the record was overwritten while we read; the next one follows
            break
        if not data:
            break
        record = data.decode("utf-8", errors="replace")
        if since is not None:
            stamp = _record_time(record)
            if stamp is not None and stamp < since - 1.0:
                continue
        line = _kill_line(record, pid)
        if line is not None:
            found = line  # keep going: the latest kill is the one that matters
    return found
