"""Hardware use and energy of training runs, attributed to their own processes.

Public API: ``with tandem.watch.track(...) as run:`` tracks a script from inside, with
``run.log_step(samples=...)`` for throughput; :class:`Run` is the same without the
``with``. ``tandem run [OPTIONS] -- COMMAND...`` wraps a command (``runner``).

The layers, from what a user calls down to where a run is kept:

- ``tracker`` (``Run``, ``track``) and ``runner`` (``start``/``wait`` a tracked command;
  ``tandem run``): the sampling loop and the life cycle of a run;
- ``samplers/``: one source of figures each (process tree, host, GPUs, CPU energy,
  ``tandem.share``), behind the :class:`~tandem.watch.samplers.Sampler` protocol;
- ``_recording/`` (internal): gets points from the sampling thread to a store without
  delaying it, on a thread or in a low-priority helper process;
- ``stores/``: where a run is kept (MLflow, a plain directory), behind the
  :class:`~tandem.watch.stores.RunStore` protocol; ``point``: the record they all pass;
- ``report``: draws stored runs; ``_summary``: folds a run into its summary;
  ``_checks``: input checks, cheap to import.

``Run`` and ``track`` are imported on first use, so that ``tandem.watch.checks`` (the
command line's input checks) costs no heavy import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tandem.watch.tracker import Run, track

__all__ = ["Run", "track"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tandem.watch import tracker

        return getattr(tracker, name)
    raise AttributeError(f"module 'tandem.watch' has no attribute {name!r}")
