"""The failure classifier: GPU-OOM signatures, each classification rule, real processes ended by
real signals and exit codes, log tails, cgroup OOM counters and the kernel log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.place.run.supervisor.failures import (
    KINDS,
    Ending,
    cgroup_dir,
    classify,
    find_gpu_oom,
    kernel_oom_killed,
    oom_kill_count,
    read_tail,
)
from tandem.place.run.supervisor.failures import _kill_line as kill_line

# --- real messages, as the frameworks print them --------------------------------------------

TORCH_OOM = """\
Epoch 3:  41%|████      | 412/1000 [02:13<03:10,  3.09it/s, loss=0.412]
Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 88, in <module>
    main()
  File "/home/ana/proj/train.py", line 71, in main
    loss = model(batch).loss
           ^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py", line 612, in forward
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3))
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. \
Of the allocated memory 75.12 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but \
unallocated. If reserved but unallocated memory is large try setting \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory \
Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""

TORCH_OOM_OLD = """\
Traceback (most recent call last):
  File "train.py", line 40, in <module>
    out = net(x)
  File "/usr/lib/python3/dist-packages/torch/nn/modules/conv.py", line 443, in _conv_forward
    return F.conv2d(input, weight, bias, self.stride,
RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.78 GiB total capacity; \
14.20 GiB already allocated; 301.19 MiB free; 14.45 GiB reserved in total by PyTorch) If reserved \
memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.
"""

# An MPS client over its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: the GPU looks as big as the limit.
MPS_PINNED_OOM = """\
  File "/srv/jobs/resnet.py", line 52, in step
    logits = model(images)
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of \
4.00 GiB of which 120.00 MiB is free. Process 88172 has 3.88 GiB memory in use.
"""

CUBLAS_OOM = """\
Traceback (most recent call last):
  File "bench.py", line 12, in <module>
    y = a @ b
RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`
"""

CUDA_ERROR_OOM = """\
Traceback (most recent call last):
  File "gen.py", line 9, in <module>
    x = torch.empty(1 << 36, device="cuda")
RuntimeError: CUDA error: out of memory
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be \
incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""

TF_OOM = """\
2024-05-02 10:14:03.118772: W tensorflow/tsl/framework/bfc_allocator.cc:485] Allocator (GPU_0_bfc) \
ran out of memory trying to allocate 4.00GiB (rounded to 4294967296)requested by op MatMul
Traceback (most recent call last):
  File "tf_train.py", line 30, in <module>
    model.fit(ds, epochs=5)
tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:

OOM when allocating tensor with shape[32768,32768] and type float on \
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
\t [[{{node MatMul}}]]
"""

TF_STATUS_OOM = """\
2 root error(s) found.
  (0) RESOURCE_EXHAUSTED:  OOM when allocating tensor with shape[64,1024,1024] and type float on \
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
\t [[{{node conv2d_4/Conv2D}}]]
"""

JAX_OOM = """\
jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate \
17179869184 bytes.
"""

CUPY_OOM = """\
Traceback (most recent call last):
  File "cupy_job.py", line 4, in <module>
    a = cp.zeros((1 << 34,), dtype=cp.float32)
  File "cupy/cuda/memory.pyx", line 1426, in cupy.cuda.memory.SingleDeviceMemoryPool._malloc
cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory
"""

NUMBA_OOM = """\
numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY
"""

NCCL_OOM = "node03:88172:88301 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'\n"

PLAIN_TRACEBACK = """\
Traceback (most recent call last):
  File "train.py", line 20, in <module>
    cfg = load(args.config)
  File "train.py", line 11, in load
    raise ValueError(f"unknown optimizer {name!r}")
ValueError: unknown optimizer 'adamw8'
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (TORCH_OOM, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
        (TORCH_OOM_OLD, "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0;"),
        (MPS_PINNED_OOM, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB."),
        (CUBLAS_OOM, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling"),
        (CUDA_ERROR_OOM, "RuntimeError: CUDA error: out of memory"),
        (TF_OOM, "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:"),
        (TF_STATUS_OOM, "(0) RESOURCE_EXHAUSTED:  OOM when allocating tensor"),
        (JAX_OOM, "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory"),
        (CUPY_OOM, "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation"),
        (NUMBA_OOM, "numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_"),
        (NCCL_OOM, "node03:88172:88301 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'"),
    ],
    ids=[
        "torch",
        "torch-old",
        "mps-pinned",
        "cublas",
        "cuda-error",
        "tf",
        "tf-status",
        "jax",
        "cupy",
        "numba",
        "nccl",
    ],
)
def test_gpu_oom_signatures(text, expected):
    line = find_gpu_oom(text)
    assert line is not None and line.startswith(expected)
    assert line == line.strip()


@pytest.mark.parametrize(
    "text",
    [
        PLAIN_TRACEBACK,
        "MemoryError\n",  # host memory, Python's own
        "OSError: [Errno 12] Cannot allocate memory\n",
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n",
        "grpc: RESOURCE_EXHAUSTED: too many pings\n",  # the status code without memory words
        "loading /usr/local/cuda/lib64/libcudart.so.12\n",
        "",
    ],
    ids=["traceback", "MemoryError", "ENOMEM", "worker-killed", "grpc", "cuda-path", "empty"],
)
def test_not_gpu_oom(text):
    assert find_gpu_oom(text) is None


def test_tried_to_allocate_line_preferred():
    text = (
        "  File 'x.py', line 3, in f\n"
        "    except torch.cuda.OutOfMemoryError:\n"
        "RuntimeError: CUDA error: out of memory\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has ...\n"
    )
    assert find_gpu_oom(text).startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00"
    )
    # without one, the first matching line
    assert find_gpu_oom(CUDA_ERROR_OOM) == "RuntimeError: CUDA error: out of memory"


# --- the rules -----------------------------------------------------------------------------


def test_ok():
    end = classify(0, TORCH_OOM)  # OOM text in a run that recovered and succeeded
    assert end == Ending("ok", "succeeded", 0, None, "succeeded", None)
    assert not end.retryable


@pytest.mark.parametrize("returncode", [0, 1, -9, -15, 137])
def test_cancelled_wins_whatever_the_code(returncode):
    end = classify(returncode, TORCH_OOM, cancelled=True, oom_kills=2)
    assert (end.kind, end.state, end.cause) == ("cancelled", "cancelled", "cancelled")
    assert not end.retryable


@pytest.mark.parametrize("returncode", [1, -6, 3])
def test_gpu_oom_whatever_the_nonzero_code(returncode):
    end = classify(returncode, TORCH_OOM_OLD)
    assert (end.kind, end.state, end.cause) == ("gpu_oom", "oom", "GPU out of memory")
    assert end.line.startswith("RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB")
    assert end.retryable


def test_gpu_oom_line_keeps_the_sizes():
    end = classify(1, TORCH_OOM)  # a line of 560 characters
    assert end.exit_code == 1 and end.signal is None
    assert end.line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert len(end.line) == 300 and end.line.endswith("...")


def test_sigkill_with_cgroup_oom_kill_is_host_oom():
    end = classify(-9, "Epoch 1: 10%\n", oom_kills=1)
    assert end == Ending("host_oom", "oom", None, "SIGKILL", "host out of memory (oom_kill)", None)
    assert end.retryable


def test_exit_137_with_kernel_oom_is_host_oom():
    kernel = "Out of memory: Killed process 4242 (python) total-vm:81234567kB, anon-rss:60123456kB"
    end = classify(137, "", kernel_oom=kernel)
    assert (end.kind, end.state, end.exit_code, end.signal) == ("host_oom", "oom", 137, None)
    assert end.cause == "host out of memory (kernel OOM killer)"
    assert end.line == kernel
    assert classify(137, "", kernel_oom=True).line is None


def test_sigkill_alone_is_not_oom():
    end = classify(-9, "Epoch 1: 10%\n")
    assert (end.kind, end.state, end.signal, end.exit_code) == ("signal", "failed", "SIGKILL", None)
    assert end.cause == "killed by SIGKILL"
    assert not end.retryable
    # oom kills do not make a SIGTERM or an ordinary exit an OOM
    assert classify(-15, "", oom_kills=3).kind == "signal"
    assert classify(1, "", oom_kills=3).kind == "exit"


def test_exit_137_alone_is_an_exit():
    end = classify(137, "")
    assert (end.kind, end.exit_code, end.signal) == ("exit", 137, None)
    assert end.cause == "exit 137 (128+SIGKILL)"


def test_other_signals():
    end = classify(
        -11, "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
    )
    assert (end.kind, end.state, end.signal, end.cause) == (
        "signal",
        "failed",
        "SIGSEGV",
        "killed by SIGSEGV",
    )
    assert end.line == "Fatal Python error: Segmentation fault"


def test_not_found():
    end = classify(127, "sh: 1: trian.py: not found\n")
    assert (end.kind, end.state, end.exit_code) == ("not_found", "failed", 127)
    assert end.cause == "command not found (exit 127)"
    assert end.line == "sh: 1: trian.py: not found"


def test_plain_exit_names_the_exception_line():
    end = classify(1, PLAIN_TRACEBACK + "wandb: Synced 5 files\n\n")
    assert (end.kind, end.state, end.exit_code, end.cause) == ("exit", "failed", 1, "exit 1")
    assert end.line == "ValueError: unknown optimizer 'adamw8'"
    assert not end.retryable


def test_a_plain_exit_says_the_last_line_it_wrote_where_no_line_looks_like_an_error():
    assert classify(2, "step 100 loss 0.3\nstep 200 loss 0.2\n\n").line == "step 200 loss 0.2"
    assert classify(1, "loading data\nno such file: data/train.csv\n").line == "no such file: data/train.csv"
    assert classify(3, "").line is None and classify(3, "\n \n").line is None
    line = classify(2, "train.py: error: the following arguments are required: --data\n").line
    assert line == "train.py: error: the following arguments are required: --data"


def test_every_kind_has_a_state():
    ends = [
        classify(0, ""),
        classify(1, TORCH_OOM),
        classify(-9, "", oom_kills=1),
        classify(-2, ""),
        classify(1, ""),
        classify(127, ""),
        classify(0, "", cancelled=True),
    ]
    assert [e.kind for e in ends] == list(KINDS)
    assert [e.state for e in ends] == ["succeeded", "oom", "oom", "failed", "failed", "failed", "cancelled"]


# --- real processes ------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_real_process_killed_by_a_real_signal(signum):
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout.readline() == b"up\n"  # the interpreter is running, not starting
    os.kill(proc.pid, signum)
    returncode = proc.wait(timeout=10)
    proc.stdout.close()
    end = classify(returncode, "up\n", oom_kills=0)
    assert (end.kind, end.signal, end.exit_code) == ("signal", signum.name, None)
    assert end.cause == f"killed by {signum.name}"


def test_real_command_not_found(tmp_path):
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        returncode = subprocess.run(
            ["sh", "-c", "tandem-no-such-command --epochs 3"], stdout=out, stderr=subprocess.STDOUT
        ).returncode
    end = classify(returncode, read_tail(log))
    assert (end.kind, end.exit_code) == ("not_found", 127)
    assert "tandem-no-such-command" in end.line and "not found" in end.line


def test_real_python_error(tmp_path):
    log = tmp_path / "job.log"
    code = "print('epoch 1', flush=True)\nraise KeyError('lr')"
    with open(log, "wb") as out:
        returncode = subprocess.run(
            [sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT
        ).returncode
    end = classify(returncode, read_tail(log))
    assert (end.kind, end.exit_code, end.cause, end.line) == ("exit", 1, "exit 1", "KeyError: 'lr'")


# --- log tails -----------------------------------------------------------------------------


def test_read_tail_of_a_big_file(tmp_path):
    log = tmp_path / "big.log"
    with open(log, "w") as f:
        for i in range(100_000):
            f.write(f"step {i:06d} loss {1 / (i + 1):.6f}\n")
        f.write(TORCH_OOM)
    assert log.stat().st_size > 2_000_000
    tail = read_tail(log, max_bytes=64 * 1024)
    assert len(tail.encode()) <= 64 * 1024
    assert tail.endswith(TORCH_OOM)
    assert tail.startswith("step ")  # the cut-off first line is dropped
    assert classify(1, tail).kind == "gpu_oom"
    assert read_tail(log, max_bytes=10**9) == log.read_text()


def test_read_tail_missing_and_undecodable(tmp_path):
    assert read_tail(tmp_path / "nope.log") == ""
    log = tmp_path / "bin.log"
    log.write_bytes(b"ok\n\xff\xfe broken\n")
    assert read_tail(log) == "ok\n\ufffd\ufffd broken\n"


# --- cgroup and kernel OOM evidence --------------------------------------------------------


def test_oom_kill_count_of_this_process():
    count = oom_kill_count(os.getpid())  # never raises, whatever this machine's cgroups are
    assert count is None or (isinstance(count, int) and count >= 0)
    directory = cgroup_dir(os.getpid())
    if directory is not None and (directory / "memory.events").exists():
        assert isinstance(count, int)
        assert count == oom_kill_count(directory)


def test_oom_kill_count_from_a_memory_events_file(tmp_path):
    (tmp_path / "memory.events").write_text("low 0\nhigh 12\nmax 40\noom 4\noom_kill 3\noom_group_kill 0\n")
    assert oom_kill_count(tmp_path) == 3
    assert oom_kill_count(tmp_path / "missing") is None
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\n")  # before Linux 4.13
    assert oom_kill_count(tmp_path) is None


def test_oom_kill_count_of_a_gone_process():
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(proc.stdout)
    assert cgroup_dir(pid) is None or Path(f"/proc/{pid}").exists()  # reused pid: fine either way
    if not Path(f"/proc/{pid}").exists():
        assert oom_kill_count(pid) is None


@pytest.mark.timeout(10)
def test_kernel_oom_killed_of_this_process_does_not_hang():
    start = time.monotonic()
    assert kernel_oom_killed(os.getpid()) is None
    assert kernel_oom_killed(os.getpid(), since=time.monotonic()) is None
    assert time.monotonic() - start < 5


def test_kernel_kill_lines():
    records = {
        "3,1234,98765432,-;Out of memory: Killed process 4242 (python) total-vm:81234567kB, "
        "anon-rss:60123456kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:120000kB oom_score_adj:0": True,
        "3,1235,98765433,-;Memory cgroup out of memory: Killed process 4242 (python3) total-vm:1234kB\n"
        " SUBSYSTEM=memory": True,
        "6,1236,98765434,-;oom_reaper: reaped process 4242 (python), now anon-rss:0kB": False,
        "3,1237,98765435,-;Out of memory: Killed process 42420 (python) total-vm:1kB": False,
        "4,1238,98765436,-;python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)": False,
    }
    for record, matches in records.items():
        line = kill_line(record, 4242)
        if matches:
            assert line is not None and line.startswith(
                ("Out of memory: Killed process 4242", "Memory cgroup")
            )
            assert "\n" not in line
        else:
            assert line is None
