"""tandem.place.sim: traces, the simulator and replays, apart from the live manager.

What it owns: job traces (:mod:`.trace`: reading, writing, sampling), the modelled server
(:mod:`.simmodel`) and the simulator that runs the daemon's own scheduler and policies on it
(:mod:`.simulate`), the reports that compare policies (:mod:`.replay`), and the replay of a
trace through a real daemon (:mod:`.live_replay`). Only ``tandem daemon simulate|replay`` and the
place benchmark use it.

What it may import: the manager's words and pure decisions (:mod:`tandem.place.model`,
:mod:`~tandem.place.policies`, :mod:`~tandem.place.scheduler`, :mod:`~tandem.place.retry`)
and, for a live replay, the client, the state reader and the views. The live manager never
imports it.
"""
