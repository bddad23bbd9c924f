"""Python jobs started warm: forked from their supervisor, whose fork server has imported torch
and MLflow, rather than started as an interpreter that imports them again.

A sweep's trials each spent about 2.5 CPU-s importing torch and MLflow before their first
batch (issue 49: on 2 cores, nine trials' imports took longer than the loading they
shared); Ray Tune's workers import them once and run trial after trial. The supervisors'
fork server (:mod:`.forkserver`) imports :data:`WARM_MODULES` once (:func:`preimport`); a
supervisor forked from it starts a job whose command is ``python SCRIPT ARGS`` or ``python
-m MODULE ARGS`` by forking itself and running the script in the fork as the interpreter
would (:func:`start`): ``sys.argv``, ``sys.path[0]``, ``__main__``, its environment, working
directory, session, standard streams, signal handlers, logging and warnings as a fresh
interpreter has them, the thread counts of torch and the BLAS set from the job's
environment (:mod:`tandem.place.threads`), and at the end its non-daemon threads joined,
its ``atexit`` functions run and its output flushed.

A job runs warm only where a fresh interpreter would import the very same modules
(:func:`plan`): its ``python`` is this interpreter (the same executable in the same
folder: the same environment), the variables that change what it imports or how it starts
(``PYTHON*``, ``LD_*``, ``HOME``) are the fork server's, it runs as the supervisor's user, it
gives no interpreter option, and where its thread counts differ from those the libraries
were loaded with they can be set (``threadpoolctl`` for the BLAS). Anything else, and any
job where ``TANDEM_WARM=0`` is set, starts as before: ``exec`` of its command.
"""

from __future__ import annotations

import atexit
import builtins
import importlib.machinery
import importlib.util
import logging
import os
import re
import runpy
import shlex
import shutil
import signal
import sys
import threading
import traceback
import types
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tandem.place.model import THREAD_VARS

# What a warm job finds imported: what a PyTorch training script imports first, and what
# each trial under tandem imports (MLflow, and the SQL store its run is written to at its
# first log_metric: 0.7 CPU-s of SQLAlchemy and alembic; tandem's drop-in loader).
WARM_MODULES = ("torch", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "tandem.share")
# The variables that change what an interpreter imports, or how, or that the imported
# libraries read as they load (torch's flags and logs, OpenMP's and the BLAS's settings): a
# job whose values differ from the fork server's starts cold. The thread counts are set in
# the fork instead; CUDA's are read at CUDA's first use, which no import makes.
_SAME_PREFIXES = ("PYTHON", "LD_", "TORCH", "PYTORCH", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "LC_")
# (the locale sets the streams' encoding at start; TZ is read as time is imported; TMPDIR
# may be kept by tempfile)
_SAME_NAMES = ("HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR")
OFF = "TANDEM_WARM"  # "0" in the job's environment: it starts as an interpreter of its own

# Set by preimport, in the fork server; a supervisor started on its own has nothing warm.
_warm: tuple[str, ...] = ()
_stamps: dict[str, float] = {}  # each imported module's file -> its mtime then (an upgrade: cold)
_import_env: dict[str, str] = {}  # the variables that matter (_mattering), as imported with
_import_threads: dict[str, str | None] = {}  # the thread variables, as imported with
_warnings: list[object] = []


def preimport(modules: Sequence[str] = WARM_MODULES) -> tuple[str, ...]:
    """Import ``modules`` (those installed) in this process, whose forks then start warm;
    which were imported. Before it, nothing of the job's kind is imported: called first."""
    global _warm, _import_env, _import_threads, _warnings
    _warnings = list(warnings.filters)  # a fresh interpreter's, before any import adds some
    _import_env = _mattering(os.environ)
    _import_threads = {v: os.environ.get(v) for v in THREAD_VARS}
    done = []
    for name in modules:
        try:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                continue
            __import__(name)
        except Exception as exc:  # a broken install: its jobs import it (and fail) themselves
            print(f"tandem: not imported ahead of the jobs: {name}: {exc}", file=sys.stderr, flush=True)
            continue
        done.append(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # an import did: a fork can use no GPU
        print("tandem: CUDA was initialised by an import ahead: jobs start cold", file=sys.stderr, flush=True)
        done = []
    _warm = tuple(done)
    _stamps.clear()
    _stamps.update(_stamped(done))
    return _warm


def _stamped(names: Sequence[str]) -> dict[str, float]:
    """The mtime of each of ``names``' files, and of its package's folder (pip replaces
    files there on an upgrade)."""
    out: dict[str, float] = {}
    for name in names:
        file = getattr(sys.modules.get(name), "__file__", None)
        for path in (file, os.path.dirname(file) if file else None):
            if path:
                try:
                    out[path] = os.stat(path).st_mtime
                except OSError:
                    out[path] = -1.0
    return out


def _upgraded() -> bool:
    """Has a module imported ahead been changed on disk since (a ``pip install -U``)?"""
    for path, then in _stamps.items():
        try:
            if os.stat(path).st_mtime != then:
                return True
        except OSError:
            return True
    return False


# A job whose script imports one of these is worth importing ahead for (a sweep's trials):
# what the fork server pays once (seconds) is paid back from the second such job on.
_WORTH = re.compile(
    rb"^[ \t]*(?:import[ \t]+[\w., \t]*?\b|from[ \t]+)"  # import a, b as c, torch / from torch
    rb"(?:torch|mlflow|tandem|lightning|pytorch_lightning|transformers|timm|torchvision|accelerate)\b",
    re.MULTILINE,
)


def _python_args(command: Sequence[str]) -> tuple[list[str], bool] | None:
    """The arguments of a ``python ...`` command after the interpreter, and whether a ``-P``
    led them (taken off); None where its program is not a Python interpreter."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    args = list(command[1:])
    safe_path = args[:1] == ["-P"]  # nothing put before sys.path (tandem's own commands say it)
    return (args[1:] if safe_path else args), safe_path


def worth_warming(command: Sequence[str], cwd: str) -> bool:
    """Would this job run warm, and does its script import torch or what imports it (read,
    never imported: the first 256 KiB of its file)? Where so, the fork server imports
    :data:`WARM_MODULES` first; a ``python -c`` or a script of the standard library's alone
    is not worth seconds of imports."""
    parsed = _python_args(command)
    if parsed is None or not parsed[0]:
        return False
    args = parsed[0]
    if args[0] == "-m":
        name = args[1] if len(args) > 1 else ""
        if name.split(".")[0] == "tandem":
            return True  # a share's producer (tandem share serve-spec), tandem's own tools
        base = os.path.join(cwd, *name.split("."))
        candidates = [base + ".py", os.path.join(base, "__main__.py")]
    else:
        candidates = [os.path.join(cwd, args[0])]
    for path in candidates:
        if not os.path.isfile(path):  # a FIFO or a device is never read (nor waited for)
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                head = os.read(fd, 256 << 10)
            finally:
                os.close(fd)
        except OSError:
            continue
        if _WORTH.search(head):
            return True
    return False


def _mattering(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` whose values must be the fork server's for a warm start."""
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(_SAME_PREFIXES) or k in _SAME_NAMES) and k not in THREAD_VARS
    }


@dataclass(frozen=True)
class WarmStart:
    """How a job runs warm: its script (``module`` False) or module, its ``sys.argv``."""

    target: str
    module: bool
    argv: list[str]
    safe_path: bool = False  # ``-P``: no folder put first on ``sys.path``
    command: tuple[str, ...] = ()  # as submitted: what ps and top show for it


def plan(
    command: Sequence[str], env: Mapping[str, str], cwd: str, as_other_user: bool, in_cgroup: bool = True
) -> WarmStart | None:
    """How ``command`` runs warm in a fork of this process, or None: it starts cold (see
    the module's docstring for when). ``in_cgroup``: its processes are found by their
    cgroup (a fork's environment, as ``/proc`` shows it, is the fork server's: it carries
    no marker of its job)."""
    if not _warm or as_other_user or not in_cgroup or env.get(OFF) == "0" or len(command) < 2:
        return None
    # Relative entries were resolved in the fork server's folder (/), not the job's
    if any(not entry or not os.path.isabs(entry) for entry in env.get("PYTHONPATH", "/").split(os.pathsep)):
        return None
    if _upgraded():
        return None
    found = _interpreter(command[0], env, cwd)
    if found is None:
        return None
    if _mattering(env) != _import_env or not _threads_settable(env):
        return None
    parsed = _python_args(command)
    if parsed is None:
        return None
    args, safe_path = parsed
    if args and args[0] == "-m":
        if len(args) < 2 or not args[1] or args[1].startswith("-"):
            return None
        return WarmStart(args[1], True, args[1:], safe_path, tuple(command))
    script = args[0] if args else "-"
    path = os.path.abspath(os.path.join(cwd, script))
    if script.startswith("-") or not os.path.isfile(path) or zipfile.is_zipfile(path):
        return None  # an option, no such file, or an archive: as the interpreter would
    return WarmStart(path, False, args, safe_path, tuple(command))


def _interpreter(program: str, env: Mapping[str, str], cwd: str) -> str | None:
    """``program`` where it is this interpreter in this environment (the same file in the
    same folder: a venv's ``python`` is a link to its base's, its folder is what differs)."""
    name = os.path.basename(program)
    if not name.startswith("python"):
        return None
    where = env.get("PATH", "")
    path = os.path.join(cwd, program) if os.sep in program else shutil.which(program, path=where)
    if path is None:
        return None
    try:
        folder = os.path.dirname(os.path.abspath(path))
        same_folder = os.path.samefile(folder, os.path.dirname(sys.executable))
        same_file = os.path.samefile(os.path.realpath(path), os.path.realpath(sys.executable))
    except OSError:
        return None
    return path if same_folder and same_file else None


def _threads_settable(env: Mapping[str, str]) -> bool:
    """Can the fork have the thread counts ``env`` asks for? torch's can always be set; the
    BLAS's (loaded with the fork server's) only with ``threadpoolctl``, or where they agree."""
    if all(env.get(v) == _import_threads.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")):
        return True
    return "numpy" not in sys.modules or importlib.util.find_spec("threadpoolctl") is not None


class ForkedJob:
    """A job started by :func:`start`: what the supervisor asks of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            self.returncode = 255
            return
        except InterruptedError:
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def start(job: WarmStart, env: Mapping[str, str], cwd: str, output_fd: int) -> ForkedJob:
    """Fork, and run ``job`` in the fork, in a session of its own, writing to ``output_fd``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # what the supervisor said stays its own
        except (OSError, ValueError):
            pass
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _run(job, env, cwd, output_fd)
        except BaseException:  # before the script ran (its folder gone, say): said in its log
            traceback.print_exc()
        finally:
            os._exit(code)
    return ForkedJob(pid)


def _run(job: WarmStart, env: Mapping[str, str], cwd: str, output_fd: int) -> int:
    """In the fork: become the interpreter ``python SCRIPT`` would have started, run it."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    os.chdir(cwd)
    _retitle(job.command)  # before the environment changes: setproctitle finds its area by it
    os.environ.clear()
    os.environ.update(env)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _fresh_streams()
    _fresh_state()
    _fresh_randomness()
    _set_threads(env)
    before = set(sys.modules)
    sys.argv = list(job.argv)
    if not job.safe_path:
        sys.path.insert(0, os.getcwd() if job.module else os.path.dirname(os.path.realpath(job.target)))
    try:
        if job.module:
            _new_main(None)
            runpy._run_module_as_main(job.target, alter_argv=True)  # type: ignore[attr-defined]
        else:
            _run_script(job.target)
        code = 0
    except SystemExit as exc:  # as the interpreter ends on it
        code = exit_code(exc)
    except BaseException as exc:
        _print_exception(exc, job)
        code = -1 if isinstance(exc, KeyboardInterrupt) else 1
    return end_as_interpreter(code, before)


def _new_main(path: str | None) -> types.ModuleType:
    """A fresh ``__main__`` module, as the interpreter has one before it runs a program."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    if path is not None:
        main.__file__ = path
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)  # type: ignore[assignment]
    sys.modules["__main__"] = main
    return main


def _fresh_streams() -> None:
    """``sys.stdin`` anew on the fork's fd 0: the fork server's had read its next requests
    ahead (a script reading its standard input gets end of file, as a cold one does)."""
    old = sys.stdin
    encoding = getattr(old, "encoding", None) or "utf-8"
    errors = getattr(old, "errors", None) or "strict"
    sys.stdin = open(0, encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    sys.__stdin__ = sys.stdin  # type: ignore[misc]


def _run_script(path: str) -> None:
    """Run the script at ``path`` as ``__main__``, as the interpreter does (``runpy`` would
    put its absolute path in ``sys.argv[0]`` while it runs, not the path as given)."""
    with open(path, "rb") as f:
        source = f.read()
    main = _new_main(path)
    # dont_inherit: not this module's __future__ imports (annotations), which compile() would pass on
    exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)


def _retitle(command: Sequence[str]) -> None:
    """``ps``, ``top`` and the GPU tools show the job's command, not the fork server's
    (``setproctitle``, as Ray names its workers; tools that split the command line on NULs
    get the title as its first word, then empty ones)."""
    if not command:
        return
    try:
        import setproctitle
    except ImportError:  # installed with tandem; without it the fork server's line shows
        return
    setproctitle.setproctitle(shlex.join(command))
    setproctitle.setthreadtitle(os.path.basename(command[0])[:15])  # top's name: python


def _fresh_state() -> None:
    """What the supervisor set that a fresh interpreter does not have."""
    warnings.filters[:] = _warnings  # type: ignore[index]
    warnings._filters_mutated()  # type: ignore[attr-defined]
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)


def _fresh_randomness() -> None:
    """Generators seeded anew, as in a fresh interpreter: forks of one process would share
    torch's and NumPy's global state (every trial's model initialised alike). Python's
    ``random`` is seeded anew at a fork by itself; ``PYTHONHASHSEED``'s hash secret stays
    the fork server's (the order of a set of strings is the same in every warm job)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None:  # its authentication key, as a new interpreter makes one
        multiprocessing.current_process().authkey = os.urandom(32)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    loader = sys.modules.get("tandem.share.loader")
    if loader is not None:  # its "seeded by the user?" compares with the seed at the start
        loader.process_started()


def _set_threads(env: Mapping[str, str]) -> None:
    """torch's and the BLAS's thread counts as the job's environment sets them."""
    want = _count(env.get("OMP_NUM_THREADS")) or _count(env.get("MKL_NUM_THREADS"))
    torch = sys.modules.get("torch")
    if torch is not None and want:
        torch.set_num_threads(want)
    blas = _count(env.get("OPENBLAS_NUM_THREADS")) or _count(env.get("OMP_NUM_THREADS"))
    if blas and "numpy" in sys.modules and importlib.util.find_spec("threadpoolctl") is not None:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        threadpool_limits(limits=blas, user_api="blas")


def _count(value: str | None) -> int | None:
    try:
        n = int(value or "")
    except ValueError:
        return None
    return n if n > 0 else None


def exit_code(exc: SystemExit) -> int:
    """The exit status of a program ended by ``exc``, as the interpreter makes it: its code,
    or its message said on stderr and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:
        print(exc.code, file=sys.stderr)
    except (OSError, ValueError):
        pass
    return 1


def _print_exception(exc: BaseException, job: WarmStart) -> None:
    """The traceback a fresh interpreter prints: from the job's own first frame on (none
    for a script that does not compile)."""
    if isinstance(exc, SyntaxError) and exc.filename == job.target:
        exc = exc.with_traceback(None)
        sys.excepthook(type(exc), exc, None)
        return
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") != "__main__":
        tb = tb.tb_next
    exc = exc.with_traceback(tb or exc.__traceback__)
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException:
        traceback.print_exception(type(exc), exc, tb)


def end_as_interpreter(code: int, since: set[str] | None = None) -> int:
    """End as the interpreter does (the caller then calls ``os._exit`` with the code returned):
    its threads joined, ``atexit`` run, its output flushed. With ``since`` (the modules
    there were before the program ran), the program's own modules and ``__main__`` are
    emptied and collected, so that what they held is finalised as at an interpreter's end
    (a file never closed is written out), and the C library's streams flushed; the modules
    imported ahead are left to the kernel, as a supervisor leaves all of its (taking them
    apart is most of an interpreter's end). ``-1``: ended by Ctrl-C, as the interpreter
    is, by the signal."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        pass
    atexit._run_exitfuncs()
    if since is not None:
        _finalise(since)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as the interpreter exits where it cannot flush
    if since is not None:
        _flush_c_streams()
    if code == -1:  # ended by Ctrl-C: as the interpreter does, by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    return code


def _finalise(since: set[str]) -> None:
    """The program's objects finalised: ``__main__``'s and its own modules' names dropped
    (their open files closed and written, ``__del__`` run), then a collection."""
    import gc

    mine = [m for n, m in list(sys.modules.items()) if n == "__main__" or n not in since]
    for module in mine:
        try:
            names = module.__dict__
            for key in [k for k in names if not (k.startswith("__") and k.endswith("__"))]:
                names.pop(key, None)
        except BaseException:  # a module's __del__ that raises: as at an interpreter's end, on
            continue
    try:
        gc.collect()
    except BaseException:
        pass


def _flush_c_streams() -> None:
    """What a C extension printed (``printf``, ``std::cout`` through stdio) and has not
    flushed: written, as ``exit`` does (``os._exit`` does not)."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
