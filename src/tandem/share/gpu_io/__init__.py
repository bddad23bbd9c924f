"""Storage to GPU: read samples' bytes from files into device memory (guarded: CPU-only safe).

A room of its own inside :mod:`tandem.share`: the io benchmark (``tandem bench io``) uses
it, and a producer may. ``_cufile`` holds the cuFile bindings and driver, ``reader`` the
:class:`GpuFileReader` and its host-side helpers; see ``reader`` for the paths it takes.
"""

from tandem.share.gpu_io._cufile import (
    ALIGN,
    BACKENDS,
    CuFileDriver,
    GpuIOError,
    ReadPastEnd,
    cufile_status,
    find_cufile_library,
    nvidia_fs_loaded,
)
from tandem.share.gpu_io.reader import (
    GpuFileReader,
    aligned_host_buffer,
    check_device,
    choose_backend,
    open_for_read,
    pread_into,
)

__all__ = [
    "ALIGN",
    "BACKENDS",
    "CuFileDriver",
    "GpuFileReader",
    "GpuIOError",
    "ReadPastEnd",
    "aligned_host_buffer",
    "check_device",
    "choose_backend",
    "cufile_status",
    "find_cufile_library",
    "nvidia_fs_loaded",
    "open_for_read",
    "pread_into",
]
