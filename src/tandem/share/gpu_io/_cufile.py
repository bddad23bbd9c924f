"""cuFile (GPUDirect Storage) through ctypes, or ``cuda.bindings.cufile``: the library, its
driver, and the errors of storage-to-GPU reads. The structs and signatures follow NVIDIA's
``cufile.h`` as given in the GDS cuFile API reference: ``CUfileError_t {CUfileOpError err;
CUresult cu_err}`` (two ints, returned by value), ``CUfileDescr_t {CUfileFileHandleType
type; union {int fd; void *handle}; const CUfileFSOps_t *fs_ops}`` (24 bytes on x86-64),
``ssize_t cuFileRead(CUfileHandle_t, void *, size_t, off_t, off_t)``. See
:mod:`tandem.share.gpu_io` for the reader that uses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any, Union

import torch

from tandem.share.errors import ShareError

PathLike = Union[str, os.PathLike]

BACKENDS = ("auto", "cufile", "pinned")
ALIGN = 4096  # O_DIRECT alignment of offsets, sizes and buffer addresses
DEFAULT_BUFFER_BYTES = 8 << 20  # per thread: two 4 MiB halves
MAX_OPEN_FILES = 256  # descriptors (and cuFile handles) kept open per reader

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class GpuIOError(ShareError):
    """A read from storage could not be done; the message says which and why."""


class ReadPastEnd(GpuIOError, ValueError):
    """A byte range asked for goes past the end of its file."""


# ---------------------------------------------------------------------------------------
# cuFile: finding the library, its structs, and the process-wide driver
# ---------------------------------------------------------------------------------------

_CUFILEOP_BASE_ERR = 5000
# CUfileOpError values (NVIDIA GDS cuFile API reference, "enum CUfileOpError").
_CUFILE_ERRORS = {
    5001: "nvidia-fs driver is not loaded",
    5002: "invalid property",
    5003: "property range error",
    5004: "nvidia-fs driver version mismatch",
    5005: "nvidia-fs driver version read error",
    5006: "driver shutdown in progress",
    5007: "GDS is not supported on this platform",
    5008: "GDS is not supported on this file",
    5009: "GDS is not supported on this GPU",
    5010: "nvidia-fs driver ioctl error",
    5011: "CUDA driver API error",
    5012: "invalid device pointer",
    5013: "invalid pointer memory type",
    5014: "pointer range exceeds the allocated address range",
    5015: "CUDA context mismatch",
    5016: "access beyond the maximum pinned memory size",
    5017: "access beyond the mapped size",
    5018: "unsupported file type",
    5019: "unsupported file open flags",
    5020: "O_DIRECT is not set on the file descriptor",
    5022: "invalid API arguments",
    5023: "device pointer already registered",
    5024: "device pointer lookup failure",
    5025: "driver or file access error",
    5026: "driver is already open",
    5027: "file descriptor is not registered",
    5028: "file descriptor is already registered",
    5029: "GPU device not found",
    5030: "internal error",
    5031: "failed to obtain a new file descriptor",
    5033: "NVFS driver initialization error",
    5034: "GDS is disabled by config for this file",
    5036: "failed to allocate pinned GPU memory",
    5043: "out of memory",
    5044: "I/O error",
    5045: "buffer registration error",
    5047: "invalid context",
    5048: "nvfs internal driver error",
    5049: "compatibility mode is off (allow_compat_mode is false) and GDS is not usable",
}
_CU_FILE_DRIVER_ALREADY_OPEN = 5026
_CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1


def _cufile_error_text(err: int, cu_err: int = 0) -> str:
    name = _CUFILE_ERRORS.get(err, "unknown error")
    text = f"CUfileOpError {err} ({name})"
    if cu_err:
        text += f", CUresult {cu_err}"
    return text


class _CUfileError(ctypes.Structure):
    """``CUfileError_t``: ``{CUfileOpError err; CUresult cu_err;}``, both C enums (int)."""

    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class _CUfileDescrHandle(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class _CUfileDescr(ctypes.Structure):
    """``CUfileDescr_t``: ``{CUfileFileHandleType type; union {int fd; void *handle;} handle;
    const CUfileFSOps_t *fs_ops;}``: offsets 0, 8, 16; 24 bytes."""

    _fields_ = [("type", ctypes.c_int), ("handle", _CUfileDescrHandle), ("fs_ops", ctypes.c_void_p)]


def _wheel_library_candidates() -> list[str]:
    """libcufile from NVIDIA's pip wheels (``nvidia-cufile``): ``nvidia/cu13/lib`` or
    ``nvidia/cufile/lib`` (older wheels) under any ``sys.path`` entry."""
    roots: list[str] = []
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("nvidia")
        if spec is not None and spec.submodule_search_locations:
            roots += list(spec.submodule_search_locations)
    roots += [os.path.join(p, "nvidia") for p in sys.path if p]
    found: list[str] = []
    for root in dict.fromkeys(roots):
        for pattern in ("cu*/lib/libcufile.so*", "cufile/lib/libcufile.so*", "*/lib/libcufile.so*"):
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                if "rdma" not in os.path.basename(path) and path not in found:
                    found.append(path)
    return found


def _library_candidates() -> list[str]:
    names: list[str] = []
    explicit = os.environ.get("TANDEM_CUFILE_LIBRARY")
    if explicit:
        names.append(explicit)
    names += _wheel_library_candidates()
    with contextlib.suppress(Exception):  # cuda-pathfinder knows the wheels' and conda's layouts
        from cuda.pathfinder import load_nvidia_dynamic_lib  # type: ignore[import-not-found]

        names.append(load_nvidia_dynamic_lib("cufile").abs_path)
    with contextlib.suppress(Exception):
        name = ctypes.util.find_library("cufile")
        if name:
            names.append(name)
    names += ["libcufile.so.0", "libcufile.so.1", "libcufile.so"]
    return list(dict.fromkeys(n for n in names if n))


@functools.lru_cache(maxsize=1)
def find_cufile_library() -> str | None:
    """The path (or soname) of a libcufile that loads and exports ``cuFileRead``, or None.

    Looks at ``$TANDEM_CUFILE_LIBRARY``, NVIDIA's pip wheels, ``cuda.pathfinder``,
    ``ctypes.util.find_library("cufile")`` and the sonames ``libcufile.so.0``/``.1``, in that
    order. Loading needs the CUDA driver library, so on a machine without one this is None.
    """
    for name in _library_candidates():
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
        if hasattr(lib, "cuFileRead") and hasattr(lib, "cuFileHandleRegister"):
            return name
    return None


def nvidia_fs_loaded() -> bool:
    """Whether the nvidia-fs kernel module (GPUDirect Storage's driver) is loaded."""
    return os.path.exists("/sys/module/nvidia_fs") or os.path.exists("/proc/driver/nvidia-fs")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class _CtypesApi:
    """cuFile through ctypes on libcufile."""

    def __init__(self, path: str):
        self.name = f"ctypes:{path}"
        lib = ctypes.CDLL(path, use_errno=True)
        err_t, vp = _CUfileError, ctypes.c_void_p
        lib.cuFileDriverOpen.argtypes, lib.cuFileDriverOpen.restype = [], err_t
        # cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 in recent releases.
        self._close = getattr(lib, "cuFileDriverClose_v2", None) or lib.cuFileDriverClose
        self._close.argtypes, self._close.restype = [], err_t
        lib.cuFileHandleRegister.argtypes = [ctypes.POINTER(vp), ctypes.POINTER(_CUfileDescr)]
        lib.cuFileHandleRegister.restype = err_t
        lib.cuFileHandleDeregister.argtypes, lib.cuFileHandleDeregister.restype = [vp], None
        lib.cuFileBufRegister.argtypes = [vp, ctypes.c_size_t, ctypes.c_int]
        lib.cuFileBufRegister.restype = err_t
        lib.cuFileBufDeregister.argtypes, lib.cuFileBufDeregister.restype = [vp], err_t
        lib.cuFileRead.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
        lib.cuFileRead.restype = ctypes.c_ssize_t
        self._lib = lib

    @staticmethod
    def _check(what: str, e: _CUfileError, ok: tuple[int, ...] = ()) -> int:
        if (e.err != 0 and e.err not in ok) or (e.err == 0 and e.cu_err != 0):
            raise GpuIOError(f"{what} failed: {_cufile_error_text(e.err, e.cu_err)}")
        return e.err

    def driver_open(self) -> bool:
        """True if this call opened the driver (False: it was open already)."""
        err = self._check("cuFileDriverOpen", self._lib.cuFileDriverOpen(), (_CU_FILE_DRIVER_ALREADY_OPEN,))
        return err == 0

    def driver_close(self) -> None:
        self._check("cuFileDriverClose", self._close())

    def handle_register(self, fd: int) -> int:
        descr = _CUfileDescr()
        descr.type = _CU_FILE_HANDLE_TYPE_OPAQUE_FD
        descr.handle.fd = fd
        handle = ctypes.c_void_p()
        self._check("cuFileHandleRegister", self._lib.cuFileHandleRegister(ctypes.byref(handle), descr))
        return int(handle.value or 0)

    def handle_deregister(self, handle: int) -> None:
        self._lib.cuFileHandleDeregister(ctypes.c_void_p(handle))

    def buf_register(self, ptr: int, size: int) -> None:
        self._check("cuFileBufRegister", self._lib.cuFileBufRegister(ctypes.c_void_p(ptr), size, 0))

    def buf_deregister(self, ptr: int) -> None:
        self._check("cuFileBufDeregister", self._lib.cuFileBufDeregister(ctypes.c_void_p(ptr)))

    def read(self, handle: int, ptr: int, size: int, file_offset: int, buf_offset: int) -> int:
        n = self._lib.cuFileRead(ctypes.c_void_p(handle), ctypes.c_void_p(ptr), size, file_offset, buf_offset)
        if n >= 0:
            return int(n)
        if n == -1:
            errno = ctypes.get_errno()
            raise GpuIOError(f"cuFileRead failed: errno {errno} ({os.strerror(errno)})")
        if -n > _CUFILEOP_BASE_ERR:
            raise GpuIOError(f"cuFileRead failed: {_cufile_error_text(-n)}")
        raise GpuIOError(f"cuFileRead failed: errno {-n} ({os.strerror(-n)})")


class _BindingsApi:
    """cuFile through ``cuda.bindings.cufile`` (NVIDIA's cuda-python), where no libcufile
    could be loaded by path; the descriptor is still a ctypes ``CUfileDescr_t``."""

    def __init__(self, module: Any):
        self.name = "cuda.bindings.cufile"
        self._m = module
        self._keep: dict[int, _CUfileDescr] = {}

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except GpuIOError:
            raise
        except Exception as exc:  # cuFileError and its kin
            raise GpuIOError(f"{what} failed: {exc}") from None

    def driver_open(self) -> bool:
        try:
            self._m.driver_open()
        except Exception as exc:
            if str(_CU_FILE_DRIVER_ALREADY_OPEN) in str(exc) or "ALREADY_OPEN" in str(exc).upper():
                return False
            raise GpuIOError(f"cuFileDriverOpen failed: {exc}") from None
        return True

    def driver_close(self) -> None:
        close = getattr(self._m, "driver_close", None) or self._m.driver_close_v2
        self._call("cuFileDriverClose", close)

    def handle_register(self, fd: int) -> int:
        descr = _CUfileDescr()
        descr.type = _CU_FILE_HANDLE_TYPE_OPAQUE_FD
        descr.handle.fd = fd
        handle = int(self._call("cuFileHandleRegister", self._m.handle_register, ctypes.addressof(descr)))
        self._keep[handle] = descr
        return handle

    def handle_deregister(self, handle: int) -> None:
        self._call("cuFileHandleDeregister", self._m.handle_deregister, handle)
        self._keep.pop(handle, None)

    def buf_register(self, ptr: int, size: int) -> None:
        self._call("cuFileBufRegister", self._m.buf_register, ptr, size, 0)

    def buf_deregister(self, ptr: int) -> None:
        self._call("cuFileBufDeregister", self._m.buf_deregister, ptr)

    def read(self, handle: int, ptr: int, size: int, file_offset: int, buf_offset: int) -> int:
        n = self._call("cuFileRead", self._m.read, handle, ptr, size, file_offset, buf_offset)
        if n is None:  # some versions of the bindings return nothing, and raise only on -1
            raise GpuIOError("cuFileRead through cuda.bindings returned no byte count; use the ctypes path")
        return int(n)


def _configure_cufile() -> tuple[str | None, str | None]:
    """``(configuration file, log file)`` cuFile will use, set before its driver opens.

    cuFile writes ``cufile.log`` into the working directory unless told otherwise: point
    ``$CUFILE_LOGFILE_PATH`` into a temporary folder, unless it is set. Where nvidia-fs is
    not loaded and no configuration is given (neither ``$CUFILE_ENV_PATH_JSON`` nor
    ``/etc/cufile.json``), write one that allows compatibility mode and point cuFile at it."""
    folder = None
    log = os.environ.get("CUFILE_LOGFILE_PATH")
    if not log:
        folder = tempfile.mkdtemp(prefix="tandem-cufile-")
        log = os.environ["CUFILE_LOGFILE_PATH"] = os.path.join(folder, "cufile.log")
    config = os.environ.get("CUFILE_ENV_PATH_JSON") or (
        "/etc/cufile.json" if os.path.exists("/etc/cufile.json") else None
    )
    if config is None and not nvidia_fs_loaded():
        folder = folder or tempfile.mkdtemp(prefix="tandem-cufile-")
        config = os.path.join(folder, "cufile.json")
        settings = {"logging": {"level": "ERROR"}, "properties": {"allow_compat_mode": True}}
        with open(config, "w") as f:
            json.dump(settings, f)
        os.environ["CUFILE_ENV_PATH_JSON"] = config
    return config, log


class CuFileDriver:
    """The process's cuFile driver: opened once, on first use, closed at exit.

    ``get()`` returns it, or raises :class:`GpuIOError` saying why cuFile is unavailable
    (the same reason on every later call: it is probed once per process)."""

    _instance: CuFileDriver | None = None
    _failure: str | None = None
    _lock = threading.Lock()

    def __init__(self, api: _CtypesApi | _BindingsApi):
        self.api = api
        self.library = api.name
        self._owns = False
        if not torch.cuda.is_available():
            raise GpuIOError("CUDA is not available in this process")
        torch.cuda.init()
        self.config, self.log = _configure_cufile()
        self._owns = api.driver_open()
        forced = _env_true("CUFILE_FORCE_COMPAT_MODE")
        self.compat = forced or not nvidia_fs_loaded()
        if forced:
            self.mode = "compat mode: CUFILE_FORCE_COMPAT_MODE is set"
        elif self.compat:
            self.mode = "compat mode: nvidia-fs not loaded"
        else:
            # cuFile may still fall back to compat mode per file (an unsupported file system)
            self.mode = "GPUDirect Storage possible: nvidia-fs loaded (not verified per file)"

    @classmethod
    def _forget_after_fork(cls) -> None:
        # A forked child has the parent's driver state but not its CUDA context: it must
        # open its own, not use the parent's.
        cls._instance, cls._failure, cls._lock = None, None, threading.Lock()

    @classmethod
    def get(cls) -> CuFileDriver:
        with cls._lock:
            if cls._instance is not None:
                return cls._instance
            if cls._failure is not None:
                raise GpuIOError(cls._failure)
            try:
                cls._instance = cls(cls._load_api())
            except GpuIOError as exc:
                cls._failure = str(exc)
                raise
            except Exception as exc:  # a library that loads but misbehaves: say so, fall back
                cls._failure = f"cuFile could not be opened: {type(exc).__name__}: {exc}"
                raise GpuIOError(cls._failure) from None
            import atexit

            atexit.register(cls._instance.close)
            return cls._instance

    @staticmethod
    def _load_api() -> _CtypesApi | _BindingsApi:
        path = find_cufile_library()
        if path is not None:
            return _CtypesApi(path)
        if importlib.util.find_spec("cuda") is not None:
            with contextlib.suppress(ImportError):
                from cuda.bindings import cufile  # type: ignore[import-not-found]

                return _BindingsApi(cufile)
        raise GpuIOError(
            "libcufile not found (pip install nvidia-cufile, or install the CUDA toolkit's GDS "
            "package; $TANDEM_CUFILE_LIBRARY may name it)"
        )

    def register_hint(self) -> str:
        """What to look at when cuFile refuses to register a file."""
        hint = f"; cuFile's log: {self.log}" if self.log else ""
        if not os.path.isdir("/run/udev/data"):
            hint += (
                "; this system has no udev database (/run/udev/data), from which cuFile reads "
                "the block device's attributes: common in containers and VMs"
            )
        return hint

    def close(self) -> None:
        if self._owns:
            self._owns = False
            with contextlib.suppress(GpuIOError):
                self.api.driver_close()


def cufile_status() -> tuple[bool, str]:
    """(whether cuFile can be used here, what it runs as or why not). Opens the driver."""
    try:
        driver = CuFileDriver.get()
    except GpuIOError as exc:
        return False, str(exc)
    return True, f"{driver.mode} ({driver.library})"
