"""Consumer groups: the ranks of one distributed job, attached as one consumer each.

Every rank of a group must see the same epochs (the same join point), so that each can take
its own part of every epoch (:mod:`tandem.share._reading`: rank ``r`` of ``W`` takes the
samples at producer offsets ``o`` with ``o % W == r``). The first rank to attach chooses the
join point; until every rank has attached, a :class:`GroupHold` keeps the window from
evicting anything from there on, as a consumer that has taken nothing would. A rank that
attaches again (a consumer made anew each epoch) starts the group's next *generation*: the
other ranks' new consumers join it there.

Plain state under the producer's lock, like the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.share._table import ConsumerRecord
from tandem.share.protocol import EntryKind

Position = tuple[int, int]


class GroupHold:
    """A link (see :mod:`tandem.share._transport`) that holds every entry from the group's
    join point on, for the ranks that have not attached yet."""

    transport = "hold"

    def __init__(self, cursor: int, position: Position):
        self._cursor = cursor
        self._position = position

    def cursor(self) -> int:
        return self._cursor

    def released_below(self) -> int:
        return self._cursor

    def holds(self, seq: int) -> bool:
        return seq >= self._cursor

    def sent(self, seq: int, kind: EntryKind, end: Position) -> None:
        pass

    def released(self, seqs: tuple[int, ...]) -> None:
        pass

    def reported(self, stall_s: float, samples: int, batches: int) -> None:
        pass

    def progress(self) -> ConsumerRecord:
        epoch, offset = self._position
        return ConsumerRecord(
            taken=self._cursor,
            released=self._cursor,
            stall_s=0.0,
            samples=0,
            batches=0,
            epoch=epoch,
            offset=offset,
        )


class StartHold:
    """The start of the stream kept for consumers expected soon: a job manager's producer is
    told how many jobs will read it as it starts (a sweep's, which attach within seconds of
    each other). A consumer that attaches mid-epoch is a cut whose missed part the producer
    makes again (an 8-trial sweep's producer made 102 batches for 3 epochs of 24). So from
    the first consumer's attach, every entry from the stream's start is held until
    ``expected`` consumers have attached, or ``within_s`` later: the later ones then start at
    the epoch's start too. Held only once one has attached (before that the window makes
    only a few batches ahead, and keeps them)."""

    def __init__(self, expected: int, within_s: float) -> None:
        self.link = GroupHold(0, (0, 0))
        self.expected, self.within_s = expected, within_s
        self.attached = 0
        self.first: float | None = None

    def attach(self, now: float) -> None:
        self.attached += 1
        self.first = now if self.first is None else self.first

    def over(self, now: float) -> bool:
        """Whether it is to go: every expected consumer came, or the time is up."""
        return self.attached >= self.expected or (
            self.first is not None and now - self.first >= self.within_s
        )

    def waiting(self) -> str:
        return f"the stream's start, kept for {self.expected - self.attached} more expected consumer(s)"


@dataclass(slots=True)
class _Generation:
    world_size: int
    cursor: int
    start: Position
    ranks: set[int] = field(default_factory=set)
    hold: GroupHold | None = None


class Groups:
    """The groups of one producer, by key."""

    def __init__(self) -> None:
        self._current: dict[str, _Generation] = {}

    def join(self, key: str, rank: int, world_size: int, here: tuple[int, Position]) -> tuple[int, Position]:
        """Where rank ``rank`` of group ``key`` starts: the group's join point, or ``here``
        (the producer's join point now) when it starts a new generation of the group."""
        gen = self._current.get(key)
        if gen is None or rank in gen.ranks or gen.world_size != world_size or gen.hold is None:
            cursor, start = here
            gen = self._current[key] = _Generation(world_size, cursor, start)
            if world_size > 1:
                gen.hold = GroupHold(cursor, start)
        gen.ranks.add(rank)
        if len(gen.ranks) >= gen.world_size:
            gen.hold = None  # every rank holds its own place now
        return gen.cursor, gen.start

    def holds(self) -> list[GroupHold]:
        return [g.hold for g in self._current.values() if g.hold is not None]

    def waiting(self) -> list[str]:
        """Groups still waiting for ranks, for "waiting for ..." messages."""
        return [
            f"group {key!r} (ranks {sorted(g.ranks)} of {g.world_size} attached)"
            for key, g in self._current.items()
            if g.hold is not None
        ]
