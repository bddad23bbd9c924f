"""Hardware use and energy of training runs, attributed to their own processes.

Two ways in: ``tandem run [OPTIONS] -- COMMAND...`` wraps a command (see
:mod:`tandem.watch.runner`); ``with tandem.watch.track(...) as run:`` tracks a script from
inside, with ``run.log_step(samples=...)`` for throughput (see :mod:`tandem.watch.tracker`).
Samplers (``samplers/``) read one source each; the recorder (``sinks/``) writes to MLflow
or plain files; ``summary`` folds a run into its summary; ``report`` draws runs over time.
"""

from tandem.watch.tracker import Run, track

__all__ = ["Run", "track"]
