"""tandem.place: a collocation-aware job manager for one server.

``tandem submit -- COMMAND`` queues a job; a daemon (started on first use) places jobs on
the server's cores, RAM and GPUs with a policy (:mod:`tandem.place.policies`), runs each
under a supervisor that outlives the daemon (:mod:`tandem.place.run.supervisor.shim`), classifies how it
ended (:mod:`tandem.place.run.supervisor.failures`) and retries out-of-memory endings with escalating
placements. State lives in SQLite (:mod:`tandem.place.state`).

Rooms, each with a docstring of what it owns and may import:

- ``tandem.place`` itself: the daemon and what it decides with. ``model`` (sizes, requests,
  states), ``policies``, ``scheduler`` and ``retry`` (pure: the same code runs in the daemon
  and the simulator), ``devices`` (capacity and measurements), ``records`` and ``state``
  (the one writer of the state file), ``protocol`` and ``client`` (the socket), ``daemon``,
  ``requests``, ``admission``, ``attempts``, ``producers`` and ``views``.
- :mod:`tandem.place.run`: one job's processes (the supervisor, process tracking, failure
  classification, launchers, MPS, the MLflow helper). It never imports the daemon or state.
- :mod:`tandem.place.sim`: traces, the simulator and replays. The live manager never
  imports it.
"""
