"""tandem.place: a collocation-aware job manager for one server.

``tandem submit -- COMMAND`` queues a job; a daemon (started on first use) places jobs on
the server's cores, RAM and GPUs with a policy (:mod:`tandem.place.policies`), runs each
under a supervisor that outlives the daemon (:mod:`tandem.place.shim`), classifies how it
ended (:mod:`tandem.place.failures`) and retries out-of-memory endings with escalating
placements. State lives in SQLite (:mod:`tandem.place.state`).

Layers, each its own module: ``model`` (sizes, requests, states), ``policies`` and
``scheduler`` (pure: the same code runs in the daemon and the simulator), ``devices``
(capacity and measurements), ``state``, ``shim``, ``failures``, ``mps``, ``protocol`` and
``client`` (the socket), ``daemon``, ``views`` and ``cli``.
"""
