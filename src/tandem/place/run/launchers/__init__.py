"""tandem.place.run.launchers: the daemon's side of starting a job's supervisor, on this host
(:mod:`.launch`) or under a Ray actor on its node (:mod:`.ray_backend`, whose node agents
measure each node as :mod:`tandem.place.devices` measures this one).

It runs in the daemon's process and the actors it starts; it passes the supervisor its files
and reads its result, and decides nothing: where and when a job runs is the scheduler's.

Doors: tandem._safepath, tandem.place.decide, tandem.place.devices, tandem.place.model,
tandem.place.resources, tandem.place.run.supervisor.
"""
