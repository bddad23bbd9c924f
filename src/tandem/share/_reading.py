"""The consumer's reading of the producer's stream: its epochs and its position in the
stream, the producer batch it holds and cuts into its own batches, and handing that back.

:class:`StreamReader` is a component of :class:`tandem.share.consumer.Consumer`, which
attaches to the producer and hands it the channel and the slab's map it made. Where each
epoch begins and ends is :func:`tandem.share._order.epoch_bounds`; the entries come through
:mod:`tandem.share._channel`.
"""

from __future__ import annotations

import collections
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tandem.share import protocol
from tandem.share._channel import SocketChannel, TableChannel, set_aside_text
from tandem.share._cuda import DeviceCopier
from tandem.share._cuda_slab import CudaSegmentMap, remove_files_of_dead_producer
from tandem.share._gate import ReleaseGate
from tandem.share._order import Position, epoch_bounds
from tandem.share._rebatch import Assembler, Piece
from tandem.share._resume import EpochItems
from tandem.share._segment_map import Segments
from tandem.share._tree import flatten, unflatten
from tandem.share.errors import (
    BatchKeptWarning,
    MissedBatchesWarning,
    ProducerError,
    ProducerFinished,
    ProducerGone,
    ProducerStopped,
    ProtocolError,
    ReaderSetAside,
    ShareError,
)


class _Held:
    """The producer batch this consumer is reading."""

    __slots__ = ("msg", "piece_spec", "leaves", "lent_at")

    def __init__(self, msg: protocol.Batch, spec: tuple, leaves: list[torch.Tensor]):
        self.msg = msg
        self.piece_spec = spec
        self.leaves = leaves
        self.lent_at: int | None = None  # the number of the last delivered batch viewing it

    @property
    def end(self) -> Position:
        return (self.msg.epoch, self.msg.offset + self.msg.count)


@dataclass(frozen=True)
class SlabAccess:
    """How this consumer reaches the producer's slab: its map of the segments, and for a
    GPU consumer the copier (host slab) or the CUDA slab itself, with the gate that holds
    a release until the GPU is done with the slot."""

    segments: Segments
    copier: DeviceCopier | None = None  # host slab, GPU consumer
    cuda_slab: CudaSegmentMap | None = None  # CUDA slab
    gate: ReleaseGate | None = None  # GPU consumers: releases wait for CUDA events


class StreamReader:
    """Iteration over the producer's stream, one epoch per :meth:`epoch`: the reading part
    of :class:`~tandem.share.consumer.Consumer`, which attaches, makes the channel and the
    slab's map, and gives them to it. It holds its position in the stream, the producer
    batch it reads, what it has lent to delivered batches and not handed back, and its
    counts."""

    def __init__(
        self,
        channel: SocketChannel | TableChannel,
        slab: SlabAccess,
        welcome: protocol.Welcome,
        *,
        name: str,
        batch_size: int | None,
        drop_last: bool,
        rank: int,
        world_size: int,
        data_timeout: float | None,
        device: torch.device,
        transform: Callable[[Any], Any] | None,
    ):
        self.name = name
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.data_timeout = data_timeout
        self.device = device
        self.transform = transform
        self.channel = channel  # how entries come and releases go (its stall, its transport)
        self._segments = slab.segments
        self._copier = slab.copier
        self._cuda_slab = slab.cuda_slab
        self._gate = slab.gate
        self._producer_pid: int = welcome.pid
        self.start: Position = (welcome.start_epoch, welcome.start_offset)  # where it joined
        self.position: Position = self.start  # where it is: (epoch, sample offset)
        # Known from the start for a sized source; an iterable one's is counted at the end of
        # the producer's first pass (its EpochEnd).
        self.samples_per_epoch: int | None = welcome.samples_per_epoch
        self._producer_batch: int | None = welcome.batch_size
        self.items = EpochItems()  # what this epoch has delivered, for state_dict
        self.samples = 0
        self.batches = 0
        # The dataset indices of the last batch handed over (a tensor; None where the producer
        # sends none: a source it does not order), for logging or weighting per sample.
        self.last_indices: torch.Tensor | None = None
        # Whether a batch kept past the contract (copied out) is warned of: the drop-in
        # DataLoader's batches are its user's to keep, as torch's are.
        self.warn_kept = True
        self.missed_batches = 0
        self.missed_samples = 0
        self.kept_batches = 0  # batches copied out because they were kept past the contract
        self._cur: _Held | None = None  # the producer batch being read
        self._lent: collections.deque[tuple[int, int, int]] = collections.deque()  # (seq, lent_at, slot)
        self._release: list[int] = []  # seqs done with, not handed back yet
        self._end: protocol.End | None = None
        self._k = 0  # this reader's epoch counter
        self.closed = False

    def progress(self) -> tuple[float, int, int, Position]:
        """What the channel reports to the producer: stall, samples, batches, position."""
        return self.channel.stall_s, self.samples, self.batches, self.position

    def release(self) -> None:
        """Hand back now every producer batch behind the batches delivered so far."""
        if self._cur is not None and self.position >= self._cur.end:
            self._done_with_current(keep=0)
        self._retire(keep=0)
        self._send_releases()

    def _send_releases(self) -> None:
        """Tell the producer now what this reader has handed back (a GPU reader's gate:
        what its events let go)."""
        if self._release or self._gate:
            self.channel.release(self._release, self._holding())

    def close(self) -> None:
        """Stop reading: what it holds goes with the connection (the consumer's to close)."""
        self.closed = True
        self._cur = None
        self.channel.close()

    def __len__(self) -> int:
        n = self.samples_per_epoch
        if n is None:
            raise TypeError(
                f"the epoch length of producer {self.name!r} is not known yet: its source states "
                "none (an IterableDataset without __len__; webdataset: .with_length(n)), and it is "
                "counted only at the end of the producer's first pass"
            )
        if self.world_size > 1:
            n //= self.world_size  # each rank's part (see _take)
            if self.batch_size is None:
                raise TypeError("a rank's batches follow the producer's: give a batch_size for len()")
        if self.batch_size is not None:
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        pbs = self._producer_batch
        if pbs is None:
            raise TypeError("the producer's batch size is not fixed; ask for a batch_size")
        p = self.start[1]
        head = math.ceil((n - p) / pbs)
        tail = p // pbs
        if self.drop_last:
            head = (n - p) // pbs
        return head + tail

    def epoch(self) -> Iterator[Any]:
        """The next epoch's batches; beginning it leaves the one before."""
        begin, end = epoch_bounds(self.start, self._k)
        self._k += 1
        mine = self._k
        self._retire(keep=1)
        self.items.begin(self.samples_per_epoch, self.world_size)
        try:
            for batch in self._batches(begin, end):
                yield batch
                if self._k != mine:
                    return  # a newer iter() has begun the next epoch: this one was left
        except GeneratorExit:  # the client left the epoch (a break): hand back what we hold
            if self._k == mine and not self.closed:
                try:
                    self._leave(end)
                except (ShareError, OSError):
                    pass  # the producer is gone (or this process is exiting): nothing to hand back
            raise
        self.items.end()

    def _leave(self, end: Position) -> None:
        """The epoch ending at ``end`` was left early: hand back what this consumer holds, so
        that it does not hold the producer while the client does something else. A batch the
        client still references is copied out (host memory); on a CUDA slab, where it cannot
        be, the last batches delivered stay lent until the next epoch begins."""
        if self._cuda_slab is not None:
            if self._cur is not None and self._cur.lent_at is None and self._cur.end <= end:
                self._done_with_current(keep=0)
        else:
            if self._cur is not None and self._cur.end <= end:  # else the next epoch starts in it
                self._done_with_current(keep=0, quiet=True)
            self._retire(keep=0, quiet=True)
        self._send_releases()

    def _batches(self, begin: Position, end: Position) -> Iterator[Any]:
        self._skip_until(begin)
        size = self.batch_size
        while size is None:  # the producer's batches as they are: no assembly, no copy
            if self.position >= end:
                return
            if not self._readable():
                self._advance(end, 0)
                continue
            a, b = self._readable_range(end)
            piece = self._take(a, b)
            if not piece.n:
                del piece  # its views of the slot would count as the client's when it goes back
                continue  # none of this consumer's samples (another rank's, or seen already)
            indices = piece.rows(piece.leaves[-1]) if self._indexed else None
            yield self._deliver(piece.view(), piece.n, piece.is_view, indices)
            del piece, indices
            self._retire(keep=1)
        while True:
            asm = Assembler(size)
            while self.position < end and asm.n < size:
                if not self._readable():
                    if asm.holds_views:
                        asm.materialize()  # copy out before the slot is released
                    if not self._advance(end, asm.n):
                        break
                    continue
                a, b = self._readable_range(end)
                asm.add(self._take(a, b, want=size - asm.n))
            if asm.empty:
                return
            if asm.n < size and self.drop_last:
                return
            views = asm.holds_views
            indices = asm.last_rows() if asm.indexed else None
            yield self._deliver(asm.result(), asm.n, views, indices)
            del indices
            self._retire(keep=1)
            if self.position >= end:
                return

    def _readable_range(self, end: Position) -> tuple[int, int]:
        """Samples ``[a, b)`` of the current producer batch that belong to this epoch."""
        assert self._cur is not None
        msg = self._cur.msg
        a = self.position[1] - msg.offset
        b = msg.count if end[0] != msg.epoch else min(msg.count, end[1] - msg.offset)
        return a, b

    def _take(self, a: int, b: int, want: int | None = None) -> Piece:
        """This consumer's samples of ``[a, b)`` of the current producer batch, at most
        ``want`` of them; the position moves past what they cover.

        Rank ``r`` of ``W`` takes the samples at producer offsets ``o`` with ``o % W == r``
        below ``W * (n // W)``: the ranks' parts of an epoch are disjoint, cover it but for
        its last ``n % W`` samples (dropped, so that every rank has as many), and do not
        depend on where the group joined (see :mod:`tandem.share._groups`)."""
        assert self._cur is not None
        msg = self._cur.msg
        items = self.items
        if items.skip is not None and self._indexed:  # a resumed epoch: unseen items only
            return self._take_unseen(a, b, want)
        step, stop = self.world_size, b
        if step > 1:
            assert self.samples_per_epoch is not None
            a += (self.rank - (msg.offset + a)) % step
            b = min(b, self.samples_per_epoch // step * step - msg.offset)
        if items.skip_samples and a < b:  # a resumed epoch of a source without indices
            k = min(items.skip_samples, len(range(a, b, step)))
            items.skip_samples -= k
            a += k * step
        n = len(range(a, b, step))
        if want is not None and n > want:
            n = want
            b = stop = a + (n - 1) * step + 1
        self.position = (msg.epoch, msg.offset + stop)
        if not n:
            b = a
        return Piece(self._cur.piece_spec, self._cur.leaves, msg.count, a, b, step)

    def _take_unseen(self, a: int, b: int, want: int | None) -> Piece:
        """:meth:`_take` in a resumed epoch: the items of ``[a, b)`` not delivered before the
        resume; a group's ``j``-th unseen item of the epoch is rank ``j % W``'s, below the
        limit that gives every rank as many (see :mod:`tandem.share._resume`)."""
        assert self._cur is not None
        msg, items = self._cur.msg, self.items
        rows = torch.arange(a, b)
        unseen = rows[items.unseen(self._cur.leaves[-1][rows])]
        ordinals = items.ordinal + torch.arange(len(unseen))
        mine = unseen
        if self.world_size > 1 or items.limit is not None:
            keep = ordinals % self.world_size == self.rank
            if items.limit is not None:
                keep &= ordinals < items.limit
            mine = unseen[keep]
        stop = b
        if want is not None and len(mine) > want:
            mine = mine[:want]
            stop = int(mine[-1]) + 1
        items.ordinal += int((unseen < stop).sum())
        self.position = (msg.epoch, msg.offset + stop)
        if not len(mine):
            return Piece(self._cur.piece_spec, self._cur.leaves, msg.count, a, a)
        return Piece(self._cur.piece_spec, self._cur.leaves, msg.count, a, stop, 1, mine)

    @property
    def _indexed(self) -> bool:
        """Whether the producer sends each batch's item indices (see :mod:`._resume`)."""
        return self._cur is not None and self._cur.piece_spec[0] == "I"

    def _deliver(self, batch: Any, samples: int, views: bool, indices: torch.Tensor | None) -> Any:
        """Count the batch and hand it over: as it is (``views``: it points into the slot of
        the producer batch being read, which is then lent to it), or copied to the device;
        then through the consumer's ``transform``."""
        self.samples += samples
        self.batches += 1
        self.items.delivered(indices, samples)
        self.last_indices = indices
        batch = self._to_device(batch, views)
        return batch if self.transform is None else self.transform(batch)

    def _to_device(self, batch: Any, views: bool) -> Any:
        if (
            views
            and self._copier is None
            and (self._cuda_slab is None or self.device == self._cuda_slab.device)
        ):
            assert self._cur is not None
            self._cur.lent_at = self.batches
        if self._copier is not None:
            return self._copier.to_device(batch)
        if self._cuda_slab is not None and self.device != self._cuda_slab.device:
            # Another GPU, or the CPU: a copy, queued on the slab GPU's current stream after
            # its wait for the producer's writes (to the CPU it is waited for at once).
            spec, leaves = flatten(batch)
            with torch.cuda.device(self._cuda_slab.device):
                return unflatten(spec, [t.to(self.device) for t in leaves])
        return batch

    def _done_with_current(self, keep: int = 1, quiet: bool = False) -> None:
        """This consumer has read the producer batch it holds. It goes back to the producer,
        unless the last ``keep`` batches delivered still view it: then it is lent to them.
        ``quiet``: a batch still referenced is copied out without a warning."""
        assert self._cur is not None
        msg, lent_at = self._cur.msg, self._cur.lent_at
        self._cur = None  # its tensors go now: released() tells whether the client kept any
        seq, slot = msg.seq, msg.segment.slot
        if lent_at is not None and lent_at > self.batches - keep:
            self._lent.append((seq, lent_at, slot))
        else:
            self._hand_back(seq, slot, quiet)

    def _retire(self, keep: int, quiet: bool = False) -> None:
        """Hand back the producer batches lent only to batches older than the last ``keep``.

        The consumer's contract: a batch stays valid while the next one is fetched (what
        Lightning's and every device prefetcher's one-ahead fetching needs), so each fetch
        retires what the batch before the last one viewed (``keep=1``)."""
        lent = self._lent
        while lent and lent[0][1] <= self.batches - keep:
            seq, _lent_at, slot = lent.popleft()
            self._hand_back(seq, slot, quiet)

    def _hand_back(self, seq: int, slot: int, quiet: bool = False) -> None:
        """Release a producer batch: at once, or, where the GPU may still be reading its
        slot, once the CUDA event recorded now has completed. ``quiet``: a batch still
        referenced is copied out within the contract (an epoch left early), not warned of."""
        if self._segments.released(slot) and not quiet:
            self.kept_batches += 1
            if self.kept_batches == 1 and self.warn_kept:
                warnings.warn(
                    f"consumer of {self.name!r}: a batch was still referenced when its shared memory "
                    "went back to the producer (a batch is valid until the batch after the next one "
                    "is asked for); tandem copied it out so it stays correct, at the cost of a copy. "
                    "To keep batches longer, copy them: tandem.share.clone_batch(batch). Said once "
                    "per consumer; Consumer.kept_batches counts them",
                    BatchKeptWarning,
                    stacklevel=5,
                )
        if self._gate is None:
            self._release.append(seq)
        elif self._cuda_slab is not None:
            self._cuda_slab.check_unmodified(slot, self.name)
            self._gate.hold(seq, self._cuda_slab.done_event())
        else:
            assert self._copier is not None
            self._gate.hold(seq, self._copier.last_event)

    def _readable(self) -> bool:
        cur = self._cur
        return cur is not None and cur.msg.epoch == self.position[0] and self.position[1] < cur.end[1]

    def _skip_until(self, begin: Position) -> None:
        """Discard what is left of an epoch the caller left early (``break``, an exception,
        a new ``iter()``), up to the next epoch.

        Everything held goes back first: the producer reuses its slots in order, so a batch
        kept back while this consumer reads past a window of others would hold it for ever.
        The last batch delivered is still in its contract (valid through this fetch), so one
        still referenced is copied out first, without a warning."""
        if self.position < begin:
            if self._cur is not None and self._cur.end <= begin:  # else the next epoch starts in it
                self._done_with_current(keep=0, quiet=True)
            self._retire(keep=0, quiet=True)
        while self.position < begin:
            if self._readable():
                assert self._cur is not None
                if self._cur.msg.epoch == begin[0]:
                    self.position = (begin[0], min(begin[1], self._cur.end[1]))
                else:
                    self.position = self._cur.end
                continue
            if not self._advance(begin, 0, keep=0):
                return

    def _advance(self, end: Position, have: int, keep: int = 1) -> bool:
        """Take the next producer entry. Returns True, or raises at the stream's end.

        The channel brings it (from the announcement table without a system call, or over
        the socket; see :mod:`tandem.share._channel`) and hands back what this consumer
        released.
        """
        if self._cur is not None:
            if keep:
                self._done_with_current()
            else:
                self._done_with_current(0, quiet=True)
        if self._end is not None:
            return self._at_end(end, have)
        try:
            reply = self.channel.take(self._release, self._holding(), self.data_timeout)
        except ProducerGone:
            if self._cuda_slab is not None and self._producer_pid:
                remove_files_of_dead_producer(self._producer_pid)
            raise
        if isinstance(reply, protocol.Batch):
            self._on_batch(reply)
        elif isinstance(reply, protocol.EpochEnd):
            self.position = max(self.position, (reply.epoch + 1, 0))
            if self.samples_per_epoch is None:
                self.samples_per_epoch = reply.samples  # an iterable source's first pass, counted
        elif isinstance(reply, protocol.End):
            self._end = reply
            return self._at_end(end, have)
        elif isinstance(reply, protocol.Failed):
            raise ProducerError(reply.message)
        elif isinstance(reply, protocol.SetAside):
            raise ReaderSetAside(set_aside_text(self.name, reply.after_s))
        else:
            raise ProtocolError(f"unexpected {type(reply).__name__} from the producer")
        self.channel.taken(reply.seq, self._holding())
        return True

    def _holding(self) -> int | None:
        """The oldest seq this consumer still holds (lent, or being read), if any: below it,
        everything is released (the table transport's watermark)."""
        if self._lent:
            return self._lent[0][0]
        return self._cur.msg.seq if self._cur is not None else None

    def _on_batch(self, msg: protocol.Batch) -> None:
        if msg.missed_batches:
            self.missed_batches += msg.missed_batches
            self.missed_samples += msg.missed_samples
            warnings.warn(
                f"consumer of {self.name!r} fell behind the producer's window and missed "
                f"{msg.missed_batches} batch(es), {msg.missed_samples} sample(s) "
                f"({self.missed_batches} batches in all); use policy='wait' on the producer "
                "to never miss data",
                MissedBatchesWarning,
                stacklevel=4,
            )
        spec, leaves = self._segments.open(msg)
        self._cur = _Held(msg, spec, leaves)
        self.position = max(self.position, (msg.epoch, msg.offset))

    def _at_end(self, end: Position, have: int) -> bool:
        """The stream has ended. False lets the caller deliver a partial batch first."""
        assert self._end is not None
        if have:
            return False
        if self._end.finished:
            raise ProducerFinished(
                f"producer {self.name!r} has finished ({self._end.reason}); "
                "this consumer has no further epoch"
            )
        begin = (end[0] - 1, end[1])
        if self.position <= begin:
            raise ProducerStopped(f"producer {self.name!r} stopped: {self._end.reason}")
        raise ProducerStopped(
            f"producer {self.name!r} stopped before the end of this consumer's epoch "
            f"({self._end.reason}); the epoch ended at producer position {self.position}, "
            f"short of {end}"
        )
