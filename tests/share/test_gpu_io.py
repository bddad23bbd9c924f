"""Storage to GPU (tandem.share.gpu_io) and `tandem bench io`: the CPU path everywhere, the
CUDA paths (pinned, cuFile) only where CUDA is available."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from click.testing import CliRunner

from tandem.bench import io_bench
from tandem.share import ShareError, gpu_io
from tandem.share.gpu_io import GpuFileReader, GpuIOError, ReadPastEnd

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def files(tmp_path):
    """Five files of random bytes, of awkward sizes (not multiples of 4 KiB)."""
    rng = random.Random(7)
    out = {}
    for i, size in enumerate([0, 1, 4095, 70_000, 3 * 4096 + 5]):
        path = tmp_path / f"f{i}.bin"
        data = rng.randbytes(size)
        path.write_bytes(data)
        out[str(path)] = data
    return out


def _ranges(files, n, seed=1):
    rng = random.Random(seed)
    sized = [(p, d) for p, d in files.items() if d]
    reqs = []
    for _ in range(n):
        path, data = rng.choice(sized)
        offset = rng.randrange(len(data))
        reqs.append((path, offset, rng.randrange(len(data) - offset + 1)))
    return reqs


def _bytes(t: torch.Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


# -- CPU ---------------------------------------------------------------------------------


@pytest.mark.parametrize("direct", [False, True])
def test_cpu_reads_return_the_exact_bytes(files, direct):
    with GpuFileReader("cpu", threads=3, direct=direct, buffer_bytes=4 * 4096) as r:
        assert r.kind == "cpu" and r.backend.startswith("cpu")
        for path, offset, size in _ranges(files, 200):
            t = r.read(path, offset, size)
            assert t.dtype == torch.uint8 and t.device.type == "cpu" and t.numel() == size
            assert _bytes(t) == files[path][offset : offset + size]


def test_read_files_equals_the_file_contents(files):
    with GpuFileReader("cpu", threads=4) as r:
        got = r.read_files(list(files))
    assert [_bytes(t) for t in got] == list(files.values())


def test_read_many_keeps_the_order_of_the_requests(files):
    reqs = _ranges(files, 300, seed=2)
    with GpuFileReader("cpu", threads=8, max_open_files=2) as r:  # evicts descriptors as it goes
        got = r.read_many(reqs)
        assert len(r._files) <= 2
    assert [_bytes(t) for t in got] == [files[p][o : o + s] for p, o, s in reqs]


def test_clear_errors(files, tmp_path):
    path = next(p for p, d in files.items() if len(d) == 4095)
    with GpuFileReader("cpu") as r:
        with pytest.raises(FileNotFoundError, match="nope.bin"):
            r.read(tmp_path / "nope.bin", 0, 1)
        with pytest.raises(ReadPastEnd, match="4095 bytes"):
            r.read(path, 4000, 100)
        with pytest.raises(ReadPastEnd):
            r.read_many([(path, 0, 10), (path, 4095, 1)])
        with pytest.raises(ValueError, match="non-negative"):
            r.read(path, -1, 1)
        assert r.read(path, 4095, 0).numel() == 0
    with pytest.raises(GpuIOError, match="closed"):
        r.read(path, 0, 1)
    with pytest.raises(ValueError, match="backend"):
        GpuFileReader("cpu", backend="spdk")
    with pytest.raises(ValueError, match="device"):
        GpuFileReader("tpu")
    with pytest.raises(GpuIOError, match="cpu"):
        GpuFileReader("cpu", backend="cufile")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(ShareError, match="CUDA is not available"):
        GpuFileReader("cuda:0")


def test_backend_selection():
    cuda = torch.device("cuda", 0)

    def missing():
        raise GpuIOError("libcufile not found")

    class Driver:
        mode = "compat mode: nvidia-fs not loaded"

    assert gpu_io.choose_backend("auto", torch.device("cpu"), missing)[0] == "cpu"
    assert gpu_io.choose_backend("pinned", torch.device("cpu"), missing)[0] == "cpu"
    kind, why, drv = gpu_io.choose_backend("auto", cuda, missing)
    assert (kind, drv) == ("pinned", None) and "libcufile not found" in why
    assert gpu_io.choose_backend("pinned", cuda, lambda: Driver())[:2] == ("pinned", "pinned (asked for)")
    kind, why, drv = gpu_io.choose_backend("auto", cuda, lambda: Driver())
    assert kind == "cufile" and why == "cufile (compat mode: nvidia-fs not loaded)"
    with pytest.raises(GpuIOError, match="cuFile is unavailable: libcufile not found"):
        gpu_io.choose_backend("cufile", cuda, missing)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_cufile_discovery_without_cuda_is_clean():
    lib = gpu_io.find_cufile_library()  # None here: no libcufile, or none that loads
    assert lib is None or isinstance(lib, str)
    ok, why = gpu_io.cufile_status()
    assert not ok and ("libcufile not found" in why if lib is None else "CUDA is not available" in why)
    with pytest.raises(GpuIOError):
        gpu_io.CuFileDriver.get()


def test_cufile_structs_match_cufile_h():
    import ctypes

    from tandem.share.gpu_io import _cufile

    assert ctypes.sizeof(_cufile._CUfileError) == 8
    assert ctypes.sizeof(_cufile._CUfileDescr) == 24
    assert _cufile._CUfileDescr.handle.offset == 8 and _cufile._CUfileDescr.fs_ops.offset == 16


def test_io_bench_quick_on_this_machine(tmp_path):
    out = tmp_path / "res" / "gpu_io.json"
    result = io_bench.run(
        folder=tmp_path / "set", size_gib=16 / 1024, seconds=0.2, threads=2, drop=False, out=out, quiet=True
    )
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    assert out.with_suffix(".md").read_text().startswith("# Storage to GPU")
    assert written["config"]["files"] >= 1 and written["config"]["file_set_bytes"] >= 16 << 20
    assert "method" in written["page_cache"] and written["page_cache"]["drop_caches"] is False
    assert io_bench.CPU_PATH in written["paths"]
    rows = [r for r in written["results"] if r["path"] == io_bench.CPU_PATH]
    assert [r["block_bytes"] for r in rows] == list(io_bench.BLOCK_SIZES)
    for r in rows:
        assert r["ops"] > 0 and r["gb_per_s"] > 0 and r["iops"] > 0 and r["cpu_cores_busy"] > 0
        assert r["cpu_cores_per_gb_per_s"] > 0 and r["lat_p99_us"] >= r["lat_p50_us"] > 0
    if not torch.cuda.is_available():
        assert io_bench.GPU_PATH in written["skipped"]
    # A second run reuses the file set.
    again = io_bench.run(
        folder=tmp_path / "set", size_gib=16 / 1024, seconds=0.05, threads=1, block_sizes=(4096,),
        drop=False, out=None, quiet=True,
    )  # fmt: skip
    assert again["config"]["file_set_created"] is False


def test_bench_io_command(tmp_path):
    from tandem.cli import main

    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main,
        ["bench", "io", "--dir", str(tmp_path / "set"), "--size-gib", "0.01", "--seconds", "0.05",
         "--threads", "2", "--block-sizes", "4K,8K", "--no-drop-caches", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert [r["block_bytes"] for r in json.loads(out.read_text())["results"]][:2] == [4096, 8192]
    res = CliRunner().invoke(main, ["bench", "io", "--block-sizes", "4X", "--out", str(out)])
    assert res.exit_code != 0 and "--block-sizes" in res.output


def test_parse_size():
    assert [io_bench.parse_size(s) for s in ["4K", "64KiB", "1M", "4MB", "4096"]] == [
        4096, 65536, 1 << 20, 4 << 20, 4096,
    ]  # fmt: skip


# -- CUDA --------------------------------------------------------------------------------


def _skip_unless_usable(backend, tmp_path):
    """cuFile may load yet refuse files here (no udev data about the disk, in a VM)."""
    if backend != "cufile":
        return
    ok, why = gpu_io.cufile_status()
    if not ok:
        pytest.skip(f"cuFile unavailable: {why}")
    probe = tmp_path / "probe.bin"
    probe.write_bytes(b"x" * 4096)
    try:
        with GpuFileReader("cuda:0", backend="cufile") as r:
            r.read(probe, 0, 1)
    except GpuIOError as exc:
        pytest.skip(str(exc))


@needs_cuda
@pytest.mark.parametrize("backend", ["pinned", "cufile"])
@pytest.mark.parametrize("direct", [False, True])
def test_device_reads_equal_the_file_bytes(files, backend, direct, tmp_path):
    _skip_unless_usable(backend, tmp_path)
    with GpuFileReader("cuda:0", backend=backend, threads=4, direct=direct, buffer_bytes=4 * 4096) as r:
        assert r.kind == backend, r.backend
        reqs = _ranges(files, 100, seed=3)
        for path, offset, size in reqs[:30]:
            t = r.read(path, offset, size)
            assert t.device.type == "cuda" and t.dtype == torch.uint8
            assert _bytes(t) == files[path][offset : offset + size]
        got = r.read_many(reqs)
        assert [_bytes(t) for t in got] == [files[p][o : o + s] for p, o, s in reqs]
        whole = r.read_files(list(files))
        assert [_bytes(t) for t in whole] == list(files.values())


@needs_cuda
@pytest.mark.parametrize("backend", ["pinned", "cufile"])
def test_device_reads_of_a_large_file(tmp_path, backend):
    """Larger than the buffer halves (several chunks), read while the caller's stream is busy."""
    _skip_unless_usable(backend, tmp_path)
    data = os.urandom(9 * 1024 * 1024 + 123)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    expected = torch.frombuffer(bytearray(data), dtype=torch.uint8).cuda()
    with GpuFileReader("cuda:0", backend=backend, threads=2, buffer_bytes=1 << 20) as r:
        a = torch.randn(4096, 4096, device="cuda")
        _ = a @ a  # keeps the current stream busy
        (t,) = r.read_files([path])
        assert torch.equal(t, expected)  # used on the caller's stream
        part = r.read(path, 12345, 5 * 1024 * 1024)
        assert torch.equal(part, expected[12345 : 12345 + 5 * 1024 * 1024])


@needs_cuda
def test_auto_backend_on_cuda_names_its_reason(files):
    with GpuFileReader("cuda:0") as r:
        assert r.kind in ("cufile", "pinned")
        assert r.backend.startswith(r.kind + " (")
        ok, why = gpu_io.cufile_status()
        assert (r.kind == "cufile") == ok, why
        got = r.read_files(list(files))  # files cuFile refuses, if any, go through pinned buffers
        assert [_bytes(t) for t in got] == list(files.values())
        assert (r.cufile_refused is not None) == ("pinned buffers" in r.backend)
