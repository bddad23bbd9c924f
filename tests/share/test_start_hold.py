"""A producer told how many consumers to expect (a job manager's, for a sweep's jobs) keeps
its stream's start until they have attached: the later ones start at the epoch's start too,
not mid-epoch (a cut whose missed part it would make again for each), and it makes no more
batches than the epochs need. Without it, or past its time, a late one cuts as before."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from tandem.share import Consumer, Producer
from tests.share.conftest import wait_for
from tests.share.serving import serving
from tests.timing import scaled

N = 256  # 16 batches of 16 an epoch


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((2,), float(i)), i


def _read_some(it, batches: int) -> list[int]:
    seen: list[int] = []
    for _ in range(batches):
        seen += next(it)[1].tolist()
    return seen


def _epochs(consumer: Consumer, epochs: int, it=None, head: tuple[int, ...] = ()) -> list[list[int]]:
    """``epochs`` epochs, the first of them ``head`` (read already from ``it``) and the rest of ``it``."""
    out = []
    for e in range(epochs):
        current = list(head) if e == 0 else []
        for _, y in it if e == 0 and it is not None else consumer:
            current += y.tolist()
        out.append(current)
    return out


def test_the_expected_consumers_all_start_at_the_epochs_start_and_nothing_is_made_twice():
    producer = Producer.from_dataset(Items(), "held", batch_size=16, shuffle=True, window=4)
    producer.expect_consumers(3, within_s=60)
    with serving(producer, epochs=None):
        first = Consumer("held", batch_size=16)
        it = iter(first)
        early = _read_some(it, 3)  # it runs ahead while the others start (a window of 4 would let
        # the stream's start go without the hold: the test_window join points)
        second = Consumer("held", batch_size=16)
        third = Consumer("held", batch_size=16)
        assert first.start == second.start == third.start == (0, 0), (first.start, second.start, third.start)
        # Every expected consumer came: the start goes (as the third's attach is recorded).
        wait_for(lambda: producer._server.start_hold is None, 10, what="the start hold to go")
        # Read at once (a window of 4 holds the fastest to the slowest), two epochs each.
        with ThreadPoolExecutor(3) as pool:
            runs = [
                pool.submit(_epochs, c, 2, rest, tuple(head))
                for c, rest, head in ((first, it, early), (second, None, []), (third, None, []))
            ]
            for run in runs:
                epochs = run.result(timeout=scaled(60))
                assert all(sorted(e) == list(range(N)) for e in epochs), [len(e) for e in epochs]
        # Two epochs for all three (and the few batches made ahead): not one more per joiner.
        assert producer._publisher.published_batches <= 2 * N // 16 + 4, producer._publisher.published_batches
        for c in (first, second, third):
            c.close()


def test_past_its_time_a_late_consumer_cuts_as_before():
    producer = Producer.from_dataset(Items(), "held-late", batch_size=16, shuffle=True, window=4)
    producer.expect_consumers(3, within_s=0.5)
    with serving(producer, epochs=None):
        first = Consumer("held-late", batch_size=16)
        it = iter(first)
        early = _read_some(it, 1)
        wait_for(lambda: producer._server.start_hold is None, 10, what="the start hold's time ran out")
        _read_some(it, 8)  # past the window of 4: epoch 0's start is gone
        late = Consumer("held-late", batch_size=16)
        assert late.start != (0, 0) and late.start[1] > 0, late.start
        assert early  # the first read its start
        first.close()  # (in "wait", a consumer that stops reading holds the others back)
        (epoch,) = _epochs(late, 1)
        assert sorted(epoch) == list(range(N)), "a cut still sees every item once"
        late.close()
