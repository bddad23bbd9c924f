"""A shared dataset as one typed record: what ``tandem share serve`` serves, what ``tandem
share define`` stores for the job manager, and how either builds and runs its producer.

:class:`ShareSpec` names every option once. The command line fills it (one option set for
``serve`` and ``define``), the job manager stores it as JSON and starts the producer with
``tandem share serve-spec SPEC.json`` (no command line rebuilt, no flags looked for),
and :meth:`ShareSpec.check` resolves the dataset or loader reference (import, and a call
with no arguments must be possible) so that a typo is refused where it is typed, not when
a producer dies in the background (``define`` reads a plain function's source rather than
importing its module: :mod:`tandem.share._locate`).

The producer's reservation under the job manager comes from here too
(:meth:`ShareSpec.producer_cpus`, :meth:`ShareSpec.loader_workers`): scaled to the cores
the manager hands out, always leaving room for a job beside it; the job manager writes the
loader worker count into the spec it starts the producer with.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import math
import os
import pkgutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from tandem.share._locate import confirmed

OBJECT_FORMS = "MODULE:FUNCTION or path/to/file.py:FUNCTION"
# "auto": what a drop-in loader (tandem.share.DataLoader) would send its workers, as the
# loader wrote it to the file ``ref`` (an AutoSpec); defined by the job manager, never typed.
SOURCES = ("dataset", "loader", "images", "auto")
# What the job manager tells a job of a public share (`share define --public`, under the
# host's system manager): where its producer listens, and whose it must be (the uid of the
# socket's peer): a consumer of another user's producer reads it as a guest (Consumer).
PUBLIC_SOCKET_ENV = "TANDEM_SHARE_SOCKET"
SHARE_OWNER_ENV = "TANDEM_SHARE_OWNER"
# In the command a job's drop-in loader runs to have the job manager serve its data
# ($TANDEM_SHARE_STARTER): the loader's own interpreter (the host's system manager's jobs run
# as their users, who may not run the manager's).
THIS_PYTHON = "{python}"
DTYPES = ("float32", "bfloat16", "float16")
MAX_AUTO_PRODUCER_CPUS = 8.0


class SpecError(ValueError):
    """A share's definition that cannot work, with what to change."""


def _load_file(path: Path, attr: str) -> Any:
    """``path/to/file.py:ATTR``: run the file as a module named after it, with its folder on
    the import path (as ``python path/to/file.py`` has), so that it can import its neighbours."""
    if not path.is_file():
        raise SpecError(f"no such file: {path}")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # so that pickle and dataclasses find its classes
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module: any error in it is theirs to see
        raise SpecError(f"cannot import {str(path)!r}: {type(exc).__name__}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SpecError(f"{path} has no attribute {attr!r}") from None


def load_object(ref: str) -> Any:
    """Resolve ``MODULE:ATTR`` (``pkgutil.resolve_name``; ATTR may be dotted) or
    ``path/to/file.py:ATTR``; :class:`SpecError` saying what is wrong otherwise."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(f"{ref!r} is not of the form {OBJECT_FORMS}")
    if module_name.endswith(".py") or "/" in module_name:
        return _load_file(Path(module_name), attr)
    # A console script's sys.path starts at its bin/ directory, not at the current one (as
    # ``python -m`` does): add it, as uvicorn and gunicorn do, so that a module of the
    # project one is in can be named.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return pkgutil.resolve_name(ref)
    except ImportError as exc:
        raise SpecError(f"cannot import {module_name!r}: {exc}") from None
    except AttributeError:
        raise SpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    except ValueError as exc:
        raise SpecError(f"{ref!r}: {exc}") from None
    except Exception as exc:  # an error while importing the user's module
        raise SpecError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None


@overload
def _absolute(ref: str) -> str: ...
@overload
def _absolute(ref: None) -> None: ...
def _absolute(ref: str | None) -> str | None:
    """A ``path/to/file.py:ATTR`` reference with its path made absolute (others as they are)."""
    if ref is None:
        return None
    module, sep, attr = ref.partition(":")
    if sep and (module.endswith(".py") or "/" in module):
        return f"{Path(module).resolve()}:{attr}"
    return ref


@dataclass(frozen=True)
class ShareSpec:
    """One shared dataset. ``source`` says what ``ref`` is: a ``dataset`` or ``loader``
    function (:data:`OBJECT_FORMS`), an ``images`` folder, or the file of an ``auto`` share
    (a drop-in loader's :class:`~tandem.share._autoserve.AutoSpec`). ``cpus``/``mem`` are what its
    producer reserves under the job manager (``cpus`` None: sized from the manager's cores)."""

    name: str
    source: str
    ref: str
    device: str | None = None  # where batches are kept; None: host memory (images: a GPU if any)
    crop: int = 224  # images: random-resized-crop size
    dtype: str = "float32"  # images: the images' dtype
    batch_size: int = 32
    shuffle: bool = False
    num_workers: int | None = None  # loader worker processes; None: auto
    worker_nice: int = 0
    seed: int = 0
    epochs: int | None = None  # None: serve until stopped
    window: int | None = None  # at most this many batches in flight (alone: this many)
    window_mem: int | None = None  # bytes the batches in flight may take (None: a share of free memory)
    policy: str = "wait"
    cpus: float | None = None
    mem: int = 0
    selection: str | None = None  # dataset or images: serve only this stored selection's items
    select: str | None = None  # dataset: "METHOD:BUDGET", a selection made (once) for this share
    select_model: str | None = None  # MODULE:FUNCTION returning the selection's proxy model
    select_job: int | None = None  # the job manager's job that makes it (the group's jobs wait for it)
    # The interpreter its producer runs under the job manager: the one that defined it (or
    # whose loader asked), which imports its dataset; None: the daemon's own.
    python: str | None = None
    # The job manager's: the jobs that will read it as its producer starts (it keeps its
    # stream's start for them: Producer.expect_consumers).
    readers: int | None = None
    # Other users' jobs may read it (`share define --public`; the host's system manager only),
    # from host memory, read-only; ``listen``: where its producer listens for them (the
    # manager's choice, set as it starts it).
    public: bool = False
    listen: str | None = None

    def __post_init__(self) -> None:
        from tandem.share._registry import validate_name

        try:
            validate_name(self.name)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if self.source not in SOURCES:
            raise SpecError(f"unknown source {self.source!r}: one of {', '.join(SOURCES)}")
        if self.dtype not in DTYPES:
            raise SpecError(f"unknown dtype {self.dtype!r}: one of {', '.join(DTYPES)}")
        if self.policy not in ("wait", "skip"):
            raise SpecError(f"unknown policy {self.policy!r}: wait or skip")
        if self.device is not None and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise SpecError(f"device {self.device!r}: use cpu, cuda or cuda:N")
        if self.public and self.source == "auto":
            raise SpecError("a drop-in loader's share is its user's own: it is never public")
        if self.public and self.device not in (None, "cpu"):
            raise SpecError(
                f"a public share keeps its batches in host memory (other users read them there): "
                f"leave out --device {self.device}"
            )
        # What --select's METHOD:BUDGET may say is tandem.select's to check (the command line
        # does, before defining); here only what the share itself must be.
        if self.select is not None and (self.source != "dataset" or self.selection is not None):
            raise SpecError("--select makes a selection of a --dataset; give --dataset, and not --selection")
        if self.selection is not None and self.source in ("loader", "auto"):
            raise SpecError("a selection picks items of a dataset: give --dataset or --images, not --loader")
        if self.window_mem is not None and self.window_mem < 1:
            raise SpecError(f"window-mem {self.window_mem!r}: the window's memory must be above 0 bytes")
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise SpecError(f"cpus {self.cpus!r}: the producer's cores must be above 0")

    # --- as stored ------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShareSpec:
        values = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def resolved(self) -> ShareSpec:
        """The same, with file paths absolute: the producer runs in another directory."""
        if self.source in ("images", "auto"):
            return dataclasses.replace(self, ref=str(Path(self.ref).resolve()))
        return dataclasses.replace(self, ref=_absolute(self.ref), select_model=_absolute(self.select_model))

    # --- checks ---------------------------------------------------------------------------

    def check(self, import_module: bool = True) -> None:
        """Resolve the reference as the producer will: the folder exists, or the function
        imports and can be called with no arguments. :class:`SpecError` otherwise.
        ``import_module=False`` (``share define``): a reference its module's source confirms
        (:mod:`tandem.share._locate`) is not imported here; its producer imports it."""
        if self.source == "images":
            if not Path(self.ref).is_dir():
                raise SpecError(f"--images {self.ref}: no such directory")
            return
        if self.source == "auto":
            if not Path(self.ref).is_file():
                raise SpecError(f"{self.ref}: no such file (the drop-in loader's spec)")
            return
        if not import_module and confirmed(self.ref):
            return
        fn = load_object(self.ref)
        if not callable(fn):
            raise SpecError(
                f"{self.ref} is a {type(fn).__name__}, not a function that returns the {self.source}"
            )
        try:
            inspect.signature(fn).bind()
        except TypeError as exc:
            raise SpecError(f"{self.ref} cannot be called with no arguments ({exc})") from None
        except ValueError:
            pass  # a builtin without a signature: it will be tried when served

    @property
    def slab_on_gpu(self) -> bool:
        """Whether its batches are kept in GPU memory (the producer then needs a GPU)."""
        if self.device is not None:
            return self.device.startswith("cuda")
        return self.source == "images"  # decoded on a GPU where there is one

    # --- what its producer reserves under the job manager ------------------------------------

    def producer_cpus(self, capacity_cpus: float) -> float:
        """Cores the producer reserves on a manager with ``capacity_cpus``: as defined, else
        its workers plus one, else a quarter of the cores (at least 1, at most 8), never so
        many that no job fits beside it (at least one core, or half a small machine, stays)."""
        if self.cpus is not None:
            return self.cpus
        if self.num_workers is not None:
            wanted = 1.0 + self.num_workers
        else:
            wanted = min(MAX_AUTO_PRODUCER_CPUS, max(1.0, capacity_cpus / 4))
        room = min(1.0, capacity_cpus / 2)
        return max(min(0.5, capacity_cpus / 2), min(wanted, capacity_cpus - room))

    def loader_workers(self, capacity_cpus: float) -> int:
        """Loader worker processes of its producer on a manager with ``capacity_cpus``: as
        defined (``--num-workers``); else, with ``--cpus``, those cores less one for the
        producer itself; else one per core of the manager, at most 8 (images: at least one,
        to read files beside the decode). The manager's cores are elastic: the producer's
        CPU weight (as much as the jobs it feeds together) settles who runs when every
        process wants a core, and workers that are a window ahead wait at no cost. Sized to
        its reserved core less one instead, an 8-trial sweep's producer on 2 cores decoded
        with one worker while the trials used a third of the other core."""
        if self.num_workers is not None:
            return self.num_workers
        from tandem.share._workers import MAX_AUTO_WORKERS, auto_workers

        if self.cpus is not None:
            workers = auto_workers(self.cpus)
        else:
            workers = max(1, min(MAX_AUTO_WORKERS, int(capacity_cpus)))
        return max(1, workers) if self.source == "images" else workers

    # --- the producer -----------------------------------------------------------------------

    def build_producer(self, selection: Any = None) -> Any:
        """The :class:`~tandem.share.Producer` this spec describes (not yet serving).
        ``selection``: the items it serves, as :meth:`Producer.from_dataset` takes them (the
        caller resolves the spec's ``selection`` id or ``select`` into them: share does not
        know how a selection is stored or made)."""
        if (self.selection is not None or self.select is not None) and selection is None:
            raise SpecError(f"share {self.name!r} serves a selection: build it with the selection's items")
        import torch

        from tandem.share.producer import Producer

        common: dict[str, Any] = {
            "window": self.window,
            "window_mem": self.window_mem,
            "policy": self.policy,
            "public": self.listen if self.public else None,
        }
        if self.source == "loader":
            return Producer(load_object(self.ref)(), self.name, device=self.device, **common)
        workers = self.num_workers  # the job manager writes its count (loader_workers) here
        if self.source in ("dataset", "auto"):
            collate_fn = worker_init_fn = None
            default_workers: int | str = "auto"
            if self.source == "auto":  # what a drop-in loader pickled (its order options are ours)
                from tandem.share._autoserve import AutoSpec

                auto = AutoSpec.read(Path(self.ref))
                dataset, collate_fn, worker_init_fn = auto.objects()
                default_workers = auto.num_workers
            else:
                dataset = load_object(self.ref)()
            return Producer.from_dataset(
                dataset,
                self.name,
                batch_size=self.batch_size,
                shuffle=self.shuffle,
                device=self.device,
                num_workers=default_workers if workers is None else workers,
                worker_nice=self.worker_nice,
                seed=self.seed,
                selection=selection,
                collate_fn=collate_fn,
                worker_init_fn=worker_init_fn,
                **common,
            )
        return Producer.from_files(
            self.ref,
            self.name,
            device=self.device or ("cuda" if torch.cuda.is_available() and not self.public else "cpu"),
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            crop=self.crop,
            dtype=getattr(torch, self.dtype),
            num_workers=2 if workers is None else workers,
            worker_nice=self.worker_nice,
            selection=selection,
            **common,
        )


def serve(spec: ShareSpec, say: Any = print, selection: Any = None) -> int:
    """Build the producer and serve until stopped or ``spec.epochs`` are done; the epochs served."""
    producer = spec.build_producer(selection)
    if spec.readers:
        producer.expect_consumers(spec.readers)
    with producer:  # claims the name (ProducerExists if it is live) before saying so
        say(f"serving {spec.name!r} (pid {os.getpid()}); Ctrl-C to stop")
        producer.serve(epochs=spec.epochs)
    say(f"{spec.name!r}: served {producer.epochs_served} epoch(s)")
    return producer.epochs_served
