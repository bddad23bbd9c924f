"""Hardware use and energy of training runs, attributed to their own processes (issue 3).

Work in progress: so far the samplers (``tandem.watch.samplers``); the ``tandem run``
wrapper, the MLflow and file sinks, the summary and the report come next.
"""
