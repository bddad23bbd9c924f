"""Benchmark: random reads from storage to the GPU, CPU-centric against GPU-centric.

Random reads of 4 KiB, 64 KiB, 1 MiB and 4 MiB (4 KiB-aligned offsets, uniformly over a set
of files) for a fixed time per block size, on ``threads`` threads each keeping one read in
flight (queue depth = threads), along each path available here:

``cpu-centric``           ``pread`` into a pinned host buffer, then a copy to the GPU on the
                          thread's stream, waited for (each read ends in GPU memory); the
                          copy and the wait are CUDA driver calls through ctypes
                          (:class:`DriverCopy`; ``run(copy="torch")`` uses torch's
                          ``copy_``). On a machine without CUDA: ``pread`` into host memory
                          only, labelled so.
``gpu-centric (cuFile)``  ``cuFileRead`` into a GPU buffer registered with cuFile: GPUDirect
                          Storage where nvidia-fs is loaded, cuFile's compatibility mode
                          where not (the label says which).
``pread only (reference)`` on a GPU machine: ``pread`` into host memory and nothing more,
                          what the storage gives with no copy to the GPU.

Reported per path and block size: GB/s (1e9 bytes), IOPS, CPU cores busy (this process's
CPU time over wall time: the reading threads, cuFile's own threads, the kernel work done
on their behalf) and CPU cores per GB/s, the comparison the research made between
CPU-centric I/O and SPDK, GPUDirect Storage and BaM. Interrupt handling and other
processes' work are not counted.

The file set should not be served from the page cache. Reads are opened with ``O_DIRECT``
(where the file system accepts it) and, when running as root, the page cache is dropped
(``/proc/sys/vm/drop_caches``) before each measurement; the output says which was used,
and whether the file set is larger than the machine's memory.

Modules: ``records`` (block sizes, cells, the file set's description), ``fileset`` (writing
it, keeping it out of the page cache), ``measure`` (the timed reads), ``driver`` (:func:`run`)
and ``report`` (the tables).
"""

from tandem.bench.io_bench.driver import run
from tandem.bench.io_bench.records import BLOCK_SIZES, CPU_PATH, GPU_PATH, HOST_PATH, parse_size

__all__ = ["BLOCK_SIZES", "CPU_PATH", "GPU_PATH", "HOST_PATH", "parse_size", "run"]
