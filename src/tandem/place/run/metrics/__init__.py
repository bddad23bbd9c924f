"""tandem.place.run.metrics: the MLflow helper that writes every job's run (its process:
:mod:`.tracking_helper`, ``python -m tandem.place.run.metrics.tracking_helper``), the daemon's
side that starts it and queues its work (:mod:`.tracking`), and how a run is ended when its
job ended without a word (:mod:`.tracking_ends`).

Doors: tandem._safepath, tandem.dirs, tandem.place.config, tandem.place.identity,
tandem.place.model, tandem.place.run.supervisor, tandem.watch.
"""
