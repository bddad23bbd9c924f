"""tandem.place.run: one job's processes, apart from the daemon that decides.

What it owns: the per-job supervisor (:mod:`.shim`, ``python -m tandem.place.run.shim``)
that outlives the daemon, starts the job, owns its process tree (:mod:`.proctrack`), meters
it and writes its result; the files the daemon and the supervisor pass each other
(:mod:`.files`); how an ending is classified (:mod:`.failures`); starting a supervisor
locally or under a Ray actor on its node (:mod:`.launch`, :mod:`.ray_backend`); MPS daemons per GPU
(:mod:`.mps`); and the MLflow helper that writes every job's metrics (:mod:`.tracking`).

What it may import: the manager's words (:mod:`tandem.place.model`), its wire protocol
(:mod:`tandem.place.protocol`, to wake the daemon), :mod:`tandem.watch` and
:mod:`tandem._ipc`. Never the daemon, its state or the simulator: a supervisor must run,
and end its job cleanly, with no daemon and no state file it can read.
"""
