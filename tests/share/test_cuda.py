"""The GPU path: guarded on CPU-only machines; exercised only where CUDA is available."""

from __future__ import annotations

import pytest
import torch

from tandem.share import Consumer, ShareError

from .workers import serve_range


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(ShareError, match="CUDA is not available"):
        Consumer("anything", device="cuda:0", timeout=1)


def test_invalid_device_is_rejected():
    with pytest.raises(ValueError, match="device"):
        Consumer("anything", device="tpu", timeout=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_consumer_gets_batches_on_the_gpu(procs):
    procs.start(serve_range, "gpu", 50, 10, epochs=1)
    with Consumer("gpu", device="cuda:0", batch_size=7, timeout=30) as c:
        ids = []
        for b in c:
            assert b["x"].device.type == "cuda"
            assert torch.equal(b["x"][:, 0].cpu(), b["i"].float().cpu())
            ids += b["i"].cpu().tolist()
    assert ids == list(range(50))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("late_copies", [False, True])
def test_copies_on_a_side_stream_are_ordered_before_the_users_stream(procs, monkeypatch, late_copies):
    """The batch is copied on the consumer's side stream; work the user queues on their own
    (current) stream must see the copied values, with no CPU synchronisation in between.
    ``late_copies``: the side stream busy-waits ~10 ms before each batch's copies, so a
    read that did not wait for them would see memory not yet written."""
    if late_copies:
        from tandem.share._cuda import DeviceCopier

        copy = DeviceCopier.to_device

        def late(self, batch):
            with torch.cuda.device(self.device):
                if self._stream is None:
                    self._stream = torch.cuda.Stream(self.device)
                with torch.cuda.stream(self._stream):
                    torch.cuda._sleep(20_000_000)
            return copy(self, batch)

        monkeypatch.setattr(DeviceCopier, "to_device", late)
    procs.start(serve_range, "gpu-stream", 64, 16, epochs=1)
    user = torch.cuda.Stream()
    ids = []
    with torch.cuda.stream(user), Consumer("gpu-stream", device="cuda:0", timeout=30) as c:
        for b in c:
            doubled = b["x"][:, 0] * 2  # queued on `user`, after its wait on the copy event
            ids += (doubled / 2).long().cpu().tolist()
    assert ids == list(range(64))
