"""The drop-in: ``from tandem.share import DataLoader`` in place of torch's, nothing else changed.

Every process on this host that builds the same loader (the same dataset and transforms,
collate and worker-init functions and order options: a fingerprint of what a
``DataLoader`` would send its workers) reads one producer: the first to iterate starts it
(:mod:`tandem.share._autoserve`, a process of the user's own that ends once its last reader
has been gone for a minute, ``$TANDEM_SHARE_LINGER_S``), the others attach, each with its
own batch size. Every epoch of every reader is every item exactly once (the producer's
order; late readers wrap around).

Under tandem's job manager (``tandem submit``, no ``--share``), the producer is a job of
its daemon's instead, reserved and recorded as a ``--share`` producer is: the loader runs
the command the daemon gave its job (``$TANDEM_SHARE_STARTER``: ``tandem share auto``), and
the daemon binds the job's waiting sweep to that share, so that they start together and
read it. Under ``--share NAME`` every drop-in loader of the job reads ``NAME``.

It *is* a ``torch.utils.data.DataLoader`` (``isinstance`` holds: Lightning takes it, and
rebuilds it with its ``DistributedSampler`` under DDP; Accelerate's ``prepare``, and so the
Hugging Face ``Trainer``, build a loader of their own class from it: ``shared`` of that one
reads a producer again), built from the same arguments: ``len``, ``dataset``,
``batch_size``, ``sampler`` (and its ``set_epoch``) are torch's own. A ``DistributedSampler``
(Lightning's injection, a hand-made one) maps to the consumer's rank and world size. What a
producer cannot reproduce (a sampler or batch sampler of the user's, a dataset that does not
pickle) falls back to torch's loader with one warning that says why; ``share=False`` asks
for that. ``loader.last_indices``: the dataset indices of the last batch.

:func:`~tandem.share.library_loaders.shared` does the same for a loader a library built
(timm's ``create_loader``, Accelerate's ``prepare``, the Hugging Face ``Trainer``'s):
``shared(loader)`` returns a drop-in with its options.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils.data as tud

from tandem.share._autoserve import LINGER_S, AutoSpec
from tandem.share._identity import anchor_indices, code_digest, item_digests, probe_indices
from tandem.share._pickled import NotPicklable, pickled
from tandem.share._registry import _is_live, lock_path, runtime_dir
from tandem.share.errors import ReaderSetAside, ShareError
from tandem.share.spec import THIS_PYTHON

log = logging.getLogger("tandem.share")
START_TIMEOUT_S = 300.0  # for the producer to claim its name (it imports torch and the dataset)
FIT_EVERY_S = 5.0  # a reader's threads are fitted to its producer's readers this often
AUTO_PREFIX = "auto-"  # a drop-in loader's share: auto-<its fingerprint>


class NotShared(Exception):
    """Why a loader reads privately (said once, as a warning)."""


@dataclass(frozen=True)
class _Plan:
    """How a loader reads from a producer: its name, what to start it with (None: one the
    job manager runs for this job already), and how (``starter``: the job manager's command
    that has its daemon run it; None: a process of the user's own). ``bound``: the job
    manager serves ``spec`` to this job already (``spec`` is kept for a producer of its own,
    should the one it serves load other items)."""

    name: str
    spec: AutoSpec | None
    rank: int | None
    world_size: int | None
    starter: list[str] | None = None
    bound: bool = False  # the manager runs this plan's producer for this job already


class DataLoader(tud.DataLoader):
    """``torch.utils.data.DataLoader``'s arguments, and ``share`` (default True: read from
    the host's one producer of this data; False: torch's own loading). See the module."""

    def __init__(
        self, dataset: Any, *args: Any, share: bool = True, device: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.share = share
        # Where each batch is moved (None: left where it is): an Accelerate-prepared loader's
        # device, which shared() keeps, as its DataLoaderShard moved its batches there.
        self.device = device
        self.last_indices: Any = None
        self._plan: _Plan | None | bool = None  # False: private (said once, if not asked for)
        self._consumer: Any = None
        self._threads: _ThreadFit | _NoFit | None = None

    # Accelerate's prepare reads every option of a loader to build one of its own class,
    # which reads with torch's loading: said once, by the one option only such a rebuild
    # reads outside torch (Lightning's rebuild is of this class, and shares).
    @property
    def pin_memory_device(self) -> str:
        reader = sys._getframe(1).f_globals.get("__name__", "")
        if reader.startswith("accelerate.") and self.share and not getattr(self, "_rebuild_said", False):
            self._rebuild_said = True
            warnings.warn(
                "Accelerate's prepare builds a loader of its own class from this "
                "tandem.share.DataLoader, which reads with torch's own loading, not from the "
                "shared producer: pass the prepared loader through tandem.share.shared(loader) "
                "to share it (docs/howto/accelerate.md)",
                stacklevel=2,
            )
        return self._pin_memory_device

    @pin_memory_device.setter
    def pin_memory_device(self, value: str) -> None:
        self._pin_memory_device = value

    # --- what torch's loader has and a consumer adds ------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        plan = self._planned()
        batches = super().__iter__() if plan is None else self._shared_epoch(plan)
        return batches if self.device is None else _moved(batches, self.device)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader's reading is (a consumer's state; {} before it reads)."""
        return self._consumer.state_dict() if self._consumer is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self._consumer_for(self._require_plan()).load_state_dict(state)

    def close(self) -> None:
        """Detach from the producer now (it goes on serving the others)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # --- sharing ---------------------------------------------------------------------------------

    def _planned(self) -> _Plan | None:
        if self._plan is None and not self.share:
            self._plan = False  # asked for: nothing to say
        if self._plan is None:
            try:
                self._plan = _plan(self)
            except NotShared as why:
                self._plan = False
                warnings.warn(
                    f"tandem.share.DataLoader reads privately (torch's own loading), not from a "
                    f"shared producer: {why}",
                    stacklevel=3,
                )
        return self._plan if isinstance(self._plan, _Plan) else None

    def _require_plan(self) -> _Plan:
        plan = self._planned()
        if plan is None:
            raise ShareError("this loader reads privately (see the warning): it has no shared state")
        return plan

    def _consumer_for(self, plan: _Plan) -> Any:
        if self._consumer is None:
            from tandem.share.consumer import Consumer

            if plan.spec is not None:
                plan = self._plan = self._served(plan)
            self._consumer = Consumer(
                plan.name,
                batch_size=self.batch_size,
                drop_last=self.drop_last,
                rank=plan.rank,
                world_size=plan.world_size,
                group=_sampler_group(plan),
                timeout=START_TIMEOUT_S,
            )
            self._consumer.warn_kept = False  # torch's batches are theirs to keep: so are these
        return self._consumer

    def _served(self, plan: _Plan) -> _Plan:
        """Have a producer serve ``plan`` (found, else started), and check that it serves
        the items this loader loads itself (see :mod:`tandem.share._identity`); where it
        does not, the plan of a producer of this loader's own, served too."""
        assert plan.spec is not None
        _serve(plan)
        differs = _items_differ(self.dataset, plan.name)
        if differs is None:
            return plan
        why, digests = differs
        own = _own(plan, digests)
        warnings.warn(
            f"tandem.share.DataLoader: the producer found for this loader's data ({plan.name}) "
            f"serves other items than this process loads ({why}: its code or what it reads "
            f"changed); reading a producer of its own ({own.name})",
            stacklevel=4,
        )
        _serve(own)
        return own

    def _shared_epoch(self, plan: _Plan) -> Iterator[Any]:
        consumer = self._consumer_for(plan)
        if self._threads is None:
            self._threads = _ThreadFit.unless_given()
        fitted = self._threads.fit(plan.name)
        batches = iter(consumer)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except ReaderSetAside as why:
                # Paused past the producer's patience (a debugger, a stopped process): the
                # others went on. The rest of this epoch, exactly, from a new reader.
                if consumer.world_size > 1:
                    raise  # a group's state is taken by all its ranks together
                state = consumer.state_dict()
                self.close()
                if state["epoch_done"]:
                    return
                log.warning("tandem.share.DataLoader: %s; continuing its epoch on a new reader", why)
                consumer = self._consumer_for(self._require_plan())
                consumer.load_state_dict(state)
                batches = iter(consumer)
                continue
            self.last_indices = consumer.last_indices
            if time.monotonic() - fitted >= FIT_EVERY_S:
                fitted = self._threads.fit(plan.name)
            yield batch


class _ThreadFit:
    """A reader's torch compute threads, fitted to the readers of its producer: the host's
    cores shared among them (at least one each; never more than it had). Loading is the
    producer's, so what a reader computes is its training alone; three readers of torch's
    default two threads on 2 cores spent their CPU in idle threads spinning (0.84x the CPU of
    private loaders, against 0.63x with one thread each). Set again at each epoch's start
    and every ``FIT_EVERY_S`` (readers come and go). Not where the user chose: OMP or MKL
    threads in the environment (the job manager sets them for its jobs), or
    ``TANDEM_SHARE_FIT_THREADS=0``."""

    def __init__(self, most: int) -> None:
        self.most = most

    @staticmethod
    def unless_given() -> _ThreadFit | _NoFit:
        if os.environ.get("TANDEM_SHARE_FIT_THREADS") == "0":
            return _NoFit()
        if any(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
            return _NoFit()
        import torch

        return _ThreadFit(torch.get_num_threads())

    def fit(self, name: str) -> float:
        """Fit to ``name``'s readers now; when (monotonic)."""
        import torch

        from tandem.share._registry import socket_path
        from tandem.share.stats import query

        try:
            readers = len(query(str(socket_path(name)), timeout=1.0).consumers)
        except (OSError, EOFError, TimeoutError, ValueError, ShareError):
            return time.monotonic()  # between producers (it is starting, or gone): next time
        want = max(1, min(self.most, len(os.sched_getaffinity(0)) // max(1, readers)))
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)
        return time.monotonic()


class _NoFit:
    def fit(self, name: str) -> float:
        return float("inf")


def _moved(batches: Iterator[Any], device: Any) -> Iterator[Any]:
    """``batches`` with their tensors on ``device`` (copied before the next batch is read:
    a shared batch's memory goes back to the producer two batches on)."""
    from tandem.share._tree import flatten, unflatten
    from tandem.share.errors import UnsupportedBatch

    for batch in batches:
        try:
            spec, leaves = flatten(batch)
        except UnsupportedBatch:  # a private loader's batch of its own kind: its own .to, if any
            yield batch.to(device) if hasattr(batch, "to") else batch
            continue
        yield unflatten(spec, [leaf.to(device) for leaf in leaves])


# --- the plan: what would be sent to a worker, and in which order -----------------------------


LAUNCHERS = ("TANDEM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT")


def _sampler_group(plan: _Plan) -> str | None:
    """The group of a ``DistributedSampler(num_replicas=W, rank=r)`` made by hand outside a
    launcher (as torch's loader reads it, without one): the processes reading this data as
    ``W`` ranks are one group. Under a launcher (or one rank), the consumer's own key."""
    if plan.world_size is None or plan.world_size < 2 or any(os.environ.get(v) for v in LAUNCHERS):
        return None
    return f"sampler:{plan.name}:{plan.world_size}"


def _serve(plan: _Plan) -> None:
    assert plan.spec is not None
    if plan.bound:  # its producer is the manager's to start: wait for it to serve
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _live(plan.name) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif plan.starter is not None:
        ask_manager(plan.spec, plan.starter)
    else:
        start_producer(plan.spec)


def _own(plan: _Plan, digests: list[str]) -> _Plan:
    """``plan`` for a producer of this process's items: named by them too, so that the
    readers that load alike share it."""
    assert plan.spec is not None
    digest = hashlib.sha256(repr((plan.name, digests)).encode()).hexdigest()[:16]
    spec = dataclasses.replace(plan.spec, name=f"{AUTO_PREFIX}{digest}")
    if plan.bound and plan.starter is None:
        raise ShareError(
            f"the producer the job manager serves this job ({plan.name}) loads other items than "
            "this job does, and this manager starts no producer for it: submit with --share NAME"
        )
    return dataclasses.replace(plan, name=spec.name, spec=spec, bound=False)


def _items_differ(dataset: Any, name: str) -> tuple[str, list[str]] | None:
    """Whether producer ``name`` serves other items than ``dataset`` loads here: (what
    differs, this process's digests of its anchor items), or None (the same, or nothing to compare: an
    iterable dataset, one whose items are random even when seeded, an older producer)."""
    from tandem.share._registry import socket_path
    from tandem.share.stats import query_items

    if isinstance(dataset, tud.IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    try:
        indices = probe_indices(len(dataset))
        mine = item_digests(dataset, indices)
        if not indices or item_digests(dataset, indices[:1]) != mine[:1]:
            log.debug("loader of %s: its items differ from one load to the next; not compared", name)
            return None
    except Exception as exc:  # noqa: BLE001 - the user's dataset: torch's own loader would say it
        log.debug("loader of %s: items not compared (%s: %s)", name, type(exc).__name__, exc)
        return None
    try:
        theirs = query_items(str(socket_path(name)), indices, timeout=START_TIMEOUT_S)
    except (OSError, EOFError, TimeoutError, ShareError) as exc:
        log.debug("loader of %s: its producer did not say its items (%s)", name, exc)
        return None
    if theirs is None or theirs == mine:
        return None
    index = next(i for i, a, b in zip(indices, mine, theirs, strict=True) if a != b)
    anchors = set(anchor_indices(len(dataset)))
    return f"item {index} differs", [d for i, d in zip(indices, mine, strict=True) if i in anchors]


def _order(loader: DataLoader) -> tuple[bool, int, int | None, int | None]:
    """``(shuffle, seed, rank, world size)`` from the loader's sampler, or :class:`NotShared`."""
    if loader.batch_size is None:
        raise NotShared("it has a batch_sampler of its own, which a producer cannot reproduce")
    sampler = loader.sampler
    if isinstance(sampler, tud.SequentialSampler):
        return False, 0, None, None
    if isinstance(sampler, tud.RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            raise NotShared("its RandomSampler draws with replacement or a num_samples of its own")
        return True, _random_seed(sampler.generator), None, None
    if isinstance(sampler, tud.DistributedSampler):
        return bool(sampler.shuffle), int(sampler.seed), int(sampler.rank), int(sampler.num_replicas)
    if isinstance(loader.dataset, tud.IterableDataset):  # its passes are its epochs, in its order
        return False, 0, None, None
    raise NotShared(f"its sampler ({type(sampler).__name__}) is its own, which a producer cannot reproduce")


# torch seeds its default generator at random in each process (a 64-bit number) unless the
# script calls torch.manual_seed: a seed set since this import, or one of 32 bits, is the
# user's (an unseeded process's random seed is one with a chance of 2**-32).
_SEED_AT_IMPORT = torch.initial_seed()


def process_started() -> None:
    """Told by a process forked to run a program of its own, its random generators seeded
    anew (the job manager's warm start, :mod:`tandem.place.run.supervisor.warm`): torch's
    seed now is the one its program starts with, not the user's."""
    global _SEED_AT_IMPORT
    _SEED_AT_IMPORT = torch.initial_seed()


_GENERATOR_DEFAULT_SEED = torch.Generator().initial_seed()  # torch.Generator() not seeded: a constant


def _random_seed(generator: torch.Generator | None) -> int:
    """The order's seed, as torch's loader draws its order: from the loader's ``generator=``,
    else from ``torch.manual_seed``'s; 0 in a process that seeded neither (so that
    unseeded processes of a sweep share one order). A generator seeded at random (64 bits:
    Accelerate seeds its sampler's from the global generator's draws) counts as unseeded."""
    if generator is not None:
        given = int(generator.initial_seed())
        if given < 2**32 or given == _GENERATOR_DEFAULT_SEED:
            return given
        return 0
    seed = torch.initial_seed()
    if seed != _SEED_AT_IMPORT or seed < 2**32:
        return int(seed) % 2**63
    return 0


def _plan(loader: DataLoader) -> _Plan:
    shuffle, seed, rank, world = _order(loader)
    given = os.environ.get("TANDEM_SHARE")
    if given and not given.startswith(AUTO_PREFIX):  # a job of `tandem submit --share NAME`
        return _Plan(given, None, rank, world)
    spec = _spec(loader, shuffle, seed)
    if given == spec.name:  # the manager's producer of this data feeds this job's sweep
        return _Plan(spec.name, spec, rank, world, _starter(), bound=True)
    if os.environ.get("TANDEM_JOB_ID"):
        starter = _starter()
        if starter is None:
            raise NotShared(
                "this job's manager does not run producers for drop-in loaders (a job on another "
                "host of a Ray cluster, or an older daemon): submit with --share NAME to share"
            )
        return _Plan(spec.name, spec, rank, world, starter)
    return _Plan(spec.name, spec, rank, world)


def _starter() -> list[str] | None:
    """The job manager's command to have its daemon serve a loader's spec
    (``$TANDEM_SHARE_STARTER``, a JSON list), or None."""
    given = os.environ.get("TANDEM_SHARE_STARTER")
    if not given:
        return None
    try:
        argv = json.loads(given)
    except ValueError:
        argv = None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ShareError(f"TANDEM_SHARE_STARTER must be a JSON list of strings (a command), not {given!r}")
    return argv


def _spec(loader: DataLoader, shuffle: bool, seed: int) -> AutoSpec:
    """What a producer of ``loader``'s data is started with, named by its fingerprint."""
    collate = loader.collate_fn if loader.collate_fn is not tud.default_collate else None
    modules: set[str] = set()
    try:
        payload = pickled((loader.dataset, collate, loader.worker_init_fn), modules)
    except NotPicklable as why:
        raise NotShared(str(why)) from None
    digest = hashlib.sha256(payload)
    # The user's own modules that the objects come from, by content: a class pickled by
    # reference is only its module's and its own name (see tandem.share._identity).
    digest.update(code_digest(modules).encode())
    digest.update(repr((shuffle, seed)).encode())
    # Its user's: under the host's system manager two users' loaders of the same data are two
    # shares (each producer runs as its user and serves their jobs), never one name for both.
    digest.update(f"uid {os.getuid()}".encode())
    name = f"{AUTO_PREFIX}{digest.hexdigest()[:16]}"
    workers: int | str = loader.num_workers or "auto"
    # What the reader imports by name (its dataset's module beside the script, run from
    # another directory: sys.path[0]) the producer finds where the reader found it.
    paths = tuple(p for p in sys.path if p and os.path.isdir(p))
    return AutoSpec(
        name, payload, loader.batch_size or 1, shuffle, seed, workers, _linger_s(), sys.executable, paths
    )


def _linger_s() -> float:
    """How long a producer this loader starts waits for a reader: ``$TANDEM_SHARE_LINGER_S``
    (seconds), else a minute."""
    given = os.environ.get("TANDEM_SHARE_LINGER_S")
    if given is None:
        return LINGER_S
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ShareError(f"TANDEM_SHARE_LINGER_S must be a number of seconds (0 or more), not {given!r}")
    return value


# --- the producer: found, else started ---------------------------------------------------------


def _live(name: str) -> bool:
    return _is_live(lock_path(name))


def start_producer(spec: AutoSpec) -> None:
    """Start the producer of ``spec`` unless one serves it: one process at a time decides
    (a file lock), and holds the decision until the one it started has claimed the name."""
    if _live(spec.name):
        return
    from filelock import FileLock

    folder = runtime_dir()
    # Not NAME.lock's suffix: the registry reads every *.lock there as a producer's.
    with FileLock(str(folder / f"{spec.name}.starting"), mode=0o600):
        if _live(spec.name):
            return
        spec_file = folder / f"{spec.name}.spec"
        spec.write(spec_file)
        log_file = spec_file.with_suffix(".log")
        # Its torch runs one compute thread (its loader workers do already): its main thread
        # only batches the items, and idle threads of a thread pool spin on the cores the
        # readers train on. The user's own setting wins.
        env = {**os.environ, **{v: os.environ.get(v, "1") for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
        # -P: the folder it starts in is not searched for modules (a `tandem/` planted there
        # would run as this user); the reader's own folders come with the spec, after its own.
        with log_file.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", "tandem.share._autoserve", str(spec_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # it outlives this process (the next reader attaches)
                cwd=os.getcwd(),
                env=env,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _live(spec.name):
            if process.poll() is not None:
                raise ShareError(
                    f"the producer this loader started ended (exit {process.returncode}): "
                    f"{_tail(log_file)} (its log: {log_file})"
                )
            if time.monotonic() > deadline:
                raise ShareError(f"the producer this loader started did not serve in {START_TIMEOUT_S:g} s")
            time.sleep(0.05)


def ask_manager(spec: AutoSpec, starter: list[str]) -> None:
    """Have the job manager serve ``spec`` from a producer job of its daemon's (``starter``:
    ``tandem share auto``, which returns once it serves, or fails with its producer's error).
    Asked even where the share is served already (a job of the same command started before
    its first reader asked, so not bound to it): the daemon then counts this job in the
    share's group, and its producer lives while the job reads."""
    spec_file = runtime_dir() / f"{spec.name}.managed.spec"  # the producer job reads it
    spec.write(spec_file)
    command = [sys.executable if part == THIS_PYTHON else part for part in starter]
    done = subprocess.run(
        [*command, str(spec_file)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).removeprefix("Error: ")
        raise ShareError(
            f"the job manager could not serve this loader's data: {said or f'exit {done.returncode}'}"
        )


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "no output"
