"""tandem.place.run: the processes of a job and beside jobs, apart from the daemon that decides.

One subpackage a process, each with the doors it may import through (its ``Doors:``
paragraph, checked by ``tests/test_house.py``):

- :mod:`.supervisor`: the per-job supervisor (``python -m tandem.place.run.supervisor.shim``)
  that outlives the daemon, starts the job, owns its process tree, meters it and writes its
  result, and the files it and the daemon pass each other;
- :mod:`.launchers`: the daemon's side of starting a supervisor, locally or under a Ray
  actor on its node;
- :mod:`.metrics`: the MLflow helper that writes every job's metrics, and the daemon's side
  of it;
- :mod:`.services`: what the manager keeps running beside its jobs: its own Ray head, an MPS
  control daemon per GPU.

Doors: tandem.place.run.supervisor, tandem.place.run.launchers, tandem.place.run.metrics,
tandem.place.run.services.
"""
