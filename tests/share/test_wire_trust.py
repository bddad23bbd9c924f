"""What a peer of a share's socket can make the other side build: only the protocol's
messages (never an object of another class, never a call), and, where that peer is another
user's producer (a public share), a batch's structure of tensors and plain values only."""

from __future__ import annotations

import os
import pickle
from collections import namedtuple

import pytest
import torch

from tandem.share import protocol
from tandem.share._slab import SlotViews, layout
from tandem.share._tree import flatten
from tandem.share.errors import ProtocolError


class _Calls:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.getpid, ())


def test_every_message_decodes_as_itself() -> None:
    messages = [
        protocol.Hello(version=4, pid=1, batch_size=None, device="cpu", table=True),
        protocol.Release((1, 2)),
        protocol.Bye(),
        protocol.Stats(),
        protocol.Items((3,)),
        protocol.ItemsReply(("ab",)),
        protocol.Refused("no"),
        protocol.SetAside(1.5),
        protocol.End(seq=1, epoch=0, offset=0, reason="done", finished=True),
        protocol.Failed(seq=1, message="m"),
    ]
    for message in messages:
        assert protocol.decode(protocol.encode(message)) == message


@pytest.mark.parametrize("payload", [_Calls(), os.system, {"a": __import__("collections").OrderedDict()}])
def test_a_pickled_message_holding_anything_else_is_refused(payload: object) -> None:
    with pytest.raises(ProtocolError, match="a message may not hold"):
        protocol.decode(bytes([0]) + pickle.dumps(payload))


@pytest.mark.parametrize(
    "message",
    [
        protocol.Hello(version=4, pid=1, batch_size=None, device="cpu", table=True, world_size="2"),  # type: ignore[arg-type]
        protocol.Release(5),  # type: ignore[arg-type]
        protocol.Next(release="ab"),  # type: ignore[arg-type]
        protocol.Batch(1, 0, 0, 1, protocol.Segment("host", 1, 0, "big"), 0, 0),  # type: ignore[arg-type]
    ],
)
def test_a_message_whose_fields_are_not_of_their_types_is_refused(message: object) -> None:
    """A pickle may set a field to anything: one of another type would fail far from the
    socket (the producer's control thread), so it is refused as it is read."""
    with pytest.raises(ProtocolError, match="not a"):
        protocol.decode(bytes([0]) + pickle.dumps(message))


Pair = namedtuple("Pair", "x y")


def _meta(batch: object) -> bytes:
    spec, leaves = flatten(batch)
    return layout(spec, leaves)[2]


def test_a_guest_decodes_tensors_and_plain_values_but_no_class_of_the_producers() -> None:
    plain = _meta({"x": torch.zeros(2, 3), "names": ["a", "b"], "n": 2})
    u8 = torch.zeros(4096, dtype=torch.uint8)
    spec, leaves = SlotViews(trusted=False).views(0, plain, u8)
    assert leaves[0].shape == (2, 3) and leaves[0].dtype == torch.float32
    classy = _meta(Pair(torch.zeros(1), torch.ones(1)))
    assert SlotViews(trusted=True).views(0, classy, u8)[0][1] is Pair  # the owner's own: as ever
    with pytest.raises(ProtocolError, match="a public share's batches are tensors"):
        SlotViews(trusted=False).views(0, classy, u8)
    calls = pickle.dumps(_Calls())
    with pytest.raises(ProtocolError):
        SlotViews(trusted=False).views(0, calls, u8)


def test_a_guest_maps_no_memory_of_another_users_that_could_shrink_under_it() -> None:
    """A guest's mapping of a batch's memory never loses its pages (a SIGBUS as it reads):
    it maps a segment only if the producer sealed its size, as every host slab does."""
    from tandem.share._segment_map import SegmentMap
    from tandem.share._slab import HostSlab

    slab = HostSlab("t", 2)
    spec, leaves = flatten({"x": torch.arange(6.0)})
    slab.write(0, spec, leaves)
    sealed = slab.read_only_fd(0)
    guest = SegmentMap(trusted=False)
    guest.add(slab.segment(0), sealed)  # sealed: mapped
    loose = os.memfd_create("loose")
    os.ftruncate(loose, 1 << 20)
    with pytest.raises(ProtocolError, match="not sealed to its size"):
        SegmentMap(trusted=False).add(protocol.Segment("host", 7, 1, 1 << 20), loose)
    with pytest.raises(OSError):
        os.fstat(loose)  # closed with the refusal
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, 1 << 20)
    SegmentMap(trusted=True).add(protocol.Segment("host", 8, 1, 1 << 20), unsealed)  # its own: as ever
    slab.close()
