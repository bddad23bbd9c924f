"""Samplers: small classes that each read one source of hardware figures.

Each has ``name``, ``available()`` (``(True, "")``, ``(True, note)`` when it works in a
reduced mode, or ``(False, why)``: a sampler says clearly when it cannot work on this
machine instead of failing), ``sample()``, which returns metric names (under ``system/``,
unit in the name) mapped to values, and optionally ``close()`` and ``tags()``.
"""

from tandem.watch.samplers.energy import CpuEnergySampler
from tandem.watch.samplers.host import HostSampler
from tandem.watch.samplers.nvml import NvmlSampler
from tandem.watch.samplers.process_tree import ProcessTreeSampler
from tandem.watch.samplers.share import ShareSampler

__all__ = ["CpuEnergySampler", "HostSampler", "NvmlSampler", "ProcessTreeSampler", "ShareSampler"]
