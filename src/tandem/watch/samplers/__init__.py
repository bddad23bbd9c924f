"""Samplers: small classes that each read one source of hardware figures.

Each has ``name``, ``available()`` (``(True, "")`` or ``(False, why)``: a sampler says
clearly when it cannot work on this machine instead of failing) and ``sample()``, which
returns metric names (under ``system/``, unit in the name) mapped to values.
"""

from tandem.watch.samplers.host import HostSampler
from tandem.watch.samplers.process_tree import ProcessTreeSampler

__all__ = ["HostSampler", "ProcessTreeSampler"]
