"""tandem.place.run.services: what the manager keeps running beside its jobs: its own Ray
head in a session of its own (:mod:`.ray_head`) and an MPS control daemon per GPU
(:mod:`.mps`).

Doors: tandem._safepath, tandem.place.model, tandem.place.paths, tandem.place.run.launchers,
tandem.place.run.supervisor.
"""
