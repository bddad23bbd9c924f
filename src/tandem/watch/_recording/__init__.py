"""Internal: getting points from the tracker's sampling thread to a run store without
delaying the run.

- ``recorder``: :class:`Recorder`, a queue and a writer thread in front of a store, with
  the fall-back to a local file when the store fails;
- ``helper``: :class:`HelperRecorder`, the same calls served by a recorder in a
  low-priority helper process, so that MLflow's import and writes are not the run's;
- ``helper_main``: that helper process's entry point.
"""
