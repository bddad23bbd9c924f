"""Both transports (the shared-memory announcement table and the socket) under both policies."""

from __future__ import annotations

import pytest

from .workers import consume, serve_range


@pytest.mark.parametrize("policy", ["wait", "skip"])
def test_socket_only_transport_delivers_every_batch(procs, monkeypatch, policy):
    # Non-x86 hosts (aarch64: Grace Hopper, Graviton) never use the table; a consumer there
    # got 2 of 20 batches and then a ProducerError (AssertionError) under the default policy.
    monkeypatch.setenv("TANDEM_SHARE_TABLE", "0")
    procs.start(serve_range, "notable", 40, 2, epochs=2, window=4, policy=policy)
    procs.start(consume, "notable", procs.queue, epochs=2, tag="a", step_s=0.01)
    res = procs.collect(["a"])
    for epoch in (0, 1):
        ids, sizes = res["a"][epoch]
        assert sorted(ids) == list(range(40))
        assert sizes == [2] * 20


def test_a_producer_that_closed_with_a_request_unread_still_delivers_its_end():
    """Linux reports ECONNRESET (once) before the packets a peer sent before closing with
    ours unread: the consumer must read its End, not report the producer gone."""
    import socket

    from tandem.share import protocol
    from tandem.share._channel import Connection
    from tandem.share.errors import ProducerGone

    producer, consumer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    end = protocol.End(seq=5, epoch=1, offset=0, reason="served 1 epoch(s)", finished=True)
    protocol.send(producer, end)
    protocol.send(consumer, protocol.Next())  # a prefetched request the producer never reads
    producer.close()
    conn = Connection(consumer, "x", 1.0)
    assert conn.receive("waiting for a batch", 1.0) == end
    with pytest.raises(ProducerGone, match="gone"):
        conn.receive("waiting for a batch", 1.0)
    consumer.close()
