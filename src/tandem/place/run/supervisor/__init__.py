"""tandem.place.run.supervisor: one job's supervisor (:mod:`.shim`, ``python -m
tandem.place.run.supervisor.shim ATTEMPT_DIR``), a process of its own that outlives the daemon.

It starts the job, owns its process tree (:mod:`.proctrack`, :mod:`.cgroups`, :mod:`.weights`),
pumps its log (:mod:`.logpump`), fences it off when its node lost both the disk and the Ray
head (:mod:`.fence`), classifies how it ended (:mod:`.failures`), writes its result in the
files it and the daemon pass each other (:mod:`.files`) and tells the daemon over its socket
(:mod:`.telling`). It must run, and end its job cleanly, with no daemon and no state file it
can read: so it imports the manager's words and wire protocol, never the daemon, its state,
its client or its decisions.

Doors: tandem._ipc, tandem.dirs, tandem.place.model, tandem.place.protocol,
tandem.place.resources, tandem.watch.
"""
