"""Samplers: small classes that each read one source of hardware figures.

Each follows the :class:`~tandem.watch.samplers.base.Sampler` protocol. The process-tree
sampler is the run's own (which processes are the run, their CPU and memory); the others
read from it (the run's pids, its CPU time) or from the host.
"""

from tandem.watch.samplers.base import Sampler
from tandem.watch.samplers.energy import CpuEnergySampler
from tandem.watch.samplers.host import HostSampler
from tandem.watch.samplers.nvml import NvmlSampler
from tandem.watch.samplers.process_tree import ProcessTreeSampler
from tandem.watch.samplers.share import ShareSampler

__all__ = ["CpuEnergySampler", "HostSampler", "NvmlSampler", "ProcessTreeSampler", "Sampler", "ShareSampler"]
